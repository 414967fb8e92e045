#include "nn/model_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "core/io.h"
#include "core/rng.h"
#include "core/text.h"
#include "nn/blocks.h"
#include "nn/layers/activation.h"
#include "nn/layers/attention.h"
#include "nn/layers/batchnorm.h"
#include "nn/layers/conv2d.h"
#include "nn/layers/cross_entropy.h"
#include "nn/layers/elementwise.h"
#include "nn/layers/embedding.h"
#include "nn/layers/layernorm.h"
#include "nn/layers/linear.h"
#include "nn/layers/pool.h"
#include "nn/layers/rmsnorm.h"
#include "nn/layers/rotary.h"
#include "nn/layers/swiglu.h"
#include "nn/layers/tensor_parallel.h"

namespace sat {

namespace {

// Widths and counts above this are surely a typo (as for --model's families); the layer
// count bounds what a "repeat" may expand to.
constexpr int64_t kMaxCount = 100'000'000;
constexpr uint64_t kMaxSampleElements = uint64_t(1) << 32;  // one sample's input (a batch of them stays in int64)
constexpr size_t kMaxLayers = 1'000'000;
constexpr uintmax_t kMaxFileBytes = 64u << 20;

// Each type's fields besides name, type and inputs.
const std::map<std::string, std::vector<std::string>>& layer_types() {
  static const std::map<std::string, std::vector<std::string>> t{
      {"linear", {"out", "in", "bias", "tp", "tp_stride", "tied_to", "weight_init", "bias_init"}},
      {"conv2d", {"out_channels", "in_channels", "kernel", "stride", "padding", "bias", "groups", "weight_init"}},
      {"batchnorm2d", {"channels", "eps", "momentum"}},
      {"relu", {}},
      {"gelu", {"approximate"}},
      {"silu", {}},
      {"flatten", {}},
      {"add", {}},
      {"dropout", {"p"}},
      {"layernorm", {"eps"}},
      {"embedding", {"vocab", "width", "std"}},
      {"gpt_embedding", {"vocab", "width", "context", "dropout"}},
      {"attention", {"heads", "kv_heads"}},
      {"rmsnorm", {"eps"}},
      {"rotary", {"head_size", "theta"}},
      {"swiglu", {}},
      {"moe", {"experts", "top_k", "ffn", "shared", "capacity", "aux"}},
      {"maxpool2d", {"kernel", "stride", "padding"}},
      {"avgpool2d", {"output"}},
      {"cross_entropy", {}},
      {"transformer_block", {"heads", "dropout", "depth"}},
      {"basic_block", {"out_channels", "stride"}},
  };
  return t;
}

std::string type_list() {
  std::string s;
  for (auto& [t, keys] : layer_types()) s += (s.empty() ? "" : ", ") + t;
  return s;
}

// The inputs a type reads: attention one fused qkv or separate q, k, v.
bool arity_ok(const std::string& type, size_t n) {
  if (type == "attention") return n == 1 || n == 3;
  return n == (type == "add" || type == "cross_entropy" || type == "swiglu" ? 2u : 1u);
}

// The fields of one layer, read with errors that name the file (and line), the layer and
// the field.
class Fields {
 public:
  Fields(const ModelFile& f, const FileLayer& l) : f_(f), l_(l) {}
  // "SPEC:LINE: layer 'NAME' (TYPE): " (the field's line, or the layer's).
  std::string where(const char* key = nullptr) const {
    std::string line;
    if (f_.lines) line = str_cat(":", (key && find(key) ? *find(key) : l_.args).line());
    return str_cat(f_.where, line, ": layer '", l_.name, "' (", l_.type, "): ");
  }
  [[noreturn]] void fail(const std::string& what, const char* key = nullptr) const { ::sat::fail(where(key), what); }
  std::optional<JsonRef> find(const char* key) const { return l_.args.find(key); }
  int64_t count(const char* key, std::optional<int64_t> def = std::nullopt, int64_t lo = 1) const {
    const auto v = find(key);
    if (!v) {
      if (!def) fail(str_cat("missing field '", key, "'"));
      return *def;
    }
    if (!(v->is_number() && std::floor(v->number()) == v->number() && v->number() >= double(lo) &&
          v->number() <= double(kMaxCount)))
      fail(str_cat("field '", key, "' must be an integer from ", lo, " to ", kMaxCount), key);
    return int64_t(v->number());
  }
  double number(const char* key, double def, double lo, double hi) const {
    const auto v = find(key);
    if (!v) return def;
    if (!(v->is_number() && v->number() >= lo && v->number() < hi))
      fail(str_cat("field '", key, "' must be a number in [", lo, ", ", hi, ")"), key);
    return v->number();
  }
  bool flag(const char* key, bool def) const {
    const auto v = find(key);
    if (!v) return def;
    if (!v->is_bool()) fail(str_cat("field '", key, "' must be true or false"), key);
    return v->boolean();
  }
  std::string text(const char* key, const std::string& def) const {
    const auto v = find(key);
    if (!v) return def;
    if (!v->is_string()) fail(str_cat("field '", key, "' must be a string"), key);
    return v->string();
  }
  // "default" | "zeros" | "ones" | "normal(STD)" | "uniform(BOUND)" | "constant(V)" |
  // "kaiming_normal_fan_out" (fan_out = the given count: torchvision's ResNet init).
  std::optional<ParamInit> init(const char* key, double fan_out = 0) const {
    const std::string s = text(key, "default");
    if (s == "default") return std::nullopt;
    if (s == "zeros") return ParamInit::zeros();
    if (s == "ones") return ParamInit::ones();
    if (s == "kaiming_normal_fan_out" && fan_out > 0) return ParamInit::normal(std::sqrt(2.0f / float(fan_out)));
    const size_t open = s.find('('), close = s.size() - 1;
    if (open != std::string::npos && s[close] == ')') {
      char* end = nullptr;
      const std::string arg = s.substr(open + 1, close - open - 1);
      const double x = std::strtod(arg.c_str(), &end);
      const std::string kind = s.substr(0, open);
      if (!arg.empty() && end && *end == 0 && std::isfinite(x)) {
        if (kind == "normal" && x >= 0) return ParamInit::normal(float(x));
        if (kind == "uniform" && x >= 0) return ParamInit::uniform(float(x));
        if (kind == "constant") return ParamInit::constant(float(x));
      }
    }
    fail(str_cat("field '", key, "': expected default, zeros, ones, normal(STD), uniform(BOUND), constant(V)",
                 fan_out > 0 ? " or kaiming_normal_fan_out" : "", ", got '", s, "'"), key);
  }

