// Hugging Face GPT-2 and Llama checkpoints into saturate's weights (nn/hf_convert.h).
#include "nn/hf_convert.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include <unistd.h>

#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "nn/models.h"
#include "nn/safetensors.h"

namespace sat {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---- the input files ----------------------------------------------------------------------

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

[[noreturn]] void fail_pickle(const std::string& path) {
  fail(path, " is a PyTorch pickle (torch.save), not safetensors: re-save it with python3 -c \"import torch; "
       "from safetensors.torch import save_file; sd = torch.load('", path, "', map_location='cpu'); "
       "save_file({k: v.contiguous().clone() for k, v in sd.items()}, 'model.safetensors')\" (pip install "
       "safetensors), or with transformers' save_pretrained(DIR, safe_serialization=True)");
}

// A zip archive (torch.save since 1.6) or a bare pickle (protocol 2+) by its first bytes.
bool looks_like_pickle(const std::string& path) {
  const InputFile f("saturate convert", path);
  unsigned char head[4] = {0, 0, 0, 0};
  const ssize_t n = ::pread(f.fd(), head, sizeof head, 0);
  if (n >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return true;
  return n >= 2 && head[0] == 0x80 && head[1] >= 2 && head[1] <= 5;
}

struct Located {
  std::string weights, config;  // config empty: none beside the weights
};

Located locate(const std::string& in) {
  check_input_path("saturate convert", in, true);
  Located l;
  const fs::path p(in);
  if (fs::is_directory(p)) {
    for (const char* name : {"model.safetensors", "model.safetensors.index.json"})
      if (l.weights.empty() && fs::exists(p / name)) l.weights = (p / name).string();
    if (l.weights.empty()) {
      for (const char* pickle : {"pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.bin"})
        if (fs::exists(p / pickle)) fail_pickle((p / pickle).string());
      fail(in, ": no model.safetensors in this directory (expected a Hugging Face checkpoint: model.safetensors "
           "and config.json)");
    }
  } else {
    l.weights = in;
  }
  const std::string ext = fs::path(l.weights).extension().string();
  const bool index = ends_with(l.weights, ".safetensors.index.json");
  if (!index && (ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".ckpt" || looks_like_pickle(l.weights)))
    fail_pickle(l.weights);
  const fs::path config = fs::path(l.weights).parent_path() / "config.json";
  if (fs::is_regular_file(config)) l.config = config.string();
  return l;
}

// The checkpoint's tensors: one safetensors file's, or those of the shards that
// model.safetensors.index.json's weight_map names (each name in one shard only).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& path) : path_(path) {
    if (!ends_with(path, ".safetensors.index.json")) {
      add(path);
      return;
    }
    const json j = json::parse(read_input_file("saturate convert", path, uint64_t(1) << 28), nullptr, false);
    SAT_CHECK(j.is_object() && j.contains("weight_map") && j.at("weight_map").is_object(), path, ": expected a JSON "
              "object with a weight_map of tensor names to safetensors files");
    std::set<std::string> shards;
    for (const auto& [name, file] : j.at("weight_map").items()) {
      SAT_CHECK(file.is_string(), path, ": weight_map's '", name, "' is ", file.dump(), ", expected a file name");
      shards.insert(file.get<std::string>());
    }
    for (const std::string& s : shards) add((fs::path(path).parent_path() / s).string());
  }
  const std::string& path() const { return path_; }  // the file, or the index
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }
  const std::string& path_of(const SafetensorsTensor& t) const { return file_of(t).path(); }
  void read(const SafetensorsTensor& t, void* dst) const { file_of(t).read(t, dst); }

 private:
  void add(const std::string& file) {
    files_.push_back(std::make_unique<SafetensorsFile>(file));
    for (const SafetensorsTensor& t : files_.back()->tensors()) {
      SAT_CHECK(!index_.count(t.name), file, ": tensor '", t.name, "' is in ", path_of(tensors_[index_.at(t.name)]),
                " too; expected each tensor in one file");
      index_[t.name] = tensors_.size();
      tensors_.push_back(t);
      file_.push_back(files_.size() - 1);
    }
  }
  SafetensorsFile& file_of(const SafetensorsTensor& t) const { return *files_[file_[size_t(&t - tensors_.data())]]; }
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<SafetensorsTensor> tensors_;
  std::vector<size_t> file_;  // per tensor: its file
  std::map<std::string, size_t> index_;
};

