// CIFAR-10 binary batches through open_dataset("cifar10:DIR") (src/data/readers.cpp).
// Input: byte 0 mod 6 chooses which of data_batch_1..5.bin, test_batch.bin the rest of
// the input becomes (gzip or plain: zlib reads both); the other five hold one valid
// record each.
#include <vector>

#include "data/dataset.h"
#include "fuzz_util.h"

namespace {

void touch(const sat::Dataset& d) {
  std::vector<float> x(size_t(d.sample_shape().numel()));
  int32_t y = 0;
  for (int64_t i = 0; i < d.size() && i < 3; ++i) d.get(i, x.data(), &y);
  if (d.size() > 3) d.get(d.size() - 1, x.data(), &y);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int slot = data[0] % 6;
  sat::fuzz::TempDir dir;
  std::vector<uint8_t> record(3073);
  record[0] = 7;
  for (size_t i = 1; i < record.size(); ++i) record[i] = uint8_t(i * 31);
  for (int i = 0; i < 6; ++i) {
    const std::string name = i < 5 ? sat::str_cat("data_batch_", i + 1, ".bin") : std::string("test_batch.bin");
    if (i == slot) sat::fuzz::write_file(dir.file(name), data + 1, size - 1);
    else sat::fuzz::write_file(dir.file(name), record.data(), record.size());
  }
  sat::DataOptions opt;
  opt.image_shape = sat::Shape{3, 32, 32};
  sat::fuzz::accepts([&] {
    sat::DataSplit s = sat::open_dataset("cifar10:" + dir.path(), opt);
    touch(*s.train);
    touch(*s.test);
  });
  return 0;
}