 private:
  const ModelFile& f_;
  const FileLayer& l_;
};

// ---- reading ----------------------------------------------------------------------------

std::string substitute(std::string s, int64_t i) {
  for (size_t at; (at = s.find("{i}")) != std::string::npos;) s.replace(at, 3, std::to_string(i));
  return s;
}

struct Reader {
  const std::string& spec;
  ModelFile& f;

  // "SPEC:LINE" for the value j (the line only in a file someone wrote).
  std::string at(const JsonRef& j) const { return f.lines ? str_cat(spec, ":", j.line()) : spec; }
  [[noreturn]] void fail_at(const JsonRef& j, const std::string& what) const {
    ::sat::fail(at(j), ": ", j.path(), ": ", what);
  }

  FileLayer layer(const JsonRef& j, int64_t i, bool repeated) const {
    if (!j.is_object()) fail_at(j, "expected a layer object, a {\"block\": [...]} or a {\"repeat\": N, \"layers\": [...]}");
    FileLayer l;
    l.args = j;
    const auto name = j.find("name"), type = j.find("type");
    if (!name || !name->is_string() || name->string().empty()) fail_at(j, "every layer needs a \"name\" (a non-empty string)");
    l.name = repeated ? substitute(name->string(), i) : name->string();
    if (!type || !type->is_string())
      ::sat::fail(at(j), ": layer '", l.name, "': missing field 'type' (one of: ", type_list(), ")");
    l.type = type->string();
    auto t = layer_types().find(l.type);
    if (t == layer_types().end())
      ::sat::fail(at(*type), ": layer '", l.name, "': unknown type '", l.type, "' (one of: ", type_list(), ")");
    for (const auto& [key, value] : j.members()) {
      if (key == "name" || key == "type" || key == "inputs") continue;
      if (std::find(t->second.begin(), t->second.end(), key) != t->second.end()) continue;
      std::string allowed = "name, type, inputs";
      for (auto& k : t->second) allowed += ", " + k;
      ::sat::fail(at(value), ": layer '", l.name, "' (", l.type, "): unknown field '", key, "' (expected ", allowed, ")");
    }
    if (const auto in = j.find("inputs")) {
      const auto bad = [&] {
        ::sat::fail(at(*in), ": layer '", l.name, "' (", l.type, "): field 'inputs' must be a list of names");
      };
      if (!in->is_array()) bad();
      for (const JsonRef& v : in->items()) {
        if (!v.is_string()) bad();
        l.inputs.push_back(repeated ? substitute(v.string(), i) : v.string());
      }
    }
    return l;
  }

