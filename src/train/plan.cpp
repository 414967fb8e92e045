#include "train/plan.h"

#include "train/step_parts.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>

#include "core/alloc.h"
#include "core/error.h"
#include "data/loader.h"
#include "nn/params.h"
#include "train/validation.h"

namespace sat {

namespace {

// Whole-model nodes [first, last) of block b.
std::pair<int, int> block_nodes(const Graph& whole, int b) {
  const auto& s = whole.block_starts();
  return {s[size_t(b)], size_t(b) + 1 < s.size() ? s[size_t(b) + 1] : whole.model_nodes()};
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return s;
}

// Each block's FLOPs (forward and backward: the time a stage takes) and memory
// (parameters, outputs and saved buffers), as prefix sums over the blocks.
struct BlockCosts {
  std::vector<double> flops{0}, bytes{0};
  double flops_of(int a, int b) const { return flops[size_t(b)] - flops[size_t(a)]; }  // blocks [a, b)
  double bytes_of(int a, int b) const { return bytes[size_t(b)] - bytes[size_t(a)]; }
};

BlockCosts block_costs(const Graph& whole) {
  BlockCosts c;
  const int n = int(whole.block_starts().size());
  for (int b = 0; b < n; ++b) {
    auto [lo, hi] = block_nodes(whole, b);
    double f = 0, m = 0;
    for (int i = lo; i < hi; ++i) {
      const Node& nd = whole.nodes()[size_t(i)];
      f += nd.setup.flops_fwd + nd.setup.flops_bwd;
      m += double(nd.setup.output.bytes());
      for (auto& s : nd.setup.saved) m += double(s.bytes());
      for (auto& p : nd.setup.params)
        if (!p.shared) m += double(p.spec.bytes());
    }
    c.flops.push_back(c.flops.back() + f);
    c.bytes.push_back(c.bytes.back() + m);
  }
  return c;
}

// Contiguous pieces of blocks [0, n), each at least one block, minimising the largest
// cost(a, b) among the pieces whose FLOPs stay within `flops_cap` (the cut points).
template <class Cost>
std::vector<int> min_max_cuts(int n, int pieces, const BlockCosts& bc, double flops_cap, Cost cost) {
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: the smallest largest cost of cutting blocks [0, i) into k pieces.
  std::vector<std::vector<double>> best(size_t(pieces) + 1, std::vector<double>(size_t(n) + 1, inf));
  std::vector<std::vector<int>> from(size_t(pieces) + 1, std::vector<int>(size_t(n) + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= pieces; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        if (bc.flops_of(j, i) > flops_cap) continue;
        const double c = std::max(best[size_t(k) - 1][size_t(j)], cost(j, i));
        if (c < best[size_t(k)][size_t(i)] - 1e-12 * std::max(1.0, c)) best[size_t(k)][size_t(i)] = c, from[size_t(k)][size_t(i)] = j;
      }
  std::vector<int> cuts(size_t(pieces) + 1, 0);
  cuts[size_t(pieces)] = n;
  for (int k = pieces, i = n; k > 0; --k) i = cuts[size_t(k) - 1] = from[size_t(k)][size_t(i)];
  return cuts;
}

// Balanced by FLOPs first (the slowest stage sets the pipeline's pace), then by memory
// among the cuts whose slowest stage is within 5% of the fastest possible.
std::vector<int> balanced_cuts(const BlockCosts& bc, int pieces) {
  const int n = int(bc.flops.size()) - 1;
  const double inf = std::numeric_limits<double>::infinity();
  auto by_flops = [&](int a, int b) { return bc.flops_of(a, b); };
  const std::vector<int> fast = min_max_cuts(n, pieces, bc, inf, by_flops);
  double slowest = 0;
  for (int k = 0; k < pieces; ++k) slowest = std::max(slowest, bc.flops_of(fast[size_t(k)], fast[size_t(k) + 1]));
  return min_max_cuts(n, pieces, bc, slowest * 1.05, [&](int a, int b) { return bc.bytes_of(a, b); });
}

}  // namespace

std::vector<std::pair<int, int>> StageSplit::nodes_of(const Graph& whole, int stage) const {
  std::vector<std::pair<int, int>> r;
  for (int c = 0; c < virtual_stages; ++c) {
    const int k = v_shape && c == 1 ? 2 * stages - 1 - stage : c * stages + stage;
    r.push_back({block_nodes(whole, cuts[size_t(k)]).first, block_nodes(whole, cuts[size_t(k) + 1] - 1).second});
  }
  return r;
}

std::string StageSplit::describe(const Graph& whole) const {
  std::string s;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    const int a = cuts[k], b = cuts[k + 1] - 1;
    const std::string first = whole.nodes()[size_t(block_nodes(whole, a).first)].name;
    const std::string last = whole.nodes()[size_t(block_nodes(whole, b).second - 1)].name;
    s += str_cat(k ? " | " : "", "blocks ", a, a == b ? "" : str_cat("-", b), " (", first,
                 first == last ? std::string() : str_cat(" .. ", last), ")");
  }
  return s;
}

void check_pipeline(const TrainConfig& cfg) {
  SAT_CHECK(cfg.tp >= 1, "--tp: expected a positive tensor-parallel size, got ", cfg.tp);
  SAT_CHECK(cfg.pp >= 1, "--pp: expected a positive number of pipeline stages, got ", cfg.pp);
  SAT_CHECK(cfg.pp > 1 || cfg.pp_split.empty(), "--pp-split needs --pp 2 or more (it names the cuts between stages)");
  check_schedule({cfg.pp_schedule, cfg.pp, int(cfg.accum), cfg.virtual_stages});
  if (cfg.pp_schedule != PipeSchedule::zb_h1 && cfg.pp_schedule != PipeSchedule::zb_v) return;
  SAT_CHECK(cfg.zero < 2, "--pp-schedule ", pipe_schedule_name(cfg.pp_schedule), " with --zero ", cfg.zero,
            ": ZeRO-2/3's per-unit gradient staging does not follow a split backward yet; use --zero 0 or 1");
}

std::string cut_problem(const Graph& whole, const StageSplit& sp, const std::string& model_name) {
  const auto& starts = whole.block_starts();
  auto piece = [&](int gid) {
    const int b = int(std::upper_bound(starts.begin(), starts.end(), gid) - starts.begin()) - 1;
    return int(std::upper_bound(sp.cuts.begin(), sp.cuts.end(), b) - sp.cuts.begin()) - 1;
  };
  for (const Node& n : whole.nodes())
    for (auto [c, slot] : whole.value(n.output).consumers) {
      const Node& reader = whole.nodes()[size_t(c)];
      const int apart = piece(reader.gid) - piece(n.gid);
      if (apart > 1)
        return str_cat("--pp ", sp.stages, sp.virtual_stages > 1 ? str_cat(" x ", sp.virtual_stages, " chunks") : "",
                       ": ", model_name, "'s value ", whole.value(n.output).name, " (made by ", n.name,
                       ") is read by ", reader.name, " ", apart, " model chunks later; a pipeline cut passes values "
                       "to the next chunk only: cut elsewhere (--pp-split) or use fewer chunks");
    }
  return "";
}

StageSplit split_model(const Graph& whole, const TrainConfig& cfg, const std::string& model_name) {
  check_pipeline(cfg);
  StageSplit sp;
  sp.stages = cfg.pp;
  sp.virtual_stages = cfg.virtual_stages;
  sp.v_shape = v_shaped(cfg.pp_schedule);
  sp.blocks = int(whole.block_starts().size());
  SAT_CHECK(sp.blocks >= 1 && whole.block_starts()[0] == 0, "internal error: model ", model_name, " declares no blocks");
  const int pieces = sp.stages * sp.virtual_stages;
  const std::string what = sp.virtual_stages > 1 ? str_cat("--pp ", sp.stages, " x --virtual-stages ",
                                                           sp.virtual_stages, " = ", pieces, " model chunks")
                                                 : str_cat("--pp ", sp.stages);
  SAT_CHECK(pieces <= sp.blocks, what, ": ", model_name, " has ", sp.blocks,
            " blocks, the units a pipeline stage is made of, so it can be cut into at most ", sp.blocks, " pieces");
  if (!cfg.pp_split.empty()) {
    const auto& s = cfg.pp_split;
    SAT_CHECK(int(s.size()) == pieces - 1, "--pp-split ", join(s), ": expected ", pieces - 1, " cut point(s) for ",
              what, ", got ", s.size());
    for (size_t k = 0; k < s.size(); ++k)
      SAT_CHECK(s[k] >= 1 && s[k] < sp.blocks && (k == 0 || s[k] > s[k - 1]), "--pp-split ", join(s),
                ": cut points must be increasing block indices between 1 and ", sp.blocks - 1, " (", model_name,
                " has ", sp.blocks, " blocks; a cut at i starts a stage at block i)");
    sp.cuts.push_back(0);
    sp.cuts.insert(sp.cuts.end(), s.begin(), s.end());
    sp.cuts.push_back(sp.blocks);
    return sp;
  }
  if (cfg.pp_schedule == PipeSchedule::interleaved) {
    SAT_CHECK(sp.blocks % pieces == 0, "--virtual-stages ", sp.virtual_stages, ": the interleaved schedule gives every "
              "model chunk the same number of blocks, but the ", sp.blocks, " blocks of ", model_name,
              " do not divide into ", what, " (", sp.blocks / sp.stages, " blocks per stage; or name the cuts with "
              "--pp-split)");
    for (int k = 0; k <= pieces; ++k) sp.cuts.push_back(k * (sp.blocks / pieces));
    return sp;
  }
  sp.cuts = balanced_cuts(block_costs(whole), pieces);
  return sp;
}

namespace {

// The V's turn (zb-v's last stage): chunk 1 takes chunk 0's output within the rank at its
// forward, and hands its gradient back at the end of its input backward (Executor::hand_on).
// Chunk 0's output so stays until chunk 1's forward, its gradient's buffer is live from
// chunk 1's backward on, and chunk 1's input gradient until the action after that backward.
void hand_on_times(const std::vector<Action>& actions, std::map<std::pair<int, int>, MicroUse>& uses) {
  for (int a = 0; a < int(actions.size()); ++a) {
    const Action& x = actions[size_t(a)];
    if (x.chunk != 1) continue;
    if (x.kind == ActionKind::forward) uses[{0, x.micro}].send = a + 1;
    if (x.kind == ActionKind::backward_input || x.kind == ActionKind::backward) {
      uses[{0, x.micro}].recv_grad = a;
      uses[{1, x.micro}].send_grad = a + 1;
    }
  }
}

// The loader batches a step holds at once on this rank: micro-batch m's batch is fetched by
// the first forward of m in a chunk that reads data and stays valid until the last action of
// those chunks on m (a split backward's weight part reads the tokens, the loss's backward the
// labels; in a V, stage 0's two chunks read the inputs and the labels of the same batches).
int batches_held(const std::vector<Action>& actions, const std::vector<int>& data_chunks) {
  auto reads = [&](const Action& a) {
    return a.is_compute() && std::find(data_chunks.begin(), data_chunks.end(), a.chunk) != data_chunks.end();
  };
  std::map<int, size_t> last_use;
  for (size_t i = 0; i < actions.size(); ++i)
    if (reads(actions[i])) last_use[actions[i].micro] = i;
  int fetched = 0, most = 0;
  std::set<int> open;  // fetched, still read
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (!reads(a)) continue;
    if (a.kind == ActionKind::forward) fetched = std::max(fetched, a.micro + 1), open.insert(a.micro);
    if (!open.empty()) most = std::max(most, fetched - *open.begin());
    if (last_use[a.micro] == i) open.erase(a.micro);
  }
  return most;
}

// The buffers' timeline of this rank's step, and which context each micro-batch of each
// chunk uses: the lowest one free at its first action (contexts are per chunk; a chunk's
// micro-batches flow first in, first out, so this is a ring).
// The operations of a communication group (a run of send/receive actions) are in flight
// together: all of them take the time of the group's first action, so that their buffers
// are live at once. A send completes before the stage's next group or its next compute other
// than a weight gradient (Executor::finish_group; after the step's last action when none
// follows): its buffer is live until then (MicroUse::send). A context is free for another
// micro-batch after the last action of its micro-batch (a buffer of it being sent still is
// not: the other micro-batch's first use of the same buffer comes after that compute).
Timeline timeline_of(const std::vector<Action>& actions, int chunks, int micro, std::vector<std::vector<int>>& ctx_of,
                     bool turn) {
  std::vector<int> at(actions.size()), sent(actions.size());
  for (size_t a = 0; a < actions.size(); ++a)
    at[a] = actions[a].is_comm() && a > 0 && actions[a - 1].is_comm() ? at[a - 1] : int(a);
  // sent[a]: the action before which the sends of a's group have completed (MicroUse::send): the
  // next compute other than a weight gradient, or the one after the next group's first action
  // (the group posts its receives before it waits for the sends: they must not share memory);
  // past the end when neither follows.
  for (int a = int(actions.size()) - 1, next = int(actions.size()); a >= 0; --a) {
    const Action& x = actions[size_t(a)];
    sent[size_t(a)] = next;
    if (x.is_comm() && at[size_t(a)] == a) next = a + 1;
    if (x.waits_for_sends()) next = a;
  }
  std::map<std::pair<int, int>, MicroUse> uses;
  std::map<std::pair<int, int>, int> last;
  for (int a = 0; a < int(actions.size()); ++a) {
    const Action& x = actions[size_t(a)];
    if (x.micro < 0) continue;
    MicroUse& u = uses[{x.chunk, x.micro}];
    u.chunk = x.chunk;
    const int t = at[size_t(a)];
    switch (x.kind) {
      case ActionKind::recv_act: u.recv = t; break;
      case ActionKind::forward: u.fwd = t; break;
      case ActionKind::send_act: u.send = sent[size_t(a)]; break;
      case ActionKind::recv_grad: u.recv_grad = t; break;
      case ActionKind::backward: u.bwd = t; break;
      case ActionKind::backward_input: u.bwd = t; break;
      case ActionKind::backward_weight: u.wgt = t; break;
      case ActionKind::send_grad: u.send_grad = sent[size_t(a)]; break;
      default: break;
    }
    last[{x.chunk, x.micro}] = a;
  }
  if (turn) hand_on_times(actions, uses);
  ctx_of.assign(size_t(chunks), std::vector<int>(size_t(micro), -1));
  std::vector<std::vector<bool>> busy(static_cast<size_t>(chunks));
  for (int a = 0; a < int(actions.size()); ++a) {
    const Action& x = actions[size_t(a)];
    if (x.micro < 0) continue;
    int& ctx = ctx_of[size_t(x.chunk)][size_t(x.micro)];
    auto& b = busy[size_t(x.chunk)];
    if (ctx < 0) {
      ctx = int(std::find(b.begin(), b.end(), false) - b.begin());
      if (ctx == int(b.size())) b.push_back(false);
      b[size_t(ctx)] = true;
      uses[{x.chunk, x.micro}].ctx = ctx;
    }
    if (last[{x.chunk, x.micro}] == a) b[size_t(ctx)] = false;
  }
  Timeline t;
  for (auto& [k, u] : uses) t.uses.push_back(u);
  return t;
}

}  // namespace

