#include "tune/layout_tune.h"

#include "backend/support.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>

#include "backend/device.h"
#include "backend/support.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/json.h"
#include "core/timer.h"
#include "dist/comm.h"
#include "tune/probe.h"
#include "tune/tune.h"

namespace sat {

std::string filter_str(const LayoutFilter& f) {
  std::string s;
  auto add = [&](const char* k, const std::string& v) { s += str_cat(s.empty() ? "" : ",", k, "=", v); };
  if (f.dp) add("dp", std::to_string(*f.dp));
  if (f.tp) add("tp", std::to_string(*f.tp));
  if (f.pp) add("pp", std::to_string(*f.pp));
  if (f.micro) add("micro", std::to_string(*f.micro));
  if (f.schedule) add("schedule", pipe_schedule_name(*f.schedule));
  if (f.v) add("v", std::to_string(*f.v));
  if (f.recompute) add("recompute", recompute_name(*f.recompute));
  if (f.sp) add("sp", *f.sp ? "on" : "off");
  if (f.zero) add("zero", std::to_string(*f.zero));
  return s;
}

std::string layout_choice_line(const Layout& l, double measured, double predicted) {
  char buf[128];
  std::snprintf(buf, sizeof buf, " (measured %.0f samples/s; predicted %.0f)", measured, predicted);
  return l.str() + buf;
}

namespace {
// A cached layout is input like any other: every field within the flags' ranges before it
// is converted to an integer or trained with. "" when it is sound.
std::string layout_choice_problem(const JsonRef& c) {
  const std::pair<const char*, std::pair<double, double>> ranges[] = {
      {"dp", {1, 1 << 20}}, {"tp", {1, 4096}}, {"pp", {1, 4096}}, {"micro_batch", {1, 1 << 24}},
      {"accum", {1, 1 << 20}}, {"virtual_stages", {1, 1024}}, {"zero", {0, 3}}};
  for (const auto& [k, r] : ranges) {
    const double x = c.at(k).number();
    if (!(std::isfinite(x) && x == std::floor(x) && x >= r.first && x <= r.second))
      return str_cat(k, " ", x, " is not from ", (long long)r.first, " to ", (long long)r.second);
  }
  for (const char* k : {"measured_samples_per_second", "predicted_samples_per_second"})
    if (!(std::isfinite(c.at(k).number()) && c.at(k).number() >= 0)) return str_cat(k, " is not a rate");
  return "";
}
}  // namespace

bool read_layout_choice(const std::string& path, Layout& l, double& measured, double& predicted) {
  if (!std::filesystem::exists(path)) return false;
  try {
    const JsonRef c = JsonRef::parse_file(path).at("layout_choice");
    const std::string why = layout_choice_problem(c);
    if (!why.empty()) {
      std::fprintf(stderr, "layout auto: ignoring the cached choice in %s (%s); tuning again\n", path.c_str(),
                   why.c_str());
      return false;
    }
    l.dp = int(c.at("dp").integer()), l.tp = int(c.at("tp").integer()), l.pp = int(c.at("pp").integer());
    l.batch = c.at("micro_batch").integer(), l.accum = c.at("accum").integer();
    const JsonRef schedule = c.at("schedule"), recompute = c.at("recompute");
    l.pp_schedule = l.pp == 1 ? PipeSchedule::one_f_one_b : parse_pipe_schedule(schedule.string(), schedule.where());
    l.virtual_stages = int(c.at("virtual_stages").integer());
    l.recompute = parse_recompute(recompute.string(), recompute.where());
    l.sequence_parallel = c.at("sequence_parallel").boolean();
    l.zero = int(c.at("zero").integer());
    measured = c.at("measured_samples_per_second").number();
    predicted = c.at("predicted_samples_per_second").number();
    return true;
  } catch (const std::exception& e) {
    // not a layout tuning's file, or damaged: tune again and overwrite it
    std::fprintf(stderr, "layout auto: ignoring the cached choice in %s (unreadable: %s); tuning again\n",
                 path.c_str(), e.what());
    return false;
  }
}

namespace {

// A layout and its two rates as numbers, for a broadcast.
constexpr int kPacked = 12;
void pack(const Layout& l, double measured, double predicted, double* v) {
  const double x[kPacked] = {double(l.dp), double(l.tp), double(l.pp), double(l.batch), double(l.accum),
                             double(l.pp_schedule), double(l.virtual_stages), double(l.recompute),
                             double(l.sequence_parallel), double(l.zero), measured, predicted};
  std::copy(x, x + kPacked, v);
}

void unpack(const double* v, Layout& l, double& measured, double& predicted) {
  l.dp = int(v[0]), l.tp = int(v[1]), l.pp = int(v[2]), l.batch = int64_t(v[3]), l.accum = int64_t(v[4]);
  l.pp_schedule = PipeSchedule(int(v[5])), l.virtual_stages = int(v[6]), l.recompute = Recompute(int(v[7]));
  l.sequence_parallel = v[8] != 0, l.zero = int(v[9]), measured = v[10], predicted = v[11];
}

}  // namespace

bool shared_layout_choice(dist::Comm* comm, const std::string& path, Layout& l, double& measured, double& predicted) {
  double v[kPacked + 1] = {};  // v[0]: found
  if ((!comm || comm->rank() == 0) && read_layout_choice(path, l, measured, predicted)) {
    const int world = comm ? comm->size() : 1;
    v[0] = int64_t(l.dp) * l.tp * l.pp == world ? 1 : 0;
    if (v[0] == 0)
      std::fprintf(stderr, "layout auto: ignoring the cached choice in %s (dp %d x tp %d x pp %d is not the job's %d "
                   "rank(s)); tuning again\n", path.c_str(), l.dp, l.tp, l.pp, world);
    pack(l, measured, predicted, v + 1);
  }
  if (comm && comm->size() > 1) comm->broadcast_sync(v, kPacked + 1, DType::f64, 0);
  if (v[0] == 0) return false;
  unpack(v + 1, l, measured, predicted);
  return true;
}

namespace {

// --memory-budget, or the batch tuner's default (tune.h). Every rank takes rank 0's.
size_t default_budget(size_t given, dist::Comm* comm, std::string& source) {
  double b = double(given);
  source = "--memory-budget";
  if (!given) b = double(default_host_budget(comm ? comm->size() : 1, source));
  if (comm && comm->size() > 1) comm->broadcast_sync(&b, 1, DType::f64, 0);
  SAT_CHECK(b > 0, "--memory-budget: could not tell how much memory is free; give a budget in bytes");
  return size_t(b);
}

PlanRequest request_of(const ModelConfig& mc, const TrainConfig& base, const LayoutTuneConfig& cfg,
                       const LayoutTuneResult& r) {
  PlanRequest q;
  q.model = mc;
  q.hw = r.hw;
  q.gpus = r.world;
  q.gpus_per_node = r.world;  // one host
  q.global_batch = cfg.global_batch;
  q.precision = base.precision == Precision::bf16 ? DType::bf16 : DType::f32;  // the CPU engine's two
  const OptimConfig oc = resolve_optim(base.optim);
  q.optimizer = oc.name;
  q.momentum = oc.name == "sgd" ? oc.momentum : 0;
  q.filter = cfg.filter;
  q.memory_limit = double(r.budget);
  q.top = cfg.candidates;
  q.one_per_mesh = true;
  return q;
}

// The planner's best layouts, or sat::Error saying why there are none.
PlanResult ranked_layouts(const PlanRequest& q, const LayoutTuneResult& r) {
  PlanResult p = plan_layouts(q);
  if (!p.best.empty() && p.best[0].fits) return p;
  SAT_CHECK(p.smallest, "--layout auto: no layout of global batch ", q.global_batch, " over ", r.world, " rank(s) has ",
            r.filter, " (ZeRO needs 2 or more data-parallel ranks; tensor parallelism, the model's splits)");
  fail("--layout auto: no layout of global batch ", q.global_batch, " over ", r.world, " rank(s)",
       r.filter.empty() ? "" : " with " + r.filter, " fits the memory budget of ", format_bytes(double(r.budget)),
       " per rank (", r.budget_source, "): the smallest, ", p.smallest->layout.str(), ", needs ",
       format_bytes(p.smallest->memory_bytes));
}

// Trains the trial's layout for a few timed steps (every rank together).
void measure(const ModelConfig& mc, const TrainConfig& base, const Dataset& train, const Dataset* test,
             const LayoutTuneConfig& cfg, LayoutTrial& t) {
  TrainConfig c = base;
  apply_layout(t.predicted.layout, c);
  const double step = std::max(t.predicted.step_seconds, 1e-6);
  const int64_t steps = std::clamp<int64_t>(int64_t(std::ceil(cfg.probe_seconds / step)), cfg.min_steps, 200);
  try {
    const TimedRun run = timed_run(mc, timed_config(c, 1 + steps, 3 * cfg.probe_seconds), train, test);
    t.measured_samples_per_second = run.samples_per_second;
    t.measured_step_seconds = run.median_step_seconds;
    t.measured_peak_bytes = run.peak_bytes;
    t.timed_steps = run.timed_steps;
    if (!run.refused.empty()) t.failed = "an allocation was refused: " + run.refused;
  } catch (const Error& e) {  // the trainer refuses the layout: every rank alike, before any collective
    t.failed = e.what();
  }
}

double pct(double a, double b) { return 100 * (a / b - 1); }

// The trial measured fastest among trials [from, end) that were timed (-1: none).
int fastest(const std::vector<LayoutTrial>& t, int from) {
  int best = -1;
  for (int i = from; i < int(t.size()); ++i)
    if (t[size_t(i)].failed.empty() && t[size_t(i)].measured_samples_per_second > 0 &&
        (best < 0 || t[size_t(i)].measured_samples_per_second > t[size_t(best)].measured_samples_per_second))
      best = i;
  return best;
}

// How the choice stands against the planner's first choice.
std::string reason_for(const std::vector<LayoutTrial>& t, int chosen) {
  const LayoutTrial& c = t[size_t(chosen)];
  const LayoutTrial& first = t[0];
  if (chosen > 0 && !first.failed.empty())
    return str_cat("the fastest measured; the planner's first choice (", first.predicted.layout.str(),
                   ") could not be timed: ", first.failed);
  char buf[512];
  if (chosen > 0) {
    std::snprintf(buf, sizeof buf,
                  "measured %.0f%% faster than the planner's first choice (%s: %.0f samples/s measured, %.0f "
                  "predicted); the planner ranked this one #%d",
                  pct(c.measured_samples_per_second, first.measured_samples_per_second),
                  first.predicted.layout.str().c_str(), first.measured_samples_per_second,
                  first.predicted.samples_per_second, chosen + 1);
    return buf;
  }
  const int next = fastest(t, 1);  // the runner-up by measurement
  if (next < 0) return "the planner's first choice, the only layout measured";
  std::snprintf(buf, sizeof buf, "the planner's first choice, confirmed: measured %.0f%% faster than the runner-up (#%d)",
                pct(c.measured_samples_per_second, t[size_t(next)].measured_samples_per_second), next + 1);
  return buf;
}

// The measured fastest, and why.
void choose(LayoutTuneResult& r) {
  const int best = fastest(r.trials, 0);
  SAT_CHECK(best >= 0, "--layout auto: none of the ", r.trials.size(), " layout(s) could be timed (",
            r.trials.front().failed, ")");
  r.chosen = best;
  r.trials[size_t(best)].chosen = true;
  r.reason = reason_for(r.trials, best);
}

// Every rank takes rank 0's choice (the measurements are the job's already: a safeguard).
void agree_on_choice(dist::Comm* comm, LayoutTuneResult& r) {
  if (!comm || comm->size() < 2) return;
  int64_t c = r.chosen;
  comm->broadcast_sync(&c, 1, DType::i64, 0);
  if (c == r.chosen) return;
  r.trials[size_t(r.chosen)].chosen = false;
  r.chosen = int(c);
  r.trials[size_t(c)].chosen = true;
}

}  // namespace

namespace {

void check_config(const TrainConfig& base, const LayoutTuneConfig& cfg) {
  require(resolve_device(base.device), Feature::layout_tuner);
  SAT_CHECK(cfg.global_batch >= 1, "--layout auto needs --global-batch (the samples per optimizer step the layouts share)");
  SAT_CHECK(cfg.candidates >= 1, "--layout-candidates: expected a positive number of layouts, got ", cfg.candidates);
  SAT_CHECK(cfg.min_steps >= 1 && cfg.probe_seconds > 0, "--layout auto: expected a positive probe length");
}

// Times every layout the planner reported, under the budget (a wrong plan shows as a
// refused allocation); `talk`: a line per layout on stderr.
void measure_all(const ModelConfig& mc, const TrainConfig& base, const Dataset& train, const Dataset* test,
                 const LayoutTuneConfig& cfg, const PlanResult& plan, bool talk, LayoutTuneResult& r) {
  device_mem_set_budget(Device::cpu, r.budget + mem_stats().current);
  struct BudgetReset {
    ~BudgetReset() { device_mem_set_budget(Device::cpu, 0); }
  } reset;
  for (const Prediction& p : plan.best) {
    LayoutTrial t;
    t.predicted = p;
    measure(mc, base, train, test, cfg, t);
    if (talk)
      std::fprintf(stderr, "layout auto: %s: %.0f samples/s measured (%.0f predicted), peak %s (plan %s)%s\n",
                   p.layout.str().c_str(), t.measured_samples_per_second, p.samples_per_second,
                   format_bytes(double(t.measured_peak_bytes)).c_str(), format_bytes(p.memory_bytes).c_str(),
                   t.failed.empty() ? "" : ("; not timed: " + t.failed).c_str());
    r.trials.push_back(std::move(t));
  }
}

}  // namespace

LayoutTuneResult tune_layout(const ModelConfig& mc, const TrainConfig& base, const Dataset& train, const Dataset* test,
                             const LayoutTuneConfig& cfg) {
  const double t0 = now_seconds();
  check_config(base, cfg);
  dist::Comm* comm = base.comm;
  const bool talk = cfg.progress && (!comm || comm->rank() == 0);
  LayoutTuneResult r;
  r.model = mc.name;
  r.data = train.name();
  r.world = comm ? comm->size() : 1;
  r.global_batch = cfg.global_batch;
  r.filter = filter_str(cfg.filter);
  r.budget = default_budget(cfg.memory_budget, comm, r.budget_source);
  if (talk)
    std::fprintf(stderr, "layout auto: measuring this machine (GEMM, memory%s)\n",
                 r.world > 1 ? ", the links between the ranks" : "");
  r.hw = hardware("this", comm);
  r.hardware_seconds = now_seconds() - t0;
  const PlanResult plan = ranked_layouts(request_of(mc, base, cfg, r), r);
  r.layouts_searched = plan.layouts;
  r.plan_seconds = plan.seconds;
  if (talk)
    std::fprintf(stderr, "layout auto: the planner searched %lld layouts in %.0f ms; timing its best %zu\n",
                 (long long)plan.layouts, 1000 * plan.seconds, plan.best.size());
  measure_all(mc, base, train, test, cfg, plan, talk, r);
  choose(r);
  agree_on_choice(comm, r);
  r.tuning_seconds = now_seconds() - t0;
  return r;
}

}  // namespace sat
