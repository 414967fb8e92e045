// The trainer: one rank of a training job. It places the rank on the process mesh
// (data-, tensor- and pipeline-parallel groups), builds its stage of the model from the
// rank's plan (train/plan.h), and runs its schedule step by step through the one
// executor (train/executor.h) with hooks for data parallelism, the noise scale and the
// optimizer; then it evaluates on the test split through the pipeline. Nothing here
// knows about the command line: the CLI fills a TrainConfig.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "data/dataset.h"
#include "data/loader.h"
#include "dist/comm.h"
#include "dist/mesh.h"
#include "nn/engine.h"
#include "nn/models.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "profile/profiler.h"
#include "train/config.h"
#include "train/data_parallel.h"
#include "train/executor.h"
#include "train/plan.h"
#include "train/sharded_dp.h"
#include "train/validate.h"

namespace sat {

// What open_dataset needs to know about a model: its input shape, classes or
// vocabulary and context.
DataOptions data_options_for(const ModelConfig& mc, uint64_t seed);
// An image model takes the data's sample shape, and its classes but for an mlp's (its
// widths are part of --model); sat::Error naming --model and the data's shape when an mlp's
// input width is not the samples' size. Token models are left as they are.
void fit_to_data(ModelConfig& mc, const Dataset& train);


struct Manifest;
struct CheckpointWrite;

// One evaluated micro-batch as the stage with the loss sees it (saturate predict): rows
// [0, batch.valid) are test samples first, first + 1, ...; logits are the model's output
// on the host, [rows of batch.y, classes] (a token model's rows are its B x T positions).
struct EvalBatch {
  const Batch& batch;
  int64_t first = 0;
  const float* logits = nullptr;
  int64_t classes = 0;
};
using EvalSink = std::function<void(const EvalBatch&)>;

// Where a run resumed from a checkpoint goes on (Trainer::resume).
struct ResumeState {
  int64_t step = 0, epoch = 0, step_in_epoch = 0;
  std::vector<double> losses;
  std::string dir;
};

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

  ParamStore& params() { return *params_; }
  const BuiltModel& model() const { return rp_->model; }
  const MemoryPlan& memory_plan() const { return rp_->memory; }
  const RankPlan& rank_plan() const { return *rp_; }
  const JobPlan& job_plan() const { return *job_; }
  const dist::Mesh& mesh() const { return *mesh_; }

  TrainResult run(const std::function<void(const StepMetrics&)>& on_step = {});
  // The test split's loss (and accuracy for classifiers); `sink` (one data-parallel rank
  // only) also sees every batch's logits, so predictions come from the same forward pass.
  EvalResult evaluate(const EvalSink& sink = {});
  // --profile: every layer's time per measured step, slowest first (gemm_peak: FLOP/s of
  // this machine's GEMMs, for each layer's share of it; 0: not shown). "" without --profile.
  std::string profile_table(double gemm_peak) const { return profiler_ ? profiler_->table(gemm_peak) : ""; }
  // --trace: the files written so far.
  std::vector<std::string> trace_files() const { return profiler_ ? profiler_->files() : std::vector<std::string>{}; }
  // Loads parameters (and states) by name from a safetensors file into every stage.
  void load_weights(const std::string& path);
  // Writes the whole model's parameters and states (gathered from the pipeline stages) to
  // a safetensors file on global rank 0. Collective over the job.
  void save_weights(const std::string& path);
  // Loads a checkpoint (train/checkpoint.h; any layout) into this rank's parameters, states
  // and optimizer state; run() then goes on from its step and data position. Collective;
  // a checkpoint that does not fit this run is a sat::Error on every rank, nothing changed.
  void resume(const std::string& dir) { resume_ = load_checkpoint(dir); }
  // Writes the checkpoint of step `step` under `root`. Collective. The pieces are copied
  // and written by a background thread; with wait, the checkpoint is complete on return,
  // otherwise finish_checkpoint() (or the next save) completes it.
  void save_checkpoint(const std::string& root, int64_t step, int64_t total, const std::vector<double>& losses,
                       bool wait = true);
  void finish_checkpoint();

