// Image decoding (PNG through libpng's simplified API, JPEG through TurboJPEG), the header and
// end check of a folder's files, and the transforms (PIL's bilinear resize, torchvision's
// centre crop, random resized crop and flip). See images.h for what each does and why.
#include "data/images.h"

#include <fcntl.h>
#include <png.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/io.h"

namespace sat {
namespace {

constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
// The IEND chunk every PNG ends with: length 0, type, CRC.
constexpr uint8_t kPngEnd[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', 0xAE, 0x42, 0x60, 0x82};
constexpr size_t kTailBytes = 4096;      // the end a file's last marker must lie in
constexpr size_t kHeadBytes = 64 << 10;  // read first for the header; the whole file when that is not enough

std::string pixels_text(int64_t w, int64_t h) { return str_cat(w, " x ", h, " pixels"); }

// The size of a decoded image, refused beyond max_pixels (sat::Error naming `where`).
void check_size(int64_t w, int64_t h, int64_t max_pixels, const std::string& where) {
  SAT_CHECK(w > 0 && h > 0, where, ": the image is ", pixels_text(w, h), "; expected a positive width and height");
  SAT_CHECK(w * h <= max_pixels, where, ": the image is ", pixels_text(w, h), ", more than the ", max_pixels,
            " pixels saturate decodes (a decompression bomb?)");
}

// src: w x h pixels of src_channels samples (1 gray, 2 gray + alpha, 3 RGB, 4 RGBA) -> `channels`
// (1 or 3), alpha dropped; colour to gray by PIL's convert("L") (ITU-R 601-2 luma, fixed point).
Image to_channels(const uint8_t* src, int w, int h, int src_channels, int channels) {
  Image out{w, h, channels, std::vector<uint8_t>(size_t(w) * size_t(h) * size_t(channels))};
  const bool color = src_channels >= 3;
  const size_t n = size_t(w) * size_t(h);
  uint8_t* d = out.pixels.data();
  for (size_t i = 0; i < n; ++i, src += src_channels) {
    if (channels == 1) {
      *d++ = color ? uint8_t((src[0] * 19595u + src[1] * 38470u + src[2] * 7471u + 0x8000u) >> 16) : src[0];
    } else {
      d[0] = src[0], d[1] = src[color ? 1 : 0], d[2] = src[color ? 2 : 0];
      d += 3;
    }
  }
  return out;
}

// ---------------------------------------------------------------- PNG

// libpng's simplified API: a colour file read as RGB(A), a gray one as gray (+ alpha), 8 bits.
struct PngHeader {
  png_image image;
  PngHeader() { std::memset(&image, 0, sizeof image), image.version = PNG_IMAGE_VERSION; }
  ~PngHeader() { png_image_free(&image); }  // nothing after finish_read or a failure
  PngHeader(const PngHeader&) = delete;
  PngHeader& operator=(const PngHeader&) = delete;
  bool begin(const uint8_t* data, size_t size) { return png_image_begin_read_from_memory(&image, data, size) != 0; }
  std::string message() const { return std::string(image.message, strnlen(image.message, sizeof image.message)); }
};

Image decode_png(const uint8_t* data, size_t size, int channels, const std::string& where, int64_t max_pixels) {
  PngHeader p;
  SAT_CHECK(p.begin(data, size), where, ": not a readable PNG (libpng: ", p.message(), ")");
  png_image& im = p.image;
  check_size(im.width, im.height, max_pixels, where);
  im.flags |= PNG_IMAGE_FLAG_16BIT_sRGB;  // 16-bit samples are sRGB-encoded, as in files that say nothing
  const bool color = im.format & PNG_FORMAT_FLAG_COLOR, alpha = im.format & PNG_FORMAT_FLAG_ALPHA;
  im.format = color ? (alpha ? PNG_FORMAT_RGBA : PNG_FORMAT_RGB) : (alpha ? PNG_FORMAT_GA : PNG_FORMAT_GRAY);
  const int src_channels = int(PNG_IMAGE_SAMPLE_CHANNELS(im.format));
  const int w = int(im.width), h = int(im.height);
  std::vector<uint8_t> buf(PNG_IMAGE_SIZE(im));
  SAT_CHECK(png_image_finish_read(&im, nullptr, buf.data(), 0, nullptr), where, ": a corrupt or truncated PNG (libpng: ",
            p.message(), ")");
  return to_channels(buf.data(), w, h, src_channels, channels);
}

std::string png_header_problem(const uint8_t* data, size_t size) {
  PngHeader p;
  if (!p.begin(data, size)) return "not a readable PNG (libpng: " + p.message() + ")";
  if (int64_t(p.image.width) * int64_t(p.image.height) > kMaxImagePixels)
    return str_cat("the image is ", pixels_text(p.image.width, p.image.height), ", more than the ", kMaxImagePixels,
                   " pixels saturate decodes");
  return "";
}

// ---------------------------------------------------------------- JPEG

// One TurboJPEG decompressor per thread, reused (a handle stays usable after an error).
struct JpegDecoder {
  tjhandle h = nullptr;
  JpegDecoder() {
#ifdef TJ_NUMINIT  // libjpeg-turbo 3
    h = tj3Init(TJINIT_DECOMPRESS);
    if (h) tj3Set(h, TJPARAM_SCANLIMIT, 500);  // progressive files of endless scans are refused
#else
    h = tjInitDecompress();
#endif
    SAT_CHECK(h, "TurboJPEG: cannot create a JPEG decompressor (out of memory?)");
  }
  ~JpegDecoder() {
#ifdef TJ_NUMINIT
    tj3Destroy(h);
#else
    tjDestroy(h);
#endif
  }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  std::string error() const {
#ifdef TJ_NUMINIT
    return tj3GetErrorStr(h);
#else
    return tjGetErrorStr2(h);
#endif
  }
  bool warning_only() const {
#ifdef TJ_NUMINIT
    return tj3GetErrorCode(h) == TJERR_WARNING;
#else
    return tjGetErrorCode(h) == TJERR_WARNING;
#endif
  }
  // The header: width, height and colour space (TJCS_*). False on an error.
  bool header(const uint8_t* data, size_t size, int& w, int& h_, int& colorspace) {
#ifdef TJ_NUMINIT
    if (tj3DecompressHeader(h, data, size) != 0) return false;
    w = tj3Get(h, TJPARAM_JPEGWIDTH), h_ = tj3Get(h, TJPARAM_JPEGHEIGHT), colorspace = tj3Get(h, TJPARAM_COLORSPACE);
    if (tj3Get(h, TJPARAM_PRECISION) != 8) return unsupported("a JPEG of more than 8 bits per sample");
    if (tj3Get(h, TJPARAM_LOSSLESS) == 1) return unsupported("a lossless JPEG");
    return true;
#else
    int subsampling = 0;
    return tjDecompressHeader3(h, data, (unsigned long)size, &w, &h_, &subsampling, &colorspace) == 0;
#endif
  }
  // Decodes into dst (w x h x the format's samples). True on success or a mere warning.
  bool decode(const uint8_t* data, size_t size, uint8_t* dst, int w, int h_, int format) {
#ifdef TJ_NUMINIT
    (void)w, (void)h_;
    return tj3Decompress8(h, data, size, dst, 0, format) == 0 || warning_only();
#else
    return tjDecompress2(h, data, (unsigned long)size, dst, w, 0, h_, format, TJFLAG_LIMITSCANS) == 0 ||
           warning_only();
#endif
  }
  std::string unsupported_what;
  bool unsupported(const char* what) {
    unsupported_what = what;
    return false;
  }
};

JpegDecoder& jpeg_decoder() {
  thread_local JpegDecoder d;
  d.unsupported_what.clear();
  return d;
}

std::string jpeg_header_problem(JpegDecoder& d, const uint8_t* data, size_t size, int& w, int& h, int& cs) {
  if (!d.header(data, size, w, h, cs))
    return d.unsupported_what.empty() ? "not a readable JPEG (TurboJPEG: " + d.error() + ")"
                                      : d.unsupported_what + "; expected 8-bit baseline or progressive JPEG";
  if (cs == TJCS_CMYK || cs == TJCS_YCCK) return "a CMYK JPEG; expected RGB or gray (convert it to RGB)";
  if (int64_t(w) * int64_t(h) > kMaxImagePixels)
    return str_cat("the image is ", pixels_text(w, h), ", more than the ", kMaxImagePixels, " pixels saturate decodes");
  return "";
}

Image decode_jpeg(const uint8_t* data, size_t size, int channels, const std::string& where, int64_t max_pixels) {
  JpegDecoder& d = jpeg_decoder();
  int w = 0, h = 0, cs = 0;
  const std::string problem = jpeg_header_problem(d, data, size, w, h, cs);
  SAT_CHECK(problem.empty(), where, ": ", problem);
  check_size(w, h, max_pixels, where);
  const bool gray = cs == TJCS_GRAY;
  const int src_channels = gray ? 1 : 3;
  std::vector<uint8_t> buf(size_t(w) * size_t(h) * size_t(src_channels));
  SAT_CHECK(d.decode(data, size, buf.data(), w, h, gray ? TJPF_GRAY : TJPF_RGB), where,
            ": a corrupt JPEG (TurboJPEG: ", d.error(), ")");
  if (src_channels == channels) return Image{w, h, channels, std::move(buf)};
  return to_channels(buf.data(), w, h, src_channels, channels);
}

// ---------------------------------------------------------------- resizing (Pillow's Resample.c, BILINEAR)

constexpr int kPrecisionBits = 32 - 8 - 2;

// For each output index: the first input index, how many, and their fixed-point weights.
struct Coefficients {
  int ksize = 0;
  std::vector<int> first, count;
  std::vector<int32_t> k;  // out x ksize
};

Coefficients bilinear_coefficients(int in_size, int out_size) {
  Coefficients c;
  const double scale = double(float(in_size)) / out_size;  // Pillow's box is floats
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // the triangle's support, widened when shrinking
  c.ksize = int(std::ceil(support)) * 2 + 1;
  c.first.resize(size_t(out_size)), c.count.resize(size_t(out_size));
  c.k.assign(size_t(out_size) * size_t(c.ksize), 0);
  std::vector<double> w(size_t(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = (xx + 0.5) * scale, ss = 1.0 / filterscale;
    const int xmin = std::max(0, int(center - support + 0.5));
    const int xmax = std::min(in_size, int(center + support + 0.5)) - xmin;
    double ww = 0;
    for (int x = 0; x < xmax; ++x) {
      const double t = std::fabs((x + xmin - center + 0.5) * ss);
      w[size_t(x)] = t < 1.0 ? 1.0 - t : 0.0;
      ww += w[size_t(x)];
    }
    int32_t* k = c.k.data() + size_t(xx) * size_t(c.ksize);
    for (int x = 0; x < xmax; ++x) {
      const double v = ww != 0.0 ? w[size_t(x)] / ww : w[size_t(x)];
      k[x] = v < 0 ? int32_t(-0.5 + v * (1 << kPrecisionBits)) : int32_t(0.5 + v * (1 << kPrecisionBits));
    }
    c.first[size_t(xx)] = xmin, c.count[size_t(xx)] = std::max(0, xmax);
  }
  return c;
}

uint8_t clip8(int32_t v) { return uint8_t(std::clamp(v >> kPrecisionBits, 0, 255)); }

// One pass along x (horizontal) or y (vertical): out has the other dimension of in.
Image resample_pass(const Image& in, int out_size, bool horizontal) {
  const int C = in.channels;
  const Coefficients c = bilinear_coefficients(horizontal ? in.width : in.height, out_size);
  Image out{horizontal ? out_size : in.width, horizontal ? in.height : out_size, C, {}};
  out.pixels.resize(size_t(out.width) * size_t(out.height) * size_t(C));
  const size_t row = size_t(in.width) * size_t(C);
  // Input sample (x along the pass, y across it, channel ch).
  const size_t step = horizontal ? size_t(C) : row, across = horizontal ? row : size_t(C);
  const int lines = horizontal ? in.height : in.width;
  for (int o = 0; o < out_size; ++o) {
    const int32_t* k = c.k.data() + size_t(o) * size_t(c.ksize);
    const int first = c.first[size_t(o)], n = c.count[size_t(o)];
    for (int l = 0; l < lines; ++l)
      for (int ch = 0; ch < C; ++ch) {
        const uint8_t* src = in.pixels.data() + size_t(l) * across + size_t(first) * step + size_t(ch);
        int32_t ss = 1 << (kPrecisionBits - 1);
        for (int x = 0; x < n; ++x) ss += int32_t(src[size_t(x) * step]) * k[x];
        const size_t at = horizontal ? (size_t(l) * size_t(out.width) + size_t(o)) * size_t(C)
                                     : (size_t(o) * size_t(out.width) + size_t(l)) * size_t(C);
        out.pixels[at + size_t(ch)] = clip8(ss);
      }
  }
  return out;
}

// Python's round() of a value that is an integer or half of one: halves to even.
int round_half_even(double v) { return int(std::nearbyint(v)); }

}  // namespace

// ---------------------------------------------------------------- decoding

ImageKind image_kind(const uint8_t* data, size_t size) {
  if (size >= 8 && std::memcmp(data, kPngSignature, 8) == 0) return ImageKind::png;
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageKind::jpeg;
  return ImageKind::unknown;
}

Image decode_image(const uint8_t* data, size_t size, int channels, const std::string& where, int64_t max_pixels) {
  SAT_ASSERT(channels == 1 || channels == 3);
  switch (image_kind(data, size)) {
    case ImageKind::png: return decode_png(data, size, channels, where, max_pixels);
    case ImageKind::jpeg: return decode_jpeg(data, size, channels, where, max_pixels);
    case ImageKind::unknown: break;
  }
  fail(where, ": not a PNG or JPEG file (", size < 8 ? str_cat(size, " bytes") : std::string("no PNG or JPEG signature"),
       ")");
}

std::string image_problem(const uint8_t* head, size_t head_size, const uint8_t* tail, size_t tail_size,
                          uint64_t file_size) {
  const ImageKind kind = image_kind(head, head_size);
  if (kind == ImageKind::unknown)
    return file_size == 0 ? "an empty file" : "not a PNG or JPEG file (no PNG or JPEG signature at its start)";
  if (kind == ImageKind::png) {
    bool ended = false;  // the IEND chunk, anywhere in the last bytes (data after it is allowed)
    for (size_t i = 0; i + sizeof kPngEnd <= tail_size && !ended; ++i)
      ended = std::memcmp(tail + i, kPngEnd, sizeof kPngEnd) == 0;
    if (!ended) return "a truncated PNG (no IEND chunk at its end)";
    return png_header_problem(head, head_size);
  }
  bool ended = false;  // the EOI marker FF D9
  for (size_t i = 0; i + 2 <= tail_size && !ended; ++i) ended = tail[i] == 0xFF && tail[i + 1] == 0xD9;
  if (!ended || file_size < 4) return "a truncated JPEG (no end-of-image marker FF D9 at its end)";
  int w = 0, h = 0, cs = 0;
  return jpeg_header_problem(jpeg_decoder(), head, head_size, w, h, cs);
}

namespace {

// Reads [offset, offset + n) of an open file.
std::vector<uint8_t> read_at(int fd, uint64_t offset, size_t n, const std::string& path) {
  std::vector<uint8_t> buf(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf.data() + got, n - got, off_t(offset + got));
    if (r < 0 && errno == EINTR) continue;
    SAT_CHECK(r >= 0, path, ": read error (", std::strerror(errno), ")");
    if (r == 0) break;
    got += size_t(r);
  }
  buf.resize(got);
  return buf;
}

}  // namespace

std::vector<uint8_t> read_image_file(const std::string& path) {
  InputFile f("", path);
  SAT_CHECK(f.size() <= (uint64_t(1) << 30), path, ": ", f.size(), " bytes; expected an image file under 1 GiB");
  std::vector<uint8_t> data = read_at(f.fd(), 0, size_t(f.size()), path);
  SAT_CHECK(data.size() == f.size(), path, ": the file shrank while being read (", data.size(), " of ", f.size(),
            " bytes)");
  return data;
}

Image load_image(const std::string& path, int channels) {
  const std::vector<uint8_t> data = read_image_file(path);
  return decode_image(data.data(), data.size(), channels, path);
}

std::string image_file_problem(const std::string& path) {
  try {
    InputFile f("", path);
    const uint64_t size = f.size();
    std::vector<uint8_t> head = read_at(f.fd(), 0, size_t(std::min<uint64_t>(size, kHeadBytes)), path);
    const uint64_t tail_at = size - std::min<uint64_t>(size, kTailBytes);
    const std::vector<uint8_t> tail = read_at(f.fd(), tail_at, size_t(size - tail_at), path);
    std::string problem = image_problem(head.data(), head.size(), tail.data(), tail.size(), size);
    // A header longer than the first bytes (large metadata): read again with the whole file.
    if (!problem.empty() && head.size() < size && image_kind(head.data(), head.size()) != ImageKind::unknown &&
        problem.rfind("not a readable", 0) == 0) {
      SAT_CHECK(size <= (uint64_t(1) << 30), path, ": ", size, " bytes; expected an image file under 1 GiB");
      head = read_at(f.fd(), 0, size_t(size), path);
      problem = image_problem(head.data(), head.size(), tail.data(), tail.size(), size);
    }
    return problem;
  } catch (const Error& e) {
    std::string m = e.what();  // "PATH is a FIFO, ..." or "PATH: cannot read ...": what follows the path
    if (m.rfind(path, 0) == 0) m.erase(0, path.size() + (m.compare(path.size(), 2, ": ") == 0 ? 2 : 1));
    return m;
  }
}

// ---------------------------------------------------------------- transforms

Image resize_bilinear(const Image& in, int width, int height) {
  SAT_ASSERT(width > 0 && height > 0 && in.width > 0 && in.height > 0);
  if (width == in.width && height == in.height) return in;
  if (width == in.width) return resample_pass(in, height, false);
  Image h = resample_pass(in, width, true);
  return height == in.height ? h : resample_pass(h, height, false);
}

Image crop_image(const Image& in, int top, int left, int height, int width) {
  SAT_ASSERT(top >= 0 && left >= 0 && height > 0 && width > 0 && top + height <= in.height &&
             left + width <= in.width);
  if (top == 0 && left == 0 && height == in.height && width == in.width) return in;
  Image out{width, height, in.channels, std::vector<uint8_t>(size_t(width) * size_t(height) * size_t(in.channels))};
  const size_t row = size_t(width) * size_t(in.channels);
  for (int y = 0; y < height; ++y)
    std::memcpy(out.pixels.data() + size_t(y) * row,
                in.pixels.data() + (size_t(top + y) * size_t(in.width) + size_t(left)) * size_t(in.channels), row);
  return out;
}

void flip_horizontal(Image& im) {
  const size_t C = size_t(im.channels);
  for (int y = 0; y < im.height; ++y) {
    uint8_t* r = im.pixels.data() + size_t(y) * size_t(im.width) * C;
    for (size_t a = 0, b = size_t(im.width) - 1; a < b; ++a, --b)
      for (size_t c = 0; c < C; ++c) std::swap(r[a * C + c], r[b * C + c]);
  }
}

Image resize_center_crop(const Image& in, int height, int width) {
  // Resize(size): the shorter side to size, the longer to int(size * long / short).
  const int64_t size = std::max(height, width);
  const bool portrait = in.width <= in.height;
  const int64_t shorter = portrait ? in.width : in.height, longer = portrait ? in.height : in.width;
  const int64_t scaled = int64_t(double(size * longer) / double(shorter));
  const int w = int(portrait ? size : scaled), h = int(portrait ? scaled : size);
  const Image r = resize_bilinear(in, w, h);
  // CenterCrop((height, width)): int(round((h - height) / 2.0)).
  return crop_image(r, round_half_even((h - height) / 2.0), round_half_even((w - width) / 2.0), height, width);
}

CropBox random_resized_crop(int height, int width, Rng& rng) {
  auto uniform = [&](double lo, double hi) { return lo + (hi - lo) * (double(rng.next_u64() >> 11) * 0x1p-53); };
  const double area = double(height) * double(width);
  const double lo = std::log(3.0 / 4.0), hi = std::log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * uniform(0.08, 1.0);
    const double aspect = std::exp(uniform(lo, hi));
    const int w = int(std::nearbyint(std::sqrt(target * aspect)));
    const int h = int(std::nearbyint(std::sqrt(target / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int top = int(rng.below(uint64_t(height - h + 1)));
      const int left = int(rng.below(uint64_t(width - w + 1)));
      return CropBox{top, left, h, w};
    }
  }
  // The fallback: a centre crop of the whole image, its ratio clamped to [3/4, 4/3].
  const double ratio = double(width) / double(height);
  int w = width, h = height;
  if (ratio < 3.0 / 4.0) h = int(std::nearbyint(w / (3.0 / 4.0)));
  else if (ratio > 4.0 / 3.0) w = int(std::nearbyint(h * (4.0 / 3.0)));
  return CropBox{(height - h) / 2, (width - w) / 2, h, w};
}

ImageAugment parse_augment(const std::string& text) {
  ImageAugment a;
  if (text.empty() || text == "off") return a;
  if (text == "standard") return ImageAugment{true, true};
  size_t start = 0;
  for (;;) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    SAT_CHECK(item == "crop" || item == "flip", "--augment ", text, ": '", item, "' is not an augmentation; expected off, "
              "standard (= crop,flip), or a comma-separated list of crop (random resized crop) and flip (horizontal)");
    (item == "crop" ? a.crop : a.flip) = true;
    if (comma == std::string::npos) return a;
    start = comma + 1;
  }
}

}  // namespace sat