// ---- config.json --------------------------------------------------------------------------

struct Config {
  std::string path;  // empty: no config.json (every lookup finds nothing)
  json j = json::object();

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }
  int64_t integer(const char* key) const {
    SAT_CHECK(has(key), path, ": '", key, "' is missing (expected a positive integer)");
    const json& v = j.at(key);
    SAT_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, path, ": '", key, "' is ", v.dump(),
              ", expected a positive integer");
    return v.get<int64_t>();
  }
  int64_t integer_or(const char* key, int64_t def) const { return has(key) ? integer(key) : def; }
  double number_or(const char* key, double def) const {
    if (!has(key)) return def;
    SAT_CHECK(j.at(key).is_number(), path, ": '", key, "' is ", j.at(key).dump(), ", expected a number");
    return j.at(key).get<double>();
  }
  std::string string_or(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    SAT_CHECK(j.at(key).is_string(), path, ": '", key, "' is ", j.at(key).dump(), ", expected a string");
    return j.at(key).get<std::string>();
  }
  bool flag_or(const char* key, bool def) const {
    if (!has(key)) return def;
    SAT_CHECK(j.at(key).is_boolean(), path, ": '", key, "' is ", j.at(key).dump(), ", expected true or false");
    return j.at(key).get<bool>();
  }
  // A setting saturate's family has fixed: refused, naming it and what saturate has, unless equal.
  void require(const char* key, bool ok, const std::string& shown, const std::string& saturate) const {
    SAT_CHECK(ok, path, ": '", key, "' is ", shown, ", which saturate's ", saturate);
  }
};

Config read_config(const std::string& path) {
  Config c;
  if (path.empty()) return c;
  c.path = path;
  c.j = json::parse(read_input_file("saturate convert", path, uint64_t(1) << 24), nullptr, false);
  SAT_CHECK(c.j.is_object(), path, ": not a JSON object (expected a Hugging Face config.json)");
  return c;
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-6 * std::abs(b); }