JobPlan::JobPlan(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test, int dp)
    : mc_(mc), cfg_(cfg), train_(&train), test_(test), dp_(dp) {
  whole_ = std::make_unique<BuiltModel>(build_model(mc, cfg.batch, true));
  split_ = split_model(*whole_->graph, cfg, mc.name);
  if (cfg.pp > 1) {
    const std::string cut = cut_problem(*whole_->graph, split_, mc.name);
    SAT_CHECK(cut.empty(), cut);
  }
  if (splits_backward(cfg.pp_schedule)) {
    const std::string flag = str_cat("--pp-schedule ", pipe_schedule_name(cfg.pp_schedule));
    SAT_CHECK(whole_->graph->device() == Device::cpu, flag, ": the split backward runs on the CPU only for now "
              "(--device cpu)");
    check_backward_splits(*whole_->graph, flag);
  }
  if (mc.tp > 1 || mc.ep > 1) {  // the whole model's size and work, not this rank's part (its experts)
    ModelConfig one = mc;
    one.tp = 1, one.tp_rank = 0, one.sequence_parallel = false;
    one.ep = 1, one.ep_rank = 0;
    full_ = std::make_unique<BuiltModel>(build_model(one, cfg.batch, true));
  }
  parameters_ = unsplit().graph->param_count();
  flops_ = train_flops_per_sample(unsplit(), cfg.batch);
  stages_.resize(size_t(cfg.pp));
  if (cfg.measure_noise && cfg.pp > 1) {
    const Graph& first = *stage(0).model.graph;
    SAT_CHECK(first.tied_copies().empty() && first.tied_remote().empty(), "--noise-scale with --pp: the weights ",
              mc.name, " ties across stages (its embedding and output head) are not measured yet; measure the noise "
              "scale without --pp");
  }
}

