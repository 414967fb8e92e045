// `saturate convert`: Hugging Face checkpoints into saturate's weights. The checkpoints in
// tests/hf (a GPT-2 with Conv1D weights, mask buffers and no `transformer.` prefix; a BF16
// Llama with tied embeddings and inv_freq buffers) and PyTorch's loss on tests/hf/tokens
// (tests/golden/hf_*.json) are written by scripts/make-hf-checkpoints. Converted (also from
// prefixed names, without config.json, from shards), the weights give PyTorch's loss under
// `saturate eval` within 1e-5 (relative). Every bad input is one line naming the file,
// tensor or key, exit status 2, and nothing written.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/text.h"
#include "nn/safetensors.h"
#include "run_command.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using sat::test::CmdResult;
using sat::test::run_command;

const std::string kSource = SAT_SOURCE_DIR;
const std::string kBin = SAT_BINARY;

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

// A fresh directory of this test's own.
fs::path temp_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / sat::str_cat("sat_test_convert_", getpid(), "_", name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A copy of tests/hf/FAMILY (model.safetensors, config.json) in dir/NAME.
fs::path copy_checkpoint(const std::string& family, const fs::path& dir, const std::string& name = "ckpt") {
  const fs::path to = dir / name;
  fs::create_directories(to);
  for (const char* f : {"model.safetensors", "config.json"})
    fs::copy_file(fs::path(kSource) / "tests/hf" / family / f, to / f);
  return to;
}

// One tensor of a safetensors file, its bytes as stored.
struct RawTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
using RawTensors = std::map<std::string, RawTensor>;

RawTensors read_raw(const fs::path& p) {
  sat::SafetensorsFile f(p.string());
  RawTensors out;
  for (const sat::SafetensorsTensor& t : f.tensors()) {
    RawTensor r{t.dtype, t.shape, std::vector<uint8_t>(t.end - t.begin)};
    f.read(t, r.bytes.data());
    out[t.name] = std::move(r);
  }
  return out;
}

void write_raw(const fs::path& p, const RawTensors& ts) {
  json header = json::object();
  uint64_t offset = 0;
  for (const auto& [name, t] : ts) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string h = header.dump();
  h.append((8 - (8 + h.size()) % 8) % 8, ' ');
  std::ofstream f(p, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(h.data(), std::streamsize(h.size()));
  for (const auto& [name, t] : ts)
    f.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
}

// The checkpoint's model.safetensors changed by `edit`.
void edit_weights(const fs::path& ckpt, const std::function<void(RawTensors&)>& edit) {
  RawTensors ts = read_raw(ckpt / "model.safetensors");
  edit(ts);
  write_raw(ckpt / "model.safetensors", ts);
}

void edit_config(const fs::path& ckpt, const std::function<void(json&)>& edit) {
  json c = read_json(ckpt / "config.json");
  edit(c);
  std::ofstream(ckpt / "config.json") << c.dump(2);
}

CmdResult convert(const std::string& args) { return run_command(kBin + " convert " + args); }

// The test loss of `saturate eval` on tests/hf/tokens, at the golden's batch.
double eval_loss(const json& golden, const fs::path& weights, const fs::path& dir) {
  const fs::path out = dir / "eval.json";
  const CmdResult r = run_command(sat::str_cat("OMP_NUM_THREADS=1 ", kBin, " eval --model ",
                                               golden["model"].get<std::string>(), " --init-weights ", weights.string(),
                                               " --data tokens:", kSource, "/", golden["tokens"].get<std::string>(),
                                               " --batch ", golden["batch"].get<int>(), " --json ", out.string()));
  EXPECT_EQ(r.status, 0) << r.out;
  if (r.status != 0) return NAN;
  const json j = read_json(out);
  EXPECT_EQ(j["samples"].get<int>(), golden["windows"].get<int>());
  return j["test_loss"].get<double>();
}

// Converted and evaluated, the checkpoint in `ckpt` gives the golden's loss (tests/golden/hf_FAMILY.json,
// or hf_GOLDEN.json); returns convert's output.
std::string expect_golden_loss(const std::string& family, const fs::path& ckpt, const fs::path& dir,
                               const std::string& flags = "", const std::string& golden = "") {
  const json g = read_json(fs::path(kSource) / "tests/golden" / ("hf_" + (golden.empty() ? family : golden) + ".json"));
  const fs::path w = dir / "w.safetensors";
  const CmdResult r = convert(sat::str_cat("--from ", family, " ", ckpt.string(), " --out ", w.string(), flags));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("model: " + g["model"].get<std::string>() + "\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("saturate eval --model " + g["model"].get<std::string>() + " --init-weights " + w.string()),
            std::string::npos) << r.out;
  const double loss = eval_loss(g, w, dir), want = g["loss"].get<double>();
  const double rel = std::abs(loss - want) / want;
  const std::string ref = g.value("reference", "PyTorch");
  EXPECT_LT(rel, g.value("tolerance", 1e-5)) << family << ": saturate " << loss << ", " << ref << " " << want;
  std::printf("[ convert  ] %s: saturate %.9f, %s %.9f (float64 %.9f), relative difference %.2e\n",
              g["model"].get<std::string>().c_str(), loss, ref.c_str(), want, g["loss_float64"].get<double>(), rel);
  return r.out;
}

// A refusal: status 2, one line naming `what`, and the output file not written.
void expect_refused(const CmdResult& r, const std::string& what, const fs::path& out) {
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find(what), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(r.out.rfind("saturate: error: ", 0), 0u) << r.out;
  EXPECT_FALSE(fs::exists(out)) << out;
}

// The checkpoint in dir/ckpt after `edit`, converted: refused naming `what`.
void expect_gpt2_refused(const std::string& name, const std::function<void(const fs::path&)>& edit,
                         const std::string& what, const std::string& family = "gpt2") {
  const fs::path dir = temp_dir(name);
  const fs::path ckpt = copy_checkpoint(family, dir);
  edit(ckpt);
  const fs::path out = dir / "w.safetensors";
  expect_refused(convert(sat::str_cat("--from ", family, " ", ckpt.string(), " --out ", out.string())), what, out);
  fs::remove_all(dir);
}

}  // namespace

TEST(Convert, Gpt2MatchesPyTorch) {
  const fs::path dir = temp_dir("gpt2");
  const std::string out = expect_golden_loss("gpt2", copy_checkpoint("gpt2", dir), dir);
  EXPECT_NE(out.find("transposed 8 Conv1D weights"), std::string::npos) << out;
  EXPECT_NE(out.find("dropped 4 causal-mask buffers"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST(Convert, LlamaMatchesPyTorch) {
  const fs::path dir = temp_dir("llama");
  const std::string out = expect_golden_loss("llama", copy_checkpoint("llama", dir), dir);
  EXPECT_NE(out.find("tie_word_embeddings: lm_head.weight copied"), std::string::npos) << out;
  EXPECT_NE(out.find("dropped 2 rotary_emb.inv_freq buffers"), std::string::npos) << out;
  fs::remove_all(dir);
}

// GPT2LMHeadModel's own files: `transformer.` prefix, lm_head.weight saved beside wte.
// Llama 3's rope_theta and Hugging Face's default rms_norm_eps go into the spec
// (llama:...,norm_eps=1e-06,rope_theta=500000) and the loss is the reference forward's
// for those settings (scripts/hf-llama-loss: 4.3452766, against 4.3440818 with the defaults
// and 4.3452842 with rope_theta alone, so the golden's tolerance 5e-7 tells eps apart too).
TEST(Convert, LlamaNormEpsAndRopeThetaAreCarried) {
  const fs::path dir = temp_dir("llama_rope");
  const fs::path ckpt = copy_checkpoint("llama", dir);
  const json g = read_json(fs::path(kSource) / "tests/golden/hf_llama_rope.json");
  edit_config(ckpt, [&](json& j) { j.update(g["config_edits"]); });
  expect_golden_loss("llama", ckpt, dir, "", "llama_rope");
  // Absent, rms_norm_eps is LlamaConfig's default 1e-6; rope_theta 10000 stays out of the spec.
  edit_config(ckpt, [](json& j) {
    j.erase("rms_norm_eps");
    j["rope_theta"] = 10000.0;
  });
  const fs::path w = dir / "w2.safetensors";
  const CmdResult r = convert("--from llama " + ckpt.string() + " --out " + w.string());
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("model: llama:layers=2,heads=4,kv_heads=2,width=32,ffn=48,context=16,vocab=64,norm_eps=1e-06\n"),
            std::string::npos) << r.out;
  fs::remove_all(dir);
}

TEST(Convert, Gpt2WithPrefixAndSavedHead) {
  const fs::path dir = temp_dir("gpt2_prefix");
  const fs::path ckpt = copy_checkpoint("gpt2", dir);
  edit_weights(ckpt, [](RawTensors& ts) {
    RawTensors p;
    for (auto& [n, t] : ts) p["transformer." + n] = t;
    p["lm_head.weight"] = ts.at("wte.weight");
    ts = p;
  });
  const std::string out = expect_golden_loss("gpt2", ckpt, dir);
  EXPECT_NE(out.find("lm_head.weight: equal to wte.weight"), std::string::npos) << out;
  fs::remove_all(dir);
}

// Without config.json the shapes give the sizes; the heads (and Llama's context) are flags.
TEST(Convert, WithoutConfigTheHeadsAreAFlag) {
  const fs::path dir = temp_dir("noconfig");
  for (const std::string family : {"gpt2", "llama"}) {
    const fs::path sub = dir / family, ckpt = copy_checkpoint(family, sub);
    fs::remove(ckpt / "config.json");
    const fs::path out = sub / "w.safetensors";
    const std::string file = (ckpt / "model.safetensors").string();
    expect_refused(convert(sat::str_cat("--from ", family, " ", file, " --out ", out.string())), "expected --heads H",
                   out);
    if (family == "llama")
      expect_refused(convert(sat::str_cat("--from llama ", file, " --heads 4 --out ", out.string())),
                     "expected --context T", out);
    expect_golden_loss(family, file, sub, family == "gpt2" ? " --heads 4" : " --heads 4 --context 16");
  }
  fs::remove_all(dir);
}

TEST(Convert, UnknownFamily) {
  const fs::path dir = temp_dir("family");
  const fs::path out = dir / "w.safetensors";
  expect_refused(convert(sat::str_cat("--from gpt3 ", kSource, "/tests/hf/gpt2 --out ", out.string())),
                 "--from: unknown model family 'gpt3' (expected gpt2 or llama)", out);
  fs::remove_all(dir);
}

TEST(Convert, PyTorchPickleIsRefusedWithHowToResave) {
  const fs::path dir = temp_dir("pickle");
  const fs::path ckpt = dir / "ckpt", out = dir / "w.safetensors";
  fs::create_directories(ckpt);
  std::ofstream(ckpt / "pytorch_model.bin") << "PK\x03\x04 a zip archive";
  expect_refused(convert("--from gpt2 " + ckpt.string() + " --out " + out.string()),
                 (ckpt / "pytorch_model.bin").string() + " is a PyTorch pickle", out);
  const CmdResult r = convert("--from gpt2 " + ckpt.string() + " --out " + out.string());
  EXPECT_NE(r.out.find("from safetensors.torch import save_file"), std::string::npos) << r.out;
  // A pickle under the safetensors name, found by its first bytes.
  fs::rename(ckpt / "pytorch_model.bin", ckpt / "model.safetensors");
  expect_refused(convert("--from gpt2 " + ckpt.string() + " --out " + out.string()), "is a PyTorch pickle", out);
  fs::remove_all(dir);
}

TEST(Convert, MissingTensor) {
  expect_gpt2_refused("missing", [](const fs::path& c) {
    edit_weights(c, [](RawTensors& ts) { ts.erase("h.1.mlp.c_fc.bias"); });
  }, "model.safetensors: tensor 'h.1.mlp.c_fc.bias' is missing (gpt:layers=2,heads=4,width=32,context=16,vocab=64 "
     "needs transformer.h.1.mlp.c_fc.bias [128])");
  expect_gpt2_refused("missing_llama", [](const fs::path& c) {
    edit_weights(c, [](RawTensors& ts) { ts.erase("model.layers.0.self_attn.k_proj.weight"); });
  }, "tensor 'model.layers.0.self_attn.k_proj.weight' is missing", "llama");
}

TEST(Convert, UnexpectedTensor) {
  expect_gpt2_refused("extra", [](const fs::path& c) {
    edit_weights(c, [](RawTensors& ts) { ts["h.2.ln_1.weight"] = ts.at("h.1.ln_1.weight"); });
  }, "model.safetensors: unexpected tensor 'h.2.ln_1.weight' (gpt:layers=2,heads=4,width=32,context=16,vocab=64 has "
     "no parameter transformer.h.2.ln_1.weight)");
  expect_gpt2_refused("extra_llama", [](const fs::path& c) {
    edit_weights(c, [](RawTensors& ts) { ts["model.layers.0.self_attn.q_proj.bias"] = ts.at("model.norm.weight"); });
  }, "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'", "llama");
}

TEST(Convert, WrongShape) {
  // c_attn stored as nn.Linear's [out, in] instead of Conv1D's [in, out].
  expect_gpt2_refused("shape", [](const fs::path& c) {
    edit_weights(c, [](RawTensors& ts) { ts.at("h.0.attn.c_attn.weight").shape = {96, 32}; });
  }, "model.safetensors: tensor 'h.0.attn.c_attn.weight' has shape [96, 32], expected [32, 96] (Conv1D's [in, out])");
  // A vocabulary that is not config.json's.
  expect_gpt2_refused("vocab", [](const fs::path& c) { edit_config(c, [](json& j) { j["vocab_size"] = 65; }); },
                      "tensor 'wte.weight' has shape [64, 32], expected [65, 32]");
}

TEST(Convert, SettingsSaturateCannotExpress) {
  expect_gpt2_refused("act", [](const fs::path& c) {
    edit_config(c, [](json& j) { j["activation_function"] = "relu"; });
  }, "config.json: 'activation_function' is 'relu', which saturate's gpt cannot express");
  expect_gpt2_refused("eps", [](const fs::path& c) {
    edit_config(c, [](json& j) { j["layer_norm_epsilon"] = 1e-6; });
  }, "config.json: 'layer_norm_epsilon' is 1e-06");
  expect_gpt2_refused("rms", [](const fs::path& c) { edit_config(c, [](json& j) { j["rms_norm_eps"] = 0.0; }); },
                      "config.json: 'rms_norm_eps' is 0, which saturate's llama cannot express: its RMSNorm eps is a "
                      "positive float", "llama");
  expect_gpt2_refused("theta", [](const fs::path& c) { edit_config(c, [](json& j) { j["rope_theta"] = 1.0; }); },
                      "config.json: 'rope_theta' is 1, which saturate's llama cannot express: its rotary embeddings' "
                      "theta is a float above 1", "llama");
  expect_gpt2_refused("scaling", [](const fs::path& c) {
    edit_config(c, [](json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; });
  }, "'rope_scaling' is {", "llama");
  expect_gpt2_refused("type", [](const fs::path& c) { edit_config(c, [](json& j) { j["model_type"] = "llama"; }); },
                      "model_type 'llama', expected gpt2 (--from gpt2)");
}

TEST(Convert, UntiedGpt2HeadIsRefused) {
  expect_gpt2_refused("untied", [](const fs::path& c) {
    edit_weights(c, [](RawTensors& ts) {
      RawTensor head = ts.at("wte.weight");
      head.bytes[0] ^= 1;
      ts["lm_head.weight"] = head;
    });
  }, "lm_head.weight differs from wte.weight");
}

TEST(Convert, NothingSavedIsLostOnARefusal) {
  const fs::path dir = temp_dir("keep");
  const fs::path ckpt = copy_checkpoint("gpt2", dir), out = dir / "w.safetensors";
  std::ofstream(out) << "earlier weights";
  edit_weights(ckpt, [](RawTensors& ts) { ts.erase("ln_f.bias"); });
  const CmdResult r = convert("--from gpt2 " + ckpt.string() + " --out " + out.string());
  EXPECT_EQ(r.status, 2) << r.out;
  std::stringstream kept;
  kept << std::ifstream(out).rdbuf();
  EXPECT_EQ(kept.str(), "earlier weights");
  // The checkpoint itself is never the output.
  const CmdResult same = convert("--from llama " + copy_checkpoint("llama", dir, "l").string() + " --out " +
                                 (dir / "l" / "model.safetensors").string());
  EXPECT_EQ(same.status, 2) << same.out;
  EXPECT_NE(same.out.find("that is the checkpoint being read"), std::string::npos) << same.out;
  fs::remove_all(dir);
}

// save_pretrained's shards: model.safetensors.index.json names the file of each tensor.
TEST(Convert, ShardedCheckpoint) {
  const fs::path dir = temp_dir("sharded");
  const fs::path ckpt = copy_checkpoint("llama", dir);
  RawTensors all = read_raw(ckpt / "model.safetensors"), first, second;
  json map = json::object();
  for (auto& [name, t] : all) {
    const bool one = name.find("layers.1.") == std::string::npos;
    (one ? first : second)[name] = t;
    map[name] = one ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  }
  fs::remove(ckpt / "model.safetensors");
  write_raw(ckpt / "model-00001-of-00002.safetensors", first);
  write_raw(ckpt / "model-00002-of-00002.safetensors", second);
  std::ofstream(ckpt / "model.safetensors.index.json") << json{{"metadata", json::object()}, {"weight_map", map}};
  expect_golden_loss("llama", ckpt, dir);
  // A tensor in two shards, and an index that is not one.
  write_raw(ckpt / "model-00002-of-00002.safetensors", all);
  const fs::path out = dir / "w2.safetensors";
  expect_refused(convert("--from llama " + ckpt.string() + " --out " + out.string()),
                 "model-00002-of-00002.safetensors: tensor 'model.embed_tokens.weight' is in", out);
  std::ofstream(ckpt / "model.safetensors.index.json") << "{}";
  expect_refused(convert("--from llama " + ckpt.string() + " --out " + out.string()),
                 "model.safetensors.index.json: expected a JSON object with a weight_map", out);
  fs::remove_all(dir);
}
