#include "tune/tune.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/timer.h"

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

namespace {

struct Probe {
  double sps = 0;
  size_t peak = 0;
  int steps = 0;
  bool oom = false;
};

TrainConfig probe_config(const TrainConfig& base, int64_t micro, int64_t accum, int64_t steps) {
  TrainConfig c = base;
  c.batch = micro;
  c.accum = accum;
  c.steps = steps;
  c.epochs = 0;
  c.evaluate = false;
  c.out_dir.clear();
  c.profile = false;
  c.progress = 0;
  c.warmup_excluded = 1;
  c.schedule = ScheduleConfig{};
  c.time_limit = 0;
  c.measure_noise = false;
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

}  // namespace

TuneResult tune(const ModelConfig& mc, const TrainConfig& base_in, const Dataset& train, const Dataset* test,
                const TuneConfig& cfg) {
  const double t0 = now_seconds();
  SAT_CHECK(cfg.objective == "throughput" || cfg.objective == "goodput",
            "--objective: expected throughput or goodput, got '", cfg.objective, "'");
  SAT_CHECK(cfg.knee >= 0 && cfg.knee < 1, "--knee: expected a fraction in [0, 1), got ", cfg.knee);
  SAT_CHECK(cfg.global_batch >= 0, "--global-batch: expected a positive number, got ", cfg.global_batch);
  SAT_CHECK(base_in.pp == 1 && base_in.tp == 1, "--pp/--tp: the tuner chooses the batch of a data-parallel layout; "
            "with pipeline or tensor parallelism give --batch and --accum");
  TrainConfig base = base_in;
  base.optim = resolve_optim(base.optim);
  dist::Comm* comm = base.comm;
  const int world = comm ? comm->size() : 1;
  const bool lead = !comm || comm->rank() == 0;
  int dev_index = 0;
  const Device dev = resolve_device(base.device, &dev_index);
  auto say = [&](auto&&... a) {
    if (lead && cfg.progress) std::fprintf(stderr, "%s\n", str_cat(a...).c_str());
  };

  TuneResult r;
  r.model = mc.name;
  r.data = train.name();
  r.device = dev == Device::cuda ? "cuda:" + std::to_string(dev_index) : "cpu";
  r.world = world;
  r.knee = cfg.knee;
  r.objective = cfg.objective;
  r.requested_global_batch = cfg.global_batch;

  // ---- the budget -----------------------------------------------------------------------
  if (cfg.memory_budget) {
    r.budget = cfg.memory_budget;
    r.budget_source = "--memory-budget";
  } else if (dev == Device::cuda) {
    r.budget = size_t(double(cuda_free_memory(dev_index)) * 0.95);
    r.budget_source = "free GPU memory less 5%";
  } else {
    r.budget = size_t(double(host_available_memory()) * 0.8 / world);
    r.budget_source = world > 1 ? "available host memory less 20%, shared by the ranks" : "available host memory less 20%";
  }
  SAT_CHECK(r.budget > 0, "--memory-budget: could not tell how much memory is free; give a budget in bytes");
  agree(comm, &r.budget, 1, DType::i64);

  // ---- the largest micro-batch that fits, from the plan alone ----------------------------
  const int64_t share = cfg.global_batch > 0 ? std::max<int64_t>(1, cfg.global_batch / world) : 0;
  int64_t cap = train.size() / world;
  if (share) cap = std::min(cap, share);
  if (cfg.max_micro_batch > 0) cap = std::min(cap, cfg.max_micro_batch);
  SAT_CHECK(cap >= 1, "--data: ", train.name(), " has ", train.size(), " samples, fewer than the ", world, " ranks");
  TrainConfig final_cfg = probe_config(base, 1, 1, 1);
  final_cfg.evaluate = test != nullptr;
  auto fits = [&](int64_t b) {
    TrainConfig c = final_cfg;
    c.batch = b;
    return predicted(mc, c, train, test, world) <= r.budget;
  };
  {
    TrainConfig c = final_cfg;
    const size_t need = predicted(mc, c, train, test, world);
    SAT_CHECK(need <= r.budget, "--memory-budget: ", mc.name, " needs ", format_bytes(double(need)),
              " per rank at micro-batch 1, more than the budget of ", format_bytes(double(r.budget)),
              (cfg.memory_budget ? "" : " (" + r.budget_source + ")"));
  }
  const int64_t lo = largest_fitting(cap, fits);
  r.max_micro_batch = lo;
  {
    TrainConfig c = final_cfg;
    c.batch = lo;
    r.max_predicted_bytes = predicted(mc, c, train, test, world);
  }
  say("tune: budget ", format_bytes(double(r.budget)), " per rank (", r.budget_source, "); the plan fits micro-batch ",
      r.max_micro_batch, " (", format_bytes(double(r.max_predicted_bytes)), ")",
      cap == r.max_micro_batch && cap < train.size() / world ? " (capped)" : "");

  // Every run below allocates under the budget: a wrong plan would show as a refused
  // allocation, counted, never as a crash.
  const size_t failed_before = device_mem_failed(dev);
  // (Host buffers that already exist, outside any plan, are not the runs' to pay for.)
  device_mem_set_budget(dev, r.budget + (dev == Device::cpu ? mem_stats().current : 0));
  struct BudgetReset {
    Device d;
    ~BudgetReset() { device_mem_set_budget(d, 0); }
  } reset{dev};

  auto run_probe = [&](int64_t micro, int64_t accum, int64_t steps, double seconds, bool noise,
                       std::vector<GradNormSample>* norms, float lr, const TuneLever* lever = nullptr) -> Probe {
    Probe p;
    TrainConfig c = probe_config(lever ? with_lever(base, *lever) : base, micro, accum, steps);
    c.time_limit = seconds;
    c.measure_noise = noise;
    c.optim.lr = lr;
    try {
      Trainer t(mc, c, train, nullptr);
      // The median step time of the timed steps: one step delayed by other work on the
      // machine must not move the estimate.
      std::vector<double> secs;
      TrainResult tr = t.run([&](const StepMetrics& m) {
        if (m.step > c.warmup_excluded) secs.push_back(m.seconds);
      });
      p.sps = tr.samples_per_second;
      if (!secs.empty()) {
        std::nth_element(secs.begin(), secs.begin() + long(secs.size() / 2), secs.end());
        p.sps = double(micro * accum * world) / secs[secs.size() / 2];
      }
      p.peak = tr.peak_memory_bytes;
      p.steps = int(tr.steps - tr.warmup_excluded);
      if (norms) *norms = tr.grad_norms;
    } catch (const OutOfMemory& e) {
      // Only a wrong plan gets here; all ranks hit it alike (same plan, same budget).
      p.oom = true;
      say("tune: micro-batch ", micro, " was refused memory: ", e.what());
    }
    return p;
  };

  // ---- confirm the maximum with one real step --------------------------------------------
  {
    Probe p = run_probe(r.max_micro_batch, 1, 1, 0, false, nullptr, base.optim.lr);
    r.confirm_peak_bytes = p.peak;
    say("tune: one step at micro-batch ", r.max_micro_batch, " peaked at ", format_bytes(double(p.peak)),
        p.oom ? " and was refused memory" : "");
  }

  // ---- probes: geometric sizes up to the maximum -----------------------------------------
  std::vector<int64_t> sizes;
  if (share) {
    // Micro-batches that divide this rank's share of the global batch: powers of two, plus
    // the largest divisor that fits.
    for (int64_t b = 1; b <= r.max_micro_batch; b *= 2)
      if (share % b == 0) sizes.push_back(b);
    for (int64_t b = r.max_micro_batch; b >= 1; --b)
      if (share % b == 0) {
        if (sizes.empty() || sizes.back() != b) sizes.push_back(b);
        break;
      }
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  } else {
    for (int64_t b = 1; b <= r.max_micro_batch; b *= 2) sizes.push_back(b);
    if (sizes.back() != r.max_micro_batch) sizes.push_back(r.max_micro_batch);
  }
  double best = 0;
  int flat = 0;  // consecutive probes that did not beat the best by more than the knee
  for (int64_t b : sizes) {
    TuneCandidate cand;
    cand.micro_batch = b;
    TrainConfig c = probe_config(base, b, 1, 1);
    cand.predicted_memory_bytes = predicted(mc, c, train, nullptr, world);
    // Plateau: three sizes in a row (a factor of 8) without a gain beyond the knee;
    // larger ones are only planned (their memory is known), not timed.
    if (flat < 3) {
      Probe p = run_probe(b, 1, 200, cfg.probe_seconds, false, nullptr, base.optim.lr);
      ++r.probes;
      agree(comm, &p.sps, 1, DType::f64);
      cand.probed = !p.oom;
      cand.samples_per_second = p.sps;
      cand.measured_peak_bytes = p.peak;
      cand.timed_steps = p.steps;
      say("tune: micro-batch ", b, ": ", int64_t(p.sps), " samples/s over ", p.steps, " steps, peak ",
          format_bytes(double(p.peak)), " (plan ", format_bytes(double(cand.predicted_memory_bytes)), ")");
      if (p.oom) break;
      if (p.sps > best * (1 + cfg.knee)) flat = 0;
      else ++flat;
      best = std::max(best, p.sps);
    }
    r.candidates.push_back(cand);
  }
  std::vector<const TuneCandidate*> probed;
  for (auto& c : r.candidates)
    if (c.probed && c.samples_per_second > 0) probed.push_back(&c);
  SAT_CHECK(!probed.empty(), "tune: no micro-batch could be timed");

  // ---- choice by throughput --------------------------------------------------------------
  TuneChoice& ch = r.choice;
  const TuneCandidate* pick = nullptr;
  auto best_of = [&](auto score) {
    double top = 0;
    for (auto* c : probed) top = std::max(top, score(*c));
    return top;
  };
  if (share) {
    // The global batch is fixed: the fastest micro-batch among those that divide it.
    for (auto* c : probed)
      if (!pick || c->samples_per_second > pick->samples_per_second) pick = c;
  } else {
    const double top = best_of([](const TuneCandidate& c) { return c.samples_per_second; });
    for (auto* c : probed)
      if (c->samples_per_second >= (1 - cfg.knee) * top) { pick = c; break; }
  }

  // ---- the gradient noise scale, measured at the chosen micro-batch ----------------------
  const int64_t noise_micro = pick->micro_batch;
  if (cfg.noise_steps > 0 && train.size() >= 2 * noise_micro * world) {
    std::vector<GradNormSample> norms;
    std::string rule;
    const float lr = scale_lr(base.optim.name, base.optim.lr, cfg.lr_batch, 2 * noise_micro * world);
    Probe p = run_probe(noise_micro, 2, cfg.noise_steps, 0, true, &norms, lr);
    NoiseScale ns;
    int64_t k = 0;
    for (auto& g : norms) {
      ns.add(g.small_sq, g.b_small, g.big_sq, g.b_big);
      r.noise.push_back({++k, g.small_sq, g.big_sq, g.b_small, g.b_big, ns.estimate()});
    }
    r.noise_scale = ns.estimate();
    agree(comm, &r.noise_scale, 1, DType::f64);
    say("tune: gradient noise scale ", r.noise_scale, " (", norms.size(), " steps at micro-batch ", noise_micro,
        " x 2 accumulation", p.oom ? ", refused memory" : "", ")");
  }
  const int64_t ref_global = probed.front()->micro_batch * world;
  for (auto& c : r.candidates) {
    c.statistical_efficiency = statistical_efficiency(r.noise_scale, ref_global, c.micro_batch * world);
    c.goodput = c.samples_per_second * c.statistical_efficiency;
  }
  char buf[512];
  const int pct = int(std::lround(cfg.knee * 100));
  if (share) {
    ch.micro_batch = pick->micro_batch;
    ch.accum = share / pick->micro_batch;
    ch.global_batch = ch.micro_batch * ch.accum * world;
    std::snprintf(buf, sizeof buf,
                  "global batch %lld kept as micro-batch %lld x %lld accumulation x %d rank(s): the fastest measured "
                  "micro-batch (%.0f samples/s) among those that divide it and fit the budget",
                  (long long)ch.global_batch, (long long)ch.micro_batch, (long long)ch.accum, world,
                  pick->samples_per_second);
    ch.reason = buf;
    if (ch.global_batch != cfg.global_batch)
      ch.reason += str_cat("; ", cfg.global_batch, " is not a multiple of ", world, " ranks, so ", ch.global_batch,
                           " is the closest below it");
  } else if (cfg.objective == "goodput" && r.noise_scale > 0) {
    const double top = best_of([](const TuneCandidate& c) { return c.goodput; });
    for (auto* c : probed) {
      const auto& cc = *std::find_if(r.candidates.begin(), r.candidates.end(),
                                     [&](const TuneCandidate& x) { return x.micro_batch == c->micro_batch; });
      if (cc.goodput >= (1 - cfg.knee) * top) { pick = &cc; break; }
    }
    ch.micro_batch = pick->micro_batch;
    ch.global_batch = ch.micro_batch * world;
    std::snprintf(buf, sizeof buf,
                  "micro-batch %lld is the smallest within %d%% of the best goodput (throughput x statistical "
                  "efficiency at gradient noise scale %.0f): %.0f samples/s at efficiency %.2f",
                  (long long)ch.micro_batch, pct, r.noise_scale, pick->samples_per_second,
                  statistical_efficiency(r.noise_scale, ref_global, ch.global_batch));
    ch.reason = buf;
  } else {
    const TuneCandidate* fastest = probed.front();
    for (auto* c : probed)
      if (c->samples_per_second > fastest->samples_per_second) fastest = c;
    ch.micro_batch = pick->micro_batch;
    ch.global_batch = ch.micro_batch * world;
    if (fastest == pick)
      std::snprintf(buf, sizeof buf,
                    "micro-batch %lld gave the best measured throughput (%.0f samples/s) and no smaller one came "
                    "within %d%% of it. The largest that fits the budget is %lld",
                    (long long)ch.micro_batch, pick->samples_per_second, pct, (long long)r.max_micro_batch);
    else
      std::snprintf(buf, sizeof buf,
                    "micro-batch %lld is the smallest within %d%% of the best measured throughput (%.0f samples/s here, "
                    "%.0f at %lld): larger batches cost memory for little speed. The largest that fits the budget is "
                    "%lld",
                    (long long)ch.micro_batch, pct, pick->samples_per_second, fastest->samples_per_second,
                    (long long)fastest->micro_batch, (long long)r.max_micro_batch);
    ch.reason = buf;
    if (cfg.objective == "goodput") ch.reason += " (goodput needs the noise scale, which could not be measured here)";
  }
  // ---- memory levers, when the budget holds back a micro-batch that may be faster --------
  const bool rising = probed.size() < 2 || probed.back()->samples_per_second >
                                               (1 + cfg.knee) * probed[probed.size() - 2]->samples_per_second;
  const bool by_goodput = !share && cfg.objective == "goodput" && r.noise_scale > 0;
  int64_t target = 0;  // the next micro-batch worth trying
  if (share) {
    for (int64_t b = r.max_micro_batch + 1; b <= std::min(share, train.size() / world) && !target; ++b)
      if (share % b == 0) target = b;
  } else {
    target = std::min(2 * r.max_micro_batch, train.size() / world);
  }
  // Probes lever l at the largest micro-batch it fits up to the target (dividing the share
  // when the global batch is kept); it is chosen when it beats the choice by the knee.
  auto choose_lever = [&](TuneLever& l) {
    int64_t b = std::min(l.max_micro_batch, target);
    while (share && share % b != 0) --b;
    TrainConfig c = with_lever(probe_config(base, b, 1, 1), l);
    l.micro_batch = b;
    l.predicted_memory_bytes = predicted(mc, c, train, nullptr, world);
    Probe p = run_probe(b, 1, 200, cfg.probe_seconds, false, nullptr, base.optim.lr, &l);
    ++r.probes;
    agree(comm, &p.sps, 1, DType::f64);
    l.samples_per_second = p.oom ? 0 : p.sps;
    l.measured_peak_bytes = p.peak;
    say("tune: micro-batch ", b, " with ", l.name, ": ", int64_t(p.sps), " samples/s, peak ",
        format_bytes(double(p.peak)), " (plan ", format_bytes(double(l.predicted_memory_bytes)), ")");
    const double before = pick->samples_per_second;
    char why[512];
    std::snprintf(why, sizeof why,
                  ". Micro-batch %lld does not fit the budget as it is; %s (the cheapest lever that fits %s) makes it "
                  "fit (plan %s) and trained at %.0f samples/s, %+.0f%% against %lld without it",
                  (long long)b, l.name.c_str(), l.max_micro_batch >= target ? "it" : "the most",
                  format_bytes(double(l.predicted_memory_bytes)).c_str(), l.samples_per_second,
                  100.0 * (l.samples_per_second / before - 1), (long long)pick->micro_batch);
    ch.reason += why;
    if (l.samples_per_second <= (1 + cfg.knee) * before) {
      ch.reason += str_cat(": not faster by more than ", pct, "%, so no lever");
      return;
    }
    ch.reason += ": chosen";
    ch.micro_batch = b;
    ch.accum = share ? share / b : 1;
    ch.global_batch = ch.micro_batch * ch.accum * world;
    ch.zero = l.zero;
    ch.recompute = l.recompute;
  };

  if (!by_goodput && rising && ch.micro_batch == r.max_micro_batch && target > r.max_micro_batch) {
    r.levers = lever_options(mc, base, world, dev);
    TuneLever* use = nullptr;
    for (TuneLever& l : r.levers) {
      l.max_micro_batch = largest_fitting(std::max(target, cap), [&](int64_t b) {
        TrainConfig c = with_lever(final_cfg, l);
        c.batch = b;
        return predicted(mc, c, train, test, world) <= r.budget;
      });
      if (!use && l.max_micro_batch >= target) use = &l;
    }
    for (TuneLever& l : r.levers)  // none reaches the target: the one that gets closest
      if (!use || (use->max_micro_batch < target && l.max_micro_batch > use->max_micro_batch)) use = &l;
    if (use && use->max_micro_batch > r.max_micro_batch) choose_lever(*use);
  }

  // All ranks take rank 0's choice (their timings differ a little).
  int64_t agreed[5] = {ch.micro_batch, ch.accum, ch.global_batch, ch.zero, int64_t(ch.recompute)};
  agree(comm, agreed, 5, DType::i64);
  ch.micro_batch = agreed[0];
  ch.accum = agreed[1];
  ch.global_batch = agreed[2];
  ch.zero = int(agreed[3]);
  ch.recompute = Recompute(agreed[4]);
  ch.lr = scale_lr(base.optim.name, base.optim.lr, cfg.lr_batch, ch.global_batch, &ch.lr_rule);
  ch.warmup_fraction = ch.global_batch > cfg.lr_batch ? 0.05 : 0.0;
  r.failed_allocations = int(device_mem_failed(dev) - failed_before);
  r.tuning_seconds = now_seconds() - t0;
  return r;
}

}  // namespace sat
