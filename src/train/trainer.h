// The trainer: one rank of a training job. It is a composition: the rank's runtime
// (train/runtime.h: mesh, device, plan, parameters, engine, optimizer, loaders, the step's
// parts and the executor), a step loop short enough to read at once (Trainer::run), and the
// observers attached to it (train/observers.h: measurement, health, noise scale, stop vote,
// progress, profiling, utilisation, checkpoints). Evaluation runs the forward-only schedule
// through the same executor (train/evaluate.h); weights go in and out through
// train/weights.h. Nothing here knows about the command line: the CLI fills a TrainConfig.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "dist/mesh.h"
#include "nn/models.h"
#include "train/checkpointer.h"
#include "train/config.h"
#include "train/evaluate.h"
#include "train/observers.h"
#include "train/plan.h"
#include "train/validate.h"

namespace sat {

class RankRuntime;

// What open_dataset needs to know about a model: its input shape, classes or
// vocabulary and context.
DataOptions data_options_for(const ModelConfig& mc, uint64_t seed);
// An image model takes the data's sample shape, and its classes but for an mlp's (its
// widths are part of --model); sat::Error naming --model and the data's shape when an mlp's
// input width is not the samples' size. Token models are left as they are.
void fit_to_data(ModelConfig& mc, const Dataset& train);

class Trainer {
 public:
  // `train` and `test` must outlive the trainer; test may be null.
  Trainer(const ModelConfig& model, const TrainConfig& cfg, const Dataset& train, const Dataset* test);
  // With the job's plan built already (by the CLI, before MPI started: each graph is built
  // once per process). job.model() must be resolved for this rank (validate.h:
  // resolved_model with its tp rank); cfg is the job's with this rank's comm and outputs.
  // The job must outlive the trainer, which releases its stage's graph when destroyed.
  Trainer(JobPlan& job, const TrainConfig& cfg);
  ~Trainer();

  // Memory of a rank of pipeline stage `stage`, computed from the plan before anything is
  // allocated. world: the job's ranks (0: cfg.comm's, or 1); world / (tp * pp)
  // data-parallel ranks shard the optimizer state under ZeRO-1.
  static MemoryPlan plan(const ModelConfig& model, const TrainConfig& cfg, const Dataset& train, const Dataset* test,
                         int world = 0, int stage = 0);

  ParamStore& params();
  const BuiltModel& model() const;
  const MemoryPlan& memory_plan() const;
  const RankPlan& rank_plan() const;
  const JobPlan& job_plan() const;
  const dist::Mesh& mesh() const;

  // Trains cfg.steps steps (or cfg.epochs epochs), from the resumed position if any; on_step
  // sees every step's metrics. Then evaluates on the test split (unless stopped by a signal).
  TrainResult run(const std::function<void(const StepMetrics&)>& on_step = {});
  // Watches the next runs too (after the trainer's own observers); o must outlive them.
  void attach(RunObserver* o) { extra_.push_back(o); }
  // The test split's loss (and accuracy for classifiers); `sink` (one data-parallel rank
  // only) also sees every batch's logits, so predictions come from the same forward pass.
  EvalResult evaluate(const EvalSink& sink = {});
  // --profile: every layer's time per measured step, slowest first (gemm_peak: FLOP/s of
  // this machine's GEMMs, for each layer's share of it; 0: not shown). "" without --profile.
  std::string profile_table(double gemm_peak) const;
  // --trace: the files written so far.
  std::vector<std::string> trace_files() const;
  // Loads parameters (and states) by name from a safetensors file (or a checkpoint
  // directory's parameters) into every stage.
  void load_weights(const std::string& path);
  // Writes the whole model's parameters and states (gathered from the pipeline stages) to
  // a safetensors file on global rank 0. Collective over the job.
  void save_weights(const std::string& path);
  // Loads a checkpoint (train/checkpoint.h; any layout) into this rank's parameters, states
  // and optimizer state; run() then goes on from its step and data position. Collective;
  // a checkpoint that does not fit this run is a sat::Error on every rank, nothing changed.
  void resume(const std::string& dir) { resume_ = checkpointer_->load(dir); }

 private:
  Trainer(JobPlan* job, const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test);
  RunState begin_run() const;
  double step_loss(const StepStats& st, double& wait) const;
  TrainResult finish(RunState& run, HealthObserver& health);
  void describe_run(TrainResult& r) const;
  void gather_ranks(TrainResult& r, const StepBreakdown& t) const;

  // The profiler outlives the runtime whose communication it observes.
  std::unique_ptr<ProfileObserver> profile_;
  std::unique_ptr<RankRuntime> rt_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::optional<ResumeState> resume_;
  std::vector<RunObserver*> extra_;
};

}  // namespace sat