  void entries(const JsonRef& list, bool in_block, int64_t i, bool repeated) {
    if (!list.is_array()) fail_at(list, "expected a list of layers");
    bool first = true;
    for (const JsonRef& e : list.items()) {
      if (e.is_object() && e.contains("block")) {
        e.expect_keys({"block"});
        entries(e.at("block"), true, i, repeated);
      } else if (e.is_object() && e.contains("repeat")) {
        e.expect_keys({"repeat", "start", "layers"});
        const int64_t n = e.at("repeat").integer(), start = e.contains("start") ? e.at("start").integer() : 0;
        if (n < 1 || n > int64_t(kMaxLayers)) fail_at(e.at("repeat"), str_cat("expected a count from 1 to ", kMaxLayers));
        if (start < 0 || start > kMaxCount) fail_at(e.at("start"), str_cat("expected an integer from 0 to ", kMaxCount));
        for (int64_t k = 0; k < n; ++k) entries(e.at("layers"), false, start + k, true);
      } else {
        f.layers.push_back(layer(e, i, repeated));
        f.layers.back().starts_block = !(in_block && !first);
      }
      first = false;
      SAT_CHECK(f.layers.size() <= kMaxLayers, spec, ": more than ", kMaxLayers, " layers");
    }
  }

  void inputs(const JsonRef& j) {
    if (!j.is_object() || j.size() != 2)
      fail_at(j, "expected two inputs, the sample and the target: {\"x\": {\"shape\": [C, H, W]}, \"y\": {\"shape\": [], "
                 "\"dtype\": \"int32\"}}");
    for (const auto& [name, d] : j.members()) {
      d.expect_keys({"shape", "dtype"});
      FileInput in{name, Shape{}, DType::f32};
      static constexpr Named<DType> kDTypes[] = {{"float32", DType::f32}, {"int32", DType::i32}};
      const std::string dtype = d.contains("dtype") ? d.at("dtype").string() : "float32";
      const auto t = find_named(dtype, kDTypes);
      if (!t) fail_at(d.at("dtype"), str_cat("expected ", choice_list(kDTypes), ", got '", dtype, "'"));
      in.dtype = *t;
      std::vector<int64_t> dims;
      for (const JsonRef& n : d.at("shape").items()) {
        const int64_t v = n.integer();
        if (v < 1 || v > kMaxCount) fail_at(n, str_cat("expected a dimension from 1 to ", kMaxCount));
        dims.push_back(v);
      }
      if (dims.size() > 4) fail_at(d.at("shape"), "expected at most 4 dimensions per sample");
      // (a batch of them is counted in int64 too: Shape::numel refuses what overflows)
      unsigned __int128 numel = 1;
      for (int64_t v : dims) numel = std::min<unsigned __int128>(numel * uint64_t(v), kMaxSampleElements + 1);
      if (numel > kMaxSampleElements)
        fail_at(d.at("shape"), str_cat("a sample of more than ", kMaxSampleElements, " elements; expected fewer"));
      in.shape = Shape(dims);
      f.inputs.push_back(in);
    }
  }
};

// Every input names an input of the model or an earlier layer; duplicates, dangling and
// cyclic references are refused, naming the layer.
void resolve(ModelFile& f) {
  std::map<std::string, int> at;  // name -> layer index (-1: a model input)
  for (auto& in : f.inputs) at[in.name] = -1;
  for (size_t i = 0; i < f.layers.size(); ++i) {
    const FileLayer& l = f.layers[i];
    if (!at.emplace(l.name, int(i)).second)
      Fields(f, l).fail(str_cat("the name '", l.name, "' is used twice (names must be unique: they name the parameters)"),
                        "name");
  }
  for (size_t i = 0; i < f.layers.size(); ++i) {
    FileLayer& l = f.layers[i];
    const Fields fl(f, l);
    if (l.inputs.empty()) {
      if (l.type == "cross_entropy")
        fl.fail(str_cat("field 'inputs' must name the logits and the target (such as [\"fc2\", \"", f.inputs[1].name, "\"])"));
      l.inputs.push_back(i == 0 ? f.inputs[0].name : f.layers[i - 1].name);
    }
    if (!arity_ok(l.type, l.inputs.size()))
      fl.fail(str_cat("field 'inputs': expected ",
                      l.type == "attention" ? "1 (q, k and v fused) or 3 (q, k, v)" : l.type == "swiglu" ? "2 (gate, up)"
                      : arity_ok(l.type, 2) ? "2" : "1", " input(s), got ", l.inputs.size()), "inputs");
    for (const std::string& in : l.inputs) {
      auto it = at.find(in);
      if (it == at.end())
        fl.fail(str_cat("field 'inputs': no input or layer is named '", in, "' (a dangling reference)"), "inputs");
      if (it->second < int(i)) continue;
      // A later layer (or this one): a cycle when it leads back here, else out of order.
      std::vector<int> todo{it->second};
      std::set<int> seen;
      bool cycle = false;
      while (!todo.empty() && !cycle) {
        const int k = todo.back();
        todo.pop_back();
        if (k < 0 || !seen.insert(k).second) continue;
        cycle = k == int(i);
        for (const std::string& n : f.layers[size_t(k)].inputs) todo.push_back(at.count(n) ? at[n] : -1);
      }
      if (cycle)
        fl.fail(str_cat("field 'inputs': '", in, "' is a cyclic reference (it depends on '", l.name, "' itself)"), "inputs");
      fl.fail(str_cat("field 'inputs': '", in, "' comes later in the file (list the layers in the order they run)"),
              "inputs");
    }
  }
}

// ---- building ---------------------------------------------------------------------------

// The layers of a file in a graph. A value is "split" when it holds this rank's part of a
// column-parallel layer's outputs (and what elementwise layers make of them): only a row
// layer, attention or the loss may read it.
class FileBuilder {
 public:
  FileBuilder(BuiltModel& m, Graph& g)
      : m_(m), g_(g), f_(*m.config.file), spec_(m.config.file->where), r_(token_regions(g, m.config, m.x_shape)) {
    value_[f_.inputs[0].name] = m.x;
    value_[f_.inputs[1].name] = m.y;
  }

