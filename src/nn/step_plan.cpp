#include "nn/step_plan.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace sat {

namespace {

// Buffers of one context, keyed by (what, index, sub-index); each gets one interval per
// micro-batch that uses the context.
class CtxBuffers {
 public:
  CtxBuffers(ArenaPlanner& p, int ctx) : p_(p), ctx_(ctx) {}
  enum What { value, grad, saved, sfwd, sbwd, temp };
  void live(What w, int i, int j, const std::string& name, MemKind kind, size_t bytes, int t0, int t1) {
    auto key = std::make_tuple(int(w), i, j);
    auto it = ids_.find(key);
    if (it == ids_.end()) {
      ids_[key] = p_.add(str_cat("ctx", ctx_, ":", name), kind, bytes, t0, t1);
    } else {
      p_.extend(it->second, t0, t1);
    }
  }
  int64_t offset(What w, int i, int j = 0) const {
    auto it = ids_.find(std::make_tuple(int(w), i, j));
    return it == ids_.end() ? -1 : int64_t(p_[it->second].offset);
  }

 private:
  ArenaPlanner& p_;
  int ctx_;
  std::map<std::tuple<int, int, int>, int> ids_;
};

// Times within an action: forward node i at unit i; backward is a sequence of events,
// for each node in backward order the recompute of its unit's nodes (forward order) when
// it is the unit's last node (full recomputation), then its backward.
struct Events {
  std::vector<int> bwd, rec;  // per node: its backward's unit; its recompute's (-1: none)
  int units = 0;              // units of a backward action (>= nodes)
  explicit Events(const Graph& g) {
    const auto& nodes = g.nodes();
    const int N = int(nodes.size());
    bwd.assign(size_t(N), -1);
    rec.assign(size_t(N), -1);
    for (int i = N; i-- > 0;) {
      const Node& n = nodes[size_t(i)];
      if (n.rc_last == i)
        for (int k = n.rc_first; k <= i; ++k) rec[size_t(k)] = units++;
      bwd[size_t(i)] = units++;
    }
  }
};

struct Times {
  int W;
  const Events& ev;
  MicroUse u;
  int f(int node) const { return u.fwd * W + node; }
  int b(int node) const { return u.bwd * W + ev.bwd[size_t(node)]; }
  int r(int node) const { return u.bwd * W + ev.rec[size_t(node)]; }
  // The end of node i's backward: its weight part's unit when the backward is split.
  int w(int node) const { return (u.wgt >= 0 ? u.wgt : u.bwd) * W + ev.bwd[size_t(node)]; }
  int at(int action) const { return action * W; }
};

// The buffers node i holds itself in one micro-batch's use: saved, scratch, and the
// temporaries of its input gradients.
void plan_node_buffers(const Graph& g, const Times& t, CtxBuffers& bufs, int i) {
  const Node& n = g.nodes()[size_t(i)];
  const auto& vals = g.values();
  const bool train = t.u.bwd >= 0;
  const bool rec = train && n.rc_first >= 0;  // its forward runs again in backward
  const bool split = train && t.u.wgt >= 0 && backward_parts(g, i).weight;  // a weight part at w(i)
  const int saved_end = split ? t.w(i) : t.b(i);
  for (size_t k = 0; k < n.setup.saved.size(); ++k) {
    const std::string what = n.name + ".saved";
    bufs.live(CtxBuffers::saved, i, int(k), what, MemKind::saved, n.setup.saved[k].bytes(), t.f(i),
              train && !rec ? saved_end : t.f(i));
    if (rec) bufs.live(CtxBuffers::saved, i, int(k), what, MemKind::saved, n.setup.saved[k].bytes(), t.r(i), saved_end);
  }
  for (size_t k = 0; k < n.setup.scratch_fwd.size(); ++k) {
    const std::string what = n.name + ".scratch";
    bufs.live(CtxBuffers::sfwd, i, int(k), what, MemKind::scratch, n.setup.scratch_fwd[k].bytes(), t.f(i), t.f(i));
    if (rec) bufs.live(CtxBuffers::sfwd, i, int(k), what, MemKind::scratch, n.setup.scratch_fwd[k].bytes(), t.r(i), t.r(i));
  }
  if (!train || !n.needs_backward) return;
  for (size_t k = 0; k < n.setup.scratch_bwd.size(); ++k) {
    bufs.live(CtxBuffers::sbwd, i, int(k), n.name + ".scratch", MemKind::scratch, n.setup.scratch_bwd[k].bytes(),
              t.b(i), t.b(i));
    if (split)
      bufs.live(CtxBuffers::sbwd, i, int(k), n.name + ".scratch", MemKind::scratch, n.setup.scratch_bwd[k].bytes(),
                t.w(i), t.w(i));
  }
  // A value read by several nodes: the last reader (first in backward order) writes its
  // gradient; the others write a temporary that is then added in.
  for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
    const Value& in = vals[size_t(n.inputs[slot])];
    if (!in.needs_grad || in.kind == Value::Kind::data) continue;
    if (in.consumers.back() != std::pair<int, int>{i, int(slot)})
      bufs.live(CtxBuffers::temp, i, int(slot), in.name + ".grad+", MemKind::activation_grads, in.spec.bytes(), t.b(i),
                t.b(i));
  }
}

