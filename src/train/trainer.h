// The single-process trainer: micro-batches with gradient accumulation, the optimizer
// and schedule, evaluation on the test split, per-step metrics and the run summary.
// Nothing here knows about the command line: the CLI fills a TrainConfig.
#pragma once
#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "data/dataset.h"
#include "dist/comm.h"
#include "data/loader.h"
#include "nn/engine.h"
#include "nn/models.h"
#include "nn/params.h"
#include "optim/optimizer.h"

namespace sat {

struct TrainConfig {
  int64_t batch = 64;        // micro-batch
  int64_t accum = 1;         // micro-batches per optimizer step
  int64_t epochs = 1;        // used when steps == 0
  int64_t steps = 0;         // optimizer steps (0: run `epochs` epochs)
  OptimConfig optim;
  ScheduleConfig schedule;
  uint64_t seed = 0;
  bool shuffle = true;
  bool evaluate = true;      // evaluate on the test split at the end (if there is one)
  int64_t warmup_excluded = -1;  // steps left out of samples_per_second (-1: automatic)
  std::string out_dir;       // metrics.jsonl and summary.json ("" = none)
  bool profile = false;      // time every layer; Trainer::profile_report() after run()
  int progress = -1;         // -1: a bar on a terminal, plain lines otherwise; 0: quiet; 1: lines
  // Data parallelism: the communicator of the job (null: this process alone). Every rank
  // trains on its slice of each global batch = world * batch * accum; gradients are
  // averaged in buckets of bucket_mb that start reducing during backward.
  dist::Comm* comm = nullptr;
  LastBatch last_batch = LastBatch::drop;
  double bucket_mb = 25;
  // BatchNorm statistics over the global batch (summed over ranks in forward and
  // backward) instead of each rank's micro-batch.
  bool sync_bn = false;
  // ZeRO stage: 0 = every rank keeps the whole optimizer state; 1 = each rank keeps
  // 1/world of it, gradients are reduce-scattered and the updated parameters all-gathered.
  int zero = 0;
  // Stop after the first step at which the measured steps (after warm-up) have run this
  // many seconds (0: run all steps); at least 3 steps are measured. Used by the tuner's
  // probes; all ranks stop at the same step.
  double time_limit = 0;
  // Measure the gradient noise scale's inputs every step (needs accum >= 2): the squared
  // norm of the first micro-batch's gradient and of the whole global batch's. The noise
  // scale they give, smoothed over steps with this decay (train/noise.h), goes into
  // metrics.jsonl and TrainResult::noise_scale.
  bool measure_noise = false;
  double noise_decay = 0.99;
  // Where gradients are reduced: "auto" (host memory over `comm` on the CPU; GPU memory
  // over NCCL, bootstrapped over `comm`, on GPUs with more than one rank), "mpi" (host
  // memory; CPU only) or "nccl" (GPU only; also with one rank, where the reduction is a
  // copy: a check that the NCCL path changes nothing).
  std::string dist_backend = "auto";
  // GPU: --device, --precision fp32|tf32|bf16|fp16, --cuda-graph.
  std::string device = "cpu";
  std::string precision = "fp32";
  bool cuda_graph = true;
};

struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // classification only
  int64_t samples = 0;
};

// One step's inputs to the two-batch estimator of the gradient noise scale.
struct GradNormSample {
  double small_sq = 0;   // |gradient of one micro-batch|^2 (mean over ranks)
  double big_sq = 0;     // |gradient of the global batch|^2
  int64_t b_small = 0, b_big = 0;
};

struct StepMetrics {
  int64_t step;      // 1-based optimizer step
  double loss;       // mean training loss over the step's accum*batch samples (before the update)
  double lr;
  double seconds;
  double samples_per_second;
  double noise_scale = NAN;  // with measure_noise: the smoothed estimate so far (0 while undefined)
};