 private:
  Trainer(JobPlan* job, const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test);
  class Hooks;
  struct Gpu;  // the CUDA side (context, optimizer, NCCL groups)
  void setup_gpu(int dev_index, bool nccl_dp);
  void setup_step(bool nccl_dp);
  void broadcast_initial_state();
  bool params_finite() const;
  void note_nonfinite_params(int64_t step);
  void check_params_finite(int64_t steps);
  std::string diverged_message(int64_t step, double loss) const;
  void init_params();
  // The parameters as full tensors: the store itself, or under ZeRO-3 a gathered copy in
  // `keep` (collective over dp).
  const ParamStore& unsharded(std::unique_ptr<ParamStore>& keep);
  double step_loss(double loss_sum, int losses, double& wait);
  void finish(TrainResult& r, int64_t total);
  void gather_ranks(TrainResult& r, const StepBreakdown& t);
  void setup_profiler();
  StepBreakdown split_tp_comm(StepBreakdown b) const;
  GroupBytes traffic() const;
  void sync_states_from_first_replica();
  std::unique_ptr<ParamStore> gather_whole_model(const ParamStore& mine);
  std::unique_ptr<ParamStore> gather_tensor_parallel(const ParamStore& mine);
  CudaCtx* gpu_ctx() const;
  // weights_only: parameters and states (--init-weights DIR), no run position or optimizer.
  ResumeState load_checkpoint(const std::string& dir, bool weights_only = false);
  void check_resumable(const std::string& dir, const Manifest& man) const;
  void load_tensors(const std::string& dir, const Manifest& man, bool weights_only);
  // After step `step` (1-based): whether to write a checkpoint, and whether a signal asks to
  // stop; every rank gets rank 0's answer (nothing is exchanged without checkpoints).
  struct CkptDecision {
    bool save = false;
    int signal = 0;
    bool finish = false;  // every rank's background write is done: complete it now
  };
  CkptDecision checkpoint_due(int64_t step, double& last_save) const;
  Manifest checkpoint_header(int64_t step, int64_t total, const std::vector<double>& losses) const;
  void snapshot_pieces(CheckpointWrite& p);
  void publish_checkpoint(CheckpointWrite& p);
  // The tensor-parallel group the step's layers use: the mesh's, or its NCCL twin on GPUs.
  dist::Comm* tp_comm() const;
  bool on_gpu() const { return gpu_ != nullptr; }

  ModelConfig mc_;
  TrainConfig cfg_;
  const Dataset& train_;
  const Dataset* test_;
  std::unique_ptr<dist::Comm> own_comm_;
  dist::Comm* world_ = nullptr;
  std::unique_ptr<dist::Mesh> mesh_;
  // --profile, --trace: after the mesh, whose groups report to it, and before everything whose
  // communication it observes (so that it outlives their last Work).
  std::unique_ptr<Profiler> profiler_;
  std::unique_ptr<JobPlan> own_job_;
  JobPlan* job_ = nullptr;
  RankPlan* rp_ = nullptr;  // this rank's stage of job_
  size_t mem_base_ = 0;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<Gpu> gpu_;  // before what uses its context, so that it is destroyed after them
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<BatchLoader> train_loader_, test_loader_;
  std::unique_ptr<ReplicaSum> replica_sum_;  // --sync-bn over the dp group
  ShardedDP* sharded_ = nullptr;           // ZeRO-2/3: the reducer, also the engine's node hooks
  std::unique_ptr<GradSync> reducer_;       // data-parallel reduction (GradReducer, or sharded_)
  std::unique_ptr<Executor> exec_;
  std::unique_ptr<Hooks> hooks_;
  std::string comm_backend_;
  std::optional<ResumeState> resume_;
  std::unique_ptr<CheckpointWrite> pending_;
  struct {
    int64_t written = 0;
    double paused = 0, written_seconds = 0, last_bytes = 0;
    std::string last;
  } ckpt_stats_;
  int64_t first_nonfinite_step_ = 0;  // the first step that left a parameter not finite (CPU)
};

}  // namespace sat