// Split backwards (MicroUse::wgt): until when each value and each value's gradient is read
// by a weight part (-1: never).
void weight_holds(const Graph& g, const Times& t, std::vector<int>& hold, std::vector<int>& hold_grad) {
  hold.assign(g.values().size(), -1), hold_grad.assign(g.values().size(), -1);
  if (t.u.bwd < 0 || t.u.wgt < 0) return;
  const Chunk& ch = g.chunks()[size_t(t.u.chunk)];
  for (int i = ch.begin; i < ch.end; ++i) {
    const Node& n = g.nodes()[size_t(i)];
    if (!backward_parts(g, i).weight) continue;
    if (n.layer->backward_reads_inputs())
      for (int v : n.inputs) hold[size_t(v)] = std::max(hold[size_t(v)], t.w(i));
    if (n.layer->backward_reads_output()) hold[size_t(n.output)] = std::max(hold[size_t(n.output)], t.w(i));
    hold_grad[size_t(n.output)] = t.w(i);
  }
}

// The intervals of one micro-batch's buffers in its context.
void plan_use(const Graph& g, const Times& t, CtxBuffers& bufs) {
  const auto& nodes = g.nodes();
  const auto& vals = g.values();
  const Chunk& ch = g.chunks()[size_t(t.u.chunk)];
  const bool train = t.u.bwd >= 0;
  // The last reader in forward order is the first in backward order.
  auto last_reader = [&](const Value& v, int dflt) {
    int n = dflt;
    for (auto& c : v.consumers) n = std::max(n, c.first);
    return n;
  };
  auto first_reader = [&](const Value& v) {
    int n = int(nodes.size());
    for (auto& c : v.consumers) n = std::min(n, c.first);
    return n;
  };
  // Full recomputation: a value computed inside a recompute unit that nothing after the
  // unit reads (the unit's output stays: later units and the stage's sends read it).
  auto recomputed = [&](int id) {
    const Value& v = vals[size_t(id)];
    const Node& p = nodes[size_t(v.producer)];
    if (p.rc_first < 0 || v.sent || id == g.loss() || id == g.logits()) return false;
    for (auto& c : v.consumers)
      if (c.first > p.rc_last) return false;
    return true;
  };
  std::vector<int> hold, hold_grad;
  weight_holds(g, t, hold, hold_grad);
  // Values first, then each node's own buffers (the order breaks the planner's ties).
  for (size_t id = 0; id < vals.size(); ++id) {
    const Value& v = vals[id];
    if (v.chunk != t.u.chunk) continue;
    if (v.kind == Value::Kind::received) {
      const int arrive = t.at(t.u.recv >= 0 ? t.u.recv : t.u.fwd);
      const int end = train ? std::max(t.b(first_reader(v)), hold[id]) : t.f(last_reader(v, 0));
      bufs.live(CtxBuffers::value, int(id), 0, v.name + " (received)", MemKind::activations, v.spec.bytes(), arrive, end);
      if (train && v.needs_grad)
        bufs.live(CtxBuffers::grad, int(id), 0, v.name + ".grad (sent)", MemKind::activation_grads, v.spec.bytes(),
                  t.b(last_reader(v, 0)), t.u.send_grad >= 0 ? t.at(t.u.send_grad) - 1 : t.b(first_reader(v)));
      continue;
    }
    if (v.kind != Value::Kind::computed) continue;
    const int i = v.producer;
    int end;
    if (train) {
      end = t.b(i);
    } else {
      end = last_reader(v, i);
      if (int(id) == g.loss() || int(id) == g.logits()) end = int(nodes.size()) - 1;
      end = t.f(end);
    }
    if (v.sent) end = std::max(end, t.at(t.u.send) - 1);
    end = std::max(end, hold[id]);
    if (train && recomputed(int(id))) {
      // Dropped after its last reader's forward; recomputed for backward.
      bufs.live(CtxBuffers::value, int(id), 0, v.name, MemKind::activations, v.spec.bytes(), t.f(i),
                t.f(last_reader(v, i)));
      bufs.live(CtxBuffers::value, int(id), 0, v.name, MemKind::activations, v.spec.bytes(), t.r(i), end);
    } else {
      bufs.live(CtxBuffers::value, int(id), 0, v.name, MemKind::activations, v.spec.bytes(), t.f(i), end);
    }
    if (train && v.needs_grad) {
      const int begin = v.sent ? t.at(t.u.recv_grad >= 0 ? t.u.recv_grad : t.u.bwd)
                               : t.b(last_reader(v, i));
      bufs.live(CtxBuffers::grad, int(id), 0, v.name + ".grad", MemKind::activation_grads, v.spec.bytes(), begin,
                std::max(t.b(i), hold_grad[id]));
    }
  }
  for (int i = ch.begin; i < ch.end; ++i) plan_node_buffers(g, t, bufs, i);
}

}  // namespace

