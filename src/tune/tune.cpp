#include "tune/tune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/text.h"
#include "core/timer.h"
#include "tune/probe.h"

namespace sat {

double statistical_efficiency(double noise, int64_t ref, int64_t batch) {
  if (!(noise > 0)) return 1;
  return (noise + double(ref)) / (noise + double(batch));
}

float scale_lr(const std::string& optimizer, float lr, int64_t ref, int64_t batch, std::string* rule) {
  SAT_CHECK(ref >= 1, "--lr-batch: expected a positive reference batch, got ", ref);
  const double k = double(batch) / double(ref);
  if (optimizer == "adamw") {
    if (rule) *rule = "square root (Adam family)";
    return float(double(lr) * std::sqrt(k));
  }
  if (rule) *rule = "linear (SGD)";
  return float(double(lr) * k);
}

size_t default_host_budget(int world, std::string& source) {
  source = world > 1 ? "available host memory less 20%, shared by the ranks" : "available host memory less 20%";
  return size_t(double(host_available_memory()) * 0.8 / std::max(1, world));
}

namespace {

struct Probe {
  std::vector<double> secs;  // the timed steps' seconds
  size_t peak = 0;
  bool oom = false;
  std::vector<GradNormSample> norms;
};

TrainConfig probe_config(const TrainConfig& base, int64_t micro, int64_t accum, int64_t steps) {
  TrainConfig c = timed_config(base, steps, 0);
  c.batch = micro;
  c.accum = accum;
  return c;
}

// The memory the plan predicts for one rank (device memory on the GPU).
size_t predicted(const ModelConfig& mc, const TrainConfig& c, const Dataset& train, const Dataset* test, int world) {
  MemoryPlan p = Trainer::plan(mc, c, train, test, world);
  return p.device ? p.device : p.total();
}

// Every rank agrees on rank 0's value.
template <typename T>
void agree(dist::Comm* comm, T* v, size_t n, DType t) {
  if (comm && comm->size() > 1) comm->broadcast_sync(v, n, t, 0);
}

// The memory levers a run could pull, cheapest first: ZeRO-1 and ZeRO-2 move what data
// parallelism moves; selective recomputation reruns attention's softmax; ZeRO-3 moves 1.5
// times as much; full recomputation reruns a third of the step's FLOPs. None when the
// user chose a lever already.
// ZeRO-2/3 are left out when the run measures the noise scale (they never hold a micro-batch's
// whole gradient); on GPUs neither lever is built yet.
std::vector<TuneLever> lever_options(const ModelConfig& mc, const TrainConfig& base, int world, Device dev) {
  std::vector<TuneLever> out;
  if (base.zero != 0 || base.recompute != Recompute::none || dev != Device::cpu) return out;
  const bool sharded = world > 1 && !base.measure_noise;
  auto supports = [&](Recompute r) {
    ModelConfig m = mc;
    m.recompute = r;
    try {
      check_recompute(m);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  if (world > 1) out.push_back({"ZeRO-1", 1});
  if (sharded) out.push_back({"ZeRO-2", 2});
  if (supports(Recompute::selective)) out.push_back({"recompute selective", 0, Recompute::selective});
  if (sharded) out.push_back({"ZeRO-3", 3});
  if (supports(Recompute::full)) out.push_back({"recompute full", 0, Recompute::full});
  return out;
}

TrainConfig with_lever(TrainConfig c, const TuneLever& l) {
  c.zero = l.zero;
  c.recompute = l.recompute;
  return c;
}

// The largest micro-batch in [1, cap] for which fits(b) (fits(1) may be false: 0).
int64_t largest_fitting(int64_t cap, const std::function<bool(int64_t)>& fits) {
  if (!fits(1)) return 0;
  int64_t lo = 1, hi = 2;
  while (hi <= cap && fits(hi)) lo = hi, hi *= 2;
  hi = std::min(hi, cap + 1);
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid;
  }
  return lo;
}

// The micro-batches considered: powers of two up to the largest that fits, and that
// largest; with a kept global batch, those that divide this rank's share of it (powers
// of two, plus the largest divisor that fits).
std::vector<int64_t> size_grid(int64_t max_fit, int64_t share) {
  std::vector<int64_t> sizes;
  for (int64_t b = 1; b <= max_fit; b *= 2)
    if (!share || share % b == 0) sizes.push_back(b);
  int64_t top = max_fit;
  while (share && share % top != 0) --top;
  sizes.push_back(top);
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The rms deviation of a's log ratios to b, round by round, from their mean (0 with
// fewer than two rounds in common): how much the rounds disagree.
double round_scatter(const std::vector<ProbeTiming>& a, const std::vector<ProbeTiming>& b, int* n) {
  std::vector<double> d;
  for (const ProbeTiming& x : a)
    for (const ProbeTiming& y : b)
      if (x.round == y.round) d.push_back(std::log(x.samples_per_second / y.samples_per_second));
  if (d.size() < 2) return 0;
  double mean = 0, ss = 0;
  for (double v : d) mean += v / double(d.size());
  for (double v : d) ss += (v - mean) * (v - mean);
  *n += int(d.size()) - 1;
  return ss;
}

std::string pct(double fraction) { return str_cat(std::lround(100 * fraction), "%"); }

std::string fixed(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

class Tuner {
 public:
  Tuner(const ModelConfig& mc, const TrainConfig& base, const Dataset& train, const Dataset* test,
        const TuneConfig& cfg)
      : mc_(mc), base_(base), train_(train), test_(test), cfg_(cfg) {
    base_.optim = resolve_optim(base_.optim);
    comm_ = base_.comm;
    world_ = comm_ ? comm_->size() : 1;
    lead_ = !comm_ || comm_->rank() == 0;
    dev_ = resolve_device(base_.device, &dev_index_);
  }
  TuneResult run();

 private:
  template <typename... A>
  void say(const A&... a) const {
    if (lead_ && cfg_.progress) std::fprintf(stderr, "%s\n", str_cat(a...).c_str());
  }
  size_t plan_at(int64_t b, const TuneLever* lever = nullptr) const {
    TrainConfig c = lever ? with_lever(final_cfg_, *lever) : final_cfg_;
    c.batch = b;
    return predicted(mc_, c, train_, test_, world_);
  }
  void set_budget();
  void find_largest();
  Probe run_probe(TrainConfig c, double seconds, int min_steps = 0);
  ProbeTiming time_candidate(TuneCandidate& c, int round);
  bool probe_first(size_t i);
  void first_pass();
  void first_pass_predicted();
  size_t decide(const std::vector<double>& log_offsets, const char* what);
  std::string rule_used(int64_t b) const;
  std::string largest_text() const;
  std::string critical_text() const;
  void record(const std::vector<size_t>& idx, const std::vector<Contender>& con, size_t ref);
  int64_t noise_small_batch(int64_t micro, double sps, int64_t times) const;
  void measure_noise(int64_t micro, double sps);
  void record_noise(const std::vector<GradNormSample>& norms);
  void explain(size_t pick);
  void weigh_levers(size_t pick);
  void try_lever(size_t pick, TuneLever& l, int64_t target);
  void agree_choice();

  const ModelConfig& mc_;
  TrainConfig base_;
  const Dataset& train_;
  const Dataset* test_;
  const TuneConfig& cfg_;
  dist::Comm* comm_ = nullptr;
  int world_ = 1, dev_index_ = 0;
  bool lead_ = true;
  Device dev_ = Device::cpu;
  TuneResult r_;
  int64_t share_ = 0, cap_ = 0;
  int64_t steps_cap_ = 0;       // the micro-batch min_steps_per_epoch allows (0: no such cap)
  bool held_by_steps_ = false;  // max_micro_batch is that cap, not the budget
  TrainConfig final_cfg_;
};

void Tuner::set_budget() {
  if (cfg_.memory_budget) {
    r_.budget = cfg_.memory_budget;
    r_.budget_source = "--memory-budget";
  } else if (dev_ == Device::cuda) {
    r_.budget = size_t(double(cuda_free_memory(dev_index_)) * 0.95);
    r_.budget_source = "free GPU memory less 5%";
  } else {
    r_.budget = default_host_budget(world_, r_.budget_source);
  }
  SAT_CHECK(r_.budget > 0, "--memory-budget: could not tell how much memory is free; give a budget in bytes");
  agree(comm_, &r_.budget, 1, DType::i64);
}

// The largest micro-batch that fits, from the plan alone.
void Tuner::find_largest() {
  share_ = cfg_.global_batch > 0 ? std::max<int64_t>(1, cfg_.global_batch / world_) : 0;
  cap_ = train_.size() / world_;
  if (share_) cap_ = std::min(cap_, share_);
  if (cfg_.max_micro_batch > 0) cap_ = std::min(cap_, cfg_.max_micro_batch);
  if (!share_ && cfg_.min_steps_per_epoch > 0) {
    steps_cap_ = std::max<int64_t>(1, train_.size() / (int64_t(world_) * cfg_.min_steps_per_epoch));
    cap_ = std::min(cap_, steps_cap_);
  }
  SAT_CHECK(cap_ >= 1, "--data: ", train_.name(), " has ", train_.size(), " samples, fewer than the ", world_,
            " ranks");
  final_cfg_ = probe_config(base_, 1, 1, 1);
  final_cfg_.evaluate = test_ != nullptr;
  const size_t need = plan_at(1);
  SAT_CHECK(need <= r_.budget, "--memory-budget: ", mc_.name, " needs ", format_bytes(double(need)),
            " per rank at micro-batch 1, more than the budget of ", format_bytes(double(r_.budget)),
            (cfg_.memory_budget ? "" : " (" + r_.budget_source + ")"));
  r_.max_micro_batch = largest_fitting(cap_, [&](int64_t b) { return plan_at(b) <= r_.budget; });
  r_.max_predicted_bytes = plan_at(r_.max_micro_batch);
  held_by_steps_ = r_.max_micro_batch == steps_cap_ && steps_cap_ < train_.size() / world_;
  say("tune: budget ", format_bytes(double(r_.budget)), " per rank (", r_.budget_source,
      "); the plan fits micro-batch ", r_.max_micro_batch, " (", format_bytes(double(r_.max_predicted_bytes)), ")",
      held_by_steps_ ? str_cat(" (capped: a larger one leaves fewer than ", cfg_.min_steps_per_epoch,
                               " optimizer steps per epoch)")
      : cap_ == r_.max_micro_batch && cap_ < train_.size() / world_ ? " (capped)" : "");
}

// Trains c for c.steps steps or `seconds` of timed steps, and at least min_steps of them
// (0: as the trainer's time limit has it, 3). A refused allocation (only a wrong plan gets
// there; all ranks hit it alike) is reported, not thrown.
Probe Tuner::run_probe(TrainConfig c, double seconds, int min_steps) {
  Probe p;
  if (min_steps > 0 && seconds > 0) {
    // Asked after the step's own time is recorded (Trainer::run calls on_step first).
    c.stop_early = [&p, seconds, min_steps](const TrainResult&) {
      double sum = 0;
      for (double x : p.secs) sum += x;
      return int(p.secs.size()) >= min_steps && sum >= seconds;
    };
  } else {
    c.time_limit = seconds;
  }
  try {
    Trainer t(mc_, c, train_, nullptr);
    TrainResult tr = t.run([&](const StepMetrics& m) {
      if (m.step > c.warmup_excluded) p.secs.push_back(m.seconds);
    });
    p.peak = tr.peak_memory_bytes;
    p.norms = std::move(tr.grad_norms);
  } catch (const OutOfMemory& e) {
    p.oom = true;
    say("tune: micro-batch ", c.batch, " was refused memory: ", e.what());
  }
  return p;
}

// One timed probe of candidate c (every rank takes rank 0's timing).
ProbeTiming Tuner::time_candidate(TuneCandidate& c, int round) {
  Probe p = run_probe(probe_config(base_, c.micro_batch, 1, 200), cfg_.probe_seconds, cfg_.probe_min_steps);
  ProbeTiming t = p.oom ? ProbeTiming{} : time_probe(p.secs, double(c.micro_batch * world_), round);
  double v[4] = {t.samples_per_second, t.log_se, t.iqr_fraction, double(t.steps)};
  agree(comm_, v, 4, DType::f64);
  t = {round, v[0], v[1], v[2], int(v[3])};
  c.measured_peak_bytes = std::max(c.measured_peak_bytes, p.peak);
  c.timed_steps += t.steps;
  say("tune: ", round ? str_cat("round ", round, ": ") : "", "micro-batch ", c.micro_batch, ": ",
      int64_t(t.samples_per_second), " samples/s over ", t.steps, " steps (step times' IQR ", pct(t.iqr_fraction),
      " of their median), peak ", format_bytes(double(p.peak)), " (plan ",
      format_bytes(double(c.predicted_memory_bytes)), ")");
  return t;
}

// The first-pass probe of candidate i; false when it was refused memory.
bool Tuner::probe_first(size_t i) {
  TuneCandidate& c = r_.candidates[i];
  ProbeTiming t = time_candidate(c, 0);
  ++r_.probes;
  c.probed = t.samples_per_second > 0;
  if (c.probed) c.timings.push_back(t), c.samples_per_second = t.samples_per_second;
  return c.probed;
}

// Every size in turn; after three in a row that gained no more than the knee over the
// best so far, surely (the upper end of the ratio's 95% interval; a factor of 8 in size),
// the larger ones are only planned.
void Tuner::first_pass() {
  int flat = 0;
  const TuneCandidate* best = nullptr;
  for (size_t i = 0; i < r_.candidates.size() && flat < 3; ++i) {
    if (!probe_first(i)) break;
    const TuneCandidate& c = r_.candidates[i];
    const bool gain = !best || compare(c.timings, best->timings).high(1.96) > 1 + cfg_.knee;
    flat = gain ? 0 : flat + 1;
    if (!best || c.samples_per_second > best->samples_per_second) best = &c;
  }
}

// With a cost model: the sizes next to its best and to its knee (the smallest within the
// knee of its best), then outwards while the measurements say the knee or the best lie
// beyond what was probed.
void Tuner::first_pass_predicted() {
  auto& cs = r_.candidates;
  const int n = int(cs.size());
  int best = 0;
  for (int i = 0; i < n; ++i)
    if (cs[size_t(i)].predicted_samples_per_second > cs[size_t(best)].predicted_samples_per_second) best = i;
  int knee = best;
  while (knee > 0 && cs[size_t(knee - 1)].predicted_samples_per_second >=
                         (1 - cfg_.knee) * cs[size_t(best)].predicted_samples_per_second)
    --knee;
  std::set<int> todo;
  for (int at : {knee, best})
    for (int i = std::max(0, at - 1); i <= std::min(n - 1, at + 1); ++i) todo.insert(i);
  for (int i : todo)
    if (!probe_first(size_t(i))) return;
  for (;;) {
    int lo = n, hi = -1;
    double top = 0;
    for (int i = 0; i < n; ++i)
      if (cs[size_t(i)].probed) lo = std::min(lo, i), hi = i, top = std::max(top, cs[size_t(i)].samples_per_second);
    int next = -1;
    if (lo > 0 && cs[size_t(lo)].samples_per_second >= (1 - cfg_.knee) * top) next = lo - 1;
    else if (hi < n - 1 && cs[size_t(hi)].samples_per_second >= top) next = hi + 1;
    if (next < 0 || !probe_first(size_t(next))) return;
  }
}

// The contest among the probed candidates (tune/contest.h); returns the chosen
// candidate's index. log_offsets (per candidate, may be empty) weigh the throughputs:
// goodput's statistical efficiency.
size_t Tuner::decide(const std::vector<double>& log_offsets, const char* what) {
  std::vector<size_t> idx;
  std::vector<Contender> con;
  for (size_t i = 0; i < r_.candidates.size(); ++i)
    if (r_.candidates[i].probed) {
      idx.push_back(i);
      con.push_back({r_.candidates[i].micro_batch, r_.candidates[i].timings, log_offsets.empty() ? 0 : log_offsets[i]});
    }
  SAT_CHECK(!con.empty(), "tune: no micro-batch could be timed");
  ContestRules rules;
  rules.knee = cfg_.knee;
  rules.max_rounds = cfg_.rounds;
  rules.fastest = share_ > 0;
  rules.larger_when_unsure = log_offsets.empty();
  const ContestOutcome o = run_contest(con, rules, [&](int k, int round) {
    return time_candidate(r_.candidates[idx[size_t(k)]], round);
  });
  ThroughputNoise& tn = r_.throughput_noise;
  tn.rounds += o.rounds;
  tn.remeasured += o.remeasured;
  tn.settled = o.verdict.settled;
  tn.unsure = o.verdict.unsure;
  tn.reference = con[size_t(o.verdict.reference)].micro_batch;
  record(idx, con, size_t(o.verdict.reference));
  say("tune: ", what, ": ", o.verdict.settled ? "settled" : "not settled", " after ", o.rounds,
      " round(s) of re-measurement (", o.remeasured, " probes); the noise-aware best is micro-batch ", tn.reference);
  return idx[size_t(o.verdict.choice)];
}

// Each contender's figures (its throughput over its rounds, its ratio to the reference,
// the spread of its step times) and the overall noise, in r_.
void Tuner::record(const std::vector<size_t>& idx, const std::vector<Contender>& con, size_t ref) {
  std::vector<double> iqr;
  double ss = 0;
  int dof = 0;
  for (size_t k = 0; k < con.size(); ++k) {
    TuneCandidate& c = r_.candidates[idx[k]];
    c.timings = con[k].timings;
    Contender plain = con[k];
    plain.log_offset = 0;
    const Estimate e = estimate(plain);
    c.samples_per_second = std::exp(e.log);
    c.samples_per_second_low = std::exp(e.log - 1.96 * e.se);
    c.samples_per_second_high = std::exp(e.log + 1.96 * e.se);
    const Ratio q = k == ref ? Ratio{0, 0, 1} : compare(con[k].timings, con[ref].timings);  // itself: exactly 1
    c.ratio_to_best = q.value(), c.ratio_to_best_low = q.low(1.96), c.ratio_to_best_high = q.high(1.96);
    std::vector<double> mine;
    for (auto& t : c.timings) mine.push_back(t.iqr_fraction), iqr.push_back(t.iqr_fraction);
    c.step_time_iqr_fraction = median_of(mine);
    if (k != ref) ss += round_scatter(con[k].timings, con[ref].timings, &dof);
  }
  r_.throughput_noise.step_time_iqr_fraction = median_of(iqr);
  r_.throughput_noise.round_to_round = dof > 0 ? std::sqrt(ss / dof) : 0;
}

// The gradient noise scale's small batch: micro up to noise_max_small, less when the big
// batch (`times` it) would be more than a quarter of the training set (sampling nearly all
// of it would hide the noise) or a step would take more than a tenth of the time cap at
// `sps` (the throughput measured at micro). 0 when not even 1 keeps to the training set.
int64_t Tuner::noise_small_batch(int64_t micro, double sps, int64_t times) const {
  int64_t b = std::min({micro, cfg_.noise_max_small, train_.size() / (4 * times)});
  if (sps > 0 && cfg_.noise_seconds > 0)
    b = std::min(b, std::max<int64_t>(1, int64_t(sps * cfg_.noise_seconds / 10 / double(times))));
  return b;
}

// The gradient noise scale, b_big = noise_ratio x b_small through accumulation and ranks;
// steps until the interval is at most noise_tolerance x the estimate wide, or a cap.
void Tuner::measure_noise(int64_t micro, double sps) {
  NoiseInterval& iv = r_.noise_interval;
  if (cfg_.noise_steps <= 0) {
    iv.reason = "not asked for (no noise-scale steps)";
    return;
  }
  const int64_t accum = std::max<int64_t>(2, (cfg_.noise_ratio + world_ - 1) / world_);
  const int64_t b = noise_small_batch(micro, sps, accum * world_);
  if (b < 1) {
    iv.reason = str_cat("the training set (", train_.size(), " samples) is too small for two batches ",
                        accum * world_, " times apart");
    return;
  }
  r_.noise_b_small = b;
  r_.noise_b_big = b * accum * world_;
  TrainConfig c = probe_config(base_, b, accum, cfg_.noise_steps);
  c.measure_noise = true;
  c.optim.lr = scale_lr(base_.optim.name, base_.optim.lr, cfg_.lr_batch, micro * world_);  // the choice's rate
  c.stop_early = [tol = cfg_.noise_tolerance](const TrainResult& tr) {
    NoiseScale ns;
    for (auto& g : tr.grad_norms) ns.add(g.small_sq, g.b_small, g.big_sq, g.b_big);
    const NoiseInterval v = ns.interval();
    return ns.count() >= 5 && v.measurable && v.high - v.low <= tol * v.estimate;
  };
  Probe p;
  try {
    p = run_probe(c, cfg_.noise_seconds);
    if (p.oom) iv.reason = "its steps were refused memory";
  } catch (const Error& e) {  // e.g. training diverged at this rate: every rank sees the same loss
    iv.reason = str_cat("its training steps failed: ", e.what());
  }
  record_noise(p.norms);
  const std::string how = str_cat(p.norms.size(), " steps at micro-batch ", b, " x ", accum, " accumulation",
                                  world_ > 1 ? str_cat(" x ", world_, " ranks") : "", ": batches ", b, " and ",
                                  r_.noise_b_big);
  if (iv.measurable)
    say("tune: gradient noise scale ", fixed("%.4g", iv.estimate), " (95% interval ", fixed("%.4g", iv.low), " to ",
        fixed("%.4g", iv.high), "; ", how, ")");
  else
    say("tune: gradient noise scale: not measurable yet: ", iv.reason, " (", how, ")");
}

// The trace of the estimate step by step, and the final interval (rank 0's on every rank);
// a reason already given (a failed measurement) stands.
void Tuner::record_noise(const std::vector<GradNormSample>& norms) {
  NoiseInterval& iv = r_.noise_interval;
  NoiseScale ns;
  for (auto& g : norms) {
    ns.add(g.small_sq, g.b_small, g.big_sq, g.b_big);
    const NoiseInterval v = ns.interval();
    r_.noise.push_back({ns.count(), g.small_sq, g.big_sq, g.b_small, g.b_big, v.estimate, v.measurable ? v.low : 0,
                        v.measurable ? v.high : 0});
  }
  if (iv.reason.empty()) iv = ns.interval();
  double v[4] = {double(iv.measurable), iv.estimate, iv.low, iv.high};
  agree(comm_, v, 4, DType::f64);
  iv.measurable = v[0] > 0, iv.estimate = v[1], iv.low = v[2], iv.high = v[3];
  r_.noise_scale = iv.measurable ? iv.estimate : 0;
}

// The largest micro-batch considered, and what held it there.
std::string Tuner::largest_text() const {
  if (!held_by_steps_) return str_cat("The largest that fits the budget is ", r_.max_micro_batch);
  return str_cat("The largest considered is ", r_.max_micro_batch, ": a larger global batch would leave fewer than ",
                 cfg_.min_steps_per_epoch, " optimizer steps per epoch of the ", train_.size(),
                 " training samples (--min-steps-per-epoch; progress comes from steps, not only samples)");
}

// The critical batch size the statistical side estimated (the gradient noise scale
// B_simple, McCandlish et al. 2018: below it a larger batch trains nearly as well per
// sample, above it each doubling buys less), and where the chosen global batch stands.
std::string Tuner::critical_text() const {
  const NoiseInterval& iv = r_.noise_interval;
  const int64_t g = r_.choice.global_batch;
  if (!iv.measurable)
    return str_cat("The critical batch size could not be estimated (", iv.reason.empty() ? "not measured" : iv.reason,
                   "), so global batch ", g, " is not weighed against it");
  const char* where = double(g) > iv.high ? "above it: beyond the critical batch, a larger batch needs more samples "
                                            "for the same progress"
                      : double(g) < iv.low ? "below it: a larger batch would still train nearly as well per sample"
                                           : "within its interval";
  return str_cat("The critical batch size estimate (the gradient noise scale B_simple) is ", fixed("%.3g", iv.estimate),
                 " (95% interval ", fixed("%.3g", iv.low), " to ", fixed("%.3g", iv.high), "); global batch ", g,
                 " is ", where);
}

// What decided the contest's choice (micro-batch b), in words for tune.json.
std::string Tuner::rule_used(int64_t b) const {
  const ThroughputNoise& tn = r_.throughput_noise;
  if (share_) return "fastest (global batch kept)";
  if (!tn.unsure) return "smallest within the knee of the noise-aware best";
  return b == tn.reference ? "none told apart within the knee: the noise-aware best"
                           : "none told apart within the knee: the largest not measured slower";
}

// The choice and its reason, from candidate `pick` (the contest's choice).
void Tuner::explain(size_t pick) {
  TuneChoice& ch = r_.choice;
  const TuneCandidate& c = r_.candidates[pick];
  const ThroughputNoise& tn = r_.throughput_noise;
  const std::string knee = pct(cfg_.knee);
  const std::string noise =
      str_cat(tn.rounds, " round(s) of re-measurement, step times' IQR ", pct(tn.step_time_iqr_fraction),
              tn.rounds ? str_cat(", rounds disagreeing by ", fixed("%.1f", 100 * tn.round_to_round), "%") : "");
  ch.micro_batch = c.micro_batch;
  ch.accum = share_ ? share_ / c.micro_batch : 1;
  ch.global_batch = ch.micro_batch * ch.accum * world_;
  const std::string sps = str_cat(fixed("%.0f", c.samples_per_second), " samples/s (95% interval ",
                                  fixed("%.0f", c.samples_per_second_low), " to ",
                                  fixed("%.0f", c.samples_per_second_high), ")");
  if (share_) {
    ch.reason = str_cat("global batch ", ch.global_batch, " kept as micro-batch ", ch.micro_batch, " x ", ch.accum,
                        " accumulation x ", world_, " rank(s): the fastest micro-batch among those that divide it and "
                        "fit the budget, ", sps, ", after ", noise);
    if (ch.global_batch != cfg_.global_batch)
      ch.reason += str_cat("; ", cfg_.global_batch, " is not a multiple of ", world_, " ranks, so ", ch.global_batch,
                           " is the closest below it");
    return;
  }
  const bool good = cfg_.objective == "goodput" && r_.noise_interval.measurable;
  const std::string what = good ? str_cat("goodput (throughput x statistical efficiency ",
                                          fixed("%.2f", c.statistical_efficiency), " at gradient noise scale ",
                                          fixed("%.3g", r_.noise_scale), ", 95% interval ",
                                          fixed("%.3g", r_.noise_interval.low), " to ",
                                          fixed("%.3g", r_.noise_interval.high), ")")
                                : std::string("throughput");
  if (tn.unsure && c.micro_batch != tn.reference)
    ch.reason = str_cat("micro-batch ", c.micro_batch, ": no micro-batch could be confirmed within ", knee,
                        " of the others through the noise (", noise, "), so the choice is the largest not measured "
                        "slower than the best (a larger batch spreads each step's fixed cost over more samples): ",
                        sps, ", ", fixed("%.3f", c.ratio_to_best), " of micro-batch ", tn.reference,
                        "'s, the noise-aware best (95% interval ", fixed("%.3f", c.ratio_to_best_low), " to ",
                        fixed("%.3f", c.ratio_to_best_high), "). ", largest_text());
  else if (c.micro_batch == tn.reference)
    ch.reason = str_cat("micro-batch ", c.micro_batch, " gave the best ", what, ", ", sps, ", and no smaller one ",
                        tn.settled ? "is" : "could be confirmed", " within ", knee, " of it (", noise,
                        "). ", largest_text());
  else
    ch.reason = str_cat("micro-batch ", c.micro_batch, " is the smallest within ", knee, " of the best ", what, ": ",
                        sps, ", ", fixed("%.3f", c.ratio_to_best), " of micro-batch ", tn.reference,
                        "'s (95% interval ",
                        fixed("%.3f", c.ratio_to_best_low), " to ", fixed("%.3f", c.ratio_to_best_high), "; ", noise,
                        tn.settled ? "" : "; smaller ones could not be told apart from the knee through the noise",
                        "): larger batches cost memory for little speed. ", largest_text());
  if (cfg_.objective == "goodput" && !good)
    ch.reason += str_cat(" (goodput needs the gradient noise scale, which is not measurable yet: ",
                         r_.noise_interval.reason, "; chosen by throughput)");
}

// Memory levers, when the budget holds back a micro-batch that may be faster: the cheapest
// lever that fits the next micro-batch (or the one that fits the largest) is tried there.
void Tuner::weigh_levers(size_t pick) {
  std::vector<const TuneCandidate*> probed;
  for (auto& c : r_.candidates)
    if (c.probed) probed.push_back(&c);
  const bool rising = probed.size() < 2 || probed.back()->samples_per_second >
                                               (1 + cfg_.knee) * probed[probed.size() - 2]->samples_per_second;
  const bool by_goodput = !share_ && cfg_.objective == "goodput" && r_.noise_scale > 0;
  TuneChoice& ch = r_.choice;
  int64_t target = 0;  // the next micro-batch worth trying
  if (share_) {
    for (int64_t b = r_.max_micro_batch + 1; b <= std::min(share_, train_.size() / world_) && !target; ++b)
      if (share_ % b == 0) target = b;
  } else {
    target = std::min(2 * r_.max_micro_batch, steps_cap_ ? steps_cap_ : train_.size() / world_);
  }
  if (by_goodput || !rising || ch.micro_batch != r_.max_micro_batch || target <= r_.max_micro_batch) return;
  r_.levers = lever_options(mc_, base_, world_, dev_);
  TuneLever* use = nullptr;
  for (TuneLever& l : r_.levers) {
    l.max_micro_batch =
        largest_fitting(std::max(target, cap_), [&](int64_t b) { return plan_at(b, &l) <= r_.budget; });
    if (!use && l.max_micro_batch >= target) use = &l;
  }
  for (TuneLever& l : r_.levers)  // none reaches the target: the one that gets closest
    if (!use || (use->max_micro_batch < target && l.max_micro_batch > use->max_micro_batch)) use = &l;
  if (use && use->max_micro_batch > r_.max_micro_batch) try_lever(pick, *use, target);
}

// Probes lever l at the largest micro-batch it fits up to the target (dividing the share
// when the global batch is kept), right after timing the choice again; takes it when it is
// faster by more than the knee.
void Tuner::try_lever(size_t pick, TuneLever& l, int64_t target) {
  TuneChoice& ch = r_.choice;
  int64_t b = std::min(l.max_micro_batch, target);
  while (share_ && share_ % b != 0) --b;
  l.micro_batch = b;
  l.predicted_memory_bytes = predicted(mc_, with_lever(probe_config(base_, b, 1, 1), l), train_, nullptr, world_);
  TuneCandidate& mine = r_.candidates[pick];
  const ProbeTiming before = time_candidate(mine, 0);
  ++r_.throughput_noise.remeasured;
  Probe p = run_probe(with_lever(probe_config(base_, b, 1, 200), l), cfg_.probe_seconds, cfg_.probe_min_steps);
  ++r_.probes;
  double sps = p.oom ? 0 : time_probe(p.secs, double(b * world_), 0).samples_per_second;
  agree(comm_, &sps, 1, DType::f64);
  l.samples_per_second = sps;
  l.measured_peak_bytes = p.peak;
  say("tune: micro-batch ", b, " with ", l.name, ": ", int64_t(sps), " samples/s, peak ", format_bytes(double(p.peak)),
      " (plan ", format_bytes(double(l.predicted_memory_bytes)), "), against ", int64_t(before.samples_per_second),
      " at micro-batch ", mine.micro_batch, " without it just before");
  const double ratio = before.samples_per_second > 0 ? sps / before.samples_per_second : 0;
  ch.reason += str_cat(". Micro-batch ", b, " does not fit the budget as it is; ", l.name,
                       " (the cheapest lever that fits ", l.max_micro_batch >= target ? "it" : "the most", ") makes it fit (plan ",
                       format_bytes(double(l.predicted_memory_bytes)), ") and trained at ", fixed("%.0f", sps),
                       " samples/s, ", fixed("%+.0f", 100 * (ratio - 1)), "% against ", mine.micro_batch,
                       " without it, timed just before");
  if (ratio <= 1 + cfg_.knee) {
    ch.reason += str_cat(": not faster by more than ", pct(cfg_.knee), ", so no lever");
    return;
  }
  ch.reason += ": chosen";
  ch.micro_batch = b;
  ch.accum = share_ ? share_ / b : 1;
  ch.global_batch = ch.micro_batch * ch.accum * world_;
  ch.zero = l.zero;
  ch.recompute = l.recompute;
}

// All ranks take rank 0's choice (their timings differ a little), then the learning rate.
void Tuner::agree_choice() {
  TuneChoice& ch = r_.choice;
  int64_t agreed[5] = {ch.micro_batch, ch.accum, ch.global_batch, ch.zero, int64_t(ch.recompute)};
  agree(comm_, agreed, 5, DType::i64);
  ch.micro_batch = agreed[0];
  ch.accum = agreed[1];
  ch.global_batch = agreed[2];
  ch.zero = int(agreed[3]);
  ch.recompute = Recompute(agreed[4]);
  ch.lr = scale_lr(base_.optim.name, base_.optim.lr, cfg_.lr_batch, ch.global_batch, &ch.lr_rule);
  // A linear warm-up over 5% of the steps whatever the batch: at a batch above --lr-batch
  // the rate was scaled up, and below it the default warm-up is kept all the same.
  ch.warmup_fraction = 0.05;
  ch.reason += ". " + critical_text();
}

TuneResult Tuner::run() {
  const double t0 = now_seconds();
  r_.model = mc_.name;
  r_.data = train_.name();
  r_.device = dev_ == Device::cuda ? "cuda:" + std::to_string(dev_index_) : "cpu";
  r_.world = world_;
  r_.knee = cfg_.knee;
  r_.objective = cfg_.objective;
  r_.requested_global_batch = cfg_.global_batch;
  set_budget();
  find_largest();
  // Every run below allocates under the budget: a wrong plan would show as a refused
  // allocation, counted, never as a crash. (Host buffers that already exist, outside any
  // plan, are not the runs' to pay for.)
  const size_t failed_before = device_mem_failed(dev_);
  device_mem_set_budget(dev_, r_.budget + (dev_ == Device::cpu ? mem_stats().current : 0));
  struct BudgetReset {
    Device d;
    ~BudgetReset() { device_mem_set_budget(d, 0); }
  } reset{dev_};
  {
    Probe p = run_probe(probe_config(base_, r_.max_micro_batch, 1, 1), 0);
    r_.confirm_peak_bytes = p.peak;
    say("tune: one step at micro-batch ", r_.max_micro_batch, " peaked at ", format_bytes(double(p.peak)),
        p.oom ? " and was refused memory" : "");
  }
  for (int64_t b : size_grid(r_.max_micro_batch, share_)) {
    TuneCandidate c;
    c.micro_batch = b;
    c.predicted_memory_bytes = predicted(mc_, probe_config(base_, b, 1, 1), train_, nullptr, world_);
    if (cfg_.predicted_samples_per_second) c.predicted_samples_per_second = cfg_.predicted_samples_per_second(b);
    r_.candidates.push_back(c);
  }
  if (cfg_.predicted_samples_per_second) first_pass_predicted();
  else first_pass();
  size_t pick = decide({}, "throughput");
  measure_noise(r_.candidates[pick].micro_batch, r_.candidates[pick].samples_per_second);
  const int64_t ref_global = r_.candidates.front().micro_batch * world_;
  std::vector<double> offsets;
  for (auto& c : r_.candidates) {
    c.statistical_efficiency = statistical_efficiency(r_.noise_scale, ref_global, c.micro_batch * world_);
    offsets.push_back(std::log(c.statistical_efficiency));
  }
  if (!share_ && cfg_.objective == "goodput" && r_.noise_scale > 0) pick = decide(offsets, "goodput");
  for (auto& c : r_.candidates) c.goodput = c.samples_per_second * c.statistical_efficiency;
  explain(pick);
  weigh_levers(pick);
  agree_choice();
  r_.throughput_noise.rule = rule_used(r_.candidates[pick].micro_batch);
  r_.failed_allocations = int(device_mem_failed(dev_) - failed_before);
  r_.tuning_seconds = now_seconds() - t0;
  return r_;
}

}  // namespace

TuneResult tune(const ModelConfig& mc, const TrainConfig& base, const Dataset& train, const Dataset* test,
                const TuneConfig& cfg) {
  check_choice("--objective", cfg.objective, {"throughput", "goodput"});
  SAT_CHECK(cfg.knee >= 0 && cfg.knee < 1, "--knee: expected a fraction in [0, 1), got ", cfg.knee);
  SAT_CHECK(cfg.global_batch >= 0, "--global-batch: expected a positive number, got ", cfg.global_batch);
  SAT_CHECK(base.pp == 1 && base.tp == 1, "--pp/--tp: the tuner chooses the batch of a data-parallel layout; "
            "with pipeline or tensor parallelism give --batch and --accum");
  SAT_CHECK(cfg.rounds >= 0 && cfg.probe_min_steps >= 1 && cfg.noise_max_small >= 1 && cfg.noise_ratio >= 2 &&
                cfg.noise_tolerance > 0,
            "internal error: tuning rounds, probe steps, noise ratio or tolerance out of range");
  return Tuner(mc, base, train, test, cfg).run();
}

}  // namespace sat
