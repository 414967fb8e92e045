// What watches a training run from outside its step loop (train/trainer.cpp): each concern
// that is not the step itself is an observer told when a step begins, when it ends, and when
// the run ends: measuring the step's time, numerical health, the noise scale's estimate, the
// library's per-step callback, the stop vote, progress and metrics.jsonl, the profiler,
// the GPU's utilisation and checkpoints (train/checkpointer.h). The trainer attaches the ones
// the run's configuration asks for; a caller can attach more. Observers run in the order
// attached; every rank attaches the same ones (some are collective).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "profile/nvml.h"
#include "profile/profiler.h"
#include "train/config.h"
#include "train/executor.h"
#include "train/noise.h"
#include "train/report.h"

namespace sat {

class RankRuntime;

// The run as the loop keeps it: where it is, how far it goes, and the result so far.
struct RunState {
  int64_t start = 0;   // steps done before this process started (resumed from a checkpoint)
  int64_t total = 0;   // the run ends after this step (observers may bring it forward)
  int64_t step = 0;    // the step running, 0-based
  int64_t global_batch = 0;
  double t_start = 0, t_train = 0;  // the run's start and the first step's
  double t_measure = 0;             // the first measured step's start (after warm-up)
  double t_end = 0;                 // the last step's end
  double tp_comm_seconds = 0;       // per measured step, of compute (the profiler's)
  StepBreakdown spent;              // summed over the measured steps
  TrainResult result;               // losses, noise, steps... filled in as the run goes
  bool measured() const { return step - start >= result.warmup_excluded; }
};

// One step as the loop hands it to the observers.
struct StepDone {
  StepMetrics metrics;   // 1-based step, loss, lr, seconds, samples/s (noise scale: filled in)
  StepStats stats;       // where the executor's time went
  double loss_wait = 0;  // waiting for the step's loss from the last stage
  double t0 = 0;         // when the step began
};

class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void step_begins(RunState& run) { (void)run; }
  virtual void step_ends(StepDone& done, RunState& run) { (void)done, (void)run; }
  virtual void run_ends(RunState& run) { (void)run; }
};

// The warm-up boundary and where each measured step's time went.
std::unique_ptr<RunObserver> measure_observer(RankRuntime& rt);
// A loss that is not finite ends the run (fp16 loss scaling skips such steps instead); the
// first update that left a parameter not finite is remembered for the message.
class HealthObserver;
std::unique_ptr<HealthObserver> health_observer(RankRuntime& rt);
// The noise probe's sample each step (collective) and the smoothed estimate.
std::unique_ptr<RunObserver> noise_observer(RankRuntime& rt);
// --clip-grad-norm: each step's norm before clipping and whether it clipped, into its metrics
// and the run's count (null without clipping).
std::unique_ptr<RunObserver> clip_observer(RankRuntime& rt);
// The library's per-step callback.
std::unique_ptr<RunObserver> callback_observer(std::function<void(const StepMetrics&)> f);
// --time-limit and stop_early: every rank stops at the step rank 0 decides (collective).
std::unique_ptr<RunObserver> stop_observer(RankRuntime& rt);
// --ep: at the run's end the moe layers' routing counts (summary.json's moe_load) become
// their sum over the expert-parallel group, collective (null without expert parallelism).
std::unique_ptr<RunObserver> moe_load_observer(RankRuntime& rt);
// Progress on stderr and DIR/metrics.jsonl.
std::unique_ptr<RunObserver> progress_observer(RankRuntime& rt, int64_t resumed_at);
// The device's utilisation while training (null where the device reports none).
std::unique_ptr<RunObserver> utilization_observer(RankRuntime& rt);

// --profile and --trace: the profiler on the step's seams (the engine's layer timer, the
// executor's actions, the mesh groups' communication), told of every step. It must outlive
// the runtime whose communication it observes (the last Work may report to it).
class ProfileObserver final : public RunObserver {
 public:
  explicit ProfileObserver(RankRuntime& rt);
  void step_begins(RunState& run) override;
  void step_ends(StepDone& done, RunState& run) override;
  void run_ends(RunState& run) override;
  const Profiler& profiler() const { return *profiler_; }

 private:
  RankRuntime& rt_;
  std::unique_ptr<Profiler> profiler_;
};

class HealthObserver final : public RunObserver {
 public:
  explicit HealthObserver(RankRuntime& rt) : rt_(rt) {}
  void step_ends(StepDone& done, RunState& run) override;
  // After the last step, on every rank alike: parameters that are not finite fail the run
  // instead of being saved and reported as a success (collective).
  void check_params(int64_t steps);

 private:
  RankRuntime& rt_;
  int64_t first_nonfinite_ = 0;  // the first step whose update left a parameter not finite
};

}  // namespace sat
