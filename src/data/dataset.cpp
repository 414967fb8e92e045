// open_dataset (spec parsing), --normalize, pixel conversion and in-memory datasets.
#include "data/dataset.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "data/csv.h"
#include "data/images.h"
#include "data/sources.h"

namespace sat {
namespace data_detail {

std::vector<float> pixel_lut(int64_t channels, const DataOptions& opt) {
  SAT_CHECK(opt.mean.size() == opt.std.size(), "--normalize: got ", opt.mean.size(), " means but ",
            opt.std.size(), " stds; expected the same number (1, or one per channel)");
  size_t k = opt.mean.size();
  SAT_CHECK(k == 0 || k == 1 || int64_t(k) == channels, "--normalize: got ", k,
            " means and stds but the data has ", channels, " channel", channels == 1 ? "" : "s",
            channels == 1 ? "; expected one mean and one std (MEAN,STD)"
                          : str_cat("; expected one mean and std for all channels, or ", channels, " of each"));
  for (size_t c = 0; c < k; ++c)
    SAT_CHECK(std::isfinite(opt.mean[c]) && std::isfinite(opt.std[c]) && opt.std[c] > 0,
              "--normalize: mean ", opt.mean[c], " / std ", opt.std[c],
              " is not valid; expected finite values and std > 0");
  std::vector<float> lut(size_t(channels) * 256);
  for (int64_t c = 0; c < channels; ++c)
    for (int v = 0; v < 256; ++v) {
      // Same float32 operations as torchvision ToTensor() (div 255) then Normalize().
      float x = float(v) / 255.0f;
      if (k) {
        size_t j = k == 1 ? 0 : size_t(c);
        x = (x - opt.mean[j]) / opt.std[j];
      }
      lut[size_t(c) * 256 + size_t(v)] = x;
    }
  return lut;
}

std::string scaling_text(const DataOptions& opt) {
  if (opt.mean.empty()) return "pixels/255";
  std::string m, s;
  for (size_t i = 0; i < opt.mean.size(); ++i) {
    if (i) m += ',', s += ',';
    m += str_cat(opt.mean[i]);
    s += str_cat(opt.std[i]);
  }
  return str_cat("(pixels/255 - ", m, ")/", s);
}

U8ImageDataset::U8ImageDataset(std::string name, Shape chw, int64_t classes, std::vector<uint8_t> pixels,
                               std::vector<uint8_t> labels, std::vector<float> lut, std::string scaling)
    : name_(std::move(name)), chw_(chw), classes_(classes), pixels_(std::move(pixels)),
      labels_(std::move(labels)), lut_(std::move(lut)), scaling_(std::move(scaling)) {
  SAT_ASSERT(pixels_.size() == labels_.size() * size_t(chw_.numel()));
  SAT_ASSERT(lut_.size() == size_t(chw_[0]) * 256);
}

void U8ImageDataset::get(int64_t i, void* x, int32_t* y) const {
  const int64_t C = chw_[0], hw = chw_[1] * chw_[2];
  const uint8_t* src = pixels_.data() + size_t(i) * size_t(C * hw);
  float* dst = static_cast<float*>(x);
  for (int64_t c = 0; c < C; ++c) {
    const float* lut = lut_.data() + c * 256;
    for (int64_t j = 0; j < hw; ++j) dst[c * hw + j] = lut[src[c * hw + j]];
  }
  *y = labels_[size_t(i)];
}

}  // namespace data_detail

namespace {

// A dataset held as ready-made tensors (float images or int32 tokens).
template <typename T>
class TensorDataset : public Dataset {
 public:
  TensorDataset(Shape sample_shape, std::vector<T> samples, std::vector<int32_t> labels, Shape label_shape,
                int64_t classes, std::string name)
      : sample_shape_(sample_shape), label_shape_(label_shape), classes_(classes),
        samples_(std::move(samples)), labels_(std::move(labels)), name_(std::move(name)) {
    const int64_t per_label = label_shape_.numel(), per_sample = sample_shape_.numel();
    SAT_CHECK(per_label > 0 && per_sample > 0, "dataset '", name_, "': sample shape ", sample_shape_.str(),
              " and label shape ", label_shape_.str(), " must not be empty");
    SAT_CHECK(labels_.size() % size_t(per_label) == 0, "dataset '", name_, "': ", labels_.size(),
              " labels is not a multiple of the label shape ", label_shape_.str());
    n_ = int64_t(labels_.size()) / per_label;
    SAT_CHECK(samples_.size() == size_t(n_ * per_sample), "dataset '", name_, "': ", samples_.size(),
              " sample values, expected ", n_, " samples x ", per_sample, " = ", n_ * per_sample);
    SAT_CHECK(classes_ > 0, "dataset '", name_, "': num_classes must be positive");
    for (int32_t l : labels_)
      SAT_CHECK(l >= -1 && l < classes_, "dataset '", name_, "': label ", l, " outside [-1, ", classes_, ")");
    if constexpr (std::is_same_v<T, int32_t>)
      for (int32_t t : samples_)
        SAT_CHECK(t >= 0 && t < classes_, "dataset '", name_, "': token ", t, " outside the vocabulary [0, ",
                  classes_, ")");
  }
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return sample_shape_; }
  DType sample_dtype() const override { return std::is_same_v<T, float> ? DType::f32 : DType::i32; }
  Shape label_shape() const override { return label_shape_; }
  int64_t num_classes() const override { return classes_; }
  void get(int64_t i, void* x, int32_t* y) const override {
    const size_t ps = size_t(sample_shape_.numel()), pl = size_t(label_shape_.numel());
    std::memcpy(x, samples_.data() + size_t(i) * ps, ps * sizeof(T));
    std::memcpy(y, labels_.data() + size_t(i) * pl, pl * sizeof(int32_t));
  }
  std::string name() const override { return name_; }
  size_t storage_bytes() const override { return samples_.size() * sizeof(T) + labels_.size() * 4; }