JobPlan::~JobPlan() = default;

const BuiltModel& JobPlan::whole() const { return whole_ ? *whole_ : stages_.at(0)->model; }

RankPlan& JobPlan::stage(int s) {
  SAT_ASSERT(s >= 0 && s < cfg_.pp);
  auto& p = stages_[size_t(s)];
  if (!p) p = std::make_unique<RankPlan>(plan_stage(s));
  return *p;
}

LoaderOptions loader_options(const TrainConfig& cfg, int keep) {
  return LoaderOptions{cfg.prefetch, keep, cfg.loader_workers, 0};
}

LoaderPlan plan_loaders(const TrainConfig& cfg, const Dataset& train, const Dataset* test, int keep) {
  LoaderPlan p;
  const LoaderOptions tr = loader_options(cfg, keep), te = loader_options(cfg);
  p.workers = BatchLoader::reading_workers(tr);
  p.prefetch = cfg.prefetch;
  p.train_slots = BatchLoader::ring_slots(tr.prefetch, tr.keep);
  p.ring_bytes = BatchLoader::buffer_bytes(train, cfg.batch, p.train_slots);
  p.scratch_bytes = BatchLoader::worker_host_bytes(train, tr);
  p.order_bytes = size_t(train.size()) * sizeof(int64_t);
  if (test && cfg.evaluate) {
    p.order_bytes += size_t(test->size()) * sizeof(int64_t);
    p.test_slots = BatchLoader::ring_slots(te.prefetch, te.keep);
    p.ring_bytes += BatchLoader::buffer_bytes(*test, cfg.batch, p.test_slots);
    p.scratch_bytes += BatchLoader::worker_host_bytes(*test, te);
  }
  if (test && validates_prefix(cfg, *test)) {  // --eval-batches: a loader of the test split's first batches
    const int64_t n = std::min(test->size(), cfg.eval_batches * cfg.batch);
    p.test_slots += BatchLoader::ring_slots(te.prefetch, te.keep);
    p.ring_bytes += BatchLoader::buffer_bytes(*test, cfg.batch, BatchLoader::ring_slots(te.prefetch, te.keep));
    p.scratch_bytes += BatchLoader::worker_host_bytes(*test, te);
    p.order_bytes += size_t(n) * sizeof(int64_t);
  }
  return p;
}

