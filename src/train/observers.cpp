#include "train/observers.h"

#include <cmath>

#include "core/timer.h"
#include "nn/layers/moe.h"
#include "train/runtime.h"

namespace sat {

namespace {

// ---- measurement -----------------------------------------------------------------------
class Measure final : public RunObserver {
 public:
  explicit Measure(RankRuntime& rt) : rt_(rt) {}
  void step_begins(RunState& run) override {
    if (run.step - run.start != run.result.warmup_excluded) return;
    run.t_measure = now_seconds();
    rt_.sync->reset_timing();
  }
  // One step's times added to the run's: the executor's parts, the wait for the loss from
  // the last stage, and what is left of the step.
  void step_ends(StepDone& d, RunState& run) override {
    if (!run.measured()) return;
    const StepStats& st = d.stats;
    StepBreakdown& b = run.spent;
    b.compute += st.compute_seconds, b.grad_sync += st.reduce_seconds;
    b.pipeline_wait += st.wait_seconds + d.loss_wait;
    b.data += st.data_seconds, b.optimizer += st.optimizer_seconds;
    b.other += d.metrics.seconds - st.compute_seconds - st.reduce_seconds - st.wait_seconds - d.loss_wait -
               st.data_seconds - st.optimizer_seconds;
  }

 private:
  RankRuntime& rt_;
};

// ---- the noise scale ---------------------------------------------------------------------
class Noise final : public RunObserver {
 public:
  explicit Noise(RankRuntime& rt) : rt_(rt), estimate_(rt.cfg.noise_decay) {}
  void step_ends(StepDone& d, RunState& run) override {
    auto& samples = run.result.grad_norms;
    rt_.noise->sample(samples);
    // A step without norms (fp16: skipped for inf/NaN gradients) leaves the estimate as it was.
    if (size_t(estimate_.count()) < samples.size()) {
      const GradNormSample& gs = samples.back();
      estimate_.add(gs.small_sq, gs.b_small, gs.big_sq, gs.b_big);
    }
    d.metrics.noise_scale = estimate_.estimate();
  }
  void run_ends(RunState& run) override {
    run.result.noise_scale = estimate_.estimate();
    run.result.noise_interval = estimate_.interval();
  }

 private:
  RankRuntime& rt_;
  NoiseScale estimate_;
};

// ---- gradient clipping ----------------------------------------------------------------------
class Clip final : public RunObserver {
 public:
  explicit Clip(const GradClip& c) : clip_(c) {}
  void step_ends(StepDone& d, RunState& run) override {
    d.metrics.grad_norm = clip_.norm();
    d.metrics.clipped = clip_.clipped();
    run.result.clipped_steps += clip_.clipped() ? 1 : 0;
  }

 private:
  const GradClip& clip_;
};

class Callback final : public RunObserver {
 public:
  explicit Callback(std::function<void(const StepMetrics&)> f) : f_(std::move(f)) {}
  void step_ends(StepDone& d, RunState&) override { f_(d.metrics); }

 private:
  std::function<void(const StepMetrics&)> f_;
};

// ---- the stop vote -------------------------------------------------------------------------
class StopVote final : public RunObserver {
 public:
  explicit StopVote(RankRuntime& rt) : rt_(rt) {}
  void step_ends(StepDone&, RunState& run) override {
    const TrainConfig& cfg = rt_.cfg;
    const bool timed = cfg.time_limit > 0 && run.step - run.start >= run.result.warmup_excluded + 2;
    if ((!timed && !cfg.stop_early) || run.step + 1 >= run.total) return;
    // Every rank stops at the same step: rank 0's clock (and answer) decides.
    run.result.steps = run.step + 1;
    double stop = (timed && now_seconds() - run.t_measure >= cfg.time_limit) || (cfg.stop_early && cfg.stop_early(run.result));
    if (rt_.world->size() > 1) rt_.world->broadcast_sync(&stop, 1, DType::f64, 0);
    if (stop > 0) run.total = run.step + 1;
  }

 private:
  RankRuntime& rt_;
};

class Progress final : public RunObserver {
 public:
  Progress(RankRuntime& rt, int64_t resumed_at)
      : reporter_(rt.cfg.progress, rt.cfg.out_dir, rt.cfg.measure_noise, resumed_at) {}
  void step_begins(RunState& run) override {
    const TrainResult& r = run.result;
    if (run.step == run.start && r.resumed_from > 0) reporter_.resumed(r.resumed_from, r.resumed_dir, r.resume_changes);
  }
  void step_ends(StepDone& d, RunState& run) override {
    reporter_.step(d.metrics, run.total, now_seconds() - run.t_train);
  }

 private:
  StepReporter reporter_;
};

class Utilization final : public RunObserver {
 public:
  explicit Utilization(std::unique_ptr<GpuSampler> s) : sampler_(std::move(s)) { sampler_->start(); }
  void run_ends(RunState& run) override {
    sampler_->stop();
    if (sampler_->available() && sampler_->stats().util_samples > 0)
      run.result.gpu_utilization_mean = sampler_->stats().mean_util_pct;
  }

