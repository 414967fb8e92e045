// The arena planner: buffers with known sizes and lifetimes (in step-timeline units)
// get offsets in one arena so that buffers alive at the same time never overlap and
// buffers with disjoint lifetimes share memory. Greedy by size, first fit in address
// order (as TFLite's and ggml's planners do); deterministic. A buffer may be live in
// several disjoint intervals (one context of a pipeline stage serves several
// micro-batches of a step, one after the other).
//
// The first fit does not scan the placed buffers (quadratic: a deep model's activations are
// all live at the turn from forward to backward, and each new one would pass every one
// below it): a segment tree over time keeps their address ranges merged, and a buffer's
// offset is found from the O(log T) merged sets its lifetime meets, in O(log) each.
#pragma once
#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace sat {

// What a byte of the step is for: the breakdown `saturate info` prints.
enum class MemKind : int {
  parameters, gradients, optimizer_state, model_state, inputs,
  activations, saved, activation_grads, scratch,
  lp_params, workspace,  // low-precision parameter copy (mixed precision); GPU only: cuBLASLt/cuDNN workspace
  gathered_params, grad_buckets,  // ZeRO-3's gathered units; ZeRO-2/3's gradient buckets
  kCount
};
const char* mem_kind_name(MemKind k);

struct PlanBuffer {
  std::string what;
  MemKind kind;
  size_t bytes;
  int t_begin, t_end;  // inclusive lifetime: the hull of `live`
  size_t offset = 0;
  std::vector<std::pair<int, int>> live;  // inclusive intervals, ascending and disjoint
  bool overlaps(const PlanBuffer& o) const;
};

class ArenaPlanner {
 public:
  static constexpr size_t kAlign = 64;
  int add(std::string what, MemKind kind, size_t bytes, int t_begin, int t_end);
  // Another interval in which buffer i is live (after all of its earlier ones).
  void extend(int i, int t_begin, int t_end);
  // Assigns offsets; returns the arena size in bytes.
  size_t solve();
  const PlanBuffer& operator[](int i) const { return bufs_[size_t(i)]; }
  size_t size() const { return bufs_.size(); }
  size_t arena_bytes() const { return arena_; }
  // Range sets the last solve() looked into (its work: O(log T) per buffer and lifetime
  // interval, times the rounds a first fit takes).
  size_t visits() const { return visits_; }

 private:
  std::vector<PlanBuffer> bufs_;
  size_t arena_ = 0;
  size_t visits_ = 0;
};

}  // namespace sat