std::string LoaderPlan::describe() const {
  const std::string rings = test_slots ? str_cat("rings of ", train_slots, " + ", test_slots, " batches (training + test)")
                                       : str_cat("a ring of ", train_slots, " batches");
  const std::string readers = workers ? str_cat(workers, " worker", workers == 1 ? "" : "s", " per loader, ", prefetch,
                                                " batch", prefetch == 1 ? "" : "es", " ahead")
                                      : std::string("read by the step (no workers)");
  return str_cat(readers, ": ", rings, " ", format_bytes(double(ring_bytes)), " (in the plan), the reading threads' own ",
                 format_bytes(double(scratch_bytes)), " (host, the dataset's scratch), the epoch orders ",
                 format_bytes(double(order_bytes)), " (host)");
}

namespace {
// The memory of a stage's graph and step under cfg's optimizer and ZeRO stage; under ZeRO-2/3
// also the sharding it plans (into shards).
MemoryPlan stage_memory(const RankPlan& r, const TrainConfig& cfg, const Dataset& train, const Dataset* test, int dp,
                        ShardPlan& shards) {
  const Graph& g = *r.model.graph;
  size_t inputs = r.reads_data ? plan_loaders(cfg, train, test, r.loader_keep).ring_bytes : 0;
  if (r.reads_data && r.model.config.cp > 1) {  // --cp: the rank's chunks cut from each micro-batch (and test batch)
    size_t reads = 0;  // over the rank's chunks (zb-v's first stage: the tokens' and the labels')
    for (const auto& ch : g.chunks()) reads += ch.data.size();
    const int slots = int(cfg.accum) + (test && cfg.evaluate ? 1 : 0);
    inputs += ContextCut::bytes(cfg.batch, r.model.x_shape[1], int(reads), slots);
  }
  const int slots = optimizer_slots(resolve_optim(cfg.optim));
  MemoryPlan m = plan_memory(g, r.step, slots, inputs, cfg.zero >= 1 ? dp : 1);
  shards = {};
  if (cfg.zero >= 2) {
    shards = plan_shards(g, r.actions, cfg.zero, dp);
    add_sharded_memory(m, g, shards, slots);
  }
  return m;
}
}  // namespace

