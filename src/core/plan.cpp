#include "core/plan.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace sat {

const char* mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::lp_params: return "low-precision parameters";
    case MemKind::workspace: return "library workspace";
    case MemKind::gathered_params: return "gathered parameters (ZeRO-3)";
    case MemKind::grad_buckets: return "gradient buckets (ZeRO-2/3)";
    case MemKind::parameters: return "parameters";
    case MemKind::gradients: return "gradients";
    case MemKind::optimizer_state: return "optimizer state";
    case MemKind::model_state: return "model state (running stats)";
    case MemKind::inputs: return "input batches (prefetch)";
    case MemKind::activations: return "activations";
    case MemKind::saved: return "saved for backward";
    case MemKind::activation_grads: return "activation gradients";
    case MemKind::scratch: return "scratch";
    case MemKind::kCount: break;
  }
  return "?";
}

int ArenaPlanner::add(std::string what, MemKind kind, size_t bytes, int t_begin, int t_end) {
  SAT_ASSERT(t_begin <= t_end);
  bufs_.push_back({std::move(what), kind, bytes, t_begin, t_end, 0, {{t_begin, t_end}}});
  return int(bufs_.size()) - 1;
}

void ArenaPlanner::extend(int i, int t_begin, int t_end) {
  PlanBuffer& b = bufs_.at(size_t(i));
  SAT_ASSERT(t_begin <= t_end && t_begin > b.t_end);
  b.live.push_back({t_begin, t_end});
  b.t_end = t_end;
}

bool PlanBuffer::overlaps(const PlanBuffer& o) const {
  if (t_begin > o.t_end || o.t_begin > t_end) return false;
  size_t i = 0, j = 0;
  while (i < live.size() && j < o.live.size()) {
    if (live[i].first <= o.live[j].second && o.live[j].first <= live[i].second) return true;
    if (live[i].second < o.live[j].second) ++i;
    else ++j;
  }
  return false;
}

size_t ArenaPlanner::solve() {
  auto rounded = [](size_t b) { return (b + kAlign - 1) / kAlign * kAlign; };
  std::vector<int> order(bufs_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return bufs_[size_t(a)].bytes > bufs_[size_t(b)].bytes; });
  // Placed buffers by offset (ties in placement order): the first fit scans them in address
  // order and stops at the first gap, with no sort per buffer.
  std::vector<int> placed;
  arena_ = 0;
  for (int i : order) {
    PlanBuffer& b = bufs_[size_t(i)];
    const size_t need = rounded(b.bytes);
    size_t off = 0;
    for (int j : placed) {
      const PlanBuffer& o = bufs_[size_t(j)];
      if (o.offset >= off + need) break;  // fits in the gap before o (and every later one)
      if (o.overlaps(b)) off = std::max(off, o.offset + rounded(o.bytes));
    }
    b.offset = off;
    arena_ = std::max(arena_, off + need);
    auto at = std::upper_bound(placed.begin(), placed.end(), off,
                               [&](size_t x, int j) { return x < bufs_[size_t(j)].offset; });
    placed.insert(at, i);
  }
  return arena_;
}

}  // namespace sat
