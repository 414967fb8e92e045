// --model strings: the preset names and FAMILY:SPEC (models.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "nn/model_file.h"
#include "nn/models.h"

namespace sat {

namespace {

// Widths, depths and counts above this are surely a typo; it also keeps every product the
// layers form from them (such as width * 4 * width * batch * context) inside int64.
constexpr int64_t kMaxCount = 100'000'000;

const char* const kFamilies =
    "gpt:layers=L,heads=H,width=C,context=T,vocab=V[,dropout=P], "
    "llama:layers=L,heads=H,kv_heads=K,width=C,ffn=F,context=T,vocab=V[,norm_eps=E][,rope_theta=R], "
    "moe:layers=L,heads=H,width=C,experts=E,top_k=K,context=T,vocab=V[,ffn=F,kv_heads=G,shared=S,capacity=CF,aux=A], "
    "mlp:IN-HIDDEN...-CLASSES, resnet:18|34, "
    "file:NET.json";

// A positive integer, the whole of `text`; sat::Error naming the spec and `what` otherwise.
int64_t positive(const std::string& spec, const std::string& what, const std::string& text) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  SAT_CHECK(ec == std::errc() && end == text.data() + text.size() && v >= 1 && v <= kMaxCount, "--model ", spec, ": ",
            what, " must be a positive integer up to ", kMaxCount, ", got '", text, "'");
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t end; (end = s.find(sep, pos)) != std::string::npos; pos = end + 1) out.push_back(s.substr(pos, end - pos));
  out.push_back(s.substr(pos));
  return out;
}

// "layers=4,heads=4,..." as key -> value; every key once, each item KEY=VALUE.
std::map<std::string, std::string> key_values(const std::string& spec, const std::string& body) {
  std::map<std::string, std::string> kv;
  for (const std::string& item : split(body, ',')) {
    const size_t eq = item.find('=');
    SAT_CHECK(eq != std::string::npos && eq > 0, "--model ", spec, ": expected KEY=VALUE items separated by commas, "
              "got '", item, "'");
    const std::string key = item.substr(0, eq);
    SAT_CHECK(kv.emplace(key, item.substr(eq + 1)).second, "--model ", spec, ": '", key, "' is given twice");
  }
  return kv;
}

// The sizes GPT and Llama share (layers, heads, width, context, vocab), each a positive
// integer under its key; `keys` lists every key the family accepts, `syntax` is its form.
struct Spec {
  const std::string& spec;
  std::map<std::string, std::string> kv;
  const char* syntax;
  int64_t take(const char* key) const {
    SAT_CHECK(kv.count(key), "--model ", spec, ": missing '", key, "' (", syntax, ")");
    return positive(spec, std::string("'") + key + "'", kv.at(key));
  }
};

Spec parse_spec(const std::string& spec, const std::string& body, const std::vector<std::string>& keys,
                const char* syntax) {
  Spec s{spec, key_values(spec, body), syntax};
  for (auto& [key, value] : s.kv)
    SAT_CHECK(std::find(keys.begin(), keys.end(), key) != keys.end(), "--model ", spec, ": unknown key '", key,
              "' (", syntax, ")");
  return s;
}

void take_transformer(ModelConfig& c, const Spec& s) {
  c.tokens = true;
  c.n_layer = s.take("layers");
  c.n_head = s.take("heads");
  c.n_embd = s.take("width");
  c.context = c.seq_len = s.take("context");
  c.vocab = c.classes = s.take("vocab");
  SAT_CHECK(c.n_embd % c.n_head == 0, "--model ", s.spec, ": width ", c.n_embd, " does not divide by heads ", c.n_head,
            " (each head has width / heads channels)");
  // One sample's attention probabilities [heads, T, T]: beyond this, sizes leave int64.
  SAT_CHECK(double(c.n_head) * double(c.context) * double(c.context) <= 1e15, "--model ", s.spec,
            ": heads x context^2 = ", double(c.n_head) * double(c.context) * double(c.context),
            " attention probabilities per sample is beyond 1e15 (", c.n_head, " heads, context ", c.context, ")");
}

// gpt:layers=L,heads=H,width=C,context=T,vocab=V[,dropout=P]
void parse_gpt(ModelConfig& c, const std::string& spec, const std::string& body) {
  const Spec s = parse_spec(spec, body, {"layers", "heads", "width", "context", "vocab", "dropout"},
                            "gpt:layers=L,heads=H,width=C,context=T,vocab=V[,dropout=P]");
  c.family = ModelFamily::gpt;
  take_transformer(c, s);
  if (s.kv.count("dropout")) {
    const std::string& v = s.kv.at("dropout");
    char* end = nullptr;
    const double p = std::strtod(v.c_str(), &end);
    // In float, as the layers keep it: 0.99999999 rounds to 1 (every activation dropped).
    SAT_CHECK(!v.empty() && end && *end == 0 && p >= 0 && float(p) < 1.0f, "--model ", spec,
              ": 'dropout' must be a probability in [0, 1), got '", v, "'");
    c.dropout = float(p);
  }
}

