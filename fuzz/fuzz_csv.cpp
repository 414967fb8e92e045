// Tables through open_dataset("csv:FILE") (src/data/csv.cpp). Input: byte 0 picks
// --val-fraction (bits 0-1: none, 0.2, 0.5, 0.9) and the seed (bits 2-7); the rest is the
// file (gzip or plain), whose label column is "y". An accepted table is read again with its
// own schema, as eval and predict read one (the label column optional).
#include <cmath>
#include <vector>

#include "data/dataset.h"
#include "fuzz_util.h"

namespace {

// Every sample: finite features, a label among the classes (or -1 where labels are optional).
void check(const sat::Dataset& d, bool labels_optional) {
  std::vector<float> x(size_t(d.sample_shape().numel()));
  int32_t y = 0;
  sat::fuzz::require(d.num_classes() >= 1 && int64_t(d.class_names().size()) == d.num_classes(), "classes named");
  for (int64_t i = 0; i < d.size(); ++i) {
    d.get(i, x.data(), &y);
    for (float v : x) sat::fuzz::require(std::isfinite(v), "finite features");
    sat::fuzz::require((y >= 0 || (labels_optional && y == -1)) && y < d.num_classes(), "labels within the classes");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static const double kFractions[] = {0, 0.2, 0.5, 0.9};
  sat::DataOptions opt;
  opt.label = "y";
  opt.val_fraction = kFractions[data[0] & 3];
  opt.seed = data[0] >> 2;
  sat::fuzz::TempDir dir;
  const std::string path = dir.file("table.csv");
  sat::fuzz::write_file(path, data + 1, size - 1);
  std::string schema;
  int64_t rows = 0;
  sat::fuzz::accepts([&] {
    sat::DataSplit s = sat::open_dataset("csv:" + path, opt);
    check(*s.train, false);
    if (s.test) check(*s.test, false);
    sat::fuzz::require((opt.val_fraction > 0) == (s.test != nullptr), "a test split exactly with --val-fraction");
    rows = s.train->size() + (s.test ? s.test->size() : 0);
    schema = s.train->schema();
  });
  if (schema.empty()) return 0;
  sat::DataOptions again;
  again.table = schema;
  again.labels_optional = true;
  sat::fuzz::accepts([&] {
    sat::DataSplit s = sat::open_dataset("csv:" + path, again);
    check(*s.test, true);
    sat::fuzz::require(s.test->size() == rows, "the same rows read with the table's own schema");
  });
  return 0;
}
