// IDX files (MNIST / Fashion-MNIST), gzip or plain, through open_dataset("mnist:DIR")
// (src/data/readers.cpp). Input: byte 0 chooses which of the four files the rest of the
// input becomes (bits 0-1: train images, train labels, t10k images, t10k labels) and its
// name (bit 2: NAME.gz, else NAME; zlib reads both gzip and plain data under either name);
// the other three files are small valid ones (one 2x2 image, one label).
#include <zlib.h>

#include <vector>

#include "data/dataset.h"
#include "fuzz_util.h"

namespace {

std::vector<uint8_t> be32(uint32_t v) { return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)}; }

std::vector<uint8_t> valid_images() {
  std::vector<uint8_t> f = be32(2051);
  for (uint32_t d : {1u, 2u, 2u})
    for (uint8_t b : be32(d)) f.push_back(b);
  for (uint8_t p : {0, 85, 170, 255}) f.push_back(p);
  return f;
}

std::vector<uint8_t> valid_labels() {
  std::vector<uint8_t> f = be32(2049);
  for (uint8_t b : be32(1)) f.push_back(b);
  f.push_back(3);
  return f;
}

void touch(const sat::Dataset& d) {
  std::vector<float> x(size_t(d.sample_shape().numel()));
  int32_t y = 0;
  for (int64_t i = 0; i < d.size() && i < 4; ++i) d.get(i, x.data(), &y);
  if (d.size() > 4) d.get(d.size() - 1, x.data(), &y);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int slot = data[0] & 3;
  const bool gz_name = data[0] & 4;
  static const char* const kNames[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  sat::fuzz::TempDir dir;
  for (int i = 0; i < 4; ++i) {
    if (i == slot) {
      sat::fuzz::write_file(dir.file(std::string(kNames[i]) + (gz_name ? ".gz" : "")), data + 1, size - 1);
    } else {
      const std::vector<uint8_t> v = i % 2 ? valid_labels() : valid_images();
      sat::fuzz::write_file(dir.file(kNames[i]), v.data(), v.size());
    }
  }
  sat::DataOptions opt;
  sat::fuzz::accepts([&] {
    sat::DataSplit s = sat::open_dataset("mnist:" + dir.path(), opt);
    touch(*s.train);
    touch(*s.test);
  });
  return 0;
}