struct TrainResult {
  int64_t steps = 0;
  double final_train_loss = 0;
  std::optional<EvalResult> test;
  double samples_per_second = 0;  // excluding the first warmup_excluded steps
  int64_t warmup_excluded = 0;
  double train_seconds = 0;
  double wall_seconds = 0;
  size_t predicted_memory_bytes = 0;
  size_t peak_memory_bytes = 0;
  std::vector<double> losses;
  std::vector<GradNormSample> grad_norms;  // with measure_noise
  double noise_scale = 0;                  // with measure_noise: the smoothed estimate at the end (0: undefined)
  // Data parallelism.
  int world_size = 1;
  std::string comm_backend;         // what reduced the gradients: "mpi", "nccl", or "" (one process)
  int64_t global_batch = 0;
  // Gradient reduction, first bucket launched .. all reduced, summed over the measured
  // steps, and the share of it that overlapped backward (CPU; not measured on GPUs: 0).
  double comm_seconds = 0;
  double comm_hidden_fraction = 0;
  std::vector<double> rank_step_seconds;  // mean step time of every rank (measured steps)
  // GPU.
  std::string device = "cpu";
  std::string device_name;
  std::string precision = "fp32";
  bool graph_replay = false;
  int64_t kernels_per_step = 0;     // kernel launches of one step without a CUDA graph
  int64_t launches_per_step = 0;    // what the host launched per step (graphs count 1)
  size_t device_memory_used_bytes = 0;  // cudaMemGetInfo: free before the run - free after the first step
  double gpu_utilization_mean = -1; // NVML, in percent; -1 when unavailable
  int64_t skipped_steps = 0;        // fp16: steps skipped for inf/NaN gradients
  double loss_scale = 0;            // fp16: final loss scale
};

// What open_dataset needs to know about a model: its input shape, classes or
// vocabulary and context.
DataOptions data_options_for(const ModelConfig& mc, uint64_t seed);

class Trainer {
 public:
  // `train` and `test` must outlive the trainer; test may be null.
  Trainer(const ModelConfig& model, const TrainConfig& cfg, const Dataset& train, const Dataset* test);
  ~Trainer();

  // Memory the run needs, computed from the plan before anything is allocated.
  // world: the number of data-parallel ranks (0: cfg.comm's, or 1); it shards the
  // optimizer state under ZeRO-1.
  static MemoryPlan plan(const ModelConfig& model, const TrainConfig& cfg, const Dataset& train, const Dataset* test,
                         int world = 0);

  ParamStore& params() { return *params_; }
  const BuiltModel& model() const { return model_; }
  const MemoryPlan& memory_plan() const { return plan_; }

  TrainResult run(const std::function<void(const StepMetrics&)>& on_step = {});
  EvalResult evaluate();
  std::string profile_report() const { return engine_->profile_report(); }

 private:
  static MemoryPlan plan_for(const Graph& g, const TrainConfig& cfg, const Dataset& train, const Dataset* test,
                             int world);
  struct CommReplicaSum;            // --sync-bn over the communicator
  std::unique_ptr<ReplicaSum> replica_sum_;

  ModelConfig mc_;
  TrainConfig cfg_;
  const Dataset& train_;
  const Dataset* test_;
  BuiltModel model_;
  MemoryPlan plan_;
  size_t mem_base_ = 0;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Optimizer> opt_;
  std::unique_ptr<BatchLoader> train_loader_, test_loader_;
  std::unique_ptr<dist::Comm> own_comm_;
  dist::Comm* comm_ = nullptr;
  struct Gpu;                       // the CUDA side (context, optimizer, graphs)
  std::unique_ptr<Gpu> gpu_;
  // Gradient buckets: flat ranges [lo, hi) of the gradient array, in launch order, each
  // launched after the backward of node ready_node (when all its parameters are final).
  struct Bucket { int64_t lo, hi; int ready_node; };
  std::vector<Bucket> buckets_;
  void plan_buckets();
  // Calls launch(b) for every bucket b not launched yet whose gradients are final after
  // backward node `node` (-1: every bucket left); launch marks it launched.
  template <class F>
  void launch_ready(const std::vector<bool>& launched, int node, F&& launch) const {
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!launched[b] && (node < 0 || buckets_[b].ready_node == node)) launch(b);
  }
  // The noise estimator's sample of one step: small_sq = |this rank's first micro-batch's
  // gradient|^2 as backward left it (scaled by 1/accum), big_sq = |the reduced gradient|^2
  // (big_sharded: of this rank's ZeRO-1 shard only). Averages small_sq over the ranks.
  void add_noise_sample(double small_sq, double big_sq, bool big_sharded, std::vector<GradNormSample>& norms);
  CudaCtx* gpu_ctx() const;
  std::string gpu_pci_bus_id() const;
  double step_cpu(int64_t step, float lr, int64_t& epoch, Batch& batch, double& comm_window, double& comm_exposed,
                  std::vector<GradNormSample>* norms);
  double step_gpu(int64_t step, float lr, int64_t& epoch, Batch& batch, bool graphs, bool prefetch_next,
                  std::vector<GradNormSample>* norms);
  void finish_gpu(TrainResult& r);
  int64_t gpu_micro_ = 0;       // micro-batches queued so far (slot = gpu_micro_ % 2)
  bool gpu_staged_ = false;     // the next micro-batch is already staged and uploading
  std::array<bool, 2> gpu_pending_{};
  bool on_gpu() const { return gpu_ != nullptr; }
};

}  // namespace sat
