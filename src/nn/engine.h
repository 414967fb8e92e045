// Runs a Graph: one arena for everything transient in a step (activations, saved
// buffers, activation gradients, scratch), laid out by the ArenaPlanner from the
// lifetimes of a static step:
//   forward of node i at time i, backward of node i at time 2N-1-i;
//   the output of node i lives [i, 2N-1-i] (its consumers' backward may read it),
//   its gradient from the first consumer's backward to its own backward,
//   saved buffers [i, 2N-1-i], scratch only during the call that uses it.
// Parameters, gradients, optimizer and model state live in the ParamStore.
#pragma once
#include <array>
#include <vector>

#include "core/alloc.h"
#include "core/plan.h"
#include "nn/graph.h"
#include "nn/params.h"

namespace sat {

struct MemoryPlan {
  std::array<size_t, size_t(MemKind::kCount)> by_kind{};  // transient kinds: before reuse
  size_t persistent = 0;  // parameters, gradients, optimizer state, model state
  size_t transient = 0;   // the step arena, after lifetime reuse
  size_t inputs = 0;      // input batch buffers of the prefetching loader
  size_t total() const { return persistent + transient + inputs; }
};

class Engine {
 public:
  Engine(Graph& g, ParamStore& ps);

  // The plan for a graph, without allocating anything.
  static MemoryPlan plan_memory(const Graph& g, int optimizer_slots, size_t input_bytes);

  void bind(int value, const Tensor& t);  // a graph input: points at a loader batch
  // Runs forward; returns the loss value (NaN if the graph has no loss).
  float forward(bool training, uint64_t seed);
  // Runs backward from d(objective)/d(loss) = dloss. With first_micro, parameter
  // gradients are overwritten (no separate zeroing pass); otherwise accumulated.
  void backward(float dloss, bool first_micro);

  Tensor value(int v) const { return vals_[size_t(v)]; }

  // Per-node timing (off by default): seconds spent in each node's forward and backward.
  void set_profiling(bool on) { profile_ = on; }
  struct NodeTime { double fwd = 0, bwd = 0; int64_t calls = 0; };
  const std::vector<NodeTime>& node_times() const { return times_; }
  // A table of time per layer kind, largest first.
  std::string profile_report() const;
  size_t arena_bytes() const { return arena_.bytes(); }
  const Graph& graph() const { return g_; }

 private:
  struct NodeRun {
    LayerCtx ctx;
    std::vector<Tensor> scratch_fwd, scratch_bwd;
    std::vector<bool> first_writer;  // per param slot: first node in backward order to touch it
    std::vector<std::pair<Tensor, Tensor>> grad_adds;  // after backward: second += first
  };
  Graph& g_;
  ParamStore& ps_;
  Buffer arena_;
  std::vector<Tensor> vals_, grads_;
  std::vector<NodeRun> runs_;
  std::vector<std::vector<int>> input_users_;
  bool profile_ = false;
  std::vector<NodeTime> times_;  // graph input value -> (node, slot) to rebind
};

}  // namespace sat