std::string number_text(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// ---- tensors ------------------------------------------------------------------------------

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {
    const float v = std::ldexp(float(man), -24);
    return sign ? -v : v;
  }
  const uint32_t bits = sign | (exp == 31 ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// A floating tensor's values as float32.
std::vector<float> read_floats(const Checkpoint& f, const SafetensorsTensor& t) {
  const std::string& d = t.dtype;
  SAT_CHECK(d == "F32" || d == "F16" || d == "BF16" || d == "F64", f.path_of(t), ": tensor '", t.name, "' has dtype ",
            d, ", expected a floating-point one (F32, F16, BF16 or F64)");
  std::vector<uint8_t> raw(t.end - t.begin);
  f.read(t, raw.data());
  const size_t width = d == "F64" ? 8 : d == "F32" ? 4 : 2, n = raw.size() / width;
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = raw.data() + i * width;
    if (d == "F32") {
      std::memcpy(&out[i], p, 4);
    } else if (d == "F64") {
      double v;
      std::memcpy(&v, p, 8);
      out[i] = float(v);
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      if (d == "F16") {
        out[i] = f16_to_f32(h);
      } else {
        const uint32_t bits = uint32_t(h) << 16;
        std::memcpy(&out[i], &bits, 4);
      }
    }
  }
  return out;
}

std::string shape_text(const std::vector<int64_t>& s) { return Shape(s).str(); }

// The parameters saturate's model of `spec` declares (tied ones left out), in its order.
struct Expected {
  std::string spec;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params;
  std::map<std::string, size_t> index;
};

Expected expected_params(const std::string& spec, const std::string& source) {
  Expected e{spec, {}, {}};
  try {
    const BuiltModel m = build_model(model_config(spec), 1, false);
    for (const ParamDecl& p : m.graph->params()) {
      if (p.shared) continue;
      e.index[p.name] = e.params.size();
      e.params.emplace_back(p.name, p.full_shape().vec());
    }
  } catch (const Error& err) {
    fail(source, ": the checkpoint's configuration is no saturate model: ", err.what());
  }
  return e;
}

// Fills a conversion's tensors from the file's, checking each against the model.
struct Filler {
  Checkpoint& file;
  const Expected& want;
  HfConversion& out;
  std::vector<bool> seen;

  Filler(Checkpoint& f, const Expected& e, HfConversion& o) : file(f), want(e), out(o), seen(e.params.size()) {
    out.spec = e.spec;
    out.tensors.resize(e.params.size());
  }
  // The file's tensor t as saturate's `name`, transposed ([in, out] into [out, in]) when asked.
  void take(const SafetensorsTensor& t, const std::string& name, bool transpose) {
    auto it = want.index.find(name);
    SAT_CHECK(it != want.index.end(), file.path_of(t), ": unexpected tensor '", t.name, "' (", want.spec,
              " has no parameter ", name, ")");
    const std::vector<int64_t>& shape = want.params[it->second].second;
    std::vector<int64_t> stored = shape;
    if (transpose) std::reverse(stored.begin(), stored.end());
    SAT_CHECK(t.shape == stored, file.path_of(t), ": tensor '", t.name, "' has shape ", shape_text(t.shape),
              ", expected ", shape_text(stored), transpose ? " (Conv1D's [in, out])" : "", " for ", want.spec);
    std::vector<float> v = read_floats(file, t);
    if (transpose) {
      const int64_t rows = stored[0], cols = stored[1];
      std::vector<float> tr(v.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) tr[size_t(c * rows + r)] = v[size_t(r * cols + c)];
      v.swap(tr);
    }
    out.tensors[it->second] = HfTensor{name, shape, std::move(v)};
    seen[it->second] = true;
  }
  // Every parameter filled; `hf_name` gives the file's name of a missing one.
  template <class F>
  void finish(F&& hf_name) {
    for (size_t i = 0; i < want.params.size(); ++i) {
      const auto& [name, shape] = want.params[i];
      SAT_CHECK(seen[i], file.path(), ": tensor '", hf_name(name), "' is missing (", want.spec, " needs ", name, " ",
                shape_text(shape), ")");
      out.parameters += int64_t(out.tensors[i].data.size());
    }
  }
  const std::vector<float>* values(const std::string& name) const {
    auto it = want.index.find(name);
    return it != want.index.end() && seen[it->second] ? &out.tensors[it->second].data : nullptr;
  }
};

// The number after `prefix` in a tensor name ("h.11.attn..." -> 11), or -1.
int64_t layer_of(const std::string& name, const std::string& prefix) {
  if (!starts_with(name, prefix)) return -1;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  return j > i && j < name.size() && name[j] == '.' ? std::stoll(name.substr(i, j - i)) : -1;
}

int64_t count_layers(const Checkpoint& f, const std::string& prefix) {
  int64_t n = 0;
  for (const SafetensorsTensor& t : f.tensors()) n = std::max(n, layer_of(t.name, prefix) + 1);
  return n;
}

// The shape of a tensor the shapes are read from when there is no config.json.
const std::vector<int64_t>& shape_of(const Checkpoint& f, const std::string& name, size_t dims) {
  const SafetensorsTensor* t = f.find(name);
  SAT_CHECK(t, f.path(), ": tensor '", name, "' is missing (no config.json beside it, so the model's sizes are read "
            "from the tensors' shapes)");
  SAT_CHECK(t->shape.size() == dims, f.path(), ": tensor '", name, "' has shape ", shape_text(t->shape), ", expected ",
            dims, " dimensions");
  return t->shape;
}

// config.json's model_type (when it has one) is the family --from names.
void check_model_type(const Config& cfg, const std::string& from) {
  const std::string type = cfg.string_or("model_type", from);
  SAT_CHECK(type == from, cfg.path, ": model_type '", type, "', expected ", from, " (--from ", from, ")");
}

int64_t heads_option(const HfConvertOptions& o, const Checkpoint& f, const Config& cfg, const char* key) {
  if (!cfg.path.empty()) {
    const int64_t h = cfg.integer(key);
    SAT_CHECK(o.heads == 0 || o.heads == h, "--heads ", o.heads, ": ", cfg.path, " says ", key, " = ", h);
    return h;
  }
  SAT_CHECK(o.heads > 0, f.path(), ": no config.json beside it, and the tensors' shapes do not give the number of "
            "attention heads: expected --heads H");
  return o.heads;
}

// ---- GPT-2 --------------------------------------------------------------------------------

// The gpt spec of config.json (or of the shapes), refusing what saturate's gpt cannot express.
std::string gpt2_spec(const Checkpoint& f, const Config& cfg, const HfConvertOptions& o, const std::string& pre) {
  check_model_type(cfg, "gpt2");
  const int64_t heads = heads_option(o, f, cfg, "n_head");
  if (cfg.path.empty()) {
    const auto& wte = shape_of(f, pre + "wte.weight", 2);
    const auto& wpe = shape_of(f, pre + "wpe.weight", 2);
    return str_cat("gpt:layers=", count_layers(f, pre + "h."), ",heads=", heads, ",width=", wte[1],
                   ",context=", wpe[0], ",vocab=", wte[0]);
  }
  const std::string act = cfg.string_or("activation_function", "gelu_new");
  cfg.require("activation_function", act == "gelu_new" || act == "gelu_pytorch_tanh", "'" + act + "'",
              "gpt cannot express: its GELU is the tanh approximation (gelu_new)");
  const double eps = cfg.number_or("layer_norm_epsilon", 1e-5);
  cfg.require("layer_norm_epsilon", near(eps, 1e-5), number_text(eps), "gpt cannot express: its LayerNorm "
              "eps is 1e-5");
  const int64_t C = cfg.integer("n_embd");
  const int64_t inner = cfg.integer_or("n_inner", 4 * C);
  cfg.require("n_inner", inner == 4 * C, std::to_string(inner), str_cat("gpt cannot express: its MLP is 4 x n_embd = ",
              4 * C, " wide"));
  cfg.require("scale_attn_weights", cfg.flag_or("scale_attn_weights", true), "false", "gpt cannot express: its "
              "attention scales by 1/sqrt(head size)");
  cfg.require("scale_attn_by_inverse_layer_idx", !cfg.flag_or("scale_attn_by_inverse_layer_idx", false), "true",
              "gpt cannot express");
  cfg.require("add_cross_attention", !cfg.flag_or("add_cross_attention", false), "true", "gpt cannot express");
  const int64_t context = cfg.has("n_positions") ? cfg.integer("n_positions") : cfg.integer("n_ctx");
  return str_cat("gpt:layers=", cfg.integer("n_layer"), ",heads=", heads, ",width=", C, ",context=", context,
                 ",vocab=", cfg.integer("vocab_size"));
}

bool gpt2_conv1d(const std::string& rest) {  // rest: without the prefix
  if (layer_of(rest, "h.") < 0) return false;
  for (const char* m : {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (ends_with(rest, m)) return true;
  return false;
}

void convert_gpt2(Checkpoint& f, const Config& cfg, const HfConvertOptions& o, HfConversion& out) {
  // GPT2LMHeadModel's files carry `transformer.`; GPT2Model's (the hub's gpt2) do not.
  const bool prefixed = f.find("transformer.wte.weight") != nullptr;
  const std::string pre = prefixed ? "transformer." : "";
  const Expected want = expected_params(gpt2_spec(f, cfg, o, pre), cfg.path.empty() ? f.path() : cfg.path);
  Filler fill(f, want, out);
  int64_t masks = 0, conv1d = 0;
  const SafetensorsTensor* lm_head = nullptr;
  for (const SafetensorsTensor& t : f.tensors()) {
    if (t.name == "lm_head.weight") {
      lm_head = &t;
      continue;
    }
    SAT_CHECK(starts_with(t.name, pre), f.path_of(t), ": unexpected tensor '", t.name, "' (its other tensors' "
              "names begin with 'transformer.')");
    const std::string rest = t.name.substr(pre.size());
    if (layer_of(rest, "h.") >= 0 && (ends_with(rest, ".attn.bias") || ends_with(rest, ".attn.masked_bias"))) {
      ++masks;
      continue;
    }
    const bool tr = gpt2_conv1d(rest);
    SAT_CHECK(!tr || t.shape.size() == 2, f.path_of(t), ": tensor '", t.name, "' has shape ", shape_text(t.shape),
              ", expected Conv1D's 2 dimensions [in, out]");
    fill.take(t, "transformer." + rest, tr);
    conv1d += tr;
  }
  fill.finish([&](const std::string& n) { return pre + n.substr(std::string("transformer.").size()); });
  if (lm_head) {
    const std::vector<float>* wte = fill.values("transformer.wte.weight");
    SAT_CHECK(read_floats(f, *lm_head) == *wte, f.path(), ": lm_head.weight differs from ", pre, "wte.weight, "
              "expected them tied (saturate's gpt ties its output head to the token embedding)");
    out.notes.push_back("lm_head.weight: equal to wte.weight, tied (saturate's gpt ties them)");
  } else {
    out.notes.push_back("lm_head: tied to wte.weight");
  }
  out.notes.push_back(str_cat("transposed ", conv1d, " Conv1D weights ([in, out]) to nn.Linear's [out, in]"));
  if (masks) out.notes.push_back(str_cat("dropped ", masks, " causal-mask buffers (attn.bias, attn.masked_bias)"));
}

// ---- Llama --------------------------------------------------------------------------------

// Settings of config.json that saturate's llama fixes, refused when they differ; rms_norm_eps
// (Hugging Face's default 1e-6) and rope_theta (default 10000) are checked here and carried
// into the spec by llama_spec.
void check_llama_config(const Config& cfg, int64_t C, int64_t heads) {
  const double eps = cfg.number_or("rms_norm_eps", 1e-6), theta = cfg.number_or("rope_theta", 10000.0);
  cfg.require("rms_norm_eps", std::isfinite(float(eps)) && float(eps) > 0, number_text(eps),
              "llama cannot express: its RMSNorm eps is a positive float");
  cfg.require("rope_theta", std::isfinite(float(theta)) && float(theta) > 1, number_text(theta),
              "llama cannot express: its rotary embeddings' theta is a float above 1");
  cfg.require("rope_scaling", !cfg.has("rope_scaling"), cfg.has("rope_scaling") ? cfg.j.at("rope_scaling").dump() : "",
              "llama cannot express: its rotary embeddings are unscaled (rope_scaling null)");
  const std::string act = cfg.string_or("hidden_act", "silu");
  cfg.require("hidden_act", act == "silu", "'" + act + "'", "llama cannot express: its MLP is SwiGLU (silu)");
  cfg.require("attention_bias", !cfg.flag_or("attention_bias", false), "true", "llama cannot express: its "
              "projections have no bias");
  cfg.require("mlp_bias", !cfg.flag_or("mlp_bias", false), "true", "llama cannot express: its MLP has no bias");
  const int64_t hd = cfg.integer_or("head_dim", C / heads);
  cfg.require("head_dim", hd * heads == C, std::to_string(hd), str_cat("llama cannot express: its heads have "
              "hidden_size / num_attention_heads = ", C / heads, " channels"));
}

std::string llama_spec(const Checkpoint& f, const Config& cfg, const HfConvertOptions& o, bool& tie) {
  check_model_type(cfg, "llama");
  const int64_t heads = heads_option(o, f, cfg, "num_attention_heads");
  if (cfg.path.empty()) {
    SAT_CHECK(o.context > 0, f.path(), ": no config.json beside it, and the tensors do not give the context "
              "(max_position_embeddings): expected --context T");
    const auto& emb = shape_of(f, "model.embed_tokens.weight", 2);
    const int64_t hs = emb[1] / heads;
    const auto& k = shape_of(f, "model.layers.0.self_attn.k_proj.weight", 2);
    tie = f.find("lm_head.weight") == nullptr;
    return str_cat("llama:layers=", count_layers(f, "model.layers."), ",heads=", heads, ",kv_heads=",
                   hs > 0 ? k[0] / hs : 0, ",width=", emb[1], ",ffn=",
                   shape_of(f, "model.layers.0.mlp.gate_proj.weight", 2)[0], ",context=", o.context, ",vocab=", emb[0]);
  }
  const int64_t C = cfg.integer("hidden_size");
  check_llama_config(cfg, C, heads);
  tie = cfg.flag_or("tie_word_embeddings", false);
  ModelConfig mc = model_config(str_cat(
      "llama:layers=", cfg.integer("num_hidden_layers"), ",heads=", heads, ",kv_heads=",
      cfg.integer_or("num_key_value_heads", heads), ",width=", C, ",ffn=", cfg.integer("intermediate_size"),
      ",context=", cfg.integer("max_position_embeddings"), ",vocab=", cfg.integer("vocab_size")));
  mc.norm_eps = float(cfg.number_or("rms_norm_eps", 1e-6));
  mc.rope_theta = float(cfg.number_or("rope_theta", 10000.0));
  return model_spec(mc);  // norm_eps= and rope_theta= only where they are not llama's defaults
}

void convert_llama(Checkpoint& f, const Config& cfg, const HfConvertOptions& o, HfConversion& out) {
  bool tie = false;
  const Expected want = expected_params(llama_spec(f, cfg, o, tie), cfg.path.empty() ? f.path() : cfg.path);
  Filler fill(f, want, out);
  int64_t inv_freq = 0;
  bool head_ignored = false;
  for (const SafetensorsTensor& t : f.tensors()) {
    if (layer_of(t.name, "model.layers.") >= 0 && ends_with(t.name, ".self_attn.rotary_emb.inv_freq")) {
      ++inv_freq;
      continue;
    }
    if (tie && t.name == "lm_head.weight") {  // tied: HF's model uses embed_tokens
      head_ignored = true;
      continue;
    }
    fill.take(t, t.name, false);
  }
  if (tie) {
    const std::vector<float>* emb = fill.values("model.embed_tokens.weight");
    if (emb) {
      const size_t head = want.index.at("lm_head.weight");
      fill.out.tensors[head] = HfTensor{"lm_head.weight", want.params[head].second, *emb};
      fill.seen[head] = true;
    }
    out.notes.push_back(head_ignored ? "tie_word_embeddings: lm_head.weight is embed_tokens' (the file's copy left "
                                       "out, as Hugging Face's model does)"
                                     : "tie_word_embeddings: lm_head.weight copied from model.embed_tokens.weight "
                                       "(saturate's llama is untied)");
  }
  fill.finish([](const std::string& n) { return n; });
  if (inv_freq) out.notes.push_back(str_cat("dropped ", inv_freq, " rotary_emb.inv_freq buffers (saturate's rotary "
                                            "embeddings compute them, rotate_half convention, the config's theta)"));
  if (cfg.path.empty())
    out.notes.push_back("no config.json: RMSNorm eps 1e-5 and rope theta 10000 assumed (saturate's llama)");
}

}  // namespace

const std::vector<std::string>& hf_families() {
  static const std::vector<std::string> f{"gpt2", "llama"};
  return f;
}

HfConversion convert_hf_checkpoint(const HfConvertOptions& o) {
  SAT_CHECK(std::find(hf_families().begin(), hf_families().end(), o.from) != hf_families().end(), "--from: unknown "
            "model family '", o.from, "' (expected gpt2 or llama)");
  const Located in = locate(o.input);
  HfConversion out;
  out.weights_file = in.weights;
  out.config_file = in.config;
  const Config cfg = read_config(in.config);
  Checkpoint f(in.weights);
  if (o.from == "gpt2") convert_gpt2(f, cfg, o, out);
  else convert_llama(f, cfg, o, out);
  return out;
}

void save_hf_conversion(const std::string& path, const HfConversion& c) {
  std::vector<SafetensorsBlob> blobs;
  for (const HfTensor& t : c.tensors) blobs.push_back({t.name, DType::f32, t.shape, t.data.data()});
  const SafetensorsMetadata metadata{{"format", "pt"}, {"producer", "saturate convert"}, {"model", c.spec},
                                     {"source", c.weights_file}};
  write_file_atomic("--out", path, [&](std::ostream& f) {
    write_safetensors(blobs, metadata,
                      [&](const void* p, size_t n) { f.write(static_cast<const char*>(p), std::streamsize(n)); });
  });
}

}  // namespace sat
