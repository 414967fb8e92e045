#include "plan/planner.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <tuple>

#include "backend/device.h"
#include "core/error.h"
#include "core/text.h"
#include "data/dataset.h"
#include "nn/params.h"
#include "plan/cost.h"
#include "plan/memory_formula.h"
#include "train/config.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "train/validate.h"

namespace sat {

// ---------------------------------------------------------------------------------------
// Layouts as text

void apply_layout(const Layout& l, TrainConfig& cfg) {
  static_cast<Layout&>(cfg) = l;
  if (l.pp == 1) cfg.pp_schedule = PipeSchedule::one_f_one_b;
  cfg.pp_split.clear();
}

bool LayoutFilter::empty() const {
  return !dp && !tp && !pp && !v && !zero && !micro && !schedule && !recompute && !sp && !cp && !ep;
}

namespace {

// Digits only, from 1 to max (2^24 by default: ranks and chunks are ints, 2147483648 wrapped
// to a negative count; strtoll's overflow to LLONG_MAX passed for a micro-batch).
int64_t positive(const std::string& key, const std::string& v, int64_t max = int64_t(1) << 24) {
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  SAT_CHECK(!v.empty() && v[0] != '-' && ec == std::errc() && end == v.data() + v.size() && x >= 1 && x <= max,
            "--layout: ", key, "=", v, ": expected a positive integer up to ", max);
  return x;
}

void set_field(LayoutFilter& f, const std::string& k, const std::string& v) {
  if (k == "dp") f.dp = int(positive(k, v));
  else if (k == "tp") f.tp = int(positive(k, v));
  else if (k == "pp") f.pp = int(positive(k, v));
  else if (k == "micro") f.micro = positive(k, v);
  else if (k == "cp") f.cp = int(positive(k, v));
  else if (k == "ep") f.ep = int(positive(k, v));
  else if (k == "v") f.v = int(positive(k, v));
  else if (k == "zero") {
    SAT_CHECK(v.size() == 1 && v[0] >= '0' && v[0] <= '3', "--layout: zero=", v, ": expected a ZeRO stage 0, 1, 2 or 3");
    f.zero = v[0] - '0';
  } else if (k == "schedule") {
    f.schedule = parse_pipe_schedule(v, "--layout: schedule");
  } else if (k == "recompute") {
    f.recompute = parse_recompute(v, "--layout: recompute");
  } else if (k == "sp") {
    f.sp = parse_on_off("--layout: sp", v);
  } else {
    fail("--layout: unknown field '", k, "' (expected dp, tp, pp, micro, schedule, v, recompute, sp, zero, cp, ep)");
  }
}

}  // namespace

LayoutFilter parse_layout(const std::string& s) {
  LayoutFilter f;
  std::set<std::string> seen;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = std::min(s.find(',', at), s.size());
    const std::string item = s.substr(at, comma - at);
    const size_t eq = item.find('=');
    SAT_CHECK(eq != std::string::npos && eq > 0, "--layout: '", item, "': expected FIELD=VALUE (e.g. dp=2,tp=4,pp=8)");
    SAT_CHECK(seen.insert(item.substr(0, eq)).second, "--layout: '", item.substr(0, eq), "' is given twice");
    set_field(f, item.substr(0, eq), item.substr(eq + 1));
    at = comma + 1;
  }
  return f;
}

namespace {

// ---------------------------------------------------------------------------------------
// Per-block tables of one tensor-parallel rank's graph at one micro-batch: what a stage of
// any cut is made of.

struct BlockTable {
  std::unique_ptr<BuiltModel> whole;  // this tp rank's whole model (for the cuts)
  std::vector<double> fwd, bwd, tp_comm;  // seconds per micro-batch (bwd: recompute included)
  std::vector<double> bwd_cached;         // seconds less with the gradients' sums in the cache
  std::vector<double> kept, work;         // bytes: kept from forward to backward; the working set beyond
  std::vector<double> bwd_weight;         // seconds of bwd that a split backward's W takes (zb-h1)
  std::vector<double> kept_weight;        // of kept, the inputs of weight gradients (held until W)
  std::vector<double> attn_fwd, attn_bwd, attn_layers;  // causal attention's seconds and count (the ring hides behind them)
  std::vector<double> attn_saved;         // of kept, what causal attention saves (its probabilities: T x T)
  std::vector<double> attn_work;          // of work, causal attention's (its scores: T x T)
  std::vector<double> moe_fwd, moe_bwd, moe_layers;  // the experts' seconds and the moe layers
  std::vector<double> params, units;      // parameters owned (this tp rank); ZeRO unit sizes (largest per block)
  std::vector<double> expert_params;      // of params, the experts' (--ep: each rank holds 1/ep of them)
  std::vector<double> cut_bytes;          // [b]: activation bytes crossing a cut before block b
  double tied = 0;                        // a tied parameter declared by the first block, used by the last
  int blocks = 0;
};

int block_of(const std::vector<int>& starts, int gid) {
  return int(std::upper_bound(starts.begin(), starts.end(), gid) - starts.begin()) - 1;
}

// Kept bytes of node i per micro-batch in flight, and its share of the working set.
std::pair<double, double> node_bytes(const Graph& g, int i) {
  const Node& n = g.nodes()[size_t(i)];
  double saved = 0, scratch = 0;
  for (auto& t : n.setup.saved) saved += double(t.bytes());
  for (auto& t : n.setup.scratch_bwd) scratch = std::max(scratch, double(t.bytes()));
  for (auto& t : n.setup.scratch_fwd) scratch = std::max(scratch, double(t.bytes()));
  const double out = double(n.setup.output.bytes());
  if (n.rc_first < 0) return {out + saved, scratch};
  bool read_after = false;  // by a node after the unit: the unit's output stays
  for (auto [c, slot] : g.value(n.output).consumers) read_after |= c > n.rc_last;
  return {read_after ? out : 0, (read_after ? 0 : out) + saved + scratch};
}

// A node with parameters of its own: its backward is two products of equal size, the input's
// gradient and the weight's (a linear layer's dX = dY W and dW = X^T dY), so a split backward's
// W takes half of it (recomputation and collectives stay with I), and W holds the node's saved
// input until it runs.
void add_weight_part(BlockTable& t, const Node& n, const NodeCost& c, size_t b) {
  bool own = false;
  for (auto& p : n.setup.params) own |= !p.shared;
  if (!own) return;
  t.bwd_weight[b] += c.bwd / 2;
  if (n.rc_first < 0)  // (a recomputed unit's saved tensors are not kept from forward)
    for (auto& x : n.setup.saved) t.kept_weight[b] += double(x.bytes());
}

void fill_blocks(BlockTable& t, const Hardware& hw, const TPContext& tp) {
  const Graph& g = *t.whole->graph;
  const auto& starts = g.block_starts();
  t.blocks = int(starts.size());
  for (auto* v : {&t.fwd, &t.bwd, &t.bwd_cached, &t.tp_comm, &t.kept, &t.work, &t.params, &t.expert_params, &t.units, &t.cut_bytes,
                  &t.bwd_weight, &t.kept_weight, &t.attn_fwd, &t.attn_bwd, &t.attn_layers, &t.attn_saved, &t.attn_work, &t.moe_fwd,
                  &t.moe_bwd, &t.moe_layers})
    v->assign(size_t(t.blocks) + 1, 0);
  const std::vector<NodeCost> cost = node_costs(g, hw, tp);
  std::map<std::string, int> declared;
  std::vector<double> largest(size_t(t.blocks), 0);
  for (int i = 0; i < int(g.nodes().size()); ++i) {
    const Node& n = g.nodes()[size_t(i)];
    const size_t b = size_t(block_of(starts, n.gid));
    t.fwd[b] += cost[size_t(i)].forward();
    t.bwd[b] += cost[size_t(i)].backward();
    t.bwd_cached[b] += cost[size_t(i)].bwd_cached;
    t.tp_comm[b] += cost[size_t(i)].comm_fwd + cost[size_t(i)].comm_bwd;
    auto [k, w] = node_bytes(g, i);
    t.kept[b] += k;
    t.work[b] += w;
    add_weight_part(t, n, cost[size_t(i)], b);
    if (std::string(n.layer->kind()) == "Moe")
      t.moe_fwd[b] += cost[size_t(i)].fwd, t.moe_bwd[b] += cost[size_t(i)].bwd, t.moe_layers[b] += 1;
    if (std::string(n.layer->kind()) == "CausalSelfAttention") {
      t.attn_fwd[b] += cost[size_t(i)].fwd, t.attn_bwd[b] += cost[size_t(i)].bwd, t.attn_layers[b] += 1;
      t.attn_work[b] += w;
      if (n.rc_first < 0)
        for (auto& x : n.setup.saved) t.attn_saved[b] += double(x.bytes());
    }
    largest[b] = std::max(largest[b], double(n.setup.output.bytes()));
    for (auto& p : n.setup.params) {
      if (p.shared) {
        if (declared.count(p.name) && declared[p.name] != int(b)) t.tied = double(p.spec.shape.numel());
        continue;
      }
      declared[p.name] = int(b);
      t.params[b] += double(p.spec.shape.numel());
      if (std::string(n.layer->kind()) == "Moe") t.expert_params[b] += double(p.spec.shape.numel());
    }
    for (auto [c, slot] : g.value(n.output).consumers) {
      const int cb = block_of(starts, g.nodes()[size_t(c)].gid);
      for (int cut = int(b) + 1; cut <= cb; ++cut) t.cut_bytes[size_t(cut)] += double(n.setup.output.bytes());
    }
  }
  for (size_t b = 0; b < size_t(t.blocks); ++b) t.work[b] += 2 * largest[b];
  if (std::getenv("SAT_PLAN_DEBUG") && t.blocks > 2)
    std::fprintf(stderr, "block 1: forward %.4g ms, backward %.4g ms (recomputation included), tensor-parallel "
                 "collectives %.4g ms\n", 1e3 * t.fwd[1], 1e3 * t.bwd[1], 1e3 * t.tp_comm[1]);
}

// The block at which each whole-model node of a stage's chunk starts and ends.
struct Pieces {
  std::vector<std::pair<int, int>> chunk_blocks;  // per chunk of each stage: [first, last) blocks
};

// ---------------------------------------------------------------------------------------
// The search

struct Search {
  const PlanRequest& req;
  ModelConfig mc;  // the family, on the device kind
  int slots = 2;
  bool gpu = true;
  DType act = DType::f32;
  EngineModel engine;                    // whose memory and communication are modelled
  std::optional<TransformerShape> shape;  // set when the engine's memory is the formulas'
  std::map<std::tuple<int, bool, int64_t, int>, BlockTable> tables;
  std::map<std::tuple<int, int, int64_t, int>, std::vector<std::vector<Action>>> lists;
  PlanResult out;
  bool splits = false;  // every layer splits its backward into I and W (zb-h1 is offered; saturate's engine)

