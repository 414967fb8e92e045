// Image folders for the tests (torchvision's ImageFolder layout, data/images.h): Fashion-MNIST's
// test images, read through saturate's own IDX reader, written as DIR/CLASS/NNNNN.png or .jpg
// with libpng and TurboJPEG, at 28x28 or resized (data/images.h's resize) to other sizes, gray
// or tinted RGB. Also the encoders themselves, for tests that write single images.
#pragma once
#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"
#include "data/images.h"

namespace sat::test {

inline const char* kFashionIdx = "/usr/share/datasets/fashion-mnist";
// Fashion-MNIST's classes as folder names ("T-shirt/top" without its slash).
inline const char* kFashionClasses[10] = {"T-shirt_top", "Trouser", "Pullover", "Dress", "Coat",
                                          "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle_boot"};

inline bool have_fashion_mnist() {
  return std::filesystem::exists(std::string(kFashionIdx) + "/t10k-images-idx3-ubyte.gz");
}

// Fashion-MNIST's 10000 test images (28x28 bytes each) and labels, read once through
// open_dataset("fashion-mnist:DIR") from a folder whose train-* names lead to the t10k files
// (the reader wants both splits; the small one twice is quick).
struct FashionMnist {
  std::vector<uint8_t> pixels;  // n x 784
  std::vector<int32_t> labels;
  int64_t n = 0;
  Image image(int64_t i) const {
    return Image{28, 28, 1, std::vector<uint8_t>(pixels.begin() + i * 784, pixels.begin() + (i + 1) * 784)};
  }
};

inline const FashionMnist& fashion_mnist() {
  static const FashionMnist data = [] {
    namespace fs = std::filesystem;
    const fs::path dir = fs::temp_directory_path() / str_cat("sat_fashion_t10k_", getpid());
    fs::create_directories(dir);
    for (const char* kind : {"images-idx3-ubyte.gz", "labels-idx1-ubyte.gz"}) {
      const fs::path src = fs::path(kFashionIdx) / (std::string("t10k-") + kind);
      for (const char* split : {"train-", "t10k-"}) {
        std::error_code ec;
        fs::create_symlink(src, dir / (split + std::string(kind)), ec);
      }
    }
    const DataSplit d = open_dataset("fashion-mnist:" + dir.string(), DataOptions{});
    fs::remove_all(dir);
    FashionMnist f;
    f.n = d.test->size();
    f.pixels.resize(size_t(f.n) * 784);
    f.labels.resize(size_t(f.n));
    std::vector<float> x(784);
    for (int64_t i = 0; i < f.n; ++i) {
      d.test->get(i, x.data(), &f.labels[size_t(i)]);
      for (int j = 0; j < 784; ++j) f.pixels[size_t(i) * 784 + size_t(j)] = uint8_t(std::lround(x[size_t(j)] * 255.0f));
    }
    return f;
  }();
  return data;
}

inline void write_png(const std::string& path, const Image& im) {
  png_image p{};
  p.version = PNG_IMAGE_VERSION;
  p.width = png_uint_32(im.width);
  p.height = png_uint_32(im.height);
  p.format = im.channels == 1 ? PNG_FORMAT_GRAY : im.channels == 2 ? PNG_FORMAT_GA
           : im.channels == 3 ? PNG_FORMAT_RGB : PNG_FORMAT_RGBA;
  SAT_CHECK(png_image_write_to_file(&p, path.c_str(), 0, im.pixels.data(), 0, nullptr), path, ": ", p.message);
}

inline std::vector<uint8_t> encode_jpeg(const Image& im, int quality) {
  tjhandle h = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  const int gray = im.channels == 1;
  const int r = tjCompress2(h, im.pixels.data(), im.width, 0, im.height, gray ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                            gray ? TJSAMP_GRAY : TJSAMP_420, quality, 0);
  std::vector<uint8_t> out(buf, buf + (r == 0 ? size : 0));
  tjFree(buf);
  tjDestroy(h);
  SAT_CHECK(r == 0, "TurboJPEG could not encode the test image");
  return out;
}

inline void write_file_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  SAT_CHECK(f && std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size(), "cannot write ", path);
  std::fclose(f);
}

inline void write_jpeg(const std::string& path, const Image& im, int quality = 95) {
  write_file_bytes(path, encode_jpeg(im, quality));
}

// How image i of a folder is written.
struct ImageVariant {
  bool jpeg = false;
  int width = 28, height = 28;
  bool rgb = false;  // tinted: (v, v*3/4, 255-v)
};

// A gray image as a variant: resized, tinted.
inline Image variant_of(const Image& gray, const ImageVariant& v) {
  Image im = resize_bilinear(gray, v.width, v.height);
  if (!v.rgb) return im;
  Image rgb{im.width, im.height, 3, std::vector<uint8_t>(im.pixels.size() * 3)};
  for (size_t i = 0; i < im.pixels.size(); ++i) {
    const uint8_t p = im.pixels[i];
    rgb.pixels[3 * i] = p, rgb.pixels[3 * i + 1] = uint8_t(p * 3 / 4), rgb.pixels[3 * i + 2] = uint8_t(255 - p);
  }
  return rgb;
}

// A mix: every fourth image each of 28x28 PNG, 28x28 JPEG, a larger RGB PNG, a larger JPEG.
inline ImageVariant mixed_variant(int64_t i) {
  const int sizes[][2] = {{40, 56}, {64, 48}, {33, 33}, {96, 70}, {50, 29}};
  const int* s = sizes[i / 4 % 5];
  switch (i % 4) {
    case 0: return ImageVariant{false, 28, 28, false};
    case 1: return ImageVariant{true, 28, 28, false};
    case 2: return ImageVariant{false, s[0], s[1], true};
    default: return ImageVariant{true, s[1], s[0], i % 8 == 3};
  }
}

struct FolderSpec {
  int64_t first = 0, count = 100;  // Fashion-MNIST test images [first, first + count)
  bool numbered = false;           // class folders "0_T-shirt_top", ...: sorted order is the label order
  std::function<ImageVariant(int64_t)> variant = [](int64_t) { return ImageVariant{}; };
};

inline std::string fashion_class_folder(int32_t label, bool numbered) {
  return numbered ? str_cat(label, "_", kFashionClasses[label]) : std::string(kFashionClasses[label]);
}

// Writes DIR/CLASS/NNNNN.png|jpg (NNNNN: the image's index) and returns the images' indices
// in the folder's order (classes in sorted order of their folders, files by name).
inline std::vector<int64_t> write_fashion_folder(const std::string& dir, const FolderSpec& spec) {
  namespace fs = std::filesystem;
  const FashionMnist& f = fashion_mnist();
  std::vector<std::tuple<std::string, std::string, int64_t>> order;  // (folder, file, index)
  for (int64_t i = spec.first; i < spec.first + spec.count; ++i) {
    const ImageVariant v = spec.variant(i);
    const std::string cls = fashion_class_folder(f.labels[size_t(i)], spec.numbered);
    fs::create_directories(fs::path(dir) / cls);
    char name[32];
    std::snprintf(name, sizeof name, "%05lld.%s", (long long)i, v.jpeg ? "jpg" : "png");
    const std::string path = (fs::path(dir) / cls / name).string();
    const Image im = variant_of(f.image(i), v);
    if (v.jpeg) write_jpeg(path, im);
    else write_png(path, im);
    order.emplace_back(cls, name, i);
  }
  std::sort(order.begin(), order.end());
  std::vector<int64_t> idx;
  for (const auto& o : order) idx.push_back(std::get<2>(o));
  return idx;
}

}  // namespace sat::test