RankPlan JobPlan::plan_stage(int stage) {
  const TrainConfig& cfg = cfg_;
  RankPlan r;
  r.split = split_;
  r.model_parameters = parameters_;
  r.model_flops_per_sample = flops_;
  r.stage = stage;
  if (cfg.pp > 1) r.model = build_model(mc_, cfg.batch, true, split_.nodes_of(*whole_->graph, stage));
  else r.model = std::move(*whole_), whole_.reset();
  const Graph& g = *r.model.graph;
  r.schedule = cfg.schedule_spec();
  r.actions = make_schedule(r.schedule, stage);
  const int chunks = int(g.chunks().size());
  SAT_CHECK(chunks == cfg.virtual_stages, "internal error: stage ", stage, " has ", chunks, " model chunks");
  const bool turn = v_shaped(r.schedule.kind) && stage == cfg.pp - 1;  // the V's turn: chunk 0 hands on to chunk 1
  r.step = plan_step(g, timeline_of(r.actions, chunks, int(cfg.accum), r.ctx_of, turn));
  std::vector<int> data_chunks;
  for (int c = 0; c < chunks; ++c)
    if (!g.chunks()[size_t(c)].data.empty()) data_chunks.push_back(c);
  r.reads_data = !data_chunks.empty();
  r.loader_keep = std::max(r.loader_keep, batches_held(r.actions, data_chunks));
  if (r.reads_data) r.loader = plan_loaders(cfg, *train_, test_, r.loader_keep);
  r.memory = stage_memory(r, cfg, *train_, test_, dp_, r.shards);
  r.flops_per_sample = (g.flops_forward() + g.flops_backward()) / double(cfg.batch);
  return r;
}