  explicit Search(const PlanRequest& r) : req(r), mc(r.model) {
    gpu = r.hw.gpu;
    act = gpu || r.precision == DType::bf16 ? r.precision : DType::f32;  // the CPU engine: f32 or bf16
    mc.device = gpu ? Device::cuda : Device::cpu;
    mc.act = act;
    OptimConfig oc;
    oc.name = r.optimizer;
    oc.momentum = r.momentum;
    slots = optimizer_slots(resolve_optim(oc));
    engine = r.engine;
    if (engine.formula) {
      shape = transformer_shape(mc);
      SAT_CHECK(shape.has_value(), "--engine ", engine.name, ": its memory is the published formulas of a "
                "transformer's step; --model ", mc.name, " is not of the gpt: or llama: family (use --engine saturate)");
      SAT_CHECK(gpu, "--engine ", engine.name, ": it runs on GPUs; --gpu ", r.hw.name, " plans saturate's CPU engine "
                "(use --engine saturate)");
    }
  }

  // The layouts the engine has: its ZeRO stages (FSDP shards everything whenever dp > 1) and
  // its tensor parallelism's sequence parallelism (torchtitan always shards the norms).
  bool engine_has(const Layout& l) const {
    if (l.zero > engine.max_zero) return false;
    if (engine.kind == EngineKind::fsdp && l.zero != (l.dp > 1 ? 3 : 0)) return false;
    if (engine.tp_sequence_parallel && l.sequence_parallel != (l.tp > 1)) return false;
    return true;
  }

  double limit() const { return req.memory_limit > 0 ? req.memory_limit : req.hw.memory_bytes; }

  // The links of the mesh's groups (tp fastest, then dp, then pp): a group whose ranks span
  // more than one node crosses the inter-node link.
  Link tp_link(const Layout& l) const { return l.tp <= req.gpus_per_node ? req.hw.intra : req.hw.inter; }
  Link dp_link(const Layout& l) const { return l.tp * l.cp * l.dp <= req.gpus_per_node ? req.hw.intra : req.hw.inter; }
  // The expert group: ep consecutive data-parallel ranks (tp x cp apart).
  Link ep_link(const Layout& l) const { return l.tp * l.cp * l.ep <= req.gpus_per_node ? req.hw.intra : req.hw.inter; }
  Link cp_link(const Layout& l) const { return l.tp * l.cp <= req.gpus_per_node ? req.hw.p2p_intra : req.hw.p2p_inter; }
  Link pp_link(const Layout& l) const {
    return l.tp * l.cp * l.dp * l.pp <= req.gpus_per_node ? req.hw.p2p_intra : req.hw.p2p_inter;
  }

  ModelConfig config_of(const Layout& l) const {
    ModelConfig c = mc;
    c.tp = l.tp, c.tp_rank = 0, c.sequence_parallel = l.sequence_parallel, c.recompute = l.recompute;
    return c;
  }

  const BlockTable& table(const Layout& l) {
    auto key = std::make_tuple(l.tp, l.sequence_parallel, l.batch, int(l.recompute));
    auto it = tables.find(key);
    if (it != tables.end()) return it->second;
    BlockTable& t = tables[key];
    t.whole = std::make_unique<BuiltModel>(build_model(config_of(l), l.batch, true));
    fill_blocks(t, req.hw, {l.tp, tp_link(l), engine.recompute_whole_core, engine.fused_dropout_add, engine.sp_regather,
                            engine.formula});
    return t;
  }

  const std::vector<std::vector<Action>>& schedule_lists(const ScheduleSpec& s) {
    auto key = std::make_tuple(int(s.kind), s.stages, int64_t(s.micro), s.virtual_stages);
    auto it = lists.find(key);
    if (it != lists.end()) return it->second;
    auto& v = lists[key];
    for (int st = 0; st < s.stages; ++st) v.push_back(make_schedule(s, st));
    return v;
  }

  TrainConfig train_config(const Layout& l) const {
    TrainConfig cfg;
    apply_layout(l, cfg);
    cfg.optim.name = req.optimizer;
    cfg.optim.momentum = req.momentum;
    return cfg;
  }

  ScheduleSpec spec_of(const Layout& l) const {
    return {l.pp == 1 ? PipeSchedule::one_f_one_b : l.pp_schedule, l.pp, int(l.accum), l.virtual_stages};
  }

