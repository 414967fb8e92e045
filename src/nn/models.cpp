#include "nn/models.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/text.h"
#include "nn/blocks.h"
#include "nn/model_file.h"
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
#include "nn/layers/ring_self_attention.h"
#include "nn/layers/rmsnorm.h"
#include "nn/layers/rotary.h"
#include "nn/layers/swiglu.h"
#include "nn/layers/tensor_parallel.h"

namespace sat {

namespace {

// The hidden layers an mlp splits under tensor parallelism, in pairs as Megatron-LM splits
// a transformer's MLP: fc i column-parallel for odd i < k (k hidden layers), fc i+1
// row-parallel; an odd last hidden layer and the output layer stay whole.
LinearTP::Split mlp_split(size_t i, size_t hidden) {  // i: fc i, from 1
  if (i % 2 == 1 && i < hidden) return LinearTP::Split::column;
  if (i % 2 == 0 && i <= hidden) return LinearTP::Split::row;
  return LinearTP::Split::none;
}

void check_mlp_tensor_parallel(const ModelConfig& c, int tp, bool sp) {
  SAT_CHECK(!sp, "--sequence-parallel: ", c.name, " has no sequence to split (it applies to the GPT models)");
  const size_t hidden = c.mlp_widths.size() - 2;
  for (size_t i = 1; i <= hidden; ++i)
    SAT_CHECK(mlp_split(i, hidden) != LinearTP::Split::column || c.mlp_widths[i] % tp == 0, "--tp ", tp, ": ",
              c.name, "'s hidden width ", c.mlp_widths[i], " (fc", i, "'s output, split by columns) does not divide by ",
              tp);
}

void check_gpt_tensor_parallel(const ModelConfig& c, int tp, bool sp) {
  SAT_CHECK(c.n_head % tp == 0, "--tp ", tp, ": ", c.name, " has ", c.n_head,
            " attention heads, which do not divide by ", tp, " (each rank computes n_head / tp whole heads)");
  const int64_t unit = 128 * int64_t(tp), padded = (c.vocab + unit - 1) / unit * unit;
  SAT_CHECK(c.vocab % tp == 0, "--tp ", tp, ": ", c.name, "'s vocabulary of ", c.vocab, " tokens does not divide by ",
            tp, " (the embedding and output head are split by vocabulary): pad it, as Megatron-LM does, with --vocab ",
            padded);
  // The window is what is split (the graph's T), not the context.
  SAT_CHECK(!sp || c.seq_len % tp == 0, "--sequence-parallel: ", c.name, "'s sequence length ", c.seq_len,
            c.seq_len < c.context ? " (--seq-len)" : "", " does not divide by --tp ", tp);
}

// A model file's layers check their own splits: one rank's graph is built for one sample.
void check_file_tensor_parallel(const ModelConfig& c, int tp, bool sp) {
  SAT_CHECK(!sp || c.tokens, "--sequence-parallel: ", c.name, " has no token sequence to split");
  SAT_CHECK(!sp || c.seq_len % tp == 0, "--sequence-parallel: ", c.name, "'s sequence length ", c.seq_len,
            " does not divide by --tp ", tp);
  ModelConfig one = c;
  one.tp = tp, one.tp_rank = 0, one.sequence_parallel = sp;
  try {
    build_model(one, 1);
  } catch (const Error& e) {
    if (std::string(e.what()).find("--tp") != std::string::npos) throw;
    fail("--tp ", tp, ": ", e.what());
  }
}

// GPT's conditions, and the key/value heads and the SwiGLU width also split over the ranks.
void check_llama_tensor_parallel(const ModelConfig& c, int tp, bool sp) {
  check_gpt_tensor_parallel(c, tp, sp);
  SAT_CHECK(!sp || c.experts == 0, "--sequence-parallel: ", c.name, "'s moe layers route every token of the "
            "sequence on each tensor-parallel rank (their experts are not split by --tp); leave "
            "--sequence-parallel out");
  SAT_CHECK(c.n_kv_head % tp == 0, "--tp ", tp, ": ", c.name, " has ", c.n_kv_head, " key/value heads, which do not "
            "divide by ", tp, " (each rank computes n_kv_head / tp of them with their query heads)");
  SAT_CHECK(c.experts > 0 || c.ffn % tp == 0, "--tp ", tp, ": ", c.name, "'s MLP width ffn=", c.ffn, " (gate_proj's and up_proj's "
            "output, split by columns) does not divide by ", tp);
}

}  // namespace

bool has_tensor_parallel_form(const ModelConfig& c) {
  if (c.family == ModelFamily::file) return file_has_tensor_parallel(*c.file);
  return c.family == ModelFamily::gpt || c.family == ModelFamily::llama ||
         (c.family == ModelFamily::mlp && c.mlp_widths.size() >= 4);
}

void check_tensor_parallel(const ModelConfig& c, int tp, bool sp) {
  SAT_CHECK(tp >= 1, "--tp: expected a positive tensor-parallel size, got ", tp);
  SAT_CHECK(!sp || tp >= 2, "--sequence-parallel needs --tp 2 or more (it splits the tensor-parallel group's "
            "LayerNorm and dropout regions along the sequence)");
  if (tp == 1) return;
  SAT_CHECK(has_tensor_parallel_form(c), "--tp ", tp, ": ", c.name, " has no tensor-parallel form (models with one: "
            "mlp with two hidden layers or more, such as mlp, gpt, such as gpt-mini and gpt2-124m, llama and moe; use "
            "--tp 1, or --pp / data parallelism)");
  if (c.family == ModelFamily::mlp) check_mlp_tensor_parallel(c, tp, sp);
  else if (c.family == ModelFamily::gpt) check_gpt_tensor_parallel(c, tp, sp);
  else if (c.family == ModelFamily::llama) check_llama_tensor_parallel(c, tp, sp);
  else check_file_tensor_parallel(c, tp, sp);
}

void check_expert_parallel(const ModelConfig& c, int ep) {
  SAT_CHECK(ep >= 1, "--ep: expected a positive expert-parallel size, got ", ep);
  if (ep == 1) return;
  SAT_CHECK(c.family != ModelFamily::file, "--ep ", ep, ": ", c.name, " is a model file, whose moe layers have no "
            "expert-parallel form yet (the moe: family has one); leave --ep out");
  SAT_CHECK(c.family == ModelFamily::llama && c.experts > 0, "--ep ", ep, ": ", c.name, " has no experts (expert "
            "parallelism splits the experts of a moe: model's layers, e.g. moe:layers=2,heads=4,width=64,experts=8,"
            "top_k=2,context=32,vocab=256); leave --ep out");
  SAT_CHECK(c.experts % ep == 0, "--ep ", ep, ": the ", c.experts, " experts of ", c.name, " do not split evenly "
            "over ", ep, " ranks (expected a divisor of ", c.experts, ")");
}

void check_context_parallel(const ModelConfig& c, int cp, int tp, bool sp) {
  SAT_CHECK(cp >= 1, "--cp: expected a positive context-parallel size, got ", cp);
  if (cp == 1) return;
  const bool dense = c.family == ModelFamily::gpt || (c.family == ModelFamily::llama && c.experts == 0);
  SAT_CHECK(c.family != ModelFamily::llama || dense, "--cp ", cp, ": ", c.name, " is a mixture of experts, whose "
            "routing is not split by context parallelism yet (--cp supports the gpt and llama families; use --cp 1)");
  SAT_CHECK(dense, "--cp ", cp, ": ", c.name, " (", family_name(c.family), ") has no attention to split over its "
            "sequence (context parallelism splits the gpt and llama families' sequences; use --cp 1)");
  SAT_CHECK(c.seq_len % (2 * int64_t(cp)) == 0, "--cp ", cp, ": ", c.name, "'s sequence length ", c.seq_len,
            c.seq_len < c.context ? " (--seq-len)" : "", " does not divide by 2 x --cp = ", 2 * cp,
            " (each rank holds two equal chunks of every sequence)");
  SAT_CHECK(!sp || (c.seq_len / cp) % tp == 0, "--sequence-parallel with --cp ", cp, ": a rank's ", c.seq_len / cp,
            " tokens of each sequence do not divide by --tp ", tp);
}

namespace {
constexpr Named<Recompute> kRecompute[] = {
    {"none", Recompute::none}, {"selective", Recompute::selective}, {"full", Recompute::full}};
}  // namespace

Recompute parse_recompute(const std::string& s, std::string_view setting) {
  if (auto r = find_named(s, kRecompute)) return *r;
  fail(setting, ": unknown mode '", s, "' (expected ", choice_list(kRecompute), ")");
}

const char* recompute_name(Recompute r) { return name_of(r, kRecompute); }

void check_recompute(const ModelConfig& c) {
  if (c.recompute == Recompute::none) return;
  const std::string mode = recompute_name(c.recompute);
  if (c.family == ModelFamily::file) {
    const bool ok = c.recompute == Recompute::full ? file_has_recompute_units(*c.file) : file_has_attention(*c.file);
    SAT_CHECK(ok, "--recompute ", mode, ": ", c.name, " has no ", c.recompute == Recompute::full ?
              "recompute units (the composites transformer_block and basic_block are)" : "attention to recompute");
    return;
  }
  const bool attention = c.family == ModelFamily::gpt || c.family == ModelFamily::llama;
  const bool resnet = c.family == ModelFamily::resnet;
  if (c.recompute == Recompute::selective)
    SAT_CHECK(attention, "--recompute selective: ", c.name, " has no attention to recompute (models with attention: "
              "gpt, such as gpt-mini and gpt2-124m, and llama; resnet supports --recompute full)");
  SAT_CHECK(attention || resnet, "--recompute ", mode, ": ", c.name, " has no recomputable blocks (--recompute full: "
            "gpt, llama and resnet, such as gpt-mini, gpt2-124m and resnet18; selective: gpt and llama)");
}

void set_seq_len(ModelConfig& c, int64_t T) {
  if (T == 0) return;
  SAT_CHECK(c.tokens, "--seq-len applies to the GPT models only, not --model ", c.name);
  SAT_CHECK(T >= 1 && T <= c.context, "--seq-len: expected a window of 1 to ", c.context, " tokens (", c.name,
            "'s context), got ", T);
  c.seq_len = T;
}

namespace {

// flatten, then per hidden width i fc i and relu i, then the output layer fc k+1. Tensor
// parallel (tp > 1): the hidden layers in pairs (mlp_split), a column-parallel fc whose
// input takes a gradient entered through a TPCopy (fc1's, the images, takes none), a
// row-parallel one completed by an all-reduce.
void build_mlp(BuiltModel& m, Graph& g) {
  const auto& c = m.config;
  const std::vector<int64_t>& w = c.mlp_widths;
  SAT_CHECK(w.size() >= 2 && w.front() == c.image.numel(), "--model ", c.name, " takes inputs of ", w.front(),
            " values, but the data's samples have shape ", c.image.str(), " (", c.image.numel(), " values)");
  SAT_CHECK(w.back() == c.classes, "internal error: ", c.name, " has ", w.back(), " outputs but ", c.classes,
            " classes");
  const TPRank tp{c.tp, c.tp_rank};
  const size_t hidden = w.size() - 2;
  // Every layer is a block, as nn.Sequential's children are for PyTorch's pipelining.
  g.begin_block();
  int x = g.add<Flatten>("flatten", {m.x});
  for (size_t i = 1; i <= hidden; ++i) {
    const std::string fc = "fc" + std::to_string(i);
    const LinearTP::Split split = mlp_split(i, hidden);
    g.begin_block();
    if (split == LinearTP::Split::column && i > 1 && tp.on()) x = g.add<TPCopy>(fc + ".copy", {x}, tp);
    x = g.add<Linear>(fc, {x}, w[i - 1], w[i], true, std::nullopt, std::nullopt, "", LinearTP{split, tp});
    if (split == LinearTP::Split::row && tp.on()) x = g.add<TPAllReduce>(fc + ".all_reduce", {x}, tp);
    g.begin_block();
    x = g.add<ReLU>("relu" + std::to_string(i), {x});
  }
  g.begin_block();
  m.logits = g.add<Linear>("fc" + std::to_string(hidden + 1), {x}, w[hidden], w[hidden + 1]);
}

void build_convnet(BuiltModel& m, Graph& g) {
  const auto& c = m.config;
  int64_t C = c.image[0], H = c.image[1], W = c.image[2];
  SAT_CHECK(H >= 4 && W >= 4, "--model convnet needs images of at least 4x4, got ", c.image.str());
  // Every layer is a block (a plain stack, like nn.Sequential).
  auto block = [&](auto&& add_layer) {
    g.begin_block();
    return add_layer();
  };
  int x = block([&] { return g.add<Conv2d>("conv1", {m.x}, C, 32, 3, 1, 1, false); });
  x = block([&] { return g.add<BatchNorm2d>("bn1", {x}, 32); });
  x = block([&] { return g.add<ReLU>("relu1", {x}); });
  x = block([&] { return g.add<MaxPool2d>("pool1", {x}, 2); });
  x = block([&] { return g.add<Conv2d>("conv2", {x}, 32, 64, 3, 1, 1, false); });
  x = block([&] { return g.add<BatchNorm2d>("bn2", {x}, 64); });
  x = block([&] { return g.add<ReLU>("relu2", {x}); });
  x = block([&] { return g.add<MaxPool2d>("pool2", {x}, 2); });
  x = block([&] { return g.add<Flatten>("flatten", {x}); });
  x = block([&] { return g.add<Linear>("fc1", {x}, 64 * (H / 4) * (W / 4), 128); });
  x = block([&] { return g.add<ReLU>("relu3", {x}); });
  m.logits = block([&] { return g.add<Linear>("fc2", {x}, 128, c.classes); });
}

// torchvision's BasicBlock ResNets with a CIFAR stem (3x3 conv, stride 1, no max-pool).
void build_resnet(BuiltModel& m, Graph& g) {
  const auto& c = m.config;
  SAT_CHECK(c.resnet_depth == 18 || c.resnet_depth == 34, "--model ", c.name, ": expected a depth of 18 or 34, got ",
            c.resnet_depth);
  const int64_t C = c.image[0];
  const int per_stage[2][4] = {{2, 2, 2, 2}, {3, 4, 6, 3}};
  const int* blocks = per_stage[c.resnet_depth == 18 ? 0 : 1];
  // Blocks: the stem, each BasicBlock (a recompute unit), the head.
  g.begin_block();
  int x = add_conv_bn(g, "conv1", "bn1", m.x, C, 64, 3, 1, 1);
  x = g.add<ReLU>("relu", {x});
  int64_t cin = 64;
  const int64_t widths[4] = {64, 128, 256, 512};
  for (int l = 0; l < 4; ++l) {
    for (int b = 0; b < blocks[l]; ++b) {
      const int64_t w = widths[l], stride = (l > 0 && b == 0) ? 2 : 1;
      g.begin_block();
      x = add_basic_block(g, "layer" + std::to_string(l + 1) + "." + std::to_string(b), x, cin, w, stride);
      cin = w;
    }
  }
  g.begin_block();
  x = g.add<AdaptiveAvgPool2d>("avgpool", {x}, 1, 1);
  x = g.add<Flatten>("flatten", {x});
  m.logits = g.add<Linear>("fc", {x}, 512, c.classes);
}

// nanoGPT's GPT-2: pre-LayerNorm blocks, learned positions, tied lm_head, N(0, 0.02)
// init with the residual projections scaled by 1/sqrt(2 * n_layer). Tensor parallel as
// Megatron-LM: a vocabulary-parallel embedding and head, per block qkv column-parallel
// (stride 3: each rank holds its n_head / tp heads' q, k and v) and the attention
// projection row-parallel, the MLP's c_fc column- and c_proj row-parallel.
void build_gpt(BuiltModel& m, Graph& g) {
  const auto& c = m.config;
  TokenRegions region = token_regions(g, c, m.x_shape);
  // Blocks: the transformer layers (Megatron's); the embedding belongs to the first and
  // the final LayerNorm and output head to the last.
  g.begin_block();
  int x = add_gpt_embedding(g, region, "transformer", m.x, c.vocab, c.context, c.n_embd, c.dropout);
  const TransformerBlock block{c.n_head, c.dropout, c.n_layer, c.recompute == Recompute::selective};
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (l > 0) g.begin_block();
    x = add_transformer_block(g, region, "transformer.h." + std::to_string(l), x, block);
  }
  x = g.add<LayerNorm>("transformer.ln_f", {x}, c.n_embd, 1e-5f, region.sp);
  x = region.enter("lm_head", x);
  const LinearTP col{LinearTP::Split::column, region.tp};
  m.logits = g.add<Linear>("lm_head", {x}, c.n_embd, c.vocab, false, ParamInit::normal(0.02f), ParamInit::zeros(),
                           "transformer.wte.weight", col);
}

// HuggingFace's LlamaForCausalLM (parameter names included, so safetensors interchange):
// per layer RMSNorm, q/k/v projections without bias (separate Linears, as HF's q_proj,
// k_proj, v_proj), rotary embeddings on q and k, grouped-query causal attention, o_proj,
// residual add; RMSNorm, SwiGLU MLP (gate_proj, up_proj, down_proj), residual add; a final
// RMSNorm and an untied lm_head. Every weight N(0, 0.02) (HF's initializer_range), the
// norms ones; RMSNorm eps and rope theta from the config (1e-5 and 10000 unless given:
// Llama 2's). Blocks, recompute units
// and tensor-parallel regions as build_gpt's: embed_tokens vocabulary-parallel, q/k/v,
// gate and up column-parallel (each rank: n_head / tp query heads, n_kv_head / tp kv heads,
// ffn / tp features), o_proj and down_proj row-parallel, lm_head vocabulary-parallel. The
// moe family's mixture-of-experts layers (router, experts, shared experts) are not split:
// every tensor-parallel rank computes them whole on the same tokens (no sequence parallelism).
void build_llama(BuiltModel& m, Graph& g) {
  const auto& c = m.config;
  const int64_t C = c.n_embd, hs = C / c.n_head, F = c.ffn;
  TokenRegions region = token_regions(g, c, m.x_shape);
  const TPRank tp = region.tp;
  const bool sp = region.sp;
  const LinearTP col{LinearTP::Split::column, tp}, row{LinearTP::Split::row, tp};
  const ParamInit w02 = ParamInit::normal(0.02f);
  auto linear = [&](const std::string& name, int x, int64_t in, int64_t out, const LinearTP& split) {
    return g.add<Linear>(name, {x}, in, out, false, w02, std::nullopt, "", split);
  };
  g.begin_block();
  int x = g.add<Embedding>("model.embed_tokens", {m.x}, c.vocab, C, w02, tp);
  x = region.leave("model.embed_tokens", x);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (l > 0) g.begin_block();
    g.begin_recompute();
    int h = g.add<RMSNorm>(p + "input_layernorm", {x}, C, c.norm_eps, sp);
    h = region.enter(p + "self_attn", h);
    int q = linear(p + "self_attn.q_proj", h, C, c.n_head * hs, col);
    int k = linear(p + "self_attn.k_proj", h, C, c.n_kv_head * hs, col);
    const int v = linear(p + "self_attn.v_proj", h, C, c.n_kv_head * hs, col);
    q = g.add<Rotary>(p + "self_attn.rotary_q", {q}, hs, c.rope_theta, c.cp, c.cp_rank);
    k = g.add<Rotary>(p + "self_attn.rotary_k", {k}, hs, c.rope_theta, c.cp, c.cp_rank);
    if (c.cp > 1)
      h = g.add<RingSelfAttention>(p + "self_attn.attn", {q, k, v}, c.n_head / tp.parts, c.n_kv_head / tp.parts, c.cp,
                                   c.cp_rank);
    else
      h = g.add<CausalSelfAttention>(p + "self_attn.attn", {q, k, v}, c.n_head / tp.parts,
                                     c.recompute == Recompute::selective, c.n_kv_head / tp.parts);
    h = linear(p + "self_attn.o_proj", h, c.n_head * hs, C, row);
    h = region.leave(p + "self_attn", h);
    x = g.add<Add>(p + "add1", {x, h});
    h = g.add<RMSNorm>(p + "post_attention_layernorm", {x}, C, c.norm_eps, sp);
    if (c.experts > 0) {  // replicated over the tensor-parallel ranks: every rank routes every token
      const MoeBlock mb{C, c.experts, c.top_k, F, c.shared_experts, double(c.capacity), c.aux_coef, c.ep, c.ep_rank};
      h = add_moe_block(g, p + "mlp", h, mb, m.aux_losses);
    } else {
      h = region.enter(p + "mlp", h);
      const int gate = linear(p + "mlp.gate_proj", h, C, F, col);
      const int up = linear(p + "mlp.up_proj", h, C, F, col);
      h = g.add<SwiGLU>(p + "mlp.act_fn", {gate, up});
      h = linear(p + "mlp.down_proj", h, F, C, row);
      h = region.leave(p + "mlp", h);
    }
    x = g.add<Add>(p + "add2", {x, h});
    g.end_recompute();
  }
  x = g.add<RMSNorm>("model.norm", {x}, C, c.norm_eps, sp);
  x = region.enter("lm_head", x);
  m.logits = linear("lm_head", x, C, c.vocab, col);
}

}  // namespace