// A finite float above `above` under `key` when given (kept as `v` otherwise).
void take_float(const Spec& s, const char* key, float above, float& v) {
  if (!s.kv.count(key)) return;
  const std::string& text = s.kv.at(key);
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  SAT_CHECK(!text.empty() && end && *end == 0 && std::isfinite(float(x)) && float(x) > above, "--model ", s.spec,
            ": '", key, "' must be a number above ", above, ", got '", text, "'");
  v = float(x);
}

// A finite float >= 0 under `key` when given (kept as `v` otherwise).
void take_nonnegative(const Spec& s, const char* key, float& v) {
  if (!s.kv.count(key)) return;
  const std::string& text = s.kv.at(key);
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  SAT_CHECK(!text.empty() && end && *end == 0 && std::isfinite(float(x)) && x >= 0, "--model ", s.spec, ": '", key,
            "' must be a number >= 0, got '", text, "'");
  v = float(x);
}

// llama:layers=L,heads=H,kv_heads=K,width=C,ffn=F,context=T,vocab=V[,norm_eps=E][,rope_theta=R]
void parse_llama(ModelConfig& c, const std::string& spec, const std::string& body) {
  const Spec s = parse_spec(
      spec, body, {"layers", "heads", "kv_heads", "width", "ffn", "context", "vocab", "norm_eps", "rope_theta"},
      "llama:layers=L,heads=H,kv_heads=K,width=C,ffn=F,context=T,vocab=V[,norm_eps=E][,rope_theta=R]");
  c.family = ModelFamily::llama;
  take_transformer(c, s);
  c.n_kv_head = s.take("kv_heads");
  c.ffn = s.take("ffn");
  take_float(s, "norm_eps", 0.0f, c.norm_eps);      // RMSNorm: x / sqrt(mean(x^2) + eps)
  take_float(s, "rope_theta", 1.0f, c.rope_theta);  // Rotary: angles t / theta^(2i / hs)
  SAT_CHECK(c.n_head % c.n_kv_head == 0, "--model ", spec, ": heads ", c.n_head, " does not divide by kv_heads ",
            c.n_kv_head, " (each key/value head serves a group of heads / kv_heads query heads)");
  SAT_CHECK((c.n_embd / c.n_head) % 2 == 0, "--model ", spec, ": width / heads = ", c.n_embd / c.n_head,
            " channels per head is odd (rotary embeddings rotate pairs of channels)");
}

// moe:layers=L,heads=H,width=C,experts=E,top_k=K,context=T,vocab=V[,ffn=F,kv_heads=G,shared=S,capacity=CF,aux=A]
// The llama family with mixture-of-experts MLPs (ModelConfig::experts > 0).
void parse_moe(ModelConfig& c, const std::string& spec, const std::string& body) {
  static const char* const syntax =
      "moe:layers=L,heads=H,width=C,experts=E,top_k=K,context=T,vocab=V[,ffn=F,kv_heads=G,shared=S,capacity=CF,aux=A]";
  const Spec s = parse_spec(spec, body, {"layers", "heads", "kv_heads", "width", "ffn", "context", "vocab", "experts",
                                         "top_k", "shared", "capacity", "aux", "norm_eps", "rope_theta"}, syntax);
  c.family = ModelFamily::llama;
  take_transformer(c, s);
  c.n_kv_head = s.kv.count("kv_heads") ? s.take("kv_heads") : c.n_head;
  c.ffn = s.kv.count("ffn") ? s.take("ffn") : 4 * c.n_embd;
  c.experts = s.take("experts");
  c.top_k = s.take("top_k");
  if (s.kv.count("shared")) {
    const std::string& v = s.kv.at("shared");
    c.shared_experts = v == "0" ? 0 : positive(spec, "'shared'", v);
  }
  take_float(s, "norm_eps", 0.0f, c.norm_eps);
  take_float(s, "rope_theta", 1.0f, c.rope_theta);
  take_nonnegative(s, "capacity", c.capacity);  // 0: no capacity limit
  take_nonnegative(s, "aux", c.aux_coef);
  SAT_CHECK(c.top_k <= c.experts, "--model ", spec, ": top_k ", c.top_k, " is more than experts ", c.experts,
            " (each token goes to top_k different experts)");
  SAT_CHECK(c.n_head % c.n_kv_head == 0, "--model ", spec, ": heads ", c.n_head, " does not divide by kv_heads ",
            c.n_kv_head, " (each key/value head serves a group of heads / kv_heads query heads)");
  SAT_CHECK((c.n_embd / c.n_head) % 2 == 0, "--model ", spec, ": width / heads = ", c.n_embd / c.n_head,
            " channels per head is odd (rotary embeddings rotate pairs of channels)");
}

