// Mixture of experts: the feed-forward layer of a sparse transformer (Mixtral, DeepSeek-MoE,
// Qwen-MoE), and its auxiliary load-balancing loss.
//
// Routing (route_topk, shared by both layers), per token t with router logits l_t [E]:
//   p_t = softmax(l_t) over all E experts; the k experts of largest p (ties: lower index),
//   gate_tj = p_t,e_j / sum_i p_t,e_i  (renormalised over the k chosen, as Mixtral does;
//   with k == 1 every gate is 1 and the router learns from the auxiliary loss alone).
// Capacity: with capacity factor cf > 0 each expert takes at most
//   C = ceil(cf * tokens * k / E)
// assignments of the micro-batch; they are taken in token order (token 0 first, then its
// k choices in order of rank), later ones are dropped: that expert contributes zero to the
// token's output (the other gates are not renormalised again). cf <= 0: no limit.
//
// Moe:    in  x [..., C], router logits [..., E] (the output of the router Linear)
//         out y [..., C], y_t = sum_j gate_tj * expert_{e_j}(x_t) over the kept assignments,
//         each expert a SwiGLU MLP: down(silu(gate(x)) * up(x)), no biases, its weights
//         experts.{e}.gate_proj.weight [F, C], up_proj [F, C], down_proj [C, F].
//         Forward saves the routing and the experts' hidden pre-activations (k * tokens rows
//         of F, the most the experts can take); backward recomputes their outputs.
// MoeAux: in  router logits [..., E];  out [1]: coef * E * sum_e f_e P_e (Switch/GShard,
//         DeepSeek's normalisation), f_e = (assignments of expert e before any drop) / (tokens * k)
//         (no gradient), P_e = mean over tokens of p_t,e. 1 * coef when perfectly balanced.
//         Added to the model's loss by the model builder.
// Expert parallelism (ep > 1, LayerCtx::ep_group of ep ranks): every rank routes its own
// tokens and applies the capacity to them (C above with this rank's tokens, as one process
// does for each micro-batch: dp ranks with --ep train as one process whose micro-batches are
// theirs), then sends each kept assignment's input to the rank of its expert (rank q computes
// experts q E/ep .. (q+1) E/ep - 1) with an all-to-all-v, runs its experts on what it
// received from every rank, and sends the outputs back with a second all-to-all-v (combine);
// backward sends the gated output gradients the same way and the input gradients back. Rank q
// (ep_rank) declares only its own experts' weights, under their global names
// (experts.{q E/ep + l}.*, slots 3l .. 3l + 2 for local expert l, ParamDecl::expert): the
// other experts' weights, gradients and optimizer state live on the other ranks of the group.
// The trainer averages these gradients over the ranks that hold the same experts
// (train/data_parallel.h). Forward also saves what its experts received and the outputs they
// returned (backward recomputes nothing across ranks).
// CPU only. Every training forward that is not a recompute adds each expert's kept
// assignments and the dropped ones to a per-layer counter (take_moe_load).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "nn/layer.h"

namespace sat {

// Routing of n tokens: probs [n, E], top [n, k] expert indices by rank, gates [n, k].
void route_topk(const float* logits, int64_t n, int64_t E, int64_t k, float* probs, int32_t* top, float* gates);
// The capacity of one expert for `tokens` tokens (see above); tokens * k when cf <= 0.
int64_t moe_capacity(double cf, int64_t tokens, int64_t E, int64_t k);

struct MoeLoad {
  std::vector<int64_t> tokens;  // per expert: assignments kept
  int64_t dropped = 0;          // assignments dropped for capacity
  int64_t routed = 0;           // assignments made (tokens * k)
};
// The per-layer counts (by layer name) of this process's training forwards since the last
// take (or the start), and resets them; moe_load() reads them without a reset (summary.json).
std::map<std::string, MoeLoad> take_moe_load();
std::map<std::string, MoeLoad> moe_load();
// Collective over group (whose ranks ran the same moe layers): every rank's counts become
// their sum over the group (expert parallelism: the load of the group's experts).
void sum_moe_load(dist::Comm& group);

class Moe : public Layer {
 public:
  // ep_rank: this rank's place in the expert-parallel group of ep (the experts it holds).
  Moe(int64_t experts, int64_t top_k, int64_t ffn, double capacity_factor = 0, int ep = 1, int ep_rank = 0);
  const char* kind() const override { return "Moe"; }
  bool backward_reads_output() const override { return false; }
  bool product_param(int) const override { return true; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  int64_t experts() const { return E_; }
  int64_t top_k() const { return K_; }

 private:
  // The rows of one expert's work: its inputs, hidden pre-activations (hg, hu), activation,
  // output or output gradient, hidden gradients and input gradient, each from row r0 on.
  struct Rows {
    const float* x = nullptr;
    float *act = nullptr, *hg = nullptr, *hu = nullptr, *y = nullptr;
    float *dhg = nullptr, *dhu = nullptr, *dx = nullptr;
  };
  void dispatch(LayerCtx& c, int64_t n);  // routing, capacity, the gather of inputs
  void expert_forward(LayerCtx& c, int64_t e, int64_t r0, int64_t m, const Rows& b, bool save, bool output = true);
  void expert_backward(LayerCtx& c, int64_t e, int64_t r0, int64_t m, const Rows& b, const float* dy);
  void router_backward(LayerCtx& c, int64_t n, const float* dgate);
  void combine(LayerCtx& c, int64_t n, const float* ye);             // y from the experts' rows
  void gate_grads(LayerCtx& c, int64_t n, const float* ye, float* dy, float* dgate);
  void input_grad(LayerCtx& c, int64_t n, const float* dxe);          // dx from the rows' dx
  void zero_grads(LayerCtx& c, int64_t e);                          // an expert with no rows here (local index)
  // Expert parallelism.
  void ep_forward(LayerCtx& c, int64_t n);
  void ep_backward(LayerCtx& c, int64_t n);
  int64_t ep_rows() const;  // the most rows the local experts can receive
  int64_t E_, K_, F_, C_ = 0, n_ = 0;
  double cf_;
  int ep_, ep_rank_;
  std::string name_;
};

class MoeAux : public Layer {
 public:
  MoeAux(int64_t experts, int64_t top_k, float coef);
  const char* kind() const override { return "MoeAux"; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;

 private:
  int64_t E_, K_;
  float coef_;
};

}  // namespace sat