  void build() {
    for (const FileLayer& l : f_.layers) {
      if (l.starts_block) g_.begin_block();
      try {
        const int out = add(l, Fields(f_, l));
        value_[l.name] = out;
      } catch (const Error& e) {
        if (std::string(e.what()).rfind(spec_ + ":", 0) == 0) throw;  // names the layer already
        ::sat::fail(Fields(f_, l).where(), e.what());
      }
    }
  }

 private:
  int in(const FileLayer& l, size_t k) const { return value_.at(l.inputs[k]); }
  const Shape& shape(int v) const { return g_.value(v).spec.shape; }
  bool split(int v) const { return split_.count(v) > 0; }

  // Layers that work on a column-parallel layer's split features as they are: elementwise
  // ones, attention (its heads), a row linear, and the loss (vocabulary-parallel logits).
  static bool may_read_split(const FileLayer& l, const Fields& fl) {
    static const std::set<std::string> types{"cross_entropy", "attention", "relu", "gelu", "silu", "dropout", "rotary",
                                             "swiglu"};
    return types.count(l.type) || (l.type == "linear" && fl.text("tp", "none") == "row");
  }

  void whole_input(const FileLayer& l, const Fields& fl, int v) const {
    if (split(v))
      fl.fail(str_cat("reads '", g_.value(v).name, "', whose features are split over the tensor-parallel group by a "
                      "\"tp\": \"column\" linear: a \"tp\": \"row\" linear must come first (", l.type, " needs them whole)"));
  }