  // Per stage, per chunk: [first, last) blocks.
  std::vector<std::vector<std::pair<int, int>>> cuts(const Layout& l, const BlockTable& t) {
    return cuts(l, split_model(*t.whole->graph, train_config(l), mc.name));
  }
  std::vector<std::vector<std::pair<int, int>>> cuts(const Layout& l, const StageSplit& sp) {
    std::vector<std::vector<std::pair<int, int>>> st(size_t(l.pp));
    for (int s = 0; s < l.pp; ++s)
      for (int c = 0; c < l.virtual_stages; ++c) {
        const int k = piece_of(spec_of(l), s, c);
        st[size_t(s)].push_back({sp.cuts[size_t(k)], sp.cuts[size_t(k) + 1]});
      }
    return st;
  }

  // What the memory and the time of a stage follow from, whatever the ZeRO stage.
  struct StageFacts {
    double params = 0;  // this rank's parameters (the tied copy on the last stage included)
    double experts = 0;  // of them, the experts' (--ep: this rank's 1/ep)
    double kept = 0;    // bytes kept for backward by the micro-batches in flight
    double work = 0;    // the largest block's working set beyond them
    double unit = 0;    // the largest block's parameters (ZeRO-2/3's staging holds two)
    double spanning = 0;  // a tied unit used at both ends of the stage (its staging spans the pass)
    double bwd = 0;     // one micro-batch's backward through all of the stage's chunks
    double tied = 0;    // tied parameters whose gradients the stage sums with another stage
    double layer_inflight = 0;  // over its chunks: blocks x micro-batches in flight (the formulas')
    double first_inflight = 0;  // micro-batches in flight on its first chunk
    double layers = 0;          // blocks on the stage, over its chunks
  };

  std::vector<StageFacts> facts(const Layout& l, const BlockTable& t, const std::vector<std::vector<std::pair<int, int>>>& st) {
    std::vector<StageFacts> out(size_t(l.pp));
    const auto& lists = schedule_lists(spec_of(l));
    for (int s = 0; s < l.pp; ++s) {
      StageFacts& f = out[size_t(s)];
      for (int c = 0; c < l.virtual_stages; ++c) {
        auto [a, b] = st[size_t(s)][size_t(c)];
        double k = 0, kw = 0;
        for (int x = a; x < b; ++x) {
          // The ring saves its output's log-sum-exp, not the probabilities (T / cp rows, no T x T).
          if (l.cp > 1) k -= t.attn_saved[size_t(x)];
          // and works on blocks of (T / cp)^2 scores: 1/cp of attention's working set again.
          const double work = t.work[size_t(x)] - (1 - 1.0 / l.cp) * t.attn_work[size_t(x)];
          // --ep: this rank holds 1/ep of the experts (their weights, gradients and optimizer state).
          const double own = t.params[size_t(x)] - (1 - 1.0 / l.ep) * t.expert_params[size_t(x)];
          f.params += own, k += t.kept[size_t(x)], f.work = std::max(f.work, work);
          f.experts += t.expert_params[size_t(x)] / l.ep;
          f.unit = std::max(f.unit, own), f.bwd += t.bwd[size_t(x)], kw += t.kept_weight[size_t(x)];
        }
        // A split backward frees the activations at I; the weight gradients' inputs stay
        // until W, for the micro-batches past I that await it (zb-h1: up to P in all).
        const int inflight = max_in_flight(lists[size_t(s)], c);
        const int held = max_held_for_weights(lists[size_t(s)], c);
        // Context parallelism: each rank holds 1/cp of every sequence's tokens.
        f.kept += (k * inflight + std::min(k, kw) * (held - inflight)) / l.cp;
        f.layer_inflight += double(b - a) * inflight;
        f.layers += double(b - a);
        if (c == 0) f.first_inflight = inflight;
      }
      f.work /= l.cp, f.bwd /= l.cp;
      // (in a V both ends of the model are on stage 0: the tied weight is one parameter there)
      const bool v = v_shaped(l.pp_schedule);
      if (l.pp > 1 && !v && (s == 0 || s == l.pp - 1)) f.tied = t.tied;
      if (l.pp > 1 && !v && s == l.pp - 1) f.params += t.tied;
      if (l.pp > 1 && v && s == 0) f.spanning = t.tied;
      if (l.pp == 1) f.spanning = t.tied;
    }
    return out;
  }

  // The formulas' rows for stage s of a layout (memory_formula.h).
  // (allocator: what of them the engine's allocator holds, formula_memory.h's allocator_bytes.)
  std::vector<MemoryRow> formula_rows(const Layout& l, const StageFacts& x, int s, double* allocator = nullptr) const {
    FormulaLayout fl;
    fl.tp = l.tp, fl.dp = l.dp, fl.pp = l.pp, fl.zero = l.zero, fl.slots = slots, fl.sp = l.sequence_parallel;
    fl.rc = l.recompute;
    FormulaStage fs;
    fs.params = x.params, fs.unit_params = x.unit, fs.first = s == 0, fs.micro = double(l.batch);
    fs.last = s == loss_stage(spec_of(l));  // (in a V the head and the loss are on stage 0)
    // The micro-batches in flight as Megatron-LM's schedules keep them (Korthikanti, 4.2.3):
    // 1F1B's stage s holds p - s; interleaved, its warm-up of 2 (p - s - 1) + (m - 1) p chunks
    // and one more, of L / (p m) layers each: L (1 + (p - 1) / (p m)) on the first stage.
    const double M = double(l.accum), p = l.pp, m = l.virtual_stages;
    if (l.pp_schedule == PipeSchedule::zb_v && l.pp > 1) {  // the schedule's own counts (both chunks)
      fs.layer_inflight = x.layer_inflight;
      fs.first_inflight = x.first_inflight;
    } else if (l.pp_schedule == PipeSchedule::interleaved && l.pp > 1) {
      const double chunks = std::min(M * m, 2 * (p - s - 1) + (m - 1) * p) + 1;
      fs.layer_inflight = x.layers / m * chunks;
      fs.first_inflight = std::min(M, std::ceil(chunks / m));
    } else {
      fs.first_inflight = std::min(M, p - s);
      fs.layer_inflight = x.layers * fs.first_inflight;
    }
    const std::vector<FormulaRow> terms = formula_memory(*shape, fl, fs, engine);
    if (allocator) *allocator = allocator_bytes(terms);
    std::vector<MemoryRow> rows;
    for (auto& r : terms) rows.push_back({r.what, r.bytes, r.what, ""});
    return rows;
  }
  double formula_total(const Layout& l, const StageFacts& x, int s) const {
    double b = 0;
    for (auto& r : formula_rows(l, x, s)) b += r.bytes;
    return b;
  }

  void estimate_memory(Prediction& p, const std::vector<StageFacts>& f) const {
    p.memory_bytes = -1;
    for (int s = 0; s < int(f.size()); ++s) {
      const StageFacts& x = f[size_t(s)];
      const double mem = shape ? formula_total(p.layout, x, s) : state_bytes(p.layout, x).total() + x.kept + x.work;
      if (mem > p.memory_bytes) p.memory_bytes = mem, p.memory_stage = s;
    }
    p.fits = p.memory_bytes <= limit();
  }

  // An estimated prediction's rows: its stage's estimate by kind.
  void add_estimate_rows(Prediction& p) {
    if (p.memory_exact || !p.memory_rows.empty()) return;
    if (shape) return make_formula(p);
    const BlockTable& t = table(p.layout);
    const auto f = facts(p.layout, t, cuts(p.layout, t));
    p.memory_rows = estimate_rows(p.layout, f[size_t(p.memory_stage)]);
  }