 private:
  std::unique_ptr<GpuSampler> sampler_;
};

// The profiler's names of the rank's actions (PyTorch's).
std::vector<TracedAction> traced_actions(const RankPlan& p, const dist::Mesh& m, const std::string& optimizer) {
  std::vector<TracedAction> out;
  for (const Action& a : p.actions) {
    const std::string name = pytorch_name(a, m.pp(), m.pp_rank(), v_shaped(p.schedule.kind));
    out.push_back({name, a.kind == ActionKind::optimizer ? "Optimizer.step#" + optimizer + ".step" : name});
  }
  return out;
}

}  // namespace

std::unique_ptr<RunObserver> measure_observer(RankRuntime& rt) { return std::make_unique<Measure>(rt); }
std::unique_ptr<HealthObserver> health_observer(RankRuntime& rt) { return std::make_unique<HealthObserver>(rt); }
std::unique_ptr<RunObserver> noise_observer(RankRuntime& rt) { return std::make_unique<Noise>(rt); }
std::unique_ptr<RunObserver> clip_observer(RankRuntime& rt) {
  return rt.clip ? std::make_unique<Clip>(*rt.clip) : nullptr;
}
std::unique_ptr<RunObserver> callback_observer(std::function<void(const StepMetrics&)> f) {
  return std::make_unique<Callback>(std::move(f));
}
std::unique_ptr<RunObserver> stop_observer(RankRuntime& rt) { return std::make_unique<StopVote>(rt); }
namespace {
class MoeLoadSum final : public RunObserver {
 public:
  explicit MoeLoadSum(dist::Comm& g) : g_(g) {}
  void run_ends(RunState&) override { sum_moe_load(g_); }

 private:
  dist::Comm& g_;
};
}  // namespace
std::unique_ptr<RunObserver> moe_load_observer(RankRuntime& rt) {
  dist::Comm* g = rt.mesh->ep_group();
  return g ? std::make_unique<MoeLoadSum>(*g) : nullptr;
}
std::unique_ptr<RunObserver> progress_observer(RankRuntime& rt, int64_t resumed_at) {
  return std::make_unique<Progress>(rt, resumed_at);
}
std::unique_ptr<RunObserver> utilization_observer(RankRuntime& rt) {
  std::unique_ptr<GpuSampler> s = rt.device->utilization();
  return s ? std::make_unique<Utilization>(std::move(s)) : nullptr;
}

// ---- numerical health ----------------------------------------------------------------------
void HealthObserver::step_ends(StepDone& d, RunState&) {
  const int64_t step = d.metrics.step;
  const double loss = d.metrics.loss;
  if (!std::isfinite(loss) && rt_.cfg.precision != Precision::fp16) {
    std::string m = str_cat("training diverged: the loss of step ", step, " is ", loss);
    if (first_nonfinite_ > 0 && first_nonfinite_ < step)
      m += str_cat(" (the parameters first became non-finite in the update of step ", first_nonfinite_, ")");
    fail(m, "; try a smaller --lr; nothing was saved");
  }
  // The optimizer counts them as it updates its spans (its shard under ZeRO: every value
  // has a rank that updates it, and check_params agrees over the job). The loss can stay
  // finite a while: an embedding row no batch reads.
  if (first_nonfinite_ == 0 && rt_.optimizer->last_nonfinite() > 0) first_nonfinite_ = step;
}

void HealthObserver::check_params(int64_t steps) {
  const ParamStore& ps = *rt_.params;
  const float* p = ps.host_flat_params();  // (on a GPU, current after DeviceBackend::to_host)
  const int64_t n = ps.sharding().stage >= 3 ? ps.shard_len() : ps.flat_size();
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t i = 0; i < n; ++i) bad += std::isfinite(p[i]) ? 0 : 1;
  const double first = first_nonfinite_ > 0 ? double(first_nonfinite_) : bad == 0 ? 0 : double(steps);
  double v[1] = {first > 0 ? first : 1e300};
  if (rt_.world->size() > 1) rt_.world->all_reduce_sync(v, 1, DType::f64, dist::ReduceOp::min);
  SAT_CHECK(v[0] >= 1e300, "training diverged: the parameters are not finite after step ", int64_t(v[0]), " of ",
            steps, " (the loss was still finite; try a smaller --lr); nothing was saved");
}

// ---- profiling -----------------------------------------------------------------------------
ProfileObserver::ProfileObserver(RankRuntime& rt) : rt_(rt) {
  const dist::Mesh& m = *rt.mesh;
  const TrainConfig& cfg = rt.cfg;
  ProfileOptions o;
  o.table = cfg.profile;
  o.trace_dir = cfg.trace_dir;
  o.schedule = cfg.trace_steps;
  o.rank = m.rank(), o.world = m.size();
  o.backend = rt.world->backend_name();
  const std::string optimizer = rt.optimizer->config().name == "adamw" ? "AdamW" : "SGD";  // PyTorch's class names
  const RankPlan& p = *rt.plan;
  profiler_ = std::make_unique<Profiler>(*p.model.graph, p.step, traced_actions(p, m, optimizer), p.memory, o);
  if (cfg.trace_dir.empty()) return;
  rt.exec->set_observer(profiler_.get());
  auto watch = [&](dist::Comm* c, const char* name) {
    if (auto* counting = dynamic_cast<dist::CountingComm*>(c)) counting->observe(profiler_.get(), name);
  };
  watch(&m.tp_group(), "tp"), watch(&m.dp_group(), "dp"), watch(&m.pp_group(), "pp");
  watch(m.embedding_group(), "embedding");
}

void ProfileObserver::step_begins(RunState& run) {
  // The engine's layer timer is attached for the steps the profiler asks to see.
  rt_.engine->set_node_timer(profiler_->begin_step(run.step + 1, run.measured()) ? profiler_.get() : nullptr);
}

void ProfileObserver::step_ends(StepDone& d, RunState&) { profiler_->end_step(d.t0, d.t0 + d.metrics.seconds); }

void ProfileObserver::run_ends(RunState& run) {
  rt_.engine->set_node_timer(nullptr);
  profiler_->finish();
  // With layers timed (--profile), the tensor-parallel collectives' layers move from compute
  // to tp_comm.
  if (profiler_->measured_steps() > 0) run.tp_comm_seconds = profiler_->tp_comm_seconds();
}

}  // namespace sat