  int add(const FileLayer& l, const Fields& fl) {
    if (!may_read_split(l, fl))
      for (size_t k = 0; k < l.inputs.size(); ++k) whole_input(l, fl, in(l, k));
    const int x = in(l, 0);
    const std::string& t = l.type;
    if (t == "linear") return linear(l, fl);
    if (t == "conv2d") return conv2d(l, fl);
    if (t == "batchnorm2d") {
      const int64_t c = fl.count("channels", shape(x).nd == 4 ? shape(x)[1] : 0, 0);
      if (shape(x).nd == 4 && c != shape(x)[1]) fl.fail(str_cat("'channels' is ", c, " but its input has ", shape(x)[1]));
      return g_.add<BatchNorm2d>(l.name, {x}, c, float(fl.number("eps", 1e-5, 0, 1)), float(fl.number("momentum", 0.1, 0, 1)));
    }
    if (t == "relu") return same_split(x, g_.add<ReLU>(l.name, {x}));
    if (t == "gelu") {
      const std::string a = fl.text("approximate", "tanh");
      if (a != "tanh" && a != "none") fl.fail(str_cat("field 'approximate' must be tanh or none (exact erf), got '", a, "'"), "approximate");
      return same_split(x, g_.add<GELU>(l.name, {x}, a == "none"));
    }
    if (t == "silu") return same_split(x, g_.add<SiLU>(l.name, {x}));
    if (t == "dropout") {
      const float p = float(fl.number("p", -1, 0, 1));
      if (p < 0) fl.fail("missing field 'p' (the probability of dropping an activation, in [0, 1))");
      return same_split(x, g_.add<Dropout>(l.name, {x}, p, r_.rows()));
    }
    if (t == "flatten") return g_.add<Flatten>(l.name, {x});
    if (t == "add") return g_.add<Add>(l.name, {x, in(l, 1)});
    if (t == "layernorm") return g_.add<LayerNorm>(l.name, {x}, shape(x)[-1], float(fl.number("eps", 1e-5, 0, 1)), r_.sp);
    if (t == "rmsnorm") return g_.add<RMSNorm>(l.name, {x}, shape(x)[-1], float(fl.number("eps", 1e-5, 0, 1)), r_.sp);
    if (t == "rotary")
      return same_split(x, g_.add<Rotary>(l.name, {x}, fl.count("head_size"), float(fl.number("theta", 1e4, 1, 1e12))));
    if (t == "swiglu") {
      if (split(x) != split(in(l, 1))) fl.fail("its gate and up inputs must both be split (\"tp\": \"column\") or both whole");
      return same_split(x, g_.add<SwiGLU>(l.name, {x, in(l, 1)}));
    }
    if (t == "embedding")
      return g_.add<Embedding>(l.name, {x}, fl.count("vocab"), fl.count("width"),
                               ParamInit::normal(float(fl.number("std", 1.0, 0, 1e6))));
    if (t == "gpt_embedding") {
      // Positions for the file's declared input length (a --seq-len window uses the first rows).
      const int64_t T = m_.config.context;
      return add_gpt_embedding(g_, r_, l.name, x, fl.count("vocab"), fl.count("context", T), fl.count("width"),
                               float(fl.number("dropout", 0, 0, 1)));
    }
    if (t == "attention") return attention(l, fl, x);
    if (t == "moe") return moe(l, fl, x);
    if (t == "maxpool2d") {
      const int64_t k = fl.count("kernel");
      return g_.add<MaxPool2d>(l.name, {x}, k, fl.count("stride", k), fl.count("padding", 0, 0));
    }
    if (t == "avgpool2d") return avgpool(l, fl, x);
    if (t == "cross_entropy") return loss(l, fl);
    if (t == "transformer_block") {
      const TransformerBlock b{fl.count("heads"), float(fl.number("dropout", 0, 0, 1)),
                               fl.count("depth", std::max<int64_t>(1, f_.transformer_blocks)),
                               m_.config.recompute == Recompute::selective};
      return add_transformer_block(g_, r_, l.name, x, b);
    }
    if (t == "basic_block") {
      SAT_CHECK(shape(x).nd == 4, "expected images [B, C, H, W] as input, got ", shape(x).str());
      return add_basic_block(g_, l.name, x, shape(x)[1], fl.count("out_channels"), fl.count("stride", 1));
    }
    fl.fail("unknown type");
  }

