// Image files through the path --data images:DIR takes (src/data/images.cpp): the check every
// file gets when a folder is opened (header and end), the PNG (libpng) and JPEG (TurboJPEG)
// decoders, and the transforms of an accepted image. Input: byte 0: bit 0 the channels (1 or
// 3), bits 1-3 the model's H x W, bits 4-7 the augmentation's seed; the rest is the file.
// Images of more than 2^20 pixels are refused here (a decompression bomb's check is tested
// by the header check's own limit), so that every input decodes in milliseconds.
#include <algorithm>
#include <string>

#include "core/rng.h"
#include "data/images.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const int kShapes[8][2] = {{28, 28}, {8, 8}, {1, 1}, {5, 13}, {32, 24}, {17, 3}, {2, 40}, {64, 64}};
  const int channels = data[0] & 1 ? 3 : 1;
  const int H = kShapes[(data[0] >> 1) & 7][0], W = kShapes[(data[0] >> 1) & 7][1];
  const uint64_t seed = data[0] >> 4;
  const uint8_t* file = data + 1;
  const size_t n = size - 1;
  // The check at open: the whole file as its head, its last 4 KiB as its tail.
  const size_t tail = std::min<size_t>(n, 4096);
  const std::string problem = sat::image_problem(file, n, file + n - tail, tail, n);
  sat::Image im;
  const bool decoded = sat::fuzz::accepts([&] { im = sat::decode_image(file, n, channels, "fuzz", 1 << 20); });
  sat::fuzz::require(problem.empty() || sat::image_kind(file, n) != sat::ImageKind::unknown ||
                         problem.rfind("not a PNG", 0) == 0 || problem == "an empty file",
                     "a file without a signature is called so");
  if (!decoded) return 0;
  sat::fuzz::require(sat::image_kind(file, n) != sat::ImageKind::unknown, "only PNG and JPEG decode");
  sat::fuzz::require(im.width > 0 && im.height > 0 && im.channels == channels &&
                         im.pixels.size() == size_t(im.width) * size_t(im.height) * size_t(channels),
                     "a decoded image has its size");
  const sat::Image c = sat::resize_center_crop(im, H, W);
  sat::fuzz::require(c.width == W && c.height == H && c.pixels.size() == size_t(W * H * channels),
                     "Resize + CenterCrop gives H x W");
  sat::Rng rng(seed);
  const sat::CropBox b = sat::random_resized_crop(im.height, im.width, rng);
  sat::fuzz::require(b.top >= 0 && b.left >= 0 && b.height > 0 && b.width > 0 && b.top + b.height <= im.height &&
                         b.left + b.width <= im.width,
                     "a random resized crop lies inside the image");
  sat::Image r = sat::resize_bilinear(sat::crop_image(im, b.top, b.left, b.height, b.width), W, H);
  sat::flip_horizontal(r);
  sat::fuzz::require(r.width == W && r.height == H, "the crop resized to H x W");
  return 0;
}
