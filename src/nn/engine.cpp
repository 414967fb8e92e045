#include "nn/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "core/timer.h"

#include "core/rng.h"
#include "nn/params.h"

namespace sat {
namespace {

// Buffer ids of one planned step.
struct StepBuffers {
  ArenaPlanner planner;
  std::vector<int> value, grad;                       // per value (-1: none / external)
  std::vector<std::vector<int>> saved, sfwd, sbwd;    // per node
  std::vector<std::vector<int>> temp;                 // per node, per input slot: extra-consumer grad temp
};

StepBuffers plan_step(const Graph& g) {
  StepBuffers b;
  const auto& nodes = g.nodes();
  const auto& vals = g.values();
  const int N = int(nodes.size());
  const bool train = g.training();
  auto bwd_t = [&](int i) { return 2 * N - 1 - i; };
  b.value.assign(vals.size(), -1);
  b.grad.assign(vals.size(), -1);
  b.saved.resize(size_t(N));
  b.sfwd.resize(size_t(N));
  b.sbwd.resize(size_t(N));
  b.temp.resize(size_t(N));
  for (size_t v = 0; v < vals.size(); ++v) {
    const Value& val = vals[v];
    if (val.producer < 0) continue;  // graph input: bound from outside
    int p = val.producer;
    int last_use = p;
    for (auto& c : val.consumers) last_use = std::max(last_use, c.first);
    if (int(v) == g.loss() || int(v) == g.logits()) last_use = N - 1;
    int end = train ? bwd_t(p) : last_use;
    b.value[v] = b.planner.add(val.name, MemKind::activations, val.spec.bytes(), p, end);
    if (train && val.needs_grad) {
      int first_consumer_bwd = val.consumers.empty() ? bwd_t(p) : bwd_t(val.consumers.back().first);
      for (auto& c : val.consumers) first_consumer_bwd = std::min(first_consumer_bwd, bwd_t(c.first));
      b.grad[v] = b.planner.add(val.name + ".grad", MemKind::activation_grads, val.spec.bytes(),
                                first_consumer_bwd, bwd_t(p));
    }
  }
  for (int i = 0; i < N; ++i) {
    const Node& n = nodes[size_t(i)];
    for (auto& s : n.setup.saved)
      b.saved[size_t(i)].push_back(b.planner.add(n.name + ".saved", MemKind::saved, s.bytes(), i, train ? bwd_t(i) : i));
    for (auto& s : n.setup.scratch_fwd)
      b.sfwd[size_t(i)].push_back(b.planner.add(n.name + ".scratch", MemKind::scratch, s.bytes(), i, i));
    b.temp[size_t(i)].assign(n.inputs.size(), -1);
    if (!train || !n.needs_backward) continue;
    for (auto& s : n.setup.scratch_bwd)
      b.sbwd[size_t(i)].push_back(b.planner.add(n.name + ".scratch", MemKind::scratch, s.bytes(), bwd_t(i), bwd_t(i)));
    // A value read by several consumers: the last consumer (first in backward order)
    // writes its gradient; the others write a temporary that is then added in.
    for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
      const Value& in = vals[size_t(n.inputs[slot])];
      if (!in.needs_grad) continue;
      std::pair<int, int> me{i, int(slot)};
      if (in.consumers.back() != me)
        b.temp[size_t(i)][slot] = b.planner.add(in.name + ".grad+", MemKind::activation_grads, in.spec.bytes(),
                                                bwd_t(i), bwd_t(i));
    }
  }
  b.planner.solve();
  return b;
}

}  // namespace

MemoryPlan Engine::plan_memory(const Graph& g, int optimizer_slots, size_t input_bytes) {
  MemoryPlan m;
  auto sizes = ParamStore::predict(g.params(), g.states(), optimizer_slots);
  m.by_kind[size_t(MemKind::parameters)] = sizes.params;
  m.by_kind[size_t(MemKind::gradients)] = g.training() ? sizes.grads : 0;
  m.by_kind[size_t(MemKind::optimizer_state)] = sizes.optimizer;
  m.by_kind[size_t(MemKind::model_state)] = sizes.states;
  m.persistent = sizes.params + (g.training() ? sizes.grads : 0) + sizes.optimizer + sizes.states;
  StepBuffers b = plan_step(g);
  for (size_t i = 0; i < b.planner.size(); ++i) m.by_kind[size_t(b.planner[int(i)].kind)] += b.planner[int(i)].bytes;
  m.transient = b.planner.arena_bytes();
  m.inputs = input_bytes;
  m.by_kind[size_t(MemKind::inputs)] = input_bytes;
  return m;
}

