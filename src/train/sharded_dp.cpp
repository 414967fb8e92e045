#include "train/sharded_dp.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/plan.h"
#include "core/timer.h"

namespace sat {

std::vector<int> shard_units(const Graph& g, int stage) {
  // The group of a node: its block (ZeRO-3), or the node itself (ZeRO-2).
  const auto& starts = g.block_starts();
  auto group_of = [&](int gid) {
    if (stage == 2) return gid;
    return int(std::upper_bound(starts.begin(), starts.end(), gid) - starts.begin()) - 1;
  };
  std::set<std::string> tied(g.tied_copies().begin(), g.tied_copies().end());
  tied.insert(g.tied_remote().begin(), g.tied_remote().end());
  // A parameter's key: the group of the nodes that use it, or its own (-2 - index) when
  // nodes of several groups use it or it is tied across stages.
  const size_t P = g.params().size();
  std::vector<int> key(P, -1);
  for (const Node& n : g.nodes())
    for (int pid : n.param_ids) {
      const int b = group_of(n.gid);
      int& k = key[size_t(pid)];
      k = k == -1 || k == b ? b : -2 - pid;
    }
  for (size_t p = 0; p < P; ++p)
    if (tied.count(g.params()[p].name)) key[p] = -2 - int(p);
  std::vector<int> units;
  for (size_t p = 0; p < P; ++p)
    if (p == 0 || key[p] != key[p - 1] || key[p] < -1) units.push_back(int(p));
  return units;
}

namespace {
// Times of one action in the staging timeline: W = N + 2 units per action; forward node i
// at 1 + i, backward node i at N - i; the action's start at 0 and end at N + 1.
struct At {
  int base, N;
  int start() const { return base; }
  int end() const { return base + N + 1; }
  int fwd(int i) const { return base + 1 + i; }
  int bwd(int i) const { return base + N - i; }
};

void live(ArenaPlanner& p, std::vector<int>& ids, int u, MemKind kind, size_t bytes, int t0, int t1) {
  if (ids[size_t(u)] < 0) ids[size_t(u)] = p.add(str_cat("unit ", u), kind, bytes, t0, t1);
  else p.extend(ids[size_t(u)], t0, t1);
}

// The units' nodes and the orders the hooks visit them in.
void order_units(const Graph& g, ShardPlan& sp) {
  const size_t U = sp.units.size();
  sp.first.assign(U, -1), sp.last.assign(U, -1), sp.bwd_last.assign(U, -1), sp.chunk.assign(U, 0);
  std::vector<int> unit_of(g.params().size());
  for (size_t u = 0; u < U; ++u)
    for (size_t p = size_t(sp.units[u]); p < (u + 1 < U ? size_t(sp.units[u + 1]) : unit_of.size()); ++p)
      unit_of[p] = int(u);
  const auto& nodes = g.nodes();
  for (int i = 0; i < int(nodes.size()); ++i)
    for (int pid : nodes[size_t(i)].param_ids) {
      const size_t u = size_t(unit_of[size_t(pid)]);
      if (sp.first[u] < 0) sp.first[u] = i;
      sp.last[u] = i;
      sp.bwd_last[u] = std::max({sp.bwd_last[u], i, nodes[size_t(i)].rc_last});
      sp.chunk[u] = nodes[size_t(i)].chunk;
    }
  const size_t C = g.chunks().size();
  sp.fwd_order.assign(C, {}), sp.bwd_order.assign(C, {}), sp.reduce_order.assign(C, {});
  for (size_t u = 0; u < U; ++u) {
    if (sp.first[u] < 0) continue;
    for (auto* o : {&sp.fwd_order, &sp.bwd_order, &sp.reduce_order}) (*o)[size_t(sp.chunk[u])].push_back(int(u));
  }
  auto by = [&](std::vector<std::vector<int>>& orders, auto less) {
    for (auto& o : orders) std::stable_sort(o.begin(), o.end(), less);
  };
  by(sp.fwd_order, [&](int a, int b) { return sp.first[size_t(a)] < sp.first[size_t(b)]; });
  by(sp.bwd_order, [&](int a, int b) { return sp.bwd_last[size_t(a)] > sp.bwd_last[size_t(b)]; });
  by(sp.reduce_order, [&](int a, int b) { return sp.first[size_t(a)] > sp.first[size_t(b)]; });
}
}  // namespace

ShardPlan plan_shards(const Graph& g, const std::vector<Action>& actions, int stage, int parts) {
  ShardPlan sp;
  sp.stage = stage, sp.parts = parts;
  if (stage < 2 || g.params().empty()) return sp;
  sp.units = shard_units(g, stage);
  if (stage >= 3) sp.gathered_dtype = g.act();  // mixed precision: the layers' copy (f32 otherwise)
  sp.range = ParamStore::unit_ranges(g.params(), sp.sharding(0));
  order_units(g, sp);
  const size_t U = sp.units.size();
  const int N = int(g.nodes().size());
  auto bytes = [&](int u) { return size_t(sp.range[size_t(u)].second - sp.range[size_t(u)].first) * 4; };
  auto lp_bytes = [&](int u) { return bytes(u) / 4 * dtype_size(sp.gathered_dtype); };
  ArenaPlanner planner;
  std::vector<int> pid(U, -1), gid(U, -1);
  for (size_t a = 0; a < actions.size(); ++a) {
    const Action& act = actions[a];
    const At t{int(a) * (N + 2), N};
    if (act.kind == ActionKind::forward && stage >= 3) {
      const auto& o = sp.fwd_order[size_t(act.chunk)];
      for (size_t j = 0; j < o.size(); ++j)
        live(planner, pid, o[j], MemKind::gathered_params, lp_bytes(o[j]),
             j == 0 ? t.start() : t.fwd(sp.first[size_t(o[j - 1])]), t.fwd(sp.last[size_t(o[j])]));
    }
    if (act.kind != ActionKind::backward) continue;
    if (stage >= 3) {
      const auto& o = sp.bwd_order[size_t(act.chunk)];
      for (size_t j = 0; j < o.size(); ++j)
        live(planner, pid, o[j], MemKind::gathered_params, lp_bytes(o[j]),
             j == 0 ? t.start() : t.bwd(sp.bwd_last[size_t(o[j - 1])]), t.bwd(sp.first[size_t(o[j])]));
    }
    const auto& r = sp.reduce_order[size_t(act.chunk)];
    for (size_t j = 0; j < r.size(); ++j)
      live(planner, gid, r[j], MemKind::grad_buckets, bytes(r[j]), t.bwd(sp.last[size_t(r[j])]),
           j + 1 < r.size() ? t.bwd(sp.first[size_t(r[j + 1])]) : t.end());
  }
  sp.staging = planner.solve();
  sp.param_at.assign(U, -1), sp.grad_at.assign(U, -1);
  for (size_t u = 0; u < U; ++u) {
    if (pid[u] >= 0) sp.param_at[u] = int64_t(planner[pid[u]].offset), sp.gathered += planner[pid[u]].bytes;
    if (gid[u] >= 0) sp.grad_at[u] = int64_t(planner[gid[u]].offset), sp.buckets += planner[gid[u]].bytes;
  }
  return sp;
}

void add_sharded_memory(MemoryPlan& m, const Graph& g, const ShardPlan& sp, int slots) {
  if (sp.stage < 2) return;
  const size_t persistent_before = m.persistent;
  auto at = [&](MemKind k) -> size_t& { return m.by_kind[size_t(k)]; };
  m.persistent -= at(MemKind::parameters) + at(MemKind::gradients) + at(MemKind::optimizer_state) +
                  at(MemKind::model_state);
  const ParamStore::Sizes s = ParamStore::predict(g.params(), g.states(), slots, sp.sharding(0));
  at(MemKind::parameters) = s.params;
  at(MemKind::gradients) = s.grads;
  at(MemKind::optimizer_state) = s.optimizer;
  at(MemKind::model_state) = s.states;
  m.persistent += s.total();
  // The low-precision copy (mixed precision): whole under ZeRO-2 (laid out in units), this
  // rank's pieces under ZeRO-3.
  m.persistent -= at(MemKind::lp_params);
  at(MemKind::lp_params) = ParamStore::lp_bytes(g.params(), g.act(), sp.sharding(0));
  m.persistent += at(MemKind::lp_params);
  at(MemKind::gathered_params) = sp.gathered;  // in sp.gathered_dtype
  at(MemKind::grad_buckets) = sp.buckets;
  m.staging = sp.staging;
  // On a GPU the store and the staging arena are device memory: the device figure follows.
  if (g.device() == Device::cuda) m.device = m.device - persistent_before + m.persistent + m.staging;
}

// ---- the hooks --------------------------------------------------------------------------
ShardedDP::ShardedDP(const Graph& g, ParamStore& ps, ShardPlan plan, dist::Comm& dp, dist::Comm* tie,
                     DeviceBackend& device)
    : g_(g),
      ps_(ps),
      plan_(std::move(plan)),
      dp_(dp),
      tie_(tie),
      dev_(device),
      arena_(device.buffer(plan_.staging, "ZeRO staging")),
      order_(device.stream_order(1)) {
  SAT_CHECK(plan_.stage >= 2 && ps.sharding().stage == plan_.stage && ps.num_units() == plan_.units.size(),
            "internal error: the store is not sharded as the plan says");
  SAT_CHECK(dp.size() == plan_.parts, "internal error: ZeRO-2/3 over ", dp.size(),
            " ranks for a plan of ", plan_.parts);
  SAT_CHECK(plan_.gathered_dtype == DType::f32 || plan_.gathered_dtype == ps.lp_dtype(),
            "internal error: ZeRO-3 gathers ", dtype_name(plan_.gathered_dtype), " units, the store keeps ",
            dtype_name(ps.lp_dtype()));
  const size_t U = plan_.units.size(), N = g.nodes().size();
  gathers_.resize(U);
  at_first_.assign(N, {}), at_last_.assign(N, {}), at_bwd_.assign(N, {});
  gaps_.assign(U, {});
  for (size_t u = 0; u < U; ++u) {
    // Mixed precision: the layers read the gathered low-precision copy, no float32 parameters.
    const bool lp = plan_.gathered_dtype != DType::f32;
    ps.bind_unit(u, lp ? nullptr : static_cast<float*>(unit_params(int(u))), unit_grads(int(u)),
                 lp ? unit_params(int(u)) : nullptr);
    if (plan_.first[u] >= 0) at_first_[size_t(plan_.first[u])].push_back(int(u));
    if (plan_.last[u] >= 0) at_last_[size_t(plan_.last[u])].push_back(int(u));
    if (plan_.bwd_last[u] >= 0) at_bwd_[size_t(plan_.bwd_last[u])].push_back(int(u));
  }
  // Padding inside each unit: zero in the buckets before they are reduced, so that the
  // shards' padding stays zero.
  std::set<std::string> tied(g.tied_copies().begin(), g.tied_copies().end());
  tied.insert(g.tied_remote().begin(), g.tied_remote().end());
  for (size_t i = 0; i < ps.num_params(); ++i) {
    const size_t u = size_t(ps.unit_of(i));
    const int64_t end = ps.offset(i) + ps.decl(i).spec.shape.numel();
    const int64_t next = i + 1 < ps.num_params() && size_t(ps.unit_of(i + 1)) == u ? ps.offset(i + 1) : ps.unit_end(u);
    if (next > end) gaps_[u].push_back({end - ps.unit_begin(u), next - ps.unit_begin(u)});
    if (tie && tied.count(ps.decl(i).name)) tied_units_.push_back(int(u));
  }
  first_micro_.assign(g.chunks().size(), true);
}

ShardedDP::~ShardedDP() {
  retired_.clear();
  gathers_.clear();
  pending_.reset();
}

void* ShardedDP::unit_params(int u) const {
  const int64_t at = plan_.param_at[size_t(u)];
  return at < 0 ? nullptr : arena_.as<uint8_t>() + at;
}

float* ShardedDP::unit_grads(int u) const {
  const int64_t at = plan_.grad_at[size_t(u)];
  return at < 0 ? nullptr : reinterpret_cast<float*>(arena_.as<uint8_t>() + at);
}

// The collective of w complete before the compute queued next: waited for on the host, or
// on a GPU an event the compute stream waits for (nothing waits on the host).
void ShardedDP::wait(dist::WorkPtr& w) {
  const double t0 = now_seconds();
  joined_.clear();
  joined_.push_back(std::move(w));
  order_->join(joined_);
  w = std::move(joined_.back());
  joined_.clear();
  exposed_ += now_seconds() - t0;
}

// A collective waited for (joined): kept until the step's end, as an NCCL Work's end waits
// for it on the host, which would hold the host back behind the GPU at every unit.
void ShardedDP::retire(dist::WorkPtr& w) {
  if (w) retired_.push_back(std::move(w));
}

// Before a collective: it comes after the compute queued so far.
void ShardedDP::launch_after_compute() { order_->before(0); }

// ZeRO-3: launches the all-gather of unit u's pieces into its buffer (once until freed):
// float32, or under mixed precision the pieces of the low-precision copy.
void ShardedDP::gather(int u) {
  if (plan_.stage < 3 || gathers_[size_t(u)]) return;
  const int64_t n = ps_.unit_piece(size_t(u)), at = ps_.unit_begin(size_t(u)) / plan_.parts;
  const DType t = plan_.gathered_dtype;
  const void* mine = t == DType::f32 ? static_cast<const void*>(ps_.flat_params() + at)
                                     : static_cast<const uint8_t*>(ps_.flat_lp()) + size_t(at) * dtype_size(t);
  launch_after_compute();
  gathers_[size_t(u)] = dp_.all_gather(mine, unit_params(u), size_t(n), t);
}

// ZeRO-3: each of `units` gathered (launched now unless prefetched; waits), and the unit
// after it in `order` (the chunk's forward or backward order) launched: the prefetch.
void ShardedDP::gather_ready(const std::vector<int>& units, const std::vector<int>& order) {
  for (int u : units) {
    gather(u);
    wait(gathers_[size_t(u)]);
    auto it = std::find(order.begin(), order.end(), u);
    if (it + 1 < order.end()) gather(*(it + 1));
  }
}

void ShardedDP::before_forward(int node) {
  if (plan_.stage < 3) return;
  gather_ready(at_first_[size_t(node)], plan_.fwd_order[size_t(g_.nodes()[size_t(node)].chunk)]);
}

void ShardedDP::after_forward(int node) {
  if (plan_.stage < 3) return;
  for (int u : at_last_[size_t(node)]) retire(gathers_[size_t(u)]);  // its buffer is free
}

void ShardedDP::before_backward(int node) {
  if (plan_.stage < 3) return;
  gather_ready(at_bwd_[size_t(node)], plan_.bwd_order[size_t(g_.nodes()[size_t(node)].chunk)]);
}

void ShardedDP::after_backward(int node) {
  const auto& o = plan_.reduce_order[size_t(g_.nodes()[size_t(node)].chunk)];
  // Units whose gradients are final, in the order the plan reduces them.
  for (int u : o)
    if (plan_.first[size_t(u)] == node) {
      if (plan_.stage >= 3) retire(gathers_[size_t(u)]);
      reduce_bucket(u);
    }
}

// Launches the reduce-scatter of unit u's bucket (in place: this rank's piece lands at
// its place in the bucket), then finishes the one before it.
void ShardedDP::reduce_bucket(int u) {
  float* b = unit_grads(u);
  for (auto [lo, hi] : gaps_[size_t(u)]) dev_.zero(b + lo, size_t(hi - lo) * sizeof(float));
  const int64_t n = ps_.unit_piece(size_t(u));
  launch_after_compute();
  dist::WorkPtr w = dp_.reduce_scatter(b, b + dp_.rank() * n, size_t(n), DType::f32, dist::ReduceOp::avg);
  finish_bucket();
  pending_ = std::move(w);
  pending_unit_ = u;
}

// The reduce-scatter in flight complete: its piece copied (first micro-batch of the
// step) or added into this rank's gradient shard.
void ShardedDP::finish_bucket() {
  if (!pending_) return;
  wait(pending_);
  retire(pending_);
  const size_t u = size_t(pending_unit_);
  const int64_t n = ps_.unit_piece(u);
  const float* src = unit_grads(int(u)) + dp_.rank() * n;
  float* dst = ps_.flat_grads() + ps_.unit_begin(u) / plan_.parts;
  dev_.add_into(dst, src, n, first_micro_[size_t(plan_.chunk[u])]);
}

void ShardedDP::after_backward(int chunk, bool, bool) {
  finish_bucket();
  first_micro_[size_t(chunk)] = false;
}

void ShardedDP::reduce() {
  finish_bucket();
  // A tied parameter is a unit of its own with the same layout on every stage that holds
  // it: the pieces of its copies line up.
  for (int u : tied_units_) {
    const int64_t n = ps_.unit_piece(size_t(u));
    tie_->all_reduce(ps_.flat_grads() + ps_.unit_begin(size_t(u)) / plan_.parts, size_t(n), DType::f32,
                     dist::ReduceOp::sum)
        ->wait();
  }
  std::fill(first_micro_.begin(), first_micro_.end(), true);
}

void ShardedDP::after_update() {
  retired_.clear();  // complete: the update came after them
  if (plan_.stage != 2) return;
  std::vector<dist::WorkPtr> works;
  float* p = ps_.flat_params();
  launch_after_compute();  // the update
  for (size_t u = 0; u < ps_.num_units(); ++u) {
    const int64_t n = ps_.unit_piece(u), lo = ps_.unit_begin(u);
    works.push_back(dp_.all_gather(p + lo + dp_.rank() * n, p + lo, size_t(n), DType::f32));
  }
  const double t0 = now_seconds();
  order_->join(works);
  exposed_ += now_seconds() - t0;
  dev_.refresh_lp(ps_);  // the whole updated parameters are here now
}

std::unique_ptr<ParamStore> ShardedDP::unsharded() const {
  auto out = std::make_unique<ParamStore>(g_.params(), g_.states(), 0, StoreSharding::weights_only());
  int64_t most = 0;
  for (size_t u = 0; u < ps_.num_units(); ++u) most = std::max(most, ps_.unit_piece(u) * plan_.parts);
  // Each unit gathered where the store lives, then copied to the host.
  DeviceBuffer staged = dev_.buffer(size_t(most) * sizeof(float), "ZeRO-3 unsharding");
  std::vector<float> unit(static_cast<size_t>(most));
  for (size_t u = 0; u < ps_.num_units(); ++u) {
    const int64_t n = ps_.unit_piece(u);
    order_->before(0);
    std::vector<dist::WorkPtr> w;
    w.push_back(dp_.all_gather(ps_.flat_params() + ps_.unit_begin(u) / plan_.parts, staged.as<float>(), size_t(n),
                               DType::f32));
    order_->join(w);
    dev_.synchronize();
    device_copy(unit.data(), Device::cpu, staged.data(), staged.device(), size_t(n * plan_.parts) * sizeof(float));
    for (size_t i = 0; i < ps_.num_params(); ++i) {
      if (size_t(ps_.unit_of(i)) != u) continue;
      const float* src = unit.data() + (ps_.offset(i) - ps_.unit_begin(u));
      Tensor dst = out->host_param(i);
      std::copy(src, src + dst.numel(), dst.f32());
    }
  }
  for (size_t i = 0; i < ps_.num_states(); ++i) {  // where the states live: the device side
    Tensor src = ps_.state(i), dst = out->host_state(i);
    device_copy(dst.ptr, Device::cpu, src.ptr, ps_.device(), src.bytes());
  }
  return out;
}

}  // namespace sat