  // A mixture-of-experts feed-forward layer (blocks.h add_moe_block); its load-balancing
  // loss is added to the file's loss.
  int moe(const FileLayer& l, const Fields& fl, int x) {
    const MoeBlock b{shape(x)[-1], fl.count("experts"), fl.count("top_k"), fl.count("ffn"), fl.count("shared", 0, 0),
                     fl.number("capacity", 0, 0, 1e6), float(fl.number("aux", 0.01, 0, 1e6))};
    if (b.top_k > b.experts)
      fl.fail(str_cat("'top_k' ", b.top_k, " is more than 'experts' ", b.experts, " (each token goes to top_k different "
                      "experts)"), "top_k");
    return add_moe_block(g_, l.name, x, b, m_.aux_losses);
  }

  int same_split(int from, int out) {
    if (split(from)) split_.insert(out);
    return out;
  }

  int linear(const FileLayer& l, const Fields& fl) {
    int x = in(l, 0);
    const int64_t width = shape(x)[-1], out = fl.count("out");
    static constexpr Named<LinearTP::Split> kSplits[] = {
        {"none", LinearTP::Split::none}, {"column", LinearTP::Split::column}, {"row", LinearTP::Split::row}};
    const std::string tp = fl.text("tp", "none");
    const auto named = find_named(tp, kSplits);
    if (!named) fl.fail(str_cat("field 'tp' must be ", choice_list(kSplits), ", got '", tp, "'"), "tp");
    const LinearTP::Split s = *named;
    if (s == LinearTP::Split::row && !split(x))
      fl.fail(str_cat("\"tp\": \"row\" reads a column-parallel layer's split outputs, but '", l.inputs[0], "' is whole"));
    const int64_t parts = r_.tp.parts, in_full = s == LinearTP::Split::row ? width * parts : width;
    if (fl.find("in") && fl.count("in") != in_full)
      fl.fail(str_cat("'in' is ", fl.count("in"), " but its input '", l.inputs[0], "' has ", in_full, " features"));
    const int64_t stride = fl.count("tp_stride", 1);
    SAT_CHECK(s == LinearTP::Split::column || stride == 1, "field 'tp_stride' applies to \"tp\": \"column\" only");
    SAT_CHECK(s != LinearTP::Split::column || out % (parts * stride) == 0, "--tp ", parts, ": 'out' ", out,
              " does not divide into ", stride, " block(s) of ", parts, " parts");
    // The region's entry: a copy whose backward all-reduces the input's gradient (none
    // needed when the input takes none, as the mlp's first layer), or the gathered rows.
    if (s == LinearTP::Split::column && (g_.value(x).needs_grad || r_.sp)) x = r_.enter(l.name, x);
    const LinearTP ltp{s, r_.tp, int(stride)};
    int y = g_.add<Linear>(l.name, {x}, in_full, out, fl.flag("bias", true), fl.init("weight_init"), fl.init("bias_init"),
                           fl.text("tied_to", ""), ltp);
    if (s == LinearTP::Split::column) {
      split_.insert(y);
      column_.insert(y);  // the loss may read these directly: vocabulary-parallel logits
    }
    if (s == LinearTP::Split::row) y = r_.leave(l.name, y);
    return y;
  }