// mlp:IN-HIDDEN...-CLASSES
void parse_mlp(ModelConfig& c, const std::string& spec, const std::string& body) {
  const std::vector<std::string> items = split(body, '-');
  SAT_CHECK(items.size() >= 2, "--model ", spec, ": expected the widths IN-HIDDEN...-CLASSES separated by '-' "
            "(such as mlp:784-1024-1024-10), got '", body, "'");
  c.family = ModelFamily::mlp;
  c.mlp_widths.clear();
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string what = i == 0 ? "the input width" : i + 1 == items.size() ? "the number of classes"
                                                                             : str_cat("hidden width ", i);
    c.mlp_widths.push_back(positive(spec, what, items[i]));
  }
  // The default data's shape when it fits (Fashion-MNIST's 28x28), else a flat vector: the
  // CLI puts the data's own shape here once it has checked the width.
  const int64_t in = c.mlp_widths.front();
  c.image = in == 784 ? Shape{1, 28, 28} : Shape{1, 1, in};
  c.classes = c.mlp_widths.back();
}

// resnet:18 | resnet:34
void parse_resnet(ModelConfig& c, const std::string& spec, const std::string& body) {
  SAT_CHECK(body == "18" || body == "34", "--model ", spec, ": expected a depth of 18 or 34 (BasicBlock ResNets), got '",
            body, "'");
  c.family = ModelFamily::resnet;
  c.resnet_depth = body == "18" ? 18 : 34;
  c.image = Shape{3, 32, 32};
}

// The preset names as their family strings.
const std::map<std::string, std::string>& presets() {
  static const std::map<std::string, std::string> p{
      {"mlp", "mlp:784-1024-1024-10"},
      {"resnet18", "resnet:18"},
      {"gpt-mini", "gpt:layers=4,heads=4,width=256,context=128,vocab=4096"},
      {"gpt2-124m", "gpt:layers=12,heads=12,width=768,context=1024,vocab=50257"}};
  return p;
}

ModelConfig parse_family(const std::string& spec) {
  ModelConfig c;
  c.name = spec;
  const size_t colon = spec.find(':');
  const std::string family = spec.substr(0, colon), body = spec.substr(colon + 1);
  if (family == "file") return model_file_config(spec, body);
  if (family == "gpt") parse_gpt(c, spec, body);
  else if (family == "llama") parse_llama(c, spec, body);
  else if (family == "moe") parse_moe(c, spec, body);
  else if (family == "mlp") parse_mlp(c, spec, body);
  else if (family == "resnet") parse_resnet(c, spec, body);
  else fail("--model ", spec, ": unknown model family '", family, "' (families: ", kFamilies, ")");
  return c;
}

}  // namespace

const std::vector<std::string>& model_names() {
  static const std::vector<std::string> names{"mlp", "convnet", "resnet18", "gpt-mini", "gpt2-124m"};
  return names;
}

const char* family_name(ModelFamily f) {
  switch (f) {
    case ModelFamily::mlp: return "mlp";
    case ModelFamily::convnet: return "convnet";
    case ModelFamily::resnet: return "resnet";
    case ModelFamily::gpt: return "gpt";
    case ModelFamily::llama: return "llama";
    case ModelFamily::file: return "file";
  }
  return "?";
}

ModelConfig model_config(const std::string& name) {
  if (name.find(':') != std::string::npos) return parse_family(name);
  if (name == "convnet") {
    ModelConfig c;
    c.name = name;
    c.family = ModelFamily::convnet;
    return c;
  }
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string list;
    for (auto& n : model_names()) list += (list.empty() ? "" : ", ") + n;
    fail("--model: unknown model '", name, "' (expected one of: ", list, "; or a family: ", kFamilies, ")");
  }
  ModelConfig c = parse_family(it->second);
  c.name = name;
  return c;
}

namespace {
// The shortest text that reads back to the same float (ostream's 6 digits printed
// 0.99999994 as 1, which --model refuses).
std::string float_text(float x) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x);
  return std::string(buf, r.ptr);
}

// A llama's norm_eps and rope_theta where they are not the defaults (1e-5, 10000), after
// their labels: existing specs and descriptions read as before.
std::string llama_extras(const ModelConfig& c, const char* eps_label, const char* theta_label) {
  std::string s;
  if (c.norm_eps != 1e-5f) s += eps_label + float_text(c.norm_eps);
  if (c.rope_theta != 10000.0f) {  // in full (500000, not 5e+05), as config.json files write it
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, c.rope_theta, std::chars_format::fixed);
    s += theta_label + std::string(buf, r.ptr);
  }
  return s;
}