 private:
  Shape sample_shape_, label_shape_;
  int64_t classes_, n_ = 0;
  std::vector<T> samples_;
  std::vector<int32_t> labels_;
  std::string name_;
};

const char* kAcceptedForms =
    "expected one of: fashion-mnist, fashion-mnist:DIR, mnist:DIR, cifar10:DIR, csv:FILE, csv:TRAIN_FILE:VAL_FILE, "
    "images:DIR, images:TRAIN_DIR:VAL_DIR, tokens:FILE (or GLOB, DIR), tokens:TRAIN_FILE:VAL_FILE, synthetic, synthetic:CxHxW";

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p == std::string::npos ? std::string::npos : p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

Shape parse_chw(const std::string& spec, const std::string& text) {
  auto parts = split(text, 'x');
  SAT_CHECK(parts.size() == 3, "--data ", spec, ": expected synthetic:CxHxW, e.g. synthetic:3x32x32");
  std::vector<int64_t> d;
  for (auto& p : parts) {
    char* end = nullptr;
    errno = 0;
    long long v = p.empty() ? 0 : std::strtoll(p.c_str(), &end, 10);
    SAT_CHECK(!p.empty() && end && *end == 0 && errno == 0 && v > 0 && v <= 65536, "--data ", spec,
              ": '", p, "' is not a positive dimension; expected synthetic:CxHxW, e.g. synthetic:3x32x32");
    d.push_back(v);
  }
  return Shape(d);
}

void require_images(const std::string& spec, const DataOptions& opt) {
  SAT_CHECK(!opt.model_takes_tokens, "--data ", spec,
            " gives images, but the model takes token sequences; expected tokens:FILE or synthetic");
}

void require_tokens(const std::string& spec, const DataOptions& opt) {
  SAT_CHECK(opt.model_takes_tokens, "--data ", spec,
            " gives token sequences, but the model takes images; expected a GPT model, or image data");
  SAT_CHECK(opt.mean.empty(), "--normalize applies to images; --data ", spec, " gives tokens");
  SAT_CHECK(opt.seq_len > 0 && opt.vocab > 0,
            "--data ", spec, ": the model's sequence length (", opt.seq_len, ") and vocabulary (",
            opt.vocab, ") must be positive");
}

}  // namespace

namespace {
class Prefix final : public Dataset {
 public:
  Prefix(const Dataset& d, int64_t n) : d_(d), n_(std::min(n, d.size())) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return d_.sample_shape(); }
  DType sample_dtype() const override { return d_.sample_dtype(); }
  Shape label_shape() const override { return d_.label_shape(); }
  int64_t num_classes() const override { return d_.num_classes(); }
  void get(int64_t i, void* x, int32_t* y) const override { d_.get(i, x, y); }
  void get_train(int64_t i, int64_t epoch, void* x, int32_t* y) const override { d_.get_train(i, epoch, x, y); }
  std::string name() const override { return d_.name(); }
  std::string scaling() const override { return d_.scaling(); }
  size_t worker_scratch_bytes() const override { return d_.worker_scratch_bytes(); }
  std::vector<std::string> class_names() const override { return d_.class_names(); }

 private:
  const Dataset& d_;
  int64_t n_;
};
}  // namespace

std::unique_ptr<Dataset> make_prefix(const Dataset& d, int64_t n) { return std::make_unique<Prefix>(d, n); }

std::unique_ptr<Dataset> make_tensor_dataset(Shape sample_shape, std::vector<float> samples,
                                             std::vector<int32_t> labels, Shape label_shape,
                                             int64_t num_classes, std::string name) {
  return std::make_unique<TensorDataset<float>>(sample_shape, std::move(samples), std::move(labels),
                                                label_shape, num_classes, std::move(name));
}

std::unique_ptr<Dataset> make_tensor_dataset(Shape sample_shape, std::vector<int32_t> samples,
                                             std::vector<int32_t> labels, Shape label_shape,
                                             int64_t num_classes, std::string name) {
  return std::make_unique<TensorDataset<int32_t>>(sample_shape, std::move(samples), std::move(labels),
                                                  label_shape, num_classes, std::move(name));
}