  int conv2d(const FileLayer& l, const Fields& fl) {
    const int x = in(l, 0);
    SAT_CHECK(shape(x).nd == 4, "expected images [B, C, H, W] as input, got ", shape(x).str());
    const int64_t cin = shape(x)[1], cout = fl.count("out_channels"), k = fl.count("kernel");
    if (fl.find("in_channels") && fl.count("in_channels") != cin)
      fl.fail(str_cat("'in_channels' is ", fl.count("in_channels"), " but its input '", l.inputs[0], "' has ", cin));
    return g_.add<Conv2d>(l.name, {x}, cin, cout, k, fl.count("stride", 1), fl.count("padding", 0, 0),
                          fl.flag("bias", true), fl.init("weight_init", double(cout * k * k)), fl.count("groups", 1));
  }

  // A fused qkv input [B, T, 3C], or q, k, v (grouped-query attention: kv_heads key/value
  // heads shared by heads / kv_heads query heads each).
  int attention(const FileLayer& l, const Fields& fl, int x) {
    const int64_t heads = fl.count("heads"), kv = fl.count("kv_heads", heads);
    std::vector<int> ins;
    for (size_t k = 0; k < l.inputs.size(); ++k) ins.push_back(in(l, k));
    for (int v : ins)
      if (split(v) != split(x)) fl.fail("its q, k and v inputs must all be split (\"tp\": \"column\") or all whole");
    const int64_t parts = split(x) ? r_.tp.parts : 1;
    SAT_CHECK(heads % parts == 0 && kv % parts == 0, "--tp ", parts, ": ", heads, " heads and ", kv,
              " key/value heads must divide by ", parts);
    const bool selective = m_.config.recompute == Recompute::selective;
    return same_split(x, g_.add<CausalSelfAttention>(l.name, ins, heads / parts, selective, kv / parts));
  }

  int avgpool(const FileLayer& l, const Fields& fl, int x) {
    int64_t h = 1, w = 1;
    if (const auto o = fl.find("output")) {
      SAT_CHECK(o->is_array() && o->size() == 2 && o->item(0).is_number() && o->item(1).is_number(),
                "field 'output' must be [H, W]");
      h = o->item(0).integer(), w = o->item(1).integer();
      SAT_CHECK(h >= 1 && w >= 1 && h <= kMaxCount && w <= kMaxCount, "field 'output' must be positive [H, W]");
    }
    return g_.add<AdaptiveAvgPool2d>(l.name, {x}, h, w);
  }

  int loss(const FileLayer& l, const Fields& fl) {
    const int logits = in(l, 0);
    // Vocabulary-parallel logits straight from a column-parallel head: the loss sums over
    // the group (Megatron's vocab-parallel cross-entropy).
    if (split(logits) && !column_.count(logits))
      fl.fail(str_cat("reads '", l.inputs[0], "', which is split over the tensor-parallel group but not by a column "
                      "linear (the output head)"));
    const TPRank tp = split(logits) ? r_.tp : TPRank{};
    m_.logits = logits;
    return g_.add<CrossEntropy>(l.name, {logits, in(l, 1)}, tp);
  }