std::string moe_spec(const ModelConfig& c) {
  return str_cat("moe:layers=", c.n_layer, ",heads=", c.n_head, ",kv_heads=", c.n_kv_head, ",width=", c.n_embd,
                 ",ffn=", c.ffn, ",experts=", c.experts, ",top_k=", c.top_k, ",shared=", c.shared_experts,
                 ",capacity=", float_text(c.capacity), ",aux=", float_text(c.aux_coef), ",context=", c.context,
                 ",vocab=", c.vocab, llama_extras(c, ",norm_eps=", ",rope_theta="));
}
}  // namespace

std::string model_spec(const ModelConfig& c) {
  switch (c.family) {
    case ModelFamily::file: return "file:" + c.file->path;
    case ModelFamily::convnet: return "convnet";
    case ModelFamily::resnet: return str_cat("resnet:", c.resnet_depth);
    case ModelFamily::mlp: {
      std::string s = "mlp:";
      for (size_t i = 0; i < c.mlp_widths.size(); ++i) s += str_cat(i ? "-" : "", c.mlp_widths[i]);
      return s;
    }
    case ModelFamily::gpt:
      return str_cat("gpt:layers=", c.n_layer, ",heads=", c.n_head, ",width=", c.n_embd, ",context=", c.context,
                     ",vocab=", c.vocab, c.dropout > 0 ? ",dropout=" + float_text(c.dropout) : std::string());
    case ModelFamily::llama:
      if (c.experts > 0) return moe_spec(c);
      return str_cat("llama:layers=", c.n_layer, ",heads=", c.n_head, ",kv_heads=", c.n_kv_head, ",width=", c.n_embd,
                     ",ffn=", c.ffn, ",context=", c.context, ",vocab=", c.vocab,
                     llama_extras(c, ",norm_eps=", ",rope_theta="));
  }
  return c.name;
}

std::string describe_model(const ModelConfig& c) {
  switch (c.family) {
    case ModelFamily::file: {
      char crc[16];
      std::snprintf(crc, sizeof crc, "%08x", c.file->crc);
      return str_cat(c.file->layers.size(), " file layers from ", c.file->path, " (hash ", crc, "); input ",
                     c.tokens ? str_cat(c.seq_len, " tokens") : c.image.str(), ", ", c.classes,
                     c.tokens ? " vocabulary" : " classes");
    }
    case ModelFamily::convnet: return str_cat("input ", c.image.str(), ", ", c.classes, " classes");
    case ModelFamily::resnet:
      return str_cat("ResNet-", c.resnet_depth, ": BasicBlocks ", c.resnet_depth == 18 ? "2, 2, 2, 2" : "3, 4, 6, 3",
                     " of widths 64, 128, 256, 512, CIFAR stem; input ", c.image.str(), ", ", c.classes, " classes");
    case ModelFamily::mlp: {
      std::string hidden;
      for (size_t i = 1; i + 1 < c.mlp_widths.size(); ++i) hidden += str_cat(i > 1 ? ", " : "", c.mlp_widths[i]);
      return str_cat("input ", c.mlp_widths.front(), hidden.empty() ? ", no hidden layer" : ", hidden widths " + hidden, ", ",
                     c.mlp_widths.back(), " classes");
    }
    case ModelFamily::gpt:
      return str_cat(c.n_layer, " layers, ", c.n_head, " heads of ", c.n_embd / c.n_head, " channels, width ", c.n_embd,
                     ", context ", c.context, ", vocabulary ", c.vocab,
                     c.dropout > 0 ? str_cat(", dropout ", c.dropout) : std::string());
    case ModelFamily::llama:
      if (c.experts > 0)
        return str_cat("Llama with mixture-of-experts MLPs: ", c.n_layer, " layers, ", c.n_head, " heads (",
                       c.n_kv_head, " key/value heads), width ", c.n_embd, ", ", c.experts, " experts of SwiGLU width ",
                       c.ffn, ", top ", c.top_k, c.shared_experts ? str_cat(", ", c.shared_experts, " shared") : "",
                       c.capacity > 0 ? ", capacity factor " + float_text(c.capacity) : std::string(", no drops"),
                       ", load-balancing coefficient ", float_text(c.aux_coef), ", context ", c.context,
                       ", vocabulary ", c.vocab, llama_extras(c, ", RMSNorm eps ", ", rope theta "));
      return str_cat("Llama: ", c.n_layer, " layers, ", c.n_head, " heads of ", c.n_embd / c.n_head, " channels (",
                     c.n_kv_head, " key/value heads), width ", c.n_embd, ", SwiGLU width ", c.ffn, ", context ",
                     c.context, ", vocabulary ", c.vocab, llama_extras(c, ", RMSNorm eps ", ", rope theta "));
  }
  return "";
}

}  // namespace sat