namespace {
std::map<std::string, int>& builds() {
  static std::map<std::string, int> b;
  return b;
}

void report_builds() {
  for (const auto& [key, n] : builds()) std::fprintf(stderr, "graph built %d time(s): %s\n", n, key.c_str());
}

void count_build(const ModelConfig& cfg, int64_t B, bool training, const std::vector<std::pair<int, int>>& stage) {
  static const bool report = [] {
    const char* e = std::getenv("SAT_REPORT_GRAPH_BUILDS");
    (void)builds();  // constructed before the handler is registered, so destroyed after it runs
    return e && std::string(e) == "1" && std::atexit(report_builds) == 0;
  }();
  (void)report;
  std::string key = str_cat(cfg.name, " batch ", B, training ? " training" : " inference", " ",
                            cfg.device == Device::cuda ? "cuda" : "cpu", " ", dtype_name(cfg.act), " tp ", cfg.tp,
                            "/", cfg.tp_rank, cfg.sequence_parallel ? " sp" : "",
                            cfg.cp > 1 ? str_cat(" cp ", cfg.cp, "/", cfg.cp_rank) : std::string(), " recompute ",
                            recompute_name(cfg.recompute), " nodes");
  for (auto [a, b] : stage) key += str_cat(" ", a, "-", b);
  if (stage.empty()) key += " all";
  ++builds()[key];
}
}  // namespace