  // The estimate of the stage that needs the most, by kind (they sum to memory_bytes).
  std::vector<MemoryRow> estimate_rows(const Layout& l, const StageFacts& x) const {
    const StateBytes b = state_bytes(l, x);
    std::vector<MemoryRow> rows;
    auto add = [&](const char* what, double bytes) {
      if (bytes > 0) rows.push_back({what, bytes, what, ""});
    };
    add(l.zero >= 3 ? "parameters (fp32 master, this rank's 1/dp shard)" : "parameters (fp32 master, whole)", b.params);
    add(l.zero >= 2 ? "gradients (fp32, this rank's 1/dp shard)" : "gradients (fp32, whole)", b.grads);
    add(l.zero >= 1 ? "optimizer state (fp32, this rank's 1/dp shard)" : "optimizer state (fp32, whole)", b.optimizer);
    add(l.zero >= 3 ? "low-precision parameters (this rank's 1/dp shard)" : "low-precision parameters (whole)", b.lp);
    add(mem_kind_name(MemKind::workspace), b.workspace);
    add("activations kept for backward (micro-batches in flight)", x.kept);
    add("working set of the largest block", x.work);
    add("gathered units in flight (ZeRO-3: in use and prefetched)", b.gathered);
    add("gradient buckets in flight (fp32, ZeRO-2/3)", b.buckets);
    return rows;
  }

  // The step ends when the last stage has reduced its gradients and updated its parameters.
  void estimate_time(Prediction& p, const std::vector<StageFacts>& f, const BlockTable& t, const ScheduleSim& sim,
                     double transfer) const {
    const Layout& l = p.layout;
    double finish = 0;
    for (int s = 0; s < l.pp; ++s) {
      const StageFacts& x = f[size_t(s)];
      const double tied = collective_seconds(Collective::all_reduce, 4 * x.tied, 2, pp_link(l), req.hw.eff.comm_eff);
      const double dp_t = dp_seconds(l, x.params, x.bwd, x.experts) + tied;
      const double opt = optimizer_seconds(l.zero >= 1 ? x.params / l.dp : x.params, slots, req.hw, act);
      double end = 0;
      for (auto& sp : sim.spans[size_t(s)]) end = std::max(end, sp.end);
      if (end + dp_t + opt > finish) finish = end + dp_t + opt, p.dp_exposed_seconds = dp_t, p.optimizer_seconds = opt;
    }
    p.step_seconds = finish;
    p.bubble_fraction = sim.bubble_fraction;
    p.compute_seconds = *std::max_element(sim.busy.begin(), sim.busy.end());
    p.pp_comm_seconds = l.pp > 1 ? transfer * 2 * double(l.accum) * l.virtual_stages : 0;
    double tp = 0;
    for (int b = 0; b < t.blocks; ++b) tp += t.tp_comm[size_t(b)];
    p.tp_comm_seconds = tp * double(l.accum) / l.pp / l.cp;
    const auto [rf, rb] = ring_exposed(l, t, 0, t.blocks);
    p.cp_comm_seconds = (rf + rb) * double(l.accum) / l.pp;
    const auto [ef, eb] = expert_exchange(l, t, 0, t.blocks);
    p.ep_comm_seconds = (ef + eb) * double(l.accum) / l.pp;
    finish_rates(p);
  }

  void finish_rates(Prediction& p) const {
    const double G = double(req.global_batch);
    p.samples_per_second = G / p.step_seconds;
    p.tokens_per_second = p.samples_per_second * double(out.tokens_per_sample);
    p.tflops_per_gpu = out.model_flops_per_sample * p.samples_per_second / req.gpus / 1e12;
    p.mfu = p.tflops_per_gpu * 1e12 / req.hw.peak(act);
  }

  // The data-parallel reduction's exposed seconds for a stage of `params` parameters (this
  // tp rank's), `experts` of them the experts', whose last micro-batch's backward takes `bwd`.
  double dp_seconds(const Layout& l, double params, double bwd, double experts = 0) const {
    if (l.dp * l.cp == 1) return 0;
    // (Context parallelism reduces over the data x context-parallel ranks, without ZeRO.)
    // The gradients reduce in the engine's reduction dtype; updated parameters are gathered in
    // the dtype the layers read (saturate's ZeRO-1/2 gather its fp32 master).
    const double grads = params * engine.reduce_bytes, eff = req.hw.eff.comm_eff * engine.dp_comm_eff;
    const double lp_size = act == DType::f32 ? 4.0 : double(dtype_size(act));
    const double gathered = params * (engine.formula || l.zero >= 3 ? lp_size : 4.0);
    const Link link = dp_link(l);
    const double buckets = std::max(2.0, std::ceil(grads / double(25 << 20)));
    // On CPU processes the reduction's copies need the cores that backward holds: it hides
    // little (mlp on 2 ranks of 1 thread: 16% of it), so it is counted in full there, at the
    // rate the link reaches beside compute (intra_busy; mlp and gpt-mini on 2 ranks of this
    // VM: exposed 4.6-4.8 and 8-9 ms, at that rate 3.9-5.3 and 8.9-12, idle 1.8 and 4.1).
    const bool overlap = req.overlap_dp && engine.overlap_dp && req.hw.gpu;
    const bool busy_known = req.hw.intra_busy.bandwidth > 0;  // a description built in code may leave it out
    const Link beside = !req.hw.gpu && busy_known && l.tp * l.dp <= req.gpus_per_node ? req.hw.intra_busy : link;
    auto hidden = [&](double comm, double behind) {
      return overlap ? std::max(comm - behind * (1 - 1 / buckets), comm / buckets) : comm;
    };
    const double gather = collective_seconds(Collective::all_gather, gathered, l.dp, link, eff);
    const double scatter = collective_seconds(Collective::reduce_scatter, grads, l.dp, beside, eff);
    const double M = double(l.accum);
    switch (l.zero) {
      case 0: {
        // --ep: the experts' gradients reduce over the ranks that hold the same experts, dp / ep
        // of them (times cp; none when ep = dp without cp), the rest over all dp x cp.
        const double e = l.ep > 1 ? experts * engine.reduce_bytes : 0;
        const int group = l.dp / l.ep * l.cp;
        double c = collective_seconds(Collective::all_reduce, grads - e, l.dp * l.cp, beside, eff);
        if (e > 0 && group > 1) c += collective_seconds(Collective::all_reduce, e, group, beside, eff);
        return hidden(c, bwd);
      }
      case 1: return hidden(scatter, bwd) + gather;
      case 2: return M * hidden(scatter, bwd) + gather;
      default: {
        // FSDP under a pipeline keeps the units gathered and the gradients whole through the
        // step: one gather before the first micro-batch, one reduce-scatter after the last.
        if (engine.gathered_through_step && l.pp > 1) return hidden(scatter, bwd) + gather;
        // Gathers behind each pass (prefetch), the reduce-scatter behind backward, as far as
        // the engine overlaps them.
        const double o = engine.zero3_overlap, fwd = o * bwd / 2;
        return M * (std::max(gather - fwd, gather / buckets) + hidden(gather + scatter, o * bwd));
      }
    }
  }

  // A rank's state with `params` parameters, as the mixed-precision engine holds it (FSDP's
  // design): the fp32 master parameters, gradients and optimizer state, sharded by the ZeRO
  // stage (3, 2 and 1 up); the low-precision copy the layers read (bf16/f16), sharded exactly
  // as the master is (1/dp under ZeRO-3, whole below); the library workspace on a GPU; and
  // ZeRO-2/3's staging of the largest unit (`unit` parameters): under ZeRO-3 the units
  // gathered in flight, the one in use and the one prefetched, in the dtype the layers read
  // (the low-precision copy's, f32 without one), and the fp32 gradient buckets of the units
  // being reduced, two of them; a tied unit used at both ends of the stage (GPT's embedding
  // and output head) stays gathered, and its bucket held, from its first use to its last.
  struct StateBytes {
    double params = 0, grads = 0, optimizer = 0, lp = 0, workspace = 0, gathered = 0, buckets = 0;
    double total() const { return params + grads + optimizer + lp + workspace + gathered + buckets; }
  };
  StateBytes state_bytes(const Layout& l, const StageFacts& x) const {
    const double params = x.params, unit = x.unit;
    const double d = l.dp, lp_size = act == DType::f32 ? 0 : double(dtype_size(act));
    StateBytes b;
    b.params = 4 * params / (l.zero >= 3 ? d : 1);
    b.grads = 4 * params / (l.zero >= 2 ? d : 1);
    b.optimizer = 4.0 * slots * params / (l.zero >= 1 ? d : 1);
    b.lp = lp_size * params / (l.zero >= 3 ? d : 1);
    b.workspace = gpu ? double(kCudaWorkspaceBytes + kCudaStepScalarsBytes) : 0;
    b.gathered = l.zero >= 3 ? (2 * unit + x.spanning) * (lp_size > 0 ? lp_size : 4) : 0;
    b.buckets = l.zero >= 2 ? (2 * unit + x.spanning) * 4 : 0;
    return b;
  }