  BuiltModel& m_;
  Graph& g_;
  const ModelFile& f_;
  std::string spec_;
  TokenRegions r_;
  std::map<std::string, int> value_;
  std::set<int> split_, column_;
};

// A regular file of a sane size, checked before reading: a device or a huge file is refused.
std::string read_text(const std::string& spec, const std::string& path) {
  return read_input_file(spec, path, kMaxFileBytes);
}

// The model of `text` (from `path`, named in parse errors), checked; `lines`: messages give
// the line (a file someone wrote).
ModelFile parse_model_file(const std::string& spec, const std::string& text, const std::string& path, bool lines) {
  ModelFile f;
  f.path = path;
  f.where = spec;
  f.lines = lines;
  f.crc = uint32_t(fnv1a64(text));
  const JsonRef doc = JsonRef::parse(text, path);
  doc.expect_keys({"name", "inputs", "layers", "loss"});
  Reader r{spec, f};
  r.inputs(doc.at("inputs"));
  r.entries(doc.at("layers"), false, 0, false);
  SAT_CHECK(!f.layers.empty(), r.at(doc.at("layers")), ": 'layers' is empty");
  resolve(f);
  f.loss = doc.contains("loss") ? doc.at("loss").string() : f.layers.back().name;
  auto loss = std::find_if(f.layers.begin(), f.layers.end(), [&](const FileLayer& l) { return l.name == f.loss; });
  SAT_CHECK(loss != f.layers.end(), r.at(doc.at("loss")), ": 'loss' names '", f.loss, "', which is no layer of the file");
  if (loss->type != "cross_entropy")
    Fields(f, *loss).fail(str_cat("the loss must be a scalar, and a ", loss->type, " gives a tensor per sample: name a "
                                  "cross_entropy layer as 'loss'"));
  if (&*loss != &f.layers.back()) Fields(f, *loss).fail("the loss must be the last layer");
  loss->starts_block = false;  // the loss stays with what precedes it
  for (auto& l : f.layers) f.transformer_blocks += l.type == "transformer_block";
  return f;
}

// The configuration of a checked file: tokens or image input, classes, context, vocabulary.
ModelConfig config_of(const std::string& spec, const std::string& where, ModelFile file) {
  auto f = std::make_shared<ModelFile>(std::move(file));
  ModelConfig c;
  c.name = spec;
  c.family = ModelFamily::file;
  const FileInput &x = f->inputs[0], &y = f->inputs[1];
  SAT_CHECK(y.dtype == DType::i32, where, ": input '", y.name, "' is the target: expected dtype int32 (class indices)");
  if (x.dtype == DType::i32) {
    SAT_CHECK(x.shape.nd == 1 && y.shape == x.shape, where, ": token input '", x.name, "' must be [T] and its target '",
              y.name, "' the same [T], got ", x.shape.str(), " and ", y.shape.str());
    c.tokens = true;
    c.context = c.seq_len = x.shape[0];  // --seq-len may shorten the window
  } else {
    SAT_CHECK(x.shape.nd == 3 && y.shape.nd == 0, where, ": image input '", x.name, "' must be [C, H, W] (as the data "
              "readers give images) and its target '", y.name, "' a class index [], got ", x.shape.str(), " and ",
              y.shape.str());
    c.image = x.shape;
  }
  c.file = f;
  // Built once for one sample: every shape is checked, and the logits give the classes.
  const BuiltModel m = build_model(c, 1);
  const Shape logits = m.graph->value(m.logits).spec.shape;
  c.classes = logits[-1];
  if (c.tokens) c.vocab = c.classes;
  return c;
}

}  // namespace

void build_from_file(BuiltModel& m, Graph& g) {
  FileBuilder(m, g).build();
  SAT_CHECK(m.logits >= 0, "internal error: model file without logits");
  m.loss = int(g.values().size()) - 1;
}

ModelConfig model_file_config(const std::string& spec, const std::string& path) {
  const std::string where = "--model " + spec;
  return config_of(spec, where, parse_model_file(where, read_text(where, path), path, true));
}

ModelConfig model_text_config(const std::string& name, const std::string& text) {
  return config_of(name, "model '" + name + "'", parse_model_file("model '" + name + "'", text, name, false));
}

bool file_has_tensor_parallel(const ModelFile& f) {
  for (const FileLayer& l : f.layers) {
    if (l.type == "gpt_embedding" || l.type == "transformer_block") return true;
    if (l.type == "linear" && l.args.contains("tp") && l.args.at("tp").is_string() && l.args.at("tp").string() != "none")
      return true;
  }
  return false;
}

bool file_has_recompute_units(const ModelFile& f) {
  return std::any_of(f.layers.begin(), f.layers.end(),
                     [](const FileLayer& l) { return l.type == "transformer_block" || l.type == "basic_block"; });
}

bool file_has_attention(const ModelFile& f) {
  return std::any_of(f.layers.begin(), f.layers.end(),
                     [](const FileLayer& l) { return l.type == "transformer_block" || l.type == "attention"; });
}

}  // namespace sat
