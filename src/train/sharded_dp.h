// Fully sharded data parallelism: ZeRO-2 (gradients and optimizer state sharded over the
// data-parallel ranks) and ZeRO-3 (parameters too), run as PyTorch FSDP runs its
// SHARD_GRAD_OP and FULL_SHARD strategies.
//
// The parameters are cut into units (shard_units: under ZeRO-3 the model's blocks, which
// are gathered whole; under ZeRO-2 each layer's, so that few gradients wait in buckets
// at once), and every rank owns 1/N of each unit (ParamStore, StoreSharding). During a
// step a unit's full
// gradient, and under ZeRO-3 its full parameters, live in buffers of one staging arena
// that is planned from the rank's schedule exactly as the step's activations are, so the
// memory plan knows every byte:
//   * ZeRO-3, forward: a unit's parameters are all-gathered before its first node runs;
//     under mixed precision (--precision bf16 on the CPU) its bf16 working copy is, the
//     half of float32's bytes: each rank keeps its pieces of the copy beside its master
//     pieces (ParamStore), the layers read only the copy, and the unit's full float32
//     parameters never exist during a step;
//     gathering the next unit is launched at the same moment, so that it overlaps this
//     unit's compute (prefetch); the buffer is free after the unit's last node.
//   * ZeRO-3, backward: the same in backward order (gathered again, prefetching the
//     unit whose backward comes next).
//   * ZeRO-2 and 3, backward: a unit's gradients are written into its bucket; after the
//     unit's first node (the last in backward order) the bucket is reduce-scattered
//     (averaged over the ranks) and the rank adds its piece to its shard of the
//     gradients. At most two reduce-scatters are in flight: launching one waits for the
//     one before. Each micro-batch's gradients are reduce-scattered (the full gradient
//     never exists), as DeepSpeed's stage 2 does.
//   * After the update: ZeRO-2 all-gathers the updated parameters (and refreshes the whole
//     low-precision copy); ZeRO-3 keeps its shard (the optimizer refreshes its pieces of
//     the copy). Gradients are reduced in float32 throughout.
// Communication per micro-batch, in the textbook ring volumes of a model of P bytes over
// N ranks: ZeRO-2 reduce-scatters P ((N-1)/N P on the wire) and all-gathers P once per
// step: what all-reducing P costs; ZeRO-3 all-gathers P twice more: 1.5 times as much
// (under bf16 it gathers P/2 twice: as much as all-reducing P).
// The CPU engine only (the GPU path is not built).
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "dist/comm.h"
#include "nn/engine.h"
#include "nn/graph.h"
#include "nn/params.h"
#include "train/data_parallel.h"
#include "train/schedule.h"

namespace sat {

// The first parameter of each unit. ZeRO-3: the model's blocks (a transformer layer, a
// residual block, a layer of a plain stack); a parameter that nodes of several blocks use,
// or that is tied to a parameter of another pipeline stage, is a unit of its own.
// ZeRO-2 (nothing is gathered): the parameters of each layer (a weight and its bias are
// final at once), so that few gradients wait in buckets.
std::vector<int> shard_units(const Graph& g, int stage = 3);

// The staging arena of one rank.
struct ShardPlan {
  int stage = 0, parts = 1;
  StoreSharding sharding(int index) const { return {stage, parts, index, units}; }
  std::vector<int> units;                          // shard_units
  std::vector<std::pair<int64_t, int64_t>> range;  // per unit: flat [begin, end)
  std::vector<int> first, last, chunk;             // per unit: the nodes that use it (-1: none)
  // per unit: the node whose backward needs it first: `last`, or the last node of a
  // recomputed block that uses it (its forward reruns before that node's backward)
  std::vector<int> bwd_last;
  std::vector<int64_t> param_at, grad_at;          // per unit: byte offset in the arena (-1: none)
  // The dtype of the gathered units (ZeRO-3): the layers' low-precision copy under mixed
  // precision (bf16), float32 otherwise. MemKind::gathered_params counts them in it.
  DType gathered_dtype = DType::f32;
  size_t staging = 0;                              // arena bytes, after lifetime reuse
  size_t gathered = 0, buckets = 0;                // bytes before reuse
  // Units of a chunk in the order the hooks gather them, forward and backward, and reduce
  // their gradients.
  std::vector<std::vector<int>> fwd_order, bwd_order, reduce_order;
};
// stage 2 or 3 over `parts` ranks, for the rank's schedule (one optimizer step).
ShardPlan plan_shards(const Graph& g, const std::vector<Action>& actions, int stage, int parts);
// ZeRO-2/3 memory: the store's sharded sizes, the staging arena and its kinds.
void add_sharded_memory(MemoryPlan& m, const Graph& g, const ShardPlan& sp, int optimizer_slots);

class ShardedDP : public NodeHooks, public GradSync {
 public:
  // dp: the data-parallel group; tie: the embedding group (null: no tied parameters).
  // Binds every unit's buffers in ps (before an Engine is built on it).
  ShardedDP(const Graph& g, ParamStore& ps, ShardPlan plan, dist::Comm& dp, dist::Comm* tie);
  ~ShardedDP() override;

  void before_forward(int node) override;
  void after_forward(int node) override;
  void before_backward(int node) override;
  void after_backward(int node) override;
  // Every micro-batch's backward overwrites the buckets; ready: none (NodeHooks do it).
  GradReady* ready(bool) override { return nullptr; }
  bool accumulates_grads() const override { return false; }
  // After a micro-batch's backward of a chunk: its last bucket reduced and added in.
  void after_backward(int chunk, bool last_micro, bool replayed) override;
  // The reduce_grads action: gradients tied across stages summed over the embedding group.
  void reduce() override;
  // After the optimizer step: ZeRO-2 gathers the updated parameters.
  void after_update() override;
  // ZeRO-3: the full parameters and states (collective over dp).
  std::unique_ptr<ParamStore> unsharded() const;
  // Seconds the step waited for gathers and reductions (what overlapped compute is not
  // measured: the window is the waiting), since reset_timing().
  double window_seconds() const override { return exposed_; }
  double exposed_seconds() const override { return exposed_; }
  void reset_timing() override { exposed_ = 0; }

 private:
  void* unit_params(int u) const;  // gathered (ZeRO-3), in plan_.gathered_dtype
  float* unit_grads(int u) const;
  void gather(int u);
  void gather_ready(const std::vector<int>& units, const std::vector<int>& order);
  void reduce_bucket(int u);
  void finish_bucket();
  void wait(dist::WorkPtr& w);

  const Graph& g_;
  ParamStore& ps_;
  ShardPlan plan_;
  dist::Comm& dp_;
  dist::Comm* tie_;
  Buffer arena_;
  std::vector<dist::WorkPtr> gathers_;  // per unit: in flight or complete (null: not gathered)
  dist::WorkPtr pending_;               // the reduce-scatter in flight
  int pending_unit_ = -1;
  std::vector<bool> first_micro_;       // per chunk: its next backward is the step's first
  std::vector<std::vector<int>> at_first_, at_last_, at_bwd_;  // per node: units its forward starts,
                                                                // its forward ends, its backward starts
  std::vector<std::vector<std::pair<int64_t, int64_t>>> gaps_;  // per unit: padding ranges
  std::vector<int> tied_units_;
  double exposed_ = 0;
};

}  // namespace sat