  // ---- enumeration ----

  std::vector<int> divisors(int64_t n, int64_t cap) const {
    std::vector<int> d;
    for (int64_t x = 1; x <= std::min(n, cap); ++x)
      if (n % x == 0) d.push_back(int(x));
    return d;
  }

  bool valid_tp(int tp, bool sp) const {
    try {
      check_tensor_parallel(mc, tp, sp);
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  // Expert-parallel sizes for dp data-parallel ranks: 1, and for a moe model every divisor of
  // dp whose experts divide by it (--layout ep= fixes one).
  std::vector<int> expert_sizes(int dp) const {
    std::vector<int> out;
    for (int ep : divisors(dp, dp)) {
      if (!allowed(req.filter.ep, ep) || (ep > 1 && (mc.experts == 0 || mc.experts % ep))) continue;
      out.push_back(ep);
    }
    return out;
  }

  // Context parallelism is searched from this sequence length up (or when --layout gives cp):
  // below it attention is too short to hide the ring, and activations rarely need the split.
  static constexpr int64_t kLongContext = 4096;
  // Context parallelism the model takes (gpt/llama, a context of 2 cp chunks) and saturate's
  // engine runs (not the published engines' formulas).
  bool valid_cp(int tp, bool sp, int cp) const {
    if (cp == 1) return true;
    if (shape) return false;
    try {
      check_context_parallel(mc, cp, tp, sp);
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  bool valid_recompute(Recompute r) const {
    ModelConfig c = mc;
    c.recompute = r;
    c.device = Device::cpu;
    try {
      check_recompute(c);
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  template <class T>
  static bool allowed(const std::optional<T>& f, T v) { return !f || *f == v; }

  // Every (schedule, v) for a pipeline of pp stages over `blocks` blocks with M micro-batches.
  std::vector<std::pair<PipeSchedule, int>> schedules(int pp, int blocks, int64_t M) const {
    if (pp == 1) return {{PipeSchedule::one_f_one_b, 1}};
    std::vector<std::pair<PipeSchedule, int>> s{{PipeSchedule::one_f_one_b, 1}};
    for (int v = 2; pp * v <= blocks; ++v)
      if (blocks % (pp * v) == 0 && M >= pp) s.push_back({PipeSchedule::interleaved, v});
    if (splits) s.push_back({PipeSchedule::zb_h1, 1});
    if (splits && 2 * pp <= blocks) s.push_back({PipeSchedule::zb_v, 2});  // two chunks per rank in a V
    return s;
  }

  // Whether the model's layers split their backward into I and W (train/plan.h's check for
  // zb-h1, on the CPU engine that runs the split: a GPU plan marks zb-h1 as refused there).
  bool backward_splits() const {
    ModelConfig c = mc;
    c.device = Device::cpu, c.act = DType::f32, c.tp = 1, c.tp_rank = 0, c.sequence_parallel = false;
    c.recompute = Recompute::none;
    try {
      check_backward_splits(*build_model(c, 1, true).graph, "--pp-schedule zb-h1");
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  void check_filter() const {
    const LayoutFilter& f = req.filter;
    const int64_t cp = f.cp.value_or(1);
    if (f.dp && f.tp && f.pp)
      SAT_CHECK(int64_t(*f.dp) * *f.tp * *f.pp * cp == req.gpus, "--layout: dp=", *f.dp, " x tp=", *f.tp, " x pp=",
                *f.pp, cp > 1 ? str_cat(" x cp=", cp) : std::string(), " = ", int64_t(*f.dp) * *f.tp * *f.pp * cp,
                " devices, but --gpus is ", req.gpus);
    for (auto [name, v] : {std::pair{"dp", f.dp}, {"tp", f.tp}, {"pp", f.pp}, {"cp", f.cp}})
      SAT_CHECK(!v || req.gpus % *v == 0, "--layout: ", name, "=", *v, " does not divide --gpus ", req.gpus);
    if (f.tp) check_tensor_parallel(mc, *f.tp, f.sp.value_or(false));
    if (f.ep && *f.ep > 1) {
      check_expert_parallel(mc, *f.ep);
      SAT_CHECK(!f.dp || *f.dp % *f.ep == 0, "--layout: ep=", *f.ep, " is carved from the data-parallel ranks: it must "
                "divide dp=", *f.dp);
    }
    if (f.cp && *f.cp > 1) {
      SAT_CHECK(!shape, "--layout: cp=", *f.cp, ": --engine ", engine.name, " is modelled without context parallelism");
      check_context_parallel(mc, *f.cp, f.tp.value_or(1), f.sp.value_or(false));
    }
    if (f.recompute) {
      ModelConfig c = mc;
      c.recompute = *f.recompute;
      c.device = Device::cpu;
      check_recompute(c);
    }
    SAT_CHECK(!f.v || !f.schedule || *f.schedule == PipeSchedule::interleaved || *f.v == 1 ||
              (*f.schedule == PipeSchedule::zb_v && *f.v == 2),
              "--layout: v=", *f.v, " needs schedule=interleaved (schedule=zb-v runs v=2)");
    SAT_CHECK(!f.zero || *f.zero == 0 || !f.dp || *f.dp > 1, "--layout: zero=", *f.zero, " shards over the "
              "data-parallel ranks, but dp=1");
  }

  // --layout against the engine modelled: the ZeRO stages and sequence parallelism it has.
  void check_engine_filter() const {
    const LayoutFilter& f = req.filter;
    SAT_CHECK(!f.zero || *f.zero <= engine.max_zero, "--layout: zero=", *f.zero, ": --engine ", engine.name,
              " has ZeRO stages up to ", engine.max_zero, engine.max_zero == 1 ? " (its distributed optimizer)" : "");
    if (engine.kind == EngineKind::fsdp) {
      SAT_CHECK(!f.zero || *f.zero == 3 || (*f.zero == 0 && f.dp && *f.dp == 1), "--layout: zero=", *f.zero,
                ": --engine fsdp shards parameters, gradients and optimizer state (ZeRO-3) whenever dp > 1");
      SAT_CHECK(!f.sp || *f.sp == (f.tp && *f.tp > 1) || !f.tp, "--layout: sp=", *f.sp ? "on" : "off",
                ": --engine fsdp runs tensor parallelism with sequence-parallel norms, and only with it");
    }
  }

  void run() {
    check_filter();
    check_engine_filter();
    {
      ModelConfig one = config_of(Layout{});
      one.recompute = Recompute::none;
      const BuiltModel m = build_model(one, 1, true);
      out.model_parameters = double(m.graph->param_count());
      out.model_flops_per_sample = train_flops_per_sample(m, 1);
      out.tokens_per_sample = mc.tokens ? mc.seq_len : 0;
    }
    splits = !shape && backward_splits();
    // Every graph the search builds is held to its end (one per tp, sp, micro-batch and
    // recomputation): refused before the first when together they cannot fit this machine.
    std::set<std::tuple<int, bool, int64_t, int>> graphs;
    const int64_t formed = for_each_point([&](int tp, bool sp, int, int, int, int64_t b, Recompute rc) {
      graphs.insert({tp, sp, b, int(rc)});
    });
    check_graphs_fit_host(int64_t(graphs.size()) + 1);  // and the one above
    for_each_point([&](int tp, bool sp, int cp, int pp, int dp, int64_t b, Recompute rc) {
      search_point(tp, sp, cp, pp, dp, b, rc);
    });
    const LayoutFilter& f = req.filter;
    SAT_CHECK(formed > 0, "--global-batch ", req.global_batch, ": no layout of ", req.gpus, " devices",
              f.empty() ? "" : " matching --layout", " can form it (the data-parallel size must divide it: ",
              "choose a global batch that a divisor of ", req.gpus, " divides)");
  }

  // Calls fn(tp, sp, cp, pp, dp, micro-batch, recomputation) for every point of the search the
  // filter allows; returns how many (tp, sp, pp, micro-batch) meshes were formed.
  template <typename F>
  int64_t for_each_point(F&& fn) const {
    const LayoutFilter& f = req.filter;
    std::vector<Recompute> rcs;
    for (Recompute r : {Recompute::none, Recompute::selective, Recompute::full})
      if (allowed(f.recompute, r) && valid_recompute(r)) rcs.push_back(r);
    int64_t formed = 0;
    for (int tp : divisors(req.gpus, f.tp ? req.gpus : req.gpus_per_node)) {
      if (!allowed(f.tp, tp)) continue;
      for (bool sp : {false, true}) {
        if (!allowed(f.sp, sp) || !valid_tp(tp, sp)) continue;
        for (int cp : divisors(req.gpus / tp, req.gpus)) {
          if (f.cp ? *f.cp != cp : !(cp == 1 || (mc.seq_len >= kLongContext && valid_cp(tp, sp, cp)))) continue;
          for (int pp : divisors(req.gpus / tp / cp, req.gpus)) {
            const int dp = req.gpus / tp / cp / pp;
            if (!allowed(f.pp, pp) || !allowed(f.dp, dp) || req.global_batch % dp) continue;
            const int64_t per_replica = req.global_batch / dp;
            for (int64_t b : divisors(per_replica, per_replica)) {
              if (!allowed(f.micro, b)) continue;
              ++formed;
              for (Recompute rc : rcs) fn(tp, sp, cp, pp, dp, b, rc);
            }
          }
        }
      }
    }
    return formed;
  }

  // `count` graphs of the model held at once, against half of this machine's available
  // memory. A graph the search holds (built, not step-planned) takes about 1.4 KiB a node
  // (measured: plan of a 1000-layer GPT, 107 graphs in 2.4 GB).
  static constexpr int64_t kSearchBytesPerNode = 2048;
  void check_graphs_fit_host(int64_t count) const {
    const double one = double(estimated_nodes(mc)) * double(kSearchBytesPerNode);
    const double avail = double(host_available_memory());
    SAT_CHECK(avail == 0 || double(count) * one <= avail / 2, "--model ", mc.name, ": planning it searches ", count,
              " graphs of the model (one per tensor-parallel size, sequence parallelism, micro-batch and "
              "recomputation), about ", format_bytes(one), " each (", kSearchBytesPerNode >> 10, " KiB a node), more "
              "than half of the ", format_bytes(avail), " this machine has available; fix more of the layout with "
              "--layout (tp=, micro=, recompute=, sp=) or plan a smaller model");
  }

  void search_point(int tp, bool sp, int cp, int pp, int dp, int64_t b, Recompute rc) {
    Layout l;
    l.tp = tp, l.sequence_parallel = sp, l.cp = cp, l.pp = pp, l.dp = dp, l.batch = b, l.recompute = rc;
    l.accum = req.global_batch / dp / b;
    const BlockTable& t = table(l);
    if (pp > t.blocks) return;
    for (int ep : expert_sizes(dp))
      for (auto [kind, v] : schedules(pp, t.blocks, l.accum)) {
        if (!allowed(req.filter.schedule, pp == 1 ? req.filter.schedule.value_or(kind) : kind)) continue;
        if (!allowed(req.filter.v, v)) continue;
        l.ep = ep, l.pp_schedule = kind, l.virtual_stages = v;
        search_schedule(l, t);
      }
  }

  // Per stage, per chunk: one micro-batch's forward and backward seconds, averaged over the
  // step's micro-batches. When the stage's parameters and their gradients (float32) fit the
  // cache, all but the first find the gradients' sums there (plan/cost.h).
  SimCosts stage_costs(const Layout& l, const BlockTable& t, const std::vector<std::vector<std::pair<int, int>>>& st) const {
    SimCosts c;
    const double M = double(l.accum);
    for (int s = 0; s < l.pp; ++s) {
      double params = 0;
      for (auto [a, b] : st[size_t(s)])
        for (int x = a; x < b; ++x) params += t.params[size_t(x)];
      const double warm = req.hw.cache.bytes > 0 && 8 * params <= req.hw.cache.bytes ? (M - 1) / M : 0;
      c.fwd.emplace_back(), c.bwd.emplace_back();
      for (auto [a, b] : st[size_t(s)]) {
        double fw = 0, bw = 0;
        for (int x = a; x < b; ++x) {
          fw += t.fwd[size_t(x)];
          bw += t.bwd[size_t(x)] - warm * t.bwd_cached[size_t(x)];
        }
        const auto [rf, rb] = ring_exposed(l, t, a, b);
        const auto [ef, eb] = expert_exchange(l, t, a, b);
        c.fwd.back().push_back(fw / l.cp + rf + ef), c.bwd.back().push_back(bw / l.cp + rb + eb);
      }
    }
    // W's share of a split backward, over the model's blocks (zb-h1's B and W timed apart).
    double bw = 0, w = 0;
    for (int x = 0; x < t.blocks; ++x) bw += t.bwd[size_t(x)], w += t.bwd_weight[size_t(x)];
    if (bw > 0) c.weight_share = w / bw;
    return c;
  }

  // Context parallelism's ring over blocks [a, b) per micro-batch, forward and backward: each
  // attention layer passes its key/value block around the cp ranks, cp - 1 steps forward and
  // cp - 1 backward (keys and values, then their gradients beside them), each step overlapped
  // with the attention of the block in hand: what is exposed is what the attention does not hide.
  std::pair<double, double> ring_exposed(const Layout& l, const BlockTable& t, int a, int b) const {
    if (l.cp == 1 || mc.n_head == 0) return {0, 0};
    const double kv_heads = double(mc.n_kv_head > 0 ? mc.n_kv_head : mc.n_head);
    const double width = double(mc.n_embd) / double(mc.n_head) * kv_heads / l.tp;
    const double block = 2 * double(l.batch) * double(mc.seq_len) / l.cp * width * double(dtype_size(act));
    const Link link = cp_link(l);
    const double eff = req.hw.eff.comm_eff, steps = l.cp - 1;
    const double cf = steps * collective_seconds(Collective::p2p, block, 2, link, eff);
    const double cb = steps * collective_seconds(Collective::p2p, 2 * block, 2, link, eff);
    double f = 0, g = 0;
    for (int x = a; x < b; ++x) {
      const double n = t.attn_layers[size_t(x)];
      if (n == 0) continue;
      f += std::max(0.0, n * cf - t.attn_fwd[size_t(x)] / l.cp);
      g += std::max(0.0, n * cb - t.attn_bwd[size_t(x)] / l.cp);
    }
    return {f, g};
  }

  // Expert parallelism over blocks [a, b) per micro-batch, forward and backward: each moe
  // layer's dispatch and combine are all-to-alls over the ep group of tokens x top_k rows of
  // the width (forward: dispatch and combine; backward: their gradients), not overlapped; and
  // the busiest rank's experts take expert_imbalance times the mean of the tokens (under ep
  // they run the group's tokens of their experts; without it every rank runs its own).
  std::pair<double, double> expert_exchange(const Layout& l, const BlockTable& t, int a, int b) const {
    if (l.ep == 1 || mc.experts == 0) return {0, 0};
    const double rows = double(l.batch) * double(mc.seq_len) / l.cp * double(mc.top_k);
    const double bytes = rows * double(mc.n_embd) * double(dtype_size(act));
    const Link link = ep_link(l);
    const double e = l.ep, a2a = (e - 1) * link.alpha + (e - 1) / e * bytes / (link.bandwidth * req.hw.eff.comm_eff);
    const double extra = std::max(0.0, req.expert_imbalance - 1);
    double f = 0, g = 0;
    for (int x = a; x < b; ++x) {
      const double n = t.moe_layers[size_t(x)];
      f += n * 2 * a2a + extra * t.moe_fwd[size_t(x)] / l.cp;
      g += n * 2 * a2a + extra * t.moe_bwd[size_t(x)] / l.cp;
    }
    return {f, g};
  }

  // The pipeline simulation of the schedule's action lists with this layout's stage costs.
  ScheduleSim simulate(const Layout& l, const BlockTable& t, const std::vector<std::vector<std::pair<int, int>>>& st,
                       SimCosts c, double* transfer) {
    double bytes = 0;
    for (int s = 0; s < l.pp; ++s)
      for (auto [a, b] : st[size_t(s)])
        if (a > 0) bytes = std::max(bytes, t.cut_bytes[size_t(a)]);
    c.transfer = l.pp > 1 ? collective_seconds(Collective::p2p, bytes, 2, pp_link(l), req.hw.eff.comm_eff) : 0;
    *transfer = c.transfer;
    c.v_shape = v_shaped(l.pp_schedule);
    ScheduleSim sim = simulate_actions(schedule_lists(spec_of(l)), c);
    SAT_CHECK(!sim.deadlock && sim.problem.empty(), "internal error: schedule ", l.str(), ": ", sim.problem);
    return sim;
  }

  // The layouts of one schedule: their memory first (no simulation for those that cannot
  // fit), then a lower bound of their time (the busiest stage's compute) against the best
  // found so far, then the simulation.
  void search_schedule(Layout l, const BlockTable& t) {
    const StageSplit split = split_model(*t.whole->graph, train_config(l), mc.name);
    // A cut that a value would cross twice (a skip connection over a stage): train refuses it.
    const std::string cut = l.pp > 1 ? cut_problem(*t.whole->graph, split, mc.name) : "";
    const auto st = cuts(l, split);
    const auto f = facts(l, t, st);
    std::vector<Prediction> ps;
    for (int z = 0; z <= (l.dp > 1 ? 3 : 0); ++z) {
      if (!allowed(req.filter.zero, z)) continue;
      l.zero = z;
      // (train refuses zb-h1 with ZeRO-2/3, and ZeRO with context parallelism)
      // (and ZeRO with expert parallelism: each rank's store holds its own experts)
      const bool split = splits_backward(l.pp_schedule);
      if (!engine_has(l) || (split && z >= 2) || (l.cp > 1 && z > 0) || (l.ep > 1 && z > 0 && !shape)) continue;
      ++out.layouts;
      if (!cut.empty()) {
        ++out.uncut;
        uncut.insert(cut);
        continue;
      }
      if (req.runnable_only) {
        const std::vector<std::string> why = refusals(l, mc.device, &mc);
        refused.insert(why.begin(), why.end());
        if (!why.empty()) {
          ++out.not_runnable;
          continue;
        }
      }
      Prediction p;
      p.layout = l;
      estimate_memory(p, f);
      if (!out.smallest || p.memory_bytes < out.smallest->memory_bytes) out.smallest = p;
      if (p.fits) ps.push_back(p);
      else ++out.over_memory;
    }
    if (ps.empty()) return;
    SimCosts c = stage_costs(l, t, st);
    double busiest = 0;
    for (int s = 0; s < l.pp; ++s) {
      double x = 0;
      for (size_t k = 0; k < c.fwd[size_t(s)].size(); ++k) x += c.fwd[size_t(s)][k] + c.bwd[size_t(s)][k];
      busiest = std::max(busiest, x * double(l.accum));
    }
    if (busiest > bar()) {
      out.slower += int64_t(ps.size());
      return;
    }
    double transfer = 0;
    const ScheduleSim sim = simulate(l, t, st, std::move(c), &transfer);
    for (Prediction& p : ps) {
      estimate_time(p, f, t, sim, transfer);
      note_time(p.step_seconds);
      out.considered.push_back(std::move(p));
    }
  }

  std::set<std::string> refused;  // runnable_only: why `saturate train` refused the layouts it left out
  std::set<std::string> uncut;    // why the layouts PlanResult::uncut counts cannot be cut

  // The step time a layout must beat to be among the ones planned exactly (the fitting
  // layouts' times so far, the (4 top + 8)-th fastest).
  std::vector<double> fastest;
  size_t keep() const { return size_t(4 * req.top + 8); }
  // With one layout per mesh wanted, a slower mesh must still be simulated: no bar (the
  // searches that ask for it, over one host's ranks, are small).
  double bar() const { return req.one_per_mesh || fastest.size() < keep() ? 1e300 : fastest.back(); }
  void note_time(double t) {
    fastest.insert(std::upper_bound(fastest.begin(), fastest.end(), t), t);
    if (fastest.size() > keep()) fastest.pop_back();
  }

  // ---- exact memory of the layouts reported ----

  std::unique_ptr<DataSplit> data;

  std::vector<int> planned_stages(const Layout& l, const BlockTable& t) {
    std::vector<int> s;
    if (l.pp <= 4) {
      for (int i = 0; i < l.pp; ++i) s.push_back(i);
      return s;
    }
    const auto st = cuts(l, t);
    int most = 0, at = 0;
    for (int i = 0; i < l.pp; ++i) {
      int n = 0;
      for (auto [a, b] : st[size_t(i)]) n += b - a;
      if (n > most) most = n, at = i;
    }
    s = {0, 1, l.pp - 1, at};
    std::sort(s.begin(), s.end());
    s.erase(std::unique(s.begin(), s.end()), s.end());
    return s;
  }

  // A formula engine's memory: every stage by the formulas, the one that needs the most.
  void make_formula(Prediction& p) {
    const Layout& l = p.layout;
    const BlockTable& t = table(l);
    const auto f = facts(l, t, cuts(l, t));
    p.memory_bytes = -1;
    for (int s = 0; s < l.pp; ++s) {
      double alloc = 0;
      std::vector<MemoryRow> rows = formula_rows(l, f[size_t(s)], s, &alloc);
      double b = 0;
      for (auto& r : rows) b += r.bytes;
      if (b > p.memory_bytes) p.memory_bytes = b, p.allocator_bytes = alloc, p.memory_stage = s, p.memory_rows = rows;
    }
    p.memory_formula = true;
    p.fits = p.memory_bytes <= limit();
  }

  void make_exact(Prediction& p) {
    const Layout& l = p.layout;
    if (shape) return make_formula(p);
    // zb-h1's and the ring's step plans need the CPU engine: on GPUs the estimate stays.
    if ((splits_backward(l.pp_schedule) || l.cp > 1) && gpu) return;
    if (!data) data = std::make_unique<DataSplit>(synthetic_shapes(data_options_for(mc, 0)));
    double most = -1;
    ModelConfig c = config_of(l);
    c.cp = l.cp;  // (rank 0 of the ring: every rank holds two chunks of the same size)
    c.ep = l.ep;  // (rank 0 of the expert group: every rank holds as many experts)
    for (int s : planned_stages(l, table(l))) {
      RankPlan r = plan_rank(c, train_config(l), *data->train, data->test.get(), s, l.dp);
      const double bytes = double(r.memory.total());
      if (bytes > most) {
        most = bytes, p.memory = r.memory, p.memory_stage = s;
        // (The ZeRO staging plan keeps no lifetimes by kind: its arena is one row.)
        p.memory_rows = memory_rows(r.memory, live_at_peak(r.step), KindBytes{}, l.zero, act);
      }
    }
    p.memory_bytes = most;
    p.memory_exact = true;
    p.fits = most <= limit();
  }

  ScheduleSim timeline(const Layout& l) {
    const BlockTable& t = table(l);
    const auto st = cuts(l, t);
    double transfer = 0;
    return simulate(l, t, st, stage_costs(l, t, st), &transfer);
  }
};

// Why the best layout wins over the runner-up: the component of the step that differs most.
std::string why_best(const std::vector<Prediction>& best, int64_t fitting) {
  if (best.empty()) return "";
  const Prediction& a = best[0];
  std::string s = str_cat("the fastest of ", fitting, " layout(s) that fit");
  if (best.size() < 2) return s;
  const Prediction& b = best[1];
  struct Part { const char* what; double a, b; };
  const Part parts[] = {
      {"compute (per stage, with recomputation)", a.compute_seconds, b.compute_seconds},
      {"pipeline bubble", a.step_seconds * a.bubble_fraction, b.step_seconds * b.bubble_fraction},
      {"tensor-parallel communication", a.tp_comm_seconds, b.tp_comm_seconds},
      {"exposed data-parallel communication", a.dp_exposed_seconds, b.dp_exposed_seconds},
      {"optimizer", a.optimizer_seconds, b.optimizer_seconds}};
  const Part* most = &parts[0];
  for (const Part& p : parts)
    if (p.b - p.a > most->b - most->a) most = &p;
  char buf[320];
  const double slower = b.step_seconds / a.step_seconds - 1;
  if (slower < 0.005)
    std::snprintf(buf, sizeof buf, "; the runner-up (%s) is within 0.5%% of it (%.2f%% slower): the cost model does not "
                  "separate them, either will do", b.layout.str().c_str(), 100 * slower);
  else
    std::snprintf(buf, sizeof buf, "; the runner-up (%s) is %.1f%% slower, mostly in %s (%.3g s against %.3g s)",
                  b.layout.str().c_str(), 100 * slower, most->what, most->b, most->a);
  return s + buf;
}

bool mesh_taken(const std::vector<Prediction>& best, const Layout& l) {
  return std::any_of(best.begin(), best.end(), [&](const Prediction& b) {
    return b.layout.dp == l.dp && b.layout.tp == l.tp && b.layout.pp == l.pp;
  });
}

}  // namespace

PlanResult plan_layouts(const PlanRequest& r) {
  const auto t0 = std::chrono::steady_clock::now();
  SAT_CHECK(r.gpus >= 1, "--gpus: expected a positive number of devices, got ", r.gpus);
  SAT_CHECK(r.gpus_per_node >= 1, "--gpus-per-node: expected a positive number, got ", r.gpus_per_node);
  SAT_CHECK(r.global_batch >= 1, "--global-batch: expected a positive number of samples, got ", r.global_batch);
  SAT_CHECK(r.top >= 1, "--top: expected a positive number of layouts, got ", r.top);
  Search s(r);
  s.run();
  PlanResult& out = s.out;
  if (out.layouts > 0 && out.uncut == out.layouts)
    fail(*s.uncut.begin(), " (every layout of ", r.gpus, " x ", r.hw.name, r.filter.empty() ? "" : " matching --layout",
         " cuts the model so)");
  if (out.layouts > 0 && out.not_runnable + out.uncut == out.layouts) {
    std::string why;
    for (const std::string& w : s.refused) why += (why.empty() ? "" : "; ") + w;
    fail("--runnable-only: `saturate train` refuses every layout of ", r.gpus, " x ", r.hw.name,
         r.filter.empty() ? "" : " matching --layout", " on ", device_kind_name(s.mc.device), " today (", why, ")");
  }
  std::vector<size_t> order(out.considered.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return out.considered[a].step_seconds < out.considered[b].step_seconds;
  });
  int64_t fitting = 0, tried = 0;
  for (size_t i : order) fitting += out.considered[i].fits;
  std::vector<bool> taken(out.considered.size());
  std::optional<Prediction> least_exact;  // the least memory of the layouts planned exactly that do not fit
  // One pass in ranking order; with one_per_mesh, a first pass takes the fastest of each
  // mesh and the second fills what is left in ranking order (one process has one mesh).
  for (int pass = r.one_per_mesh ? 0 : 1; pass < 2; ++pass)
    for (size_t i : order) {
      if (int(out.best.size()) >= r.top || tried >= 4 * int64_t(r.top) + 8) break;
      if (!out.considered[i].fits || taken[i]) continue;
      if (pass == 0 && mesh_taken(out.best, out.considered[i].layout)) continue;
      taken[i] = true;
      Prediction p = out.considered[i];
      const double estimate = p.memory_bytes;
      if (r.exact_memory) s.make_exact(p);
      ++tried;
      if (std::getenv("SAT_PLAN_DEBUG"))
        std::fprintf(stderr, "exact %s: estimate %.4g, plan %.4g (%+.1f%%)\n", p.layout.str().c_str(), estimate,
                     p.memory_bytes, 100 * (estimate / p.memory_bytes - 1));
      if (p.fits) out.best.push_back(p);
      else if (p.memory_exact && (!least_exact || p.memory_bytes < least_exact->memory_bytes)) least_exact = p;
    }
  // The estimate let through layouts that the exact plans refused: the smallest of those
  // plans is what the nearest layout needs, not the estimate that let it through.
  if (out.best.empty() && least_exact &&
      (!out.smallest || out.smallest->fits || least_exact->memory_bytes < out.smallest->memory_bytes))
    out.smallest = least_exact;
  std::stable_sort(out.best.begin(), out.best.end(),
                   [](const Prediction& a, const Prediction& b) { return a.step_seconds < b.step_seconds; });
  if (out.best.empty() && out.considered.size() == 1) {  // one layout asked for: say how it does
    Prediction p = out.considered[0];
    if (r.exact_memory) s.make_exact(p);
    out.best.push_back(p);
  }
  for (Prediction& p : out.best) s.add_estimate_rows(p);
  if (out.smallest) s.add_estimate_rows(*out.smallest);
  if (!out.best.empty()) out.timeline = s.timeline(out.best[0].layout);
  out.why = out.best.empty() || out.best[0].fits ? why_best(out.best, fitting)
                                                 : "the one layout asked for; it does not fit";
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

Prediction predict_layout(const PlanRequest& r, const Layout& l) {
  PlanRequest one = r;
  one.filter = {};
  one.filter.dp = l.dp, one.filter.tp = l.tp, one.filter.pp = l.pp, one.filter.micro = l.batch;
  one.filter.schedule = l.pp_schedule, one.filter.v = l.virtual_stages, one.filter.recompute = l.recompute;
  one.filter.sp = l.sequence_parallel, one.filter.zero = l.zero, one.filter.cp = l.cp, one.filter.ep = l.ep;
  one.top = 1;
  one.memory_limit = 1e30;
  PlanResult p = plan_layouts(one);
  SAT_CHECK(!p.best.empty(), "internal error: layout ", l.str(), " was not formed");
  p.best[0].fits = p.best[0].memory_bytes <= (r.memory_limit > 0 ? r.memory_limit : r.hw.memory_bytes);
  return p.best[0];
}

}  // namespace sat