Engine::Engine(Graph& g, ParamStore& ps) : g_(g), ps_(ps) {
  StepBuffers b = plan_step(g);
  arena_ = Buffer(b.planner.arena_bytes(), "activations arena");
  auto at = [&](int id, const TensorSpec& spec) {
    if (id < 0) return Tensor(nullptr, spec.shape, spec.dtype);
    return Tensor(arena_.as<uint8_t>() + b.planner[id].offset, spec.shape, spec.dtype);
  };
  const auto& vals = g.values();
  const auto& nodes = g.nodes();
  for (size_t v = 0; v < vals.size(); ++v) {
    vals_.push_back(at(b.value[v], vals[v].spec));
    grads_.push_back(at(b.grad[v], vals[v].spec));
  }
  input_users_.resize(vals.size());
  // Which node touches a parameter first in backward order (the highest node index).
  std::vector<int> first_node(g.params().size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int pid : nodes[i].param_ids) first_node[size_t(pid)] = int(i);
  runs_.resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    NodeRun& r = runs_[i];
    LayerCtx& c = r.ctx;
    for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
      int v = n.inputs[slot];
      c.in.push_back(vals_[size_t(v)]);
      SAT_ASSERT(slot < 64);  // (node, slot) of a graph input's users is packed as node*64+slot
      if (vals[size_t(v)].producer < 0) input_users_[size_t(v)].push_back(int(i * 64 + slot));
      Tensor din = grads_[size_t(v)];
      if (b.temp[i][slot] >= 0) {
        Tensor t = at(b.temp[i][slot], vals[size_t(v)].spec);
        r.grad_adds.push_back({t, din});
        din = t;
      }
      c.din.push_back(n.needs_backward ? din : Tensor(nullptr, din.shape, din.dtype));
    }
    c.out = vals_[size_t(n.output)];
    c.dout = grads_[size_t(n.output)];
    for (size_t k = 0; k < n.param_ids.size(); ++k) {
      size_t pid = size_t(n.param_ids[k]);
      c.params.push_back(ps.param(pid));
      c.grads.push_back(ps.grad(pid));
      c.accumulate.push_back(true);
      r.first_writer.push_back(first_node[pid] == int(i));
    }
    for (int sid : n.state_ids) c.states.push_back(ps.state(size_t(sid)));
    for (size_t k = 0; k < b.saved[i].size(); ++k) c.saved.push_back(at(b.saved[i][k], n.setup.saved[k]));
    for (size_t k = 0; k < b.sfwd[i].size(); ++k) r.scratch_fwd.push_back(at(b.sfwd[i][k], n.setup.scratch_fwd[k]));
    for (size_t k = 0; k < b.sbwd[i].size(); ++k) r.scratch_bwd.push_back(at(b.sbwd[i][k], n.setup.scratch_bwd[k]));
  }
}

void Engine::bind(int v, const Tensor& t) {
  const Value& val = g_.value(v);
  SAT_CHECK(val.producer < 0, "internal error: binding a computed value");
  SAT_CHECK(t.shape == val.spec.shape && t.dtype == val.spec.dtype, "input ", val.name, " expects ",
            val.spec.shape.str(), " ", dtype_name(val.spec.dtype), ", got ", t.shape.str(), " ", dtype_name(t.dtype));
  vals_[size_t(v)] = t;
  for (int u : input_users_[size_t(v)]) runs_[size_t(u / 64)].ctx.in[size_t(u % 64)] = t;
}

float Engine::forward(bool training, uint64_t seed) {
  SAT_CHECK(!training || g_.training(), "internal error: training step on an inference graph");
  auto& nodes = g_.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    NodeRun& r = runs_[i];
    r.ctx.training = training;
    r.ctx.seed = mix_seed(seed, i);
    r.ctx.scratch = r.scratch_fwd;
    if (!profile_) {
      nodes[i].layer->forward(r.ctx);
      continue;
    }
    times_.resize(nodes.size());
    double t0 = now_seconds();
    nodes[i].layer->forward(r.ctx);
    times_[i].fwd += now_seconds() - t0;
    times_[i].calls++;
  }
  if (g_.loss() < 0) return std::nanf("");
  return vals_[size_t(g_.loss())].f32()[0];
}

void Engine::backward(float dloss, bool first_micro) {
  SAT_CHECK(g_.training() && g_.loss() >= 0, "internal error: backward needs a training graph with a loss");
  grads_[size_t(g_.loss())].f32()[0] = dloss;
  auto& nodes = g_.nodes();
  for (size_t i = nodes.size(); i-- > 0;) {
    if (!nodes[i].needs_backward) continue;
    NodeRun& r = runs_[i];
    for (size_t k = 0; k < r.first_writer.size(); ++k) r.ctx.accumulate[k] = !(first_micro && r.first_writer[k]);
    r.ctx.scratch = r.scratch_bwd;
    double t0 = profile_ ? now_seconds() : 0;
    nodes[i].layer->backward(r.ctx);
    for (auto& [tmp, dst] : r.grad_adds) {
      const float* s = tmp.f32();
      float* d = dst.f32();
      int64_t n = tmp.numel();
#pragma omp parallel for simd if (n > 65536)
      for (int64_t k = 0; k < n; ++k) d[k] += s[k];
    }
    if (profile_) times_[i].bwd += now_seconds() - t0;
  }
}

std::string Engine::profile_report() const {
  struct Row { double fwd = 0, bwd = 0, flops = 0; int n = 0; };
  std::map<std::string, Row> by_kind;
  double total = 0;
  int64_t calls = 1;
  for (size_t i = 0; i < times_.size(); ++i) {
    const Node& n = g_.nodes()[i];
    Row& r = by_kind[n.layer->kind()];
    r.fwd += times_[i].fwd;
    r.bwd += times_[i].bwd;
    r.flops += n.setup.flops_fwd + n.setup.flops_bwd;
    r.n++;
    total += times_[i].fwd + times_[i].bwd;
    calls = std::max<int64_t>(calls, times_[i].calls);
  }
  std::vector<std::pair<std::string, Row>> rows(by_kind.begin(), by_kind.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.fwd + a.second.bwd > b.second.fwd + b.second.bwd; });
  std::string out = "layer kind            count  forward ms  backward ms   share  GFLOP/s   (per micro-batch, over " +
                    std::to_string(calls) + " forward calls)\n";
  char line[256];
  for (auto& [kind, r] : rows) {
    double t = r.fwd + r.bwd;
    std::snprintf(line, sizeof line, "%-20s %6d %11.3f %12.3f %6.1f%% %8.1f\n", kind.c_str(), r.n, 1e3 * r.fwd / double(calls),
                  1e3 * r.bwd / double(calls), total > 0 ? 100 * t / total : 0.0, t > 0 ? r.flops * double(calls) / t / 1e9 : 0.0);
    out += line;
  }
  return out;
}

}  // namespace sat
