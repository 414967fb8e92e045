#include "nn/blocks.h"

#include <cmath>

#include "nn/layers/activation.h"
#include "nn/layers/attention.h"
#include "nn/layers/batchnorm.h"
#include "nn/layers/conv2d.h"
#include "nn/layers/elementwise.h"
#include "nn/layers/embedding.h"
#include "nn/layers/layernorm.h"
#include "nn/layers/linear.h"
#include "nn/layers/moe.h"
#include "nn/layers/ring_self_attention.h"
#include "nn/layers/swiglu.h"
#include "nn/layers/tensor_parallel.h"

namespace sat {

int TokenRegions::enter(const std::string& name, int x) {
  if (!tp.on()) return x;
  if (!sp) return g.add<TPCopy>(name + ".copy", {x}, tp);
  // This rank's rows of the stream -> the whole [B, T, C].
  return g.add<TPAllGather>(name + ".all_gather", {x}, tp, Shape{tokens[0], tokens[1], g.value(x).spec.shape[-1]});
}

int TokenRegions::leave(const std::string& name, int x) {
  if (!tp.on()) return x;
  return sp ? g.add<TPReduceScatter>(name + ".reduce_scatter", {x}, tp) : g.add<TPAllReduce>(name + ".all_reduce", {x}, tp);
}

TokenRegions token_regions(Graph& g, const ModelConfig& c, const Shape& x_shape) {
  const TPRank tp{c.tp, c.tp_rank};
  return TokenRegions{g, tp, tp.on() && c.sequence_parallel, x_shape, c.cp, c.cp_rank};
}

int add_gpt_embedding(Graph& g, TokenRegions& r, const std::string& name, int x, int64_t vocab, int64_t context,
                      int64_t width, float dropout) {
  x = g.add<GPTEmbedding>(name, {x}, vocab, context, width, 0.02f, r.tp, r.cp, r.cp_rank);
  x = r.leave(name, x);
  if (dropout > 0) x = g.add<Dropout>(name + ".drop", {x}, dropout, r.rows(), r.cp_rows());
  return x;
}

int add_transformer_block(Graph& g, TokenRegions& r, const std::string& prefix, int x, const TransformerBlock& b) {
  const std::string p = prefix + ".";
  const int64_t C = g.value(x).spec.shape[-1];
  const LinearTP col{LinearTP::Split::column, r.tp}, qkv{LinearTP::Split::column, r.tp, 3};
  const LinearTP row{LinearTP::Split::row, r.tp};
  const ParamInit w02 = ParamInit::normal(0.02f), zero = ParamInit::zeros();
  const ParamInit wproj = ParamInit::normal(0.02f / std::sqrt(2.0f * float(b.depth)));
  SAT_CHECK(b.heads % r.tp.parts == 0, p, "attn: ", b.heads, " attention heads do not divide by --tp ", r.tp.parts);
  g.begin_recompute();
  int h = g.add<LayerNorm>(p + "ln_1", {x}, C, 1e-5f, r.sp);
  h = r.enter(p + "attn", h);
  h = g.add<Linear>(p + "attn.c_attn", {h}, C, 3 * C, true, w02, zero, "", qkv);
  if (r.cp > 1)  // the whole sequence's attention through the ring (nothing T x T to recompute)
    h = g.add<RingSelfAttention>(p + "attn.attn", {h}, b.heads / r.tp.parts, 0, r.cp, r.cp_rank);
  else
    h = g.add<CausalSelfAttention>(p + "attn.attn", {h}, b.heads / r.tp.parts, b.selective);
  h = g.add<Linear>(p + "attn.c_proj", {h}, C, C, true, wproj, zero, "", row);
  h = r.leave(p + "attn", h);
  if (b.dropout > 0) h = g.add<Dropout>(p + "attn.resid_dropout", {h}, b.dropout, r.rows(), r.cp_rows());
  x = g.add<Add>(p + "add1", {x, h});
  h = g.add<LayerNorm>(p + "ln_2", {x}, C, 1e-5f, r.sp);
  h = r.enter(p + "mlp", h);
  h = g.add<Linear>(p + "mlp.c_fc", {h}, C, 4 * C, true, w02, zero, "", col);
  h = g.add<GELU>(p + "mlp.gelu", {h});
  h = g.add<Linear>(p + "mlp.c_proj", {h}, 4 * C, C, true, wproj, zero, "", row);
  h = r.leave(p + "mlp", h);
  if (b.dropout > 0) h = g.add<Dropout>(p + "mlp.dropout", {h}, b.dropout, r.rows(), r.cp_rows());
  x = g.add<Add>(p + "add2", {x, h});
  g.end_recompute();
  return x;
}

int add_conv_bn(Graph& g, const std::string& conv, const std::string& bn, int x, int64_t cin, int64_t cout, int64_t k,
                int64_t stride, int64_t pad) {
  // torchvision's ResNet init: kaiming_normal_(mode="fan_out", nonlinearity="relu").
  const ParamInit w = ParamInit::normal(std::sqrt(2.0f / float(cout * k * k)));
  x = g.add<Conv2d>(conv, {x}, cin, cout, k, stride, pad, false, w);
  return g.add<BatchNorm2d>(bn, {x}, cout);
}

int add_basic_block(Graph& g, const std::string& prefix, int x, int64_t cin, int64_t w, int64_t stride) {
  const std::string p = prefix + ".";
  g.begin_recompute();
  int h = add_conv_bn(g, p + "conv1", p + "bn1", x, cin, w, 3, stride, 1);
  h = g.add<ReLU>(p + "relu1", {h});
  h = add_conv_bn(g, p + "conv2", p + "bn2", h, w, w, 3, 1, 1);
  int shortcut = x;
  if (stride != 1 || cin != w) shortcut = add_conv_bn(g, p + "downsample.0", p + "downsample.1", x, cin, w, 1, stride, 0);
  x = g.add<Add>(p + "add", {h, shortcut});
  x = g.add<ReLU>(p + "relu2", {x});
  g.end_recompute();
  return x;
}

int add_moe_block(Graph& g, const std::string& name, int x, const MoeBlock& b, std::vector<int>& aux_losses) {
  const ParamInit w02 = ParamInit::normal(0.02f);
  const int logits = g.add<Linear>(name + ".gate", {x}, b.width, b.experts, false, w02, std::nullopt);
  if (b.aux_coef > 0) {
    // One running sum, carried from block to block beside the hidden state: a pipeline cut
    // then passes one value on, whatever the number of moe layers before it (a layer's own
    // loss read at the end of the model would cross several cuts at once).
    const int aux = g.add<MoeAux>(name + ".aux", {logits}, b.experts, b.top_k, b.aux_coef);
    if (aux_losses.empty()) aux_losses.push_back(aux);
    else aux_losses[0] = g.add<Add>(name + ".aux_sum", {aux_losses[0], aux});
  }
  const int y = g.add<Moe>(name, {x, logits}, b.experts, b.top_k, b.ffn, b.capacity, b.ep, b.ep_rank);
  if (b.shared == 0) return y;
  const int64_t S = b.shared * b.ffn;
  const std::string sp = name + ".shared_expert.";
  const int gate = g.add<Linear>(sp + "gate_proj", {x}, b.width, S, false, w02, std::nullopt);
  const int up = g.add<Linear>(sp + "up_proj", {x}, b.width, S, false, w02, std::nullopt);
  const int a = g.add<SwiGLU>(sp + "act_fn", {gate, up});
  const int d = g.add<Linear>(sp + "down_proj", {a}, S, b.width, false, w02, std::nullopt);
  return g.add<Add>(name + ".add_shared", {y, d});
}

int add_aux_losses(Graph& g, int loss, const std::vector<int>& aux_losses) {
  for (size_t i = 0; i < aux_losses.size(); ++i) loss = g.add<Add>(str_cat("loss.plus_aux.", i), {loss, aux_losses[i]});
  return loss;
}

}  // namespace sat