void parse_normalize(const std::string& text, DataOptions& opt) {
  std::vector<float> v;
  for (const auto& p : split(text, ',')) {
    char* end = nullptr;
    errno = 0;
    float f = p.empty() ? 0.f : std::strtof(p.c_str(), &end);
    SAT_CHECK(!p.empty() && end && *end == 0 && errno == 0 && std::isfinite(f), "--normalize ", text, ": '", p,
              "' is not a number; expected MEAN,STD or M1,..,Mc,S1,..,Sc");
    v.push_back(f);
  }
  SAT_CHECK(v.size() >= 2 && v.size() % 2 == 0, "--normalize ", text, ": got ", v.size(),
            " numbers; expected MEAN,STD (2) or C means then C stds (2C), e.g. 0.2860,0.3530");
  size_t c = v.size() / 2;
  opt.mean.assign(v.begin(), v.begin() + long(c));
  opt.std.assign(v.begin() + long(c), v.end());
  for (float s : opt.std) SAT_CHECK(s > 0, "--normalize ", text, ": std ", s, " must be > 0");
}

DataSplit open_dataset(const std::string& spec, const DataOptions& opt) {
  using namespace data_detail;
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const bool has_arg = colon != std::string::npos;

  SAT_CHECK(kind == "csv" || opt.label.empty(), "--label applies to tables only (--data csv:FILE), not --data ", spec);
  SAT_CHECK(kind == "csv" || kind == "images" || opt.val_fraction == 0, "--val-fraction applies to tables and image "
            "folders only (--data csv:FILE, images:DIR), not --data ", spec);
  SAT_CHECK(kind == "images" || ((opt.augment.empty() || opt.augment == "off") && !opt.skip_bad_images),
            opt.skip_bad_images ? "--skip-bad-images" : "--augment", " applies to image folders only (--data images:DIR), "
            "not --data ", spec);
  if (kind == "images") {
    require_images(spec, opt);
    auto parts = split(rest, ':');
    SAT_CHECK(has_arg && !parts[0].empty() && parts.size() <= 2 && (parts.size() == 1 || !parts[1].empty()),
              "--data ", spec, ": expected images:DIR or images:TRAIN_DIR:VAL_DIR (folders of class folders)");
    return open_images(parts[0], parts.size() == 2 ? parts[1] : "", opt);
  }
  if (kind == "csv") {
    SAT_CHECK(!opt.model_takes_tokens, "--data ", spec, " gives rows of numeric features, but the model takes token "
              "sequences; expected --model mlp:FEATURES-...-CLASSES or a model file");
    auto parts = split(rest, ':');
    SAT_CHECK(has_arg && !parts[0].empty() && parts.size() <= 2 && (parts.size() == 1 || !parts[1].empty()),
              "--data ", spec, ": expected csv:FILE or csv:TRAIN_FILE:VAL_FILE");
    return open_csv(parts[0], parts.size() == 2 ? parts[1] : "", opt);
  }
  if (kind == "fashion-mnist") {
    require_images(spec, opt);
    SAT_CHECK(!has_arg || !rest.empty(), "--data ", spec, ": empty directory; ", kAcceptedForms);
    return open_idx("fashion-mnist", has_arg ? rest : "/usr/share/datasets/fashion-mnist", !has_arg, opt);
  }
  if (kind == "mnist") {
    require_images(spec, opt);
    SAT_CHECK(!rest.empty(), "--data ", spec, ": expected mnist:DIR (the directory of the IDX files)");
    return open_idx("mnist", rest, false, opt);
  }
  if (kind == "cifar10") {
    require_images(spec, opt);
    SAT_CHECK(!rest.empty(), "--data ", spec, ": expected cifar10:DIR (the directory of data_batch_1.bin ...)");
    return open_cifar10(rest, opt);
  }
  if (kind == "tokens") {
    require_tokens(spec, opt);
    auto parts = split(rest, ':');
    SAT_CHECK(has_arg && !parts[0].empty() && parts.size() <= 2 && (parts.size() == 1 || !parts[1].empty()),
              "--data ", spec, ": expected tokens:FILE or tokens:TRAIN_FILE:VAL_FILE (each a file, a glob or a "
              "directory of shards)");
    return open_tokens(parts[0], parts.size() == 2 ? parts[1] : "", opt);
  }
  if (kind == "synthetic") {
    if (has_arg) {
      Shape chw = parse_chw(spec, rest);
      SAT_CHECK(!opt.model_takes_tokens, "--data ", spec,
                ": synthetic:CxHxW gives images, but the model takes tokens; expected plain 'synthetic'");
      return open_synthetic_images(chw, opt.num_classes, opt);
    }
    if (opt.model_takes_tokens) {
      require_tokens(spec, opt);
      return open_synthetic_tokens(opt);
    }
    SAT_CHECK(opt.image_shape.nd == 3 && opt.image_shape.numel() > 0, "--data synthetic: the model's image shape ",
              opt.image_shape.str(), " is not C,H,W");
    return open_synthetic_images(opt.image_shape, opt.num_classes, opt);
  }
  fail("--data ", spec, ": unknown dataset; ", kAcceptedForms);
}

}  // namespace sat
