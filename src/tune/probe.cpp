#include "tune/probe.h"

#include <algorithm>

#include "core/error.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "train/trainer.h"

namespace sat {

TrainConfig timed_config(const TrainConfig& base, int64_t max_steps, double seconds) {
  TrainConfig c = base;
  c.steps = max_steps;
  c.epochs = 0;
  c.time_limit = seconds;
  c.evaluate = false;
  c.out_dir.clear();
  c.profile = false;
  c.trace_dir.clear();
  c.checkpoint_dir.clear();  // a probe writes no checkpoints (and takes no hold on the run's directory)
  c.checkpoint_every = 0;
  c.checkpoint_every_minutes = 0;
  c.progress = 0;
  c.warmup_excluded = 1;
  c.schedule = ScheduleConfig{};
  c.measure_noise = false;
  c.eval_every = c.eval_batches = 0;  // no validation during a probe, no best checkpoint
  c.keep_best.clear();
  return c;
}

double median_seconds(std::vector<double> s) {
  if (s.empty()) return 0;
  const size_t h = s.size() / 2;
  std::nth_element(s.begin(), s.begin() + long(h), s.end());
  if (s.size() % 2) return s[h];
  return 0.5 * (s[h] + *std::max_element(s.begin(), s.begin() + long(h)));
}

namespace {

// The job's figures: the slowest median, the largest peak and plan.
void agree_on_job(const TrainConfig& c, TimedRun& t) {
  double v[3] = {t.median_step_seconds, double(t.peak_bytes), double(t.planned_bytes)};
  if (c.comm && c.comm->size() > 1) c.comm->all_reduce_sync(v, 3, DType::f64, dist::ReduceOp::max);
  t.median_step_seconds = v[0];
  t.peak_bytes = size_t(v[1]);
  t.planned_bytes = size_t(v[2]);
}

}  // namespace

TimedRun timed_run(const ModelConfig& mc, const TrainConfig& c_in, const Dataset& train, const Dataset* test) {
  TimedRun t;
  TrainConfig c = c_in;
  const int world = c.comm ? c.comm->size() : 1, dp = c.dp_of(world);
  const std::unique_ptr<Dataset> one_batch = make_prefix(test ? *test : train, c.batch * dp);
  c.evaluate = test != nullptr;
  try {
    Trainer trainer(mc, c, train, test ? one_batch.get() : nullptr);
    TrainResult r = trainer.run([&](const StepMetrics& m) {
      if (m.step > c.warmup_excluded) t.step_seconds.push_back(m.seconds);
    });
    t.timed_steps = int(t.step_seconds.size());
    t.median_step_seconds = median_seconds(t.step_seconds);
    t.peak_bytes = r.peak_memory_bytes;
    t.planned_bytes = r.predicted_memory_bytes;
  } catch (const OutOfMemory& e) {
    // Only a wrong plan gets here; every rank of a stage meets it alike (same plan, same budget).
    t.refused = e.what();
  }
  agree_on_job(c, t);
  if (t.median_step_seconds > 0) t.samples_per_second = double(c.global_batch(world)) / t.median_step_seconds;
  return t;
}

}  // namespace sat
