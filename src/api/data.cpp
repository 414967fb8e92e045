// saturate::Dataset and load_data (include/saturate/data.h): the engine's in-memory
// datasets and readers behind a shared handle.
#include <algorithm>

#include "api/impl.h"
#include "train/trainer.h"

namespace saturate {

namespace {

// Samples [first, first + count) of another dataset.
class Slice : public sat::Dataset {
 public:
  Slice(std::shared_ptr<const sat::Dataset> base, int64_t first, int64_t count)
      : base_(std::move(base)), first_(first), count_(count) {}
  int64_t size() const override { return count_; }
  sat::Shape sample_shape() const override { return base_->sample_shape(); }
  sat::DType sample_dtype() const override { return base_->sample_dtype(); }
  sat::Shape label_shape() const override { return base_->label_shape(); }
  int64_t num_classes() const override { return base_->num_classes(); }
  void get(int64_t i, void* x, int32_t* y) const override { base_->get(first_ + i, x, y); }
  std::string name() const override {
    return sat::str_cat(base_->name(), " [", first_, ", ", first_ + count_, ")");
  }

 private:
  std::shared_ptr<const sat::Dataset> base_;
  int64_t first_, count_;
};

Dataset wrap(std::shared_ptr<const sat::Dataset> d, bool labelled) {
  auto impl = std::make_shared<Dataset::Impl>();
  impl->data = std::move(d);
  impl->labelled = labelled;
  return Dataset(impl);
}

// The shape's sample count: sat::Error when `values` is not a whole number of samples.
int64_t samples_of(size_t values, const sat::Shape& shape, const std::string& name) {
  SAT_CHECK(shape.nd >= 1 && shape.numel() >= 1, "dataset '", name, "': the sample shape ", shape.str(),
            " is empty");
  SAT_CHECK(values % size_t(shape.numel()) == 0, "dataset '", name, "': ", values, " values are not a whole number of ",
            "samples of shape ", shape.str(), " (", shape.numel(), " values each)");
  return int64_t(values / size_t(shape.numel()));
}

}  // namespace

Dataset Dataset::from_arrays(std::vector<float> x, std::vector<int64_t> shape, std::vector<int32_t> labels,
                             int64_t classes, std::string name) {
  return guarded([&] {
    const sat::Shape s(shape);
    const int64_t n = samples_of(x.size(), s, name);
    SAT_CHECK(classes >= 1, "dataset '", name, "': classes must be at least 1, got ", classes);
    const bool labelled = !labels.empty();
    if (!labelled) labels.assign(size_t(n), 0);
    SAT_CHECK(int64_t(labels.size()) == n, "dataset '", name, "': ", n, " samples but ", labels.size(), " labels");
    for (size_t i = 0; i < labels.size(); ++i)
      SAT_CHECK(labels[i] >= 0 && labels[i] < classes, "dataset '", name, "': label ", i, " is ", labels[i],
                "; expected a class index 0 to ", classes - 1);
    return wrap(sat::make_tensor_dataset(s, std::move(x), std::move(labels), sat::Shape{}, classes, name), labelled);
  });
}

Dataset Dataset::from_tokens(std::vector<int32_t> tokens, int64_t T, std::vector<int32_t> next, int64_t vocab,
                             std::string name) {
  return guarded([&] {
    const sat::Shape s{T};
    SAT_CHECK(T >= 1, "dataset '", name, "': the window T must be at least 1, got ", T);
    samples_of(tokens.size(), s, name);
    const bool labelled = !next.empty();
    if (!labelled) next.assign(tokens.size(), -1);
    SAT_CHECK(next.size() == tokens.size(), "dataset '", name, "': ", tokens.size(), " tokens but ", next.size(),
              " next tokens");
    return wrap(sat::make_tensor_dataset(s, std::move(tokens), std::move(next), s, vocab, name), labelled);
  });
}

int64_t Dataset::size() const { return impl_->data->size(); }
std::vector<int64_t> Dataset::sample_shape() const { return impl_->data->sample_shape().vec(); }
int64_t Dataset::classes() const { return impl_->data->num_classes(); }
bool Dataset::labelled() const { return impl_->labelled; }
std::string Dataset::name() const { return impl_->data->name(); }

Dataset Dataset::slice(int64_t first, int64_t count) const {
  if (first < 0 || count < 1 || first + count > size())
    throw Error(sat::str_cat("dataset '", name(), "': slice [", first, ", ", first + count, ") is not within its ",
                             size(), " samples"));
  return wrap(std::make_shared<Slice>(impl_->data, first, count), impl_->labelled);
}

Data load_data(const std::string& spec, const Model& model, uint64_t seed) {
  return guarded([&] {
    sat::DataSplit d = sat::open_dataset(spec, sat::data_options_for(model.impl()->config, seed));
    Data out{wrap(std::shared_ptr<const sat::Dataset>(std::move(d.train)), true), std::nullopt, d.description};
    if (d.test) out.test = wrap(std::shared_ptr<const sat::Dataset>(std::move(d.test)), true);
    return out;
  });
}

}  // namespace saturate
