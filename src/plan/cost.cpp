#include "plan/cost.h"

#include <algorithm>

#include "nn/layers/attention.h"
#include "nn/layers/cross_entropy.h"
#include "nn/layers/elementwise.h"
#include "nn/layers/linear.h"
#include "nn/layers/tensor_parallel.h"

namespace sat {

double collective_seconds(Collective c, double S, int n, const Link& l, double eff) {
  if (S <= 0) return 0;
  const double beta = l.bandwidth * eff;
  if (c == Collective::p2p) return l.alpha + S / beta;
  if (n <= 1) return 0;
  const double steps = n - 1, share = double(n - 1) / n;
  if (c == Collective::all_reduce) return 2 * steps * l.alpha + 2 * share * S / beta;
  return steps * l.alpha + share * S / beta;
}

double kernel_seconds(double flops, double bytes, const Hardware& hw, DType precision) {
  const Efficiency& e = hw.eff;
  double t = e.kernel_overhead;
  if (flops > 0) t += (flops + e.gemm_half_flops) / (hw.peak(precision) * e.gemm_max);
  if (bytes > 0) t += bytes / (hw.memory_bandwidth * e.memory_eff);
  return t;
}

namespace {

// The collectives of a node's forward and backward (tensor_parallel.h): which algorithm
// carries LayerSetup::comm_fwd / comm_bwd.
std::pair<Collective, Collective> collectives_of(const Layer& l) {
  if (dynamic_cast<const TPAllGather*>(&l)) return {Collective::all_gather, Collective::reduce_scatter};
  if (dynamic_cast<const TPReduceScatter*>(&l)) return {Collective::reduce_scatter, Collective::all_gather};
  return {Collective::all_reduce, Collective::all_reduce};  // TPCopy, TPAllReduce, the loss's sums
}

// Bytes a node's kernels move: forward reads its inputs and parameters and writes its output,
// saved buffers and scratch; backward reads them all again, uses its own scratch and writes
// the input and parameter gradients (parameters' in float32).
struct Traffic {
  double fwd = 0, bwd = 0;
  double grads = 0;  // of backward's: the parameter gradients' (accumulated over micro-batches)
};

Traffic traffic(const Node& n, DType act, bool lean_backward) {
  const LayerSetup& s = n.setup;
  auto sum = [](const std::vector<TensorSpec>& v) {
    double b = 0;
    for (const TensorSpec& t : v) b += double(t.bytes());
    return b;
  };
  double params = 0;
  for (const ParamDecl& p : s.params) params += double(p.spec.shape.numel());
  const double in = sum(s.inputs), out = double(s.output.bytes()), w = params * double(dtype_size(act));
  const double fwd = in + w + out + sum(s.saved) + sum(s.scratch_fwd);
  // Backward reads the inputs, saved buffers and output again, and the output's gradient, and
  // writes the inputs' gradients; kernels that read the output's gradient and not the output
  // (lean_backward) move a tensor less: a pointwise layer 3, not 4.
  const double bwd = fwd - sum(s.scratch_fwd) + sum(s.scratch_bwd) + in + (lean_backward ? 0 : out) + params * 4;
  return {fwd, bwd, params * 4};
}

// The seconds `bytes` take less from the cache than from memory.
double cache_saving(double bytes, const Hardware& hw) {
  if (hw.cache.bytes <= 0 || bytes <= 0) return 0;
  const double e = hw.eff.memory_eff;
  return std::max(0.0, bytes / (hw.memory_bandwidth * e) - bytes / (hw.cache.bandwidth * e));
}

}  // namespace

namespace {

// The share of the FLOPs-only rate a node's products reach by their shape (hw.eff.gemm_half_dim):
// a Linear's m x k by k x n, attention's two products over a head's channels.
double shape_factor(const Node& n, const Efficiency& e) {
  if (e.gemm_half_dim <= 0) return 1;
  auto s = [&](double d) { return d / (d + e.gemm_half_dim); };
  const LayerSetup& st = n.setup;
  const Layer& l = n.layer->unwrapped();
  if (dynamic_cast<const Linear*>(&l) && !st.params.empty() && st.params[0].spec.shape.nd == 2 && !st.inputs.empty()) {
    const double out = double(st.params[0].spec.shape[0]), in = double(st.params[0].spec.shape[1]);
    const double m = double(st.inputs[0].shape.numel()) / in;
    return s(m) * s(out) * s(in);
  }
  if (auto* a = dynamic_cast<const CausalSelfAttention*>(&l); a && st.output.shape.nd == 3) {
    const double T = double(st.output.shape[1]), C = double(st.output.shape[2]);
    const double head = C / double(std::max<int64_t>(1, a->n_head()));
    return s(T) * s(T) * s(std::max(1.0, head));
  }
  return 1;
}

}  // namespace

std::vector<NodeCost> node_costs(const Graph& g, const Hardware& hw, const TPContext& tp) {
  std::vector<NodeCost> out(g.nodes().size());
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    const LayerSetup& s = n.setup;
    NodeCost& c = out[i];
    Traffic tr = traffic(n, g.act(), tp.lean_backward);
    if (tp.fused_dropout_add && dynamic_cast<const Dropout*>(&n.layer->unwrapped())) {
      double mask = 0;
      for (auto& t : s.saved) mask += double(t.bytes());
      tr.fwd = tr.bwd = mask;
    }
    const double shape = shape_factor(n, hw.eff);
    c.fwd = kernel_seconds(s.flops_fwd / shape, tr.fwd, hw, g.act());
    if (g.training() && n.needs_backward) {
      c.bwd = kernel_seconds(s.flops_bwd / shape, tr.bwd, hw, g.act());
      c.bwd_cached = cache_saving(tr.grads, hw);
    }
    const auto [cf, cb] = collectives_of(n.layer->unwrapped());
    c.comm_fwd = collective_seconds(cf, s.comm_fwd, tp.tp, tp.link, hw.eff.comm_eff);
    if (g.training() && n.needs_backward) c.comm_bwd = collective_seconds(cb, s.comm_bwd, tp.tp, tp.link, hw.eff.comm_eff);
    if (g.training() && tp.sp_regather && n.rc_first < 0 && dynamic_cast<const TPAllGather*>(&n.layer->unwrapped()))
      c.comm_bwd += c.comm_fwd;  // the sharded input gathered again for the weight's gradient
    if (!g.training()) continue;
    if (n.rc_first >= 0) {
      c.recompute = c.fwd + c.comm_fwd;
    } else if (auto* a = dynamic_cast<const CausalSelfAttention*>(&n.layer->unwrapped()); a && a->recompute()) {
      const double share = tp.recompute_whole_core ? 1.0 : 0.5;  // q k^T and the softmax again (and x v)
      c.recompute = kernel_seconds(s.flops_fwd * share / shape, tr.fwd, hw, g.act());
    }
  }
  return out;
}

double optimizer_seconds(double params, int slots, const Hardware& hw, DType act) {
  const bool low = act == DType::bf16 || act == DType::f16;
  const double bytes = params * (4.0 * (3 + 2 * slots) + (low ? 2.0 : 0.0));
  return kernel_seconds(0, bytes, hw, DType::f32);
}

}  // namespace sat
