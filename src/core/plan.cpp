#include "core/plan.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <unordered_map>
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

namespace {

// Disjoint address ranges [begin, end), merged where they touch or overlap.
class Ranges {
 public:
  void add(size_t b, size_t e) {
    auto it = r_.upper_bound(b);
    if (it != r_.begin() && std::prev(it)->second >= b) --it;
    while (it != r_.end() && it->first <= e) {
      b = std::min(b, it->first), e = std::max(e, it->second);
      it = r_.erase(it);
    }
    r_.emplace(b, e);
  }
  // The end of a range that [x, x + n) overlaps, or x when there is none.
  size_t clear_of(size_t x, size_t n) const {
    auto it = r_.upper_bound(x);
    if (it != r_.begin() && std::prev(it)->second > x) return std::prev(it)->second;
    return it != r_.end() && it->first < x + n ? it->second : x;
  }

 private:
  std::map<size_t, size_t> r_;
};

// The placed buffers' address ranges over time: a segment tree over the step's time units.
// A lifetime interval is held by its O(log T) canonical nodes ("here") and, merged, by
// them and their ancestors ("below"). The buffers live at some time of [a, b] are exactly
// those held here by an ancestor of one of [a, b]'s canonical nodes, or below one of them.
class Occupancy {
 public:
  explicit Occupancy(int times) : n_(std::max(times, 1)) {}
  void add(int a, int b, size_t off, size_t end) { add(1, 0, n_ - 1, a, b, off, end); }
  // The ranges that a buffer live during [a, b] must keep clear of.
  void conflicts(int a, int b, std::vector<const Ranges*>& out) const { collect(1, 0, n_ - 1, a, b, out); }

 private:
  struct Node { Ranges here, below; };
  void add(int k, int l, int r, int a, int b, size_t off, size_t end) {
    if (b < l || r < a) return;
    Node& node = nodes_[k];
    node.below.add(off, end);
    if (a <= l && r <= b) return node.here.add(off, end);
    const int m = (l + r) / 2;
    add(2 * k, l, m, a, b, off, end);
    add(2 * k + 1, m + 1, r, a, b, off, end);
  }
  void collect(int k, int l, int r, int a, int b, std::vector<const Ranges*>& out) const {
    if (b < l || r < a) return;
    const auto it = nodes_.find(k);
    if (it == nodes_.end()) return;  // nothing placed in [l, r]
    if (a <= l && r <= b) return out.push_back(&it->second.below);
    out.push_back(&it->second.here);
    const int m = (l + r) / 2;
    collect(2 * k, l, m, a, b, out);
    collect(2 * k + 1, m + 1, r, a, b, out);
  }
  int n_;
  std::unordered_map<int, Node> nodes_;
};

}  // namespace

size_t ArenaPlanner::solve() {
  auto rounded = [](size_t b) { return (b + kAlign - 1) / kAlign * kAlign; };
  std::vector<int> order(bufs_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return bufs_[size_t(a)].bytes > bufs_[size_t(b)].bytes; });
  int times = 0;
  for (const PlanBuffer& b : bufs_) times = std::max(times, b.t_end + 1);
  Occupancy placed(times);
  std::vector<const Ranges*> sets;
  arena_ = 0;
  visits_ = 0;
  for (int i : order) {
    PlanBuffer& b = bufs_[size_t(i)];
    const size_t need = rounded(b.bytes);
    b.offset = 0;
    if (need == 0) continue;  // (holds no byte)
    sets.clear();
    for (auto [t0, t1] : b.live) placed.conflicts(t0, t1, sets);
    // First fit: the lowest offset clear of every range of every set.
    size_t off = 0;
    for (bool moved = true; moved;) {
      moved = false;
      for (const Ranges* r : sets) {
        ++visits_;
        const size_t next = r->clear_of(off, need);
        if (next != off) off = next, moved = true;
      }
    }
    b.offset = off;
    arena_ = std::max(arena_, off + need);
    for (auto [t0, t1] : b.live) placed.add(t0, t1, off, off + need);
  }
  return arena_;
}

}  // namespace sat
