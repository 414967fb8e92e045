// llm.c token shards through open_dataset("tokens:FILE") (src/data/readers.cpp).
// Input: byte 0 gives the sequence length (1 + b % 16), byte 1 the vocabulary
// (1 + b * 257, so 1 to 65536); the rest is the file (gzip or plain).
#include <vector>

#include "data/dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  sat::DataOptions opt;
  opt.model_takes_tokens = true;
  opt.seq_len = 1 + data[0] % 16;
  opt.vocab = 1 + int64_t(data[1]) * 257;
  sat::fuzz::TempDir dir;
  const std::string path = dir.file("shard.bin");
  sat::fuzz::write_file(path, data + 2, size - 2);
  sat::fuzz::accepts([&] {
    sat::DataSplit s = sat::open_dataset("tokens:" + path, opt);
    const sat::Dataset& d = *s.train;
    std::vector<int32_t> x(size_t(d.sample_shape().numel())), y(size_t(d.label_numel()));
    for (int64_t i = 0; i < d.size() && i < 3; ++i) d.get(i, x.data(), y.data());
    if (d.size() > 3) d.get(d.size() - 1, x.data(), y.data());
    for (size_t j = 0; j < x.size(); ++j)
      sat::fuzz::require(x[j] >= 0 && x[j] < opt.vocab && y[j] >= 0 && y[j] < opt.vocab, "tokens within the vocabulary");
  });
  return 0;
}
