// saturate::Model, Layer and Sequential (include/saturate/model.h). A Sequential writes a
// model file's text and model_text_config checks it exactly as --model file: does.
#include <cstring>
#include <nlohmann/json.hpp>

#include "api/impl.h"
#include "nn/model_file.h"
#include "core/io.h"
#include "nn/safetensors.h"

namespace saturate {

using ojson = nlohmann::ordered_json;

// ---- layers --------------------------------------------------------------------------

Layer::Layer(std::string type, std::string fields_json) : type_(std::move(type)), fields_(std::move(fields_json)) {}

Layer& Layer::named(std::string name) {
  name_ = std::move(name);
  return *this;
}

Layer& Layer::reads(std::vector<std::string> inputs) {
  inputs_ = std::move(inputs);
  return *this;
}

namespace {
Layer with(const char* type, const ojson& fields) { return Layer(type, fields.dump()); }
}  // namespace

Layer Linear(int64_t out, bool bias) { return with("linear", {{"out", out}, {"bias", bias}}); }
Layer Conv2d(int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding, bool bias) {
  return with("conv2d",
              {{"out_channels", out_channels}, {"kernel", kernel}, {"stride", stride}, {"padding", padding}, {"bias", bias}});
}
Layer BatchNorm2d() { return Layer("batchnorm2d"); }
Layer LayerNorm() { return Layer("layernorm"); }
Layer ReLU() { return Layer("relu"); }
Layer GELU() { return Layer("gelu"); }
Layer SiLU() { return Layer("silu"); }
Layer Flatten() { return Layer("flatten"); }
Layer Dropout(double p) { return with("dropout", {{"p", p}}); }
Layer MaxPool2d(int64_t kernel, int64_t stride) {
  ojson f{{"kernel", kernel}};
  if (stride != 0) f["stride"] = stride;
  return with("maxpool2d", f);
}
Layer GlobalAvgPool2d() { return with("avgpool2d", {{"output", {1, 1}}}); }
Layer Add(const std::string& a, const std::string& b) { return Layer("add").reads({a, b}); }

// ---- sequential ----------------------------------------------------------------------

Sequential::Sequential(std::vector<int64_t> input_shape, std::string name)
    : input_(std::move(input_shape)), name_(std::move(name)) {}

Sequential& Sequential::add(Layer layer) {
  layers_.push_back(std::move(layer));
  return *this;
}

namespace {

// A layer's entry of the file: its fields with name, type and (when given) inputs.
ojson layer_entry(const Layer& l, const std::string& name, const std::string& model) {
  ojson fields = ojson::parse(l.fields(), nullptr, false);
  if (fields.is_discarded() || !fields.is_object())
    throw Error("model '" + model + "': layer '" + name + "' (" + l.type() + "): its fields must be a JSON object, got " +
                l.fields());
  for (const char* key : {"name", "type", "inputs"})
    if (fields.contains(key))
      throw Error("model '" + model + "': layer '" + name + "' (" + l.type() + "): field '" + key +
                  "' is given by Layer::named/reads, not among the fields");
  ojson e{{"name", name}, {"type", l.type()}};
  if (!l.inputs().empty()) e["inputs"] = l.inputs();
  e.update(fields);
  return e;
}

}  // namespace

std::string Sequential::json() const {
  ojson layers = ojson::array();
  std::map<std::string, int> count;  // default names: the type and its count, "linear2"
  std::string last = "x";
  for (const Layer& l : layers_) {
    const std::string name = l.name().empty() ? l.type() + std::to_string(++count[l.type()]) : l.name();
    layers.push_back(layer_entry(l, name, name_));
    last = name;
  }
  layers.push_back({{"name", "loss"}, {"type", "cross_entropy"}, {"inputs", {last, "y"}}});
  ojson doc{{"name", name_},
            {"inputs", {{"x", {{"shape", input_}}}, {"y", {{"shape", ojson::array()}, {"dtype", "int32"}}}}},
            {"layers", layers},
            {"loss", "loss"}};
  return doc.dump(2) + "\n";
}

Model Sequential::build() const {
  if (layers_.empty()) throw Error("model '" + name_ + "': no layers (add some before build())");
  const std::string text = json();
  return guarded([&] {
    auto impl = std::make_shared<Model::Impl>();
    impl->config = sat::model_text_config(name_, text);
    impl->json = text;
    return Model(impl);
  });
}

// ---- model ---------------------------------------------------------------------------

std::unique_ptr<sat::ParamStore> empty_weights(const sat::ModelConfig& mc) {
  const sat::BuiltModel m = sat::build_model(mc, 1);
  auto ps = std::make_unique<sat::ParamStore>(m.graph->params(), m.graph->states(), 0);
  return ps;
}

void copy_weights(const sat::ParamStore& from, sat::ParamStore& to) {
  for (size_t i = 0; i < to.num_params(); ++i) {
    const int j = from.find_param(to.decl(i).name);
    SAT_CHECK(j >= 0 && from.decl(size_t(j)).spec.shape == to.decl(i).spec.shape, "the weights have no parameter ",
              to.decl(i).name, " of shape ", to.decl(i).spec.shape.str(), " (another model's weights?)");
    std::memcpy(to.host_param(i).ptr, from.host_param(size_t(j)).ptr, size_t(to.decl(i).spec.shape.numel()) * 4);
  }
  for (size_t i = 0; i < to.num_states(); ++i) {
    const int j = from.find_state(to.state_decl(i).name);
    SAT_CHECK(j >= 0 && from.state_decl(size_t(j)).spec.bytes() == to.state_decl(i).spec.bytes(),
              "the weights have no state ", to.state_decl(i).name, " (another model's weights?)");
    std::memcpy(to.host_state(i).ptr, from.host_state(size_t(j)).ptr, to.state_decl(i).spec.bytes());
  }
  to.refresh_lp();
}

Model Model::load(const std::string& spec) {
  return guarded([&] {
    const bool path = spec.size() > 5 && spec.compare(spec.size() - 5, 5, ".json") == 0 && spec.rfind("file:", 0) != 0;
    auto impl = std::make_shared<Impl>();
    impl->spec = path ? "file:" + spec : spec;
    impl->config = sat::model_config(impl->spec);
    if (impl->config.family == sat::ModelFamily::file) impl->json = sat::read_input_file("--model", impl->config.file->path);
    return Model(impl);
  });
}

Model Model::from_json(const std::string& text, const std::string& name) {
  return guarded([&] {
    auto impl = std::make_shared<Impl>();
    impl->config = sat::model_text_config(name, text);
    impl->json = text;
    return Model(impl);
  });
}

std::string Model::json() const { return impl_->json; }

const std::string& Model::name() const { return impl_->config.name; }

int64_t Model::parameters() const {
  return guarded([&] {
    const sat::BuiltModel m = sat::build_model(impl_->config, 1);
    int64_t n = 0;
    for (const sat::ParamDecl& p : m.graph->params())
      if (!p.shared) n += p.spec.shape.numel();
    return n;
  });
}

std::string Model::summary() const {
  return guarded([&] {
    return sat::str_cat(impl_->config.name, ": ", sat::describe_model(impl_->config), "; ", parameters(),
                        " parameters");
  });
}

std::vector<int64_t> Model::input_shape() const {
  const sat::ModelConfig& c = impl_->config;
  return c.tokens ? std::vector<int64_t>{c.seq_len} : c.image.vec();
}

int64_t Model::classes() const { return impl_->config.classes; }
bool Model::takes_tokens() const { return impl_->config.tokens; }
bool Model::has_weights() const { return impl_->weights != nullptr; }

std::vector<std::string> Model::weight_names() const {
  std::vector<std::string> names;
  if (!impl_->weights) return names;
  const sat::ParamStore& w = *impl_->weights;
  for (size_t i = 0; i < w.num_params(); ++i) names.push_back(w.decl(i).name);
  for (size_t i = 0; i < w.num_states(); ++i) names.push_back(w.state_decl(i).name);
  return names;
}

namespace {

// A weight by name as floats (an integer state converted).
std::vector<float> weight_values(const sat::ParamStore& w, const std::string& model, const std::string& name) {
  if (const int i = w.find_param(name); i >= 0) {
    const sat::Tensor t = w.host_param(size_t(i));
    return std::vector<float>(t.f32(), t.f32() + t.numel());
  }
  const int s = w.find_state(name);
  SAT_CHECK(s >= 0, "model '", model, "' has no weight named '", name, "'");
  const sat::Tensor t = w.host_state(size_t(s));
  SAT_ASSERT(t.dtype == sat::DType::f32 || t.dtype == sat::DType::i64);
  std::vector<float> v(size_t(t.numel()));
  for (int64_t k = 0; k < t.numel(); ++k)
    v[size_t(k)] = t.dtype == sat::DType::i64 ? float(static_cast<const int64_t*>(t.ptr)[k]) : t.f32()[k];
  return v;
}

}  // namespace

std::vector<float> Model::weight(const std::string& name) const {
  if (!impl_->weights) throw Error("model '" + this->name() + "' has no weights yet (fit it or load_weights)");
  return guarded([&] { return weight_values(*impl_->weights, this->name(), name); });
}

std::vector<std::string> Model::declared_weights() const {
  if (impl_->weights) return weight_names();
  const auto w = guarded([&] { return empty_weights(impl_->config); });
  std::vector<std::string> names;
  for (size_t i = 0; i < w->num_params(); ++i) names.push_back(w->decl(i).name);
  for (size_t i = 0; i < w->num_states(); ++i) names.push_back(w->state_decl(i).name);
  return names;
}

std::vector<int64_t> Model::weight_shape(const std::string& name) const {
  return guarded([&] {
    std::unique_ptr<sat::ParamStore> fresh;
    const sat::ParamStore& w = impl_->weights ? *impl_->weights : *(fresh = empty_weights(impl_->config));
    if (const int i = w.find_param(name); i >= 0) return w.decl(size_t(i)).spec.shape.vec();
    const int s = w.find_state(name);
    SAT_CHECK(s >= 0, "model '", this->name(), "' has no weight named '", name, "'");
    return w.state_decl(size_t(s)).spec.shape.vec();
  });
}

namespace {

// The tensor a weight's values go to (f32, or an i64 state such as num_batches_tracked),
// the name and the number of values checked.
sat::Tensor weight_tensor(sat::ParamStore& w, const std::string& model, const std::string& name, size_t values) {
  const int i = w.find_param(name), s = w.find_state(name);
  SAT_CHECK(i >= 0 || s >= 0, "model '", model, "' has no weight named '", name, "'");
  const sat::Tensor t = i >= 0 ? w.host_param(size_t(i)) : w.host_state(size_t(s));
  SAT_CHECK(int64_t(values) == t.numel(), "model '", model, "': weight '", name, "' has ", t.numel(),
            " values (shape ", t.shape.str(), "), got ", values);
  SAT_ASSERT(t.dtype == sat::DType::f32 || t.dtype == sat::DType::i64);
  return t;
}

void set_tensor(const sat::Tensor& t, const std::vector<float>& values) {
  for (size_t k = 0; k < values.size(); ++k) {
    if (t.dtype == sat::DType::i64) static_cast<int64_t*>(t.ptr)[k] = int64_t(values[k]);
    else t.f32()[k] = values[k];
  }
}

// A model without weights gets every parameter and float state from `weights`; its counters
// (an i64 state such as num_batches_tracked, which PyTorch's BatchNorm keeps) start at 0.
void require_all(sat::ParamStore& to, const std::map<std::string, std::vector<float>>& weights,
                 const std::string& model) {
  std::vector<std::string> need;
  for (size_t i = 0; i < to.num_params(); ++i) need.push_back(to.decl(i).name);
  for (size_t i = 0; i < to.num_states(); ++i) {
    const sat::Tensor t = to.host_state(i);
    if (t.dtype != sat::DType::i64) need.push_back(to.state_decl(i).name);
    else if (!weights.count(to.state_decl(i).name)) std::fill_n(static_cast<int64_t*>(t.ptr), t.numel(), 0);
  }
  for (const std::string& n : need)
    SAT_CHECK(weights.count(n), "model '", model, "' has no weights yet: set_weights needs every one of its ",
              need.size(), " parameters and statistics, and '", n, "' is missing");
}

}  // namespace

void Model::set_weights(const std::map<std::string, std::vector<float>>& weights) {
  guarded([&] {
    const bool fresh = !impl_->weights;
    std::unique_ptr<sat::ParamStore> w = fresh ? empty_weights(impl_->config) : nullptr;
    sat::ParamStore& to = fresh ? *w : *impl_->weights;
    std::vector<std::pair<sat::Tensor, const std::vector<float>*>> writes;  // all checked before any is written
    for (const auto& [key, values] : weights) writes.emplace_back(weight_tensor(to, name(), key, values.size()), &values);
    if (fresh) require_all(to, weights, name());
    for (const auto& [t, values] : writes) set_tensor(t, *values);
    if (fresh) impl_->weights = std::move(w);
    impl_->weights->refresh_lp();
  });
}

void Model::save(const std::string& path) const {
  if (!impl_->weights) throw Error("model '" + name() + "' has no weights to save yet (fit it or load_weights)");
  guarded([&] { sat::save_safetensors(path, *impl_->weights, impl_->config.name); });
}

void Model::load_weights(const std::string& path) {
  guarded([&] {
    auto w = empty_weights(impl_->config);
    sat::load_safetensors(path, *w);  // a sat::Error naming the file for another model's
    impl_->weights = std::move(w);
  });
}

}  // namespace saturate
