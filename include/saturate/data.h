// saturate as a C++ library: datasets. A Dataset is read-only and cheap to copy (copies
// share the samples); the readers are the CLI's own (--data).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace saturate {

class Model;

class Dataset {
 public:
  // N samples of per-sample shape `shape` ([C, H, W]), row-major one after another in x,
  // and their class indices 0 <= label < classes. No labels: a dataset to predict on
  // (evaluate and fit refuse it). Error when the sizes do not agree or a label is out of range.
  static Dataset from_arrays(std::vector<float> x, std::vector<int64_t> shape, std::vector<int32_t> labels,
                             int64_t classes, std::string name = "arrays");
  // N windows of T tokens each (token models) and the T next tokens of each (-1: ignored).
  static Dataset from_tokens(std::vector<int32_t> tokens, int64_t T, std::vector<int32_t> next, int64_t vocab,
                             std::string name = "tokens");

  int64_t size() const;
  std::vector<int64_t> sample_shape() const;
  int64_t classes() const;
  bool labelled() const;
  std::string name() const;
  // Samples [first, first + count) as a dataset of their own (no copy): a validation split.
  Dataset slice(int64_t first, int64_t count) const;

  struct Impl;
  explicit Dataset(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const std::shared_ptr<const Impl>& impl() const { return impl_; }

 private:
  std::shared_ptr<const Impl> impl_;
};

struct Data {
  Dataset train;
  std::optional<Dataset> test;  // none when the format has no test split
  std::string description;      // source, sizes, shapes
};

// Opens data as --data does ("fashion-mnist", "mnist:DIR", "cifar10:DIR",
// "tokens:FILE[:VAL_FILE]", "synthetic"), shaped for `model` (a token model's windows are
// its context; synthetic data takes its input shape and classes).
Data load_data(const std::string& spec, const Model& model, uint64_t seed = 0);

}  // namespace saturate