StepPlan plan_step(const Graph& g, const Timeline& tl) {
  const int N = int(g.nodes().size());
  StepPlan sp;
  ArenaPlanner planner;
  std::vector<MicroUse> uses = tl.uses;
  auto first_action = [](const MicroUse& u) { return u.recv >= 0 ? std::min(u.recv, u.fwd) : u.fwd; };
  std::stable_sort(uses.begin(), uses.end(),
                   [&](const MicroUse& a, const MicroUse& b) { return first_action(a) < first_action(b); });
  for (auto& u : uses) sp.contexts = std::max(sp.contexts, u.ctx + 1);
  std::vector<CtxBuffers> bufs;
  for (int k = 0; k < sp.contexts; ++k) bufs.emplace_back(planner, k);
  const Events ev(g);
  sp.units = std::max(N, ev.units) + 1;
  for (auto& u : uses) plan_use(g, Times{sp.units, ev, u}, bufs[size_t(u.ctx)]);
  sp.arena = planner.solve();
  sp.bwd_unit = ev.bwd, sp.rec_unit = ev.rec;
  for (size_t i = 0; i < planner.size(); ++i) {
    const PlanBuffer& b = planner[int(i)];
    sp.by_kind[size_t(b.kind)] += b.bytes;
    for (auto [t0, t1] : b.live) sp.lifetimes.push_back({b.bytes, t0, t1, b.kind});
  }
  const auto& nodes = g.nodes();
  sp.ctx.resize(size_t(sp.contexts));
  for (int k = 0; k < sp.contexts; ++k) {
    StepPlan::Ctx& c = sp.ctx[size_t(k)];
    const CtxBuffers& b = bufs[size_t(k)];
    for (size_t v = 0; v < g.values().size(); ++v) {
      c.value.push_back(b.offset(CtxBuffers::value, int(v)));
      c.grad.push_back(b.offset(CtxBuffers::grad, int(v)));
    }
    c.saved.resize(nodes.size());
    c.sfwd.resize(nodes.size());
    c.sbwd.resize(nodes.size());
    c.temp.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {
      const Node& n = nodes[i];
      for (size_t j = 0; j < n.setup.saved.size(); ++j) c.saved[i].push_back(b.offset(CtxBuffers::saved, int(i), int(j)));
      for (size_t j = 0; j < n.setup.scratch_fwd.size(); ++j)
        c.sfwd[i].push_back(b.offset(CtxBuffers::sfwd, int(i), int(j)));
      for (size_t j = 0; j < n.setup.scratch_bwd.size(); ++j)
        c.sbwd[i].push_back(b.offset(CtxBuffers::sbwd, int(i), int(j)));
      for (size_t j = 0; j < n.inputs.size(); ++j) c.temp[i].push_back(b.offset(CtxBuffers::temp, int(i), int(j)));
    }
  }
  return sp;
}

namespace {
std::vector<size_t> live_of(const std::vector<StepPlan::Live>& lifetimes) {
  int end = 0;
  for (const auto& l : lifetimes) end = std::max(end, l.t1 + 1);
  std::vector<int64_t> delta(size_t(end) + 1, 0);
  for (const auto& l : lifetimes) delta[size_t(l.t0)] += int64_t(l.bytes), delta[size_t(l.t1) + 1] -= int64_t(l.bytes);
  std::vector<size_t> live(static_cast<size_t>(end));
  int64_t now = 0;
  for (int t = 0; t < end; ++t) live[size_t(t)] = size_t(now += delta[size_t(t)]);
  return live;
}
}  // namespace

std::vector<size_t> live_bytes(const StepPlan& p) { return live_of(p.lifetimes); }

std::array<size_t, size_t(MemKind::kCount)> live_at_peak(const StepPlan& p) { return live_at_peak(p.lifetimes); }

std::array<size_t, size_t(MemKind::kCount)> live_at_peak(const std::vector<StepPlan::Live>& lifetimes) {
  std::array<size_t, size_t(MemKind::kCount)> by{};
  const std::vector<size_t> live = live_of(lifetimes);
  if (live.empty()) return by;
  const int peak = int(std::max_element(live.begin(), live.end()) - live.begin());
  for (const auto& l : lifetimes)
    if (l.t0 <= peak && peak <= l.t1) by[size_t(l.kind)] += l.bytes;
  return by;
}

}  // namespace sat