const std::map<std::string, int>& graph_builds() { return builds(); }

int64_t estimated_nodes(const ModelConfig& cfg) {
  switch (cfg.family) {
    case ModelFamily::gpt:
    case ModelFamily::llama: return cfg.n_layer * kNodesPerBlock + kNodesPerBlock;
    case ModelFamily::mlp: return int64_t(cfg.mlp_widths.size()) * 4;
    case ModelFamily::file: return cfg.file ? int64_t(cfg.file->layers.size()) + 4 : 0;
    case ModelFamily::convnet:
    case ModelFamily::resnet: return 256;
  }
  return 0;
}

void check_graph_fits_host(const ModelConfig& cfg) {
  const double need = double(estimated_nodes(cfg)) * double(kHostBytesPerNode);
  const double avail = double(host_available_memory());
  SAT_CHECK(avail == 0 || need <= avail / 2, "--model ", cfg.name, ": its graph of about ", estimated_nodes(cfg),
            " layer nodes needs about ", format_bytes(need), " of host memory to build and plan (",
            kHostBytesPerNode >> 10, " KiB a node), more than half of the ", format_bytes(avail),
            " this machine has available; expected a smaller model");
}

BuiltModel build_model(const ModelConfig& cfg, int64_t B, bool training, const std::vector<std::pair<int, int>>& stage) {
  SAT_CHECK(B >= 1, "--batch must be at least 1, got ", B);
  count_build(cfg, B, training, stage);
  const bool file = cfg.family == ModelFamily::file;
  if (!file) check_tensor_parallel(cfg, cfg.tp, cfg.sequence_parallel);  // a file's layers check it as they are built
  check_context_parallel(cfg, cfg.cp, cfg.tp, cfg.sequence_parallel);
  check_recompute(cfg);
  check_graph_fits_host(cfg);
  BuiltModel m;
  m.config = cfg;
  m.graph = std::make_unique<Graph>(training, cfg.act, cfg.device);
  Graph& g = *m.graph;
  g.set_recompute(training && cfg.recompute == Recompute::full);
  if (!stage.empty()) g.keep_nodes(stage);
  if (file) {
    std::vector<int64_t> dims{B};
    for (int64_t d : cfg.file->inputs[0].shape.vec()) dims.push_back(d);
    if (cfg.tokens) dims = {B, cfg.seq_len};  // the window (--seq-len), the file's length by default
    m.x_shape = Shape(dims);
    m.y_shape = cfg.tokens ? Shape{B, cfg.seq_len} : Shape{B};
    m.x_dtype = cfg.file->inputs[0].dtype;
  } else if (cfg.tokens) {
    m.x_shape = Shape{B, cfg.seq_len / cfg.cp};  // --cp: this rank's two chunks of each sequence
    m.y_shape = m.x_shape;
    m.x_dtype = DType::i32;
  } else {
    m.x_shape = Shape{B, cfg.image[0], cfg.image[1], cfg.image[2]};
    m.y_shape = Shape{B};
  }
  m.x = g.input(file ? cfg.file->inputs[0].name : "x", m.x_shape, m.x_dtype);
  m.y = g.input(file ? cfg.file->inputs[1].name : "y", m.y_shape, DType::i32);
  switch (cfg.family) {
    case ModelFamily::mlp: build_mlp(m, g); break;
    case ModelFamily::convnet: build_convnet(m, g); break;
    case ModelFamily::resnet: build_resnet(m, g); break;
    case ModelFamily::gpt: build_gpt(m, g); break;
    case ModelFamily::llama: build_llama(m, g); break;
    case ModelFamily::file: build_from_file(m, g); break;
  }
  if (file) {
    m.loss = add_aux_losses(g, m.loss, m.aux_losses);
    g.finish();
    g.set_logits(m.logits);
    g.set_loss(m.loss);
    return m;
  }
  m.loss = g.add<CrossEntropy>("loss", {m.logits, m.y}, cfg.tokens ? TPRank{cfg.tp, cfg.tp_rank} : TPRank{});
  m.loss = add_aux_losses(g, m.loss, m.aux_losses);  // moe: plus the load-balancing losses
  g.finish();
  g.set_logits(m.logits);
  g.set_loss(m.loss);
  return m;
}

double train_flops_per_sample(const BuiltModel& m, int64_t batch) {
  return (m.graph->flops_forward() + m.graph->flops_backward()) / double(batch);
}

double recompute_flops(const Graph& g) {
  double f = 0;
  for (const Node& n : g.nodes()) {
    if (!g.training()) break;
    if (n.rc_first >= 0) {
      f += n.setup.flops_fwd;
    } else if (auto* a = dynamic_cast<const CausalSelfAttention*>(&n.layer->unwrapped()); a && a->recompute()) {
      f += n.setup.flops_fwd / 2;  // q k^T of the two products
    }
  }
  return f;
}

}  // namespace sat