MemoryPlan JobPlan::memory_with(int s, const TrainConfig& other) {
  ShardPlan shards;
  return stage_memory(stage(s), other, *train_, test_, dp_, shards);
}

RankPlan plan_rank(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test, int stage,
                   int dp) {
  JobPlan job(mc, cfg, train, test, dp);
  return std::move(job.stage(stage));
}

GroupBytes predict_comm(const RankPlan& plan, const TrainConfig& cfg, int dp) {
  const Graph& g = *plan.model.graph;
  const double micro = double(cfg.accum);
  GroupBytes b;
  // A recompute unit's forward runs twice (full recomputation): its collectives too.
  for (const Node& n : g.nodes()) {
    const bool ring = std::string_view(n.layer->kind()) == "RingSelfAttention";  // --cp: over the cp group
    (ring ? b.cp : b.tp) +=
        micro * (n.setup.comm_fwd * (n.rc_first >= 0 ? 2 : 1) + (n.needs_backward ? n.setup.comm_bwd : 0));
  }
  for (const ParamDecl& p : g.params())
    if (p.shard.partial_grad) b.tp += double(p.spec.bytes());
  if (dp > 1 && cfg.zero >= 2) {
    // Per micro-batch: every unit's gradients reduce-scattered (float32), under ZeRO-3 its
    // parameters gathered for forward and again for backward (in the gathered dtype: bf16
    // under mixed precision); ZeRO-2 gathers them once after the update.
    double units = 0;
    for (auto [lo, hi] : plan.shards.range) units += double(hi - lo) * 4;
    const double gathered = units / 4 * double(dtype_size(plan.shards.gathered_dtype));
    b.dp = micro * (units + (cfg.zero >= 3 ? 2 * gathered : 0)) + (cfg.zero == 2 ? units : 0) + (g.loss() >= 0 ? 8 : 0);
  } else if (dp * cfg.cp > 1) {  // --cp: the reduction runs over dp x cp
    const double flat = double(ParamStore::predict(g.params(), g.states(), 0, cfg.zero >= 1 ? dp : 1).params);
    b.dp = (cfg.zero >= 1 ? 2 : 1) * flat + (g.loss() >= 0 ? 8 : 0);
  }
  if (cfg.pp > 1) {
    std::set<int> handed;  // (a V's turn: handed on within the rank, no message)
    for (const Value& v : g.values())
      if (v.handed_from >= 0) handed.insert(v.handed_from);
    for (const Chunk& c : g.chunks()) {
      for (int v : c.sent)
        if (!handed.count(v)) b.pp += micro * double(g.value(v).spec.bytes());
      for (int v : c.received)
        if (g.value(v).needs_grad && g.value(v).handed_from < 0) b.pp += micro * double(g.value(v).spec.bytes());
    }
    b.pp += 8;  // the step's loss, broadcast from the last stage
  }
  std::vector<std::string> tied = g.tied_copies();
  tied.insert(tied.end(), g.tied_remote().begin(), g.tied_remote().end());
  if (cfg.pp > 1)
    for (size_t i = 0; i < g.params().size(); ++i) {
      const ParamDecl& p = g.params()[i];
      if (std::find(tied.begin(), tied.end(), p.name) == tied.end()) continue;
      if (cfg.zero < 2 || dp == 1) {
        b.embedding += double(p.spec.bytes());
        continue;
      }
      // ZeRO-2/3: the tied parameter is a unit of its own; a rank sums its piece.
      const auto& units = plan.shards.units;
      const size_t u = size_t(std::upper_bound(units.begin(), units.end(), int(i)) - units.begin()) - 1;
      b.embedding += double(plan.shards.range[u].second - plan.shards.range[u].first) / dp * 4;
    }
  return b;
}

}  // namespace sat
