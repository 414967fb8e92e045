// Image folders as training data: --data images:DIR[:VALDIR], torchvision's ImageFolder layout.
//
// DIR holds one folder per class; a class's index is its folder's place in the sorted names
// (bytewise, as Python sorts str; folders whose names start with '.' are left out). Its
// images are the .jpg, .jpeg and .png files (any case) under its folder, subfolders included,
// in torchvision's order: folder by folder in sorted order of their paths, each folder's
// files sorted by name. Other files are ignored. The test split: DIR's own train/ and val/
// when it has both, else VALDIR, else --val-fraction's share of the images (a seeded
// shuffle's last ones, as for tables), else none.
//
// Decoding: PNG with libpng's simplified API, JPEG with TurboJPEG (tj3 where the installed
// libjpeg-turbo has it), to 8 bits per sample and the model's channels C (1 or 3): a colour
// image becomes gray as PIL's convert("L") does (ITU-R 601-2 luma in PIL's fixed point,
// L = (19595 R + 38470 G + 7471 B + 32768) >> 16), a gray one RGB by replication; alpha is
// dropped, not composited (PIL's convert("RGB")). A colour JPEG is decoded to RGB first (so
// its gray is PIL's, not the decoder's Y). CMYK JPEGs, 12-bit and lossless JPEGs are
// refused. libpng corrects a PNG whose gAMA chunk is not sRGB's to sRGB (PIL ignores gAMA)
// and reads 16-bit PNGs as sRGB-encoded samples rounded to 8 bits (PIL keeps the high byte),
// the only places where the pixels may differ from PIL's by a level.
//
// Transforms (eval, and training without --augment): torchvision's Resize(max(H, W)) then
// CenterCrop((H, W)) on the PIL image: the shorter side scaled to max(H, W) (the longer one
// to int(size * long / short)), then the centre H x W cut out (offsets rounded half to
// even, as Python's round). Resizing is PIL's Image.resize(BILINEAR): a triangle filter
// widened by the scale when shrinking (antialiasing), separable, horizontal pass first,
// 8-bit fixed-point coefficients (22 fraction bits) and rounding as Pillow's Resample.c; an
// image already of the target size is passed through untouched, so a folder of 28x28 PNGs
// gives Fashion-MNIST's own pixels. Then pixel/255 (or --normalize), as for IDX data.
//
// --augment (training only): `crop` = RandomResizedCrop((H, W), scale (0.08, 1), ratio
// (3/4, 4/3)) with torchvision's 10 tries and its centre-crop fallback, then the crop resized
// as above; `flip` = RandomHorizontalFlip(0.5); `standard` = crop,flip. Each sample's draw
// comes from Rng(mix_seed(mix_seed(mix_seed(seed, stream), epoch), i)) (Dataset::get_train),
// never from the thread or the rank that reads it.
//
// Bad files: when the folder is opened every file's header is read (libpng, TurboJPEG) and
// its end checked (a PNG's IEND chunk, a JPEG's EOI marker FF D9, within the last 4 KiB), on
// every rank. By default a bad file stops the run there, before the first step and before
// anything is written: one line naming the first bad file, what is wrong with it and how
// many bad files the folder holds (sat::Error, exit status 2). --skip-bad-images leaves them
// out instead and the data's description says how many. A file that still fails to decode
// later (a corrupt JPEG whose header and end are whole) is a sat::Error naming the file;
// JPEG warnings (corrupt data the decoder gets past, as PIL does) are not errors.
//
// Memory: only the file index (paths and labels) is held; each get() reads and decodes its
// file. get() and get_train() are reentrant: each call has its own decoder state.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "data/dataset.h"

namespace sat {

// An 8-bit image, rows top to bottom, the channels of a pixel together (HWC): 1 = gray, 3 = RGB.
struct Image {
  int width = 0, height = 0, channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels
};

enum class ImageKind { unknown, png, jpeg };
ImageKind image_kind(const uint8_t* data, size_t size);  // by the signature

// Images of more pixels are refused (PIL refuses above the same number, 2 x its
// MAX_IMAGE_PIXELS): a decompression bomb costs nothing.
inline constexpr int64_t kMaxImagePixels = 178956970;

// Decodes a whole PNG or JPEG file's bytes to `channels` (1 or 3) samples per pixel (see
// above). Throws sat::Error "WHERE: what is wrong".
Image decode_image(const uint8_t* data, size_t size, int channels, const std::string& where,
                   int64_t max_pixels = kMaxImagePixels);

// A whole image file's bytes (refused over 1 GiB), and the file decoded (sat::Error naming it).
std::vector<uint8_t> read_image_file(const std::string& path);
Image load_image(const std::string& path, int channels);

// What is wrong with an image file's header and end ("" when nothing): `head` is the file's
// first bytes (the whole file when it is small), `tail` its last ones (up to 4 KiB),
// `file_size` its size. The check every file gets when a folder is opened.
std::string image_problem(const uint8_t* head, size_t head_size, const uint8_t* tail, size_t tail_size,
                          uint64_t file_size);
// The same for a file on disk (its start and end are read); "" when nothing is wrong.
std::string image_file_problem(const std::string& path);

// PIL's Image.resize((width, height), BILINEAR) (see above). The same size: a copy.
Image resize_bilinear(const Image& in, int width, int height);
// The top x left corner's height x width pixels (inside the image).
Image crop_image(const Image& in, int top, int left, int height, int width);
void flip_horizontal(Image& im);
// torchvision's Resize(max(H, W)) + CenterCrop((H, W)).
Image resize_center_crop(const Image& in, int height, int width);

// A crop: rows [top, top + height), columns [left, left + width).
struct CropBox {
  int top = 0, left = 0, height = 0, width = 0;
};
// torchvision's RandomResizedCrop.get_params for an image of height x width, scale (0.08, 1),
// ratio (3/4, 4/3), drawn from rng.
CropBox random_resized_crop(int height, int width, Rng& rng);

// --augment: off | standard (= crop,flip) | a comma-separated list of crop and flip.
struct ImageAugment {
  bool crop = false, flip = false;
  bool any() const { return crop || flip; }
};
ImageAugment parse_augment(const std::string& text);

namespace data_detail {

// --data images:DIR[:VALDIR] (DataOptions: image_shape, mean/std, seed, val_fraction, augment,
// skip_bad_images; in eval and predict `table`, the schema saved with the weights, and
// labels_optional: a folder of images without class folders).
DataSplit open_images(const std::string& dir, const std::string& val_dir, const DataOptions& opt);

}  // namespace data_detail
}  // namespace sat
