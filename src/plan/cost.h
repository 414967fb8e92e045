// The cost model: how long the pieces of a training step take on a device (plan/hardware.h),
// from what the graph already knows about every node (FLOPs, the bytes of its inputs, output,
// parameters and saved buffers, the payload of its collectives).
//
// * A kernel of f FLOPs moving m bytes takes
//       overhead + f / (peak * gemm_max * f / (f + gemm_half_flops)) + m / (bandwidth * memory_eff)
//   a roofline whose compute efficiency rises with the kernel's size (small GEMMs do not fill
//   the device) and in which a layer's compute and its memory traffic add: a layer is several
//   kernels (attention: two batched GEMMs around a softmax that reads and writes the
//   probabilities), and the additive form is exact for the GEMM-only and the memory-only ones.
// * When a stage's parameters and their gradients fit the device's cache (hw.cache), every
//   micro-batch of a step after the first adds its parameter gradients to sums that are
//   there: those bytes cost bytes / (cache bandwidth * memory_eff) instead. Only those: a
//   product with few rows runs at the rate its packing of the weights allows wherever the
//   weights are (OpenBLAS, one thread here, 8 x 1024 x 1024: 0.57 ms with the weights in
//   cache, 0.65 ms from memory), while the gradient's update (K = 8, beta 1) runs 2.5x faster
//   in cache (0.31 against 0.76 ms). mlp, 2 pipeline stages, 8 micro-batches of 8: 21.7 ms
//   measured, 26.2 predicted with every gradient update from memory, 22.7 with this.
// * A collective of payload S over n ranks, on a link of latency alpha and bandwidth beta
//   (times comm_eff), by the ring algorithms NCCL and MPI use for large messages:
//       all-reduce      2 (n-1) alpha + 2 (n-1)/n S / beta
//       all-gather, reduce-scatter   (n-1) alpha + (n-1)/n S / beta
//       point-to-point  alpha + S / beta
//   The payload is what the communicators count (dist/comm.h): an all-reduce's buffer, an
//   all-gather's output, a reduce-scatter's input.
#pragma once
#include <vector>

#include "nn/graph.h"
#include "plan/hardware.h"

namespace sat {

enum class Collective { all_reduce, all_gather, reduce_scatter, p2p };
double collective_seconds(Collective c, double payload_bytes, int ranks, const Link& link, double comm_eff = 1);

// One kernel (or one layer's worth of kernels) on hw at the given precision.
double kernel_seconds(double flops, double bytes, const Hardware& hw, DType precision);

// Where the tensor-parallel collectives of a graph run: tp ranks over `link`.
struct TPContext {
  int tp = 1;
  Link link;
  // Selective recomputation recomputes attention's whole core (q k^T, softmax, dropout and the
  // product with v: Megatron-LM's CoreAttention), not saturate's q k^T and softmax.
  bool recompute_whole_core = false;
  // Dropout runs inside the residual add's kernel (Megatron-LM's bias-dropout-add): it moves
  // only its mask, the add the rest.
  bool fused_dropout_add = false;
  // Sequence parallelism keeps the sharded input of a gathered product and gathers it again
  // in backward for the weight's gradient (Megatron-LM; saturate keeps the gathered input).
  bool sp_regather = false;
  // Backward kernels read the output's gradient but not the output (the published engines'
  // fused kernels; saturate's own read both).
  bool lean_backward = false;
};

// The seconds of one call of a node: its forward, its backward (0 without one), the
// forward again when backward recomputes it (full recomputation: its whole forward;
// selective: attention's q k^T product), and its tensor-parallel collectives (forward,
// backward), which nothing overlaps; and the seconds backward takes less when the sums of
// the node's parameter gradients are in the cache.
struct NodeCost {
  double fwd = 0, bwd = 0, recompute = 0, comm_fwd = 0, comm_bwd = 0;
  double bwd_cached = 0;
  double forward() const { return fwd + comm_fwd; }
  double backward() const { return bwd + comm_bwd + recompute; }
};
// Every node of g (a whole model or a stage) on hw; activations in g.act(), parameters read
// in the activation dtype (GPU mixed precision reads the low-precision copy).
std::vector<NodeCost> node_costs(const Graph& g, const Hardware& hw, const TPContext& tp);

// The optimizer's update of `params` parameters: memory bound, each reads the parameter,
// its gradient and `slots` state arrays and writes the parameter and the state (and, on a
// GPU in mixed precision, the low-precision copy).
double optimizer_seconds(double params, int slots, const Hardware& hw, DType act);

}  // namespace sat
