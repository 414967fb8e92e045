// What a training run is asked to do (TrainConfig) and what it reports (TrainResult),
// in typed form: the CLI parses flags into these, nothing below it knows about flags
// (error messages name the setting's flag so that the CLI can pass them on unchanged).
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "data/loader.h"
#include "nn/models.h"
#include "optim/optimizer.h"
#include "profile/trace.h"
#include "train/noise.h"
#include "train/layout.h"
#include "train/schedule.h"

namespace sat {

namespace dist {
class Comm;
}

// --precision: fp32, tf32 (float32 GEMMs on tensor cores), bf16/fp16 mixed precision
// (GPU; fp32 master weights, fp16 with dynamic loss scaling).
enum class Precision { fp32, tf32, bf16, fp16 };
Precision parse_precision(const std::string& s);  // sat::Error naming --precision
const char* precision_name(Precision p);

// --dist-backend: where gradients are reduced: auto (host memory over MPI on the CPU,
// GPU memory over NCCL on GPUs), mpi (host memory; CPU only), nccl (GPU only; also with
// one rank, where the reduction is a copy: a check that the NCCL path changes nothing).
enum class DistBackend { automatic, mpi, nccl };
DistBackend parse_dist_backend(const std::string& s);  // sat::Error naming --dist-backend

struct TrainResult;

// The layout (train/layout.h: micro-batch, accumulation, tensor/pipeline/data parallelism,
// the schedule, recomputation, sequence parallelism, ZeRO) and the run's other settings.
// Tensor parallelism (tp): the model's large matrix products (and its vocabulary) are split
// over the tp ranks of each group, Megatron-LM's way (nn/models.h); with sequence_parallel
// the LayerNorm and dropout regions are split along the sequence too. Recomputation: less
// activation memory for recomputing in backward. Pipeline parallelism (pp): the model is
// cut into pp stages (pp * virtual_stages model chunks) between blocks, balanced by FLOPs and
// memory unless pp_split names the cut points; every optimizer step runs `accum`
// micro-batches through them by pp_schedule. ZeRO: 1 = each data-parallel rank keeps 1/dp of
// the optimizer state, 2 = and of the gradients, 3 = and of the parameters.
struct TrainConfig : Layout {
  int64_t epochs = 1;        // used when steps == 0
  int64_t steps = 0;         // optimizer steps (0: run `epochs` epochs)
  OptimConfig optim;
  ScheduleConfig schedule;
  uint64_t seed = 0;
  bool shuffle = true;
  bool evaluate = true;      // evaluate on the test split at the end (if there is one)
  // The loaders (data/loader.h): batches read ahead of the step (--prefetch; 0: read in the
  // step) and the threads that read them (--loader-workers, resolved by the caller: 0 reads
  // in the step, the CLI's auto: cli/args.h auto_loader_workers).
  int prefetch = 2;
  int loader_workers = 1;
  int64_t warmup_excluded = -1;  // steps left out of samples_per_second (-1: automatic)
  std::string out_dir;       // metrics.jsonl and summary.json ("" = none)
  bool profile = false;      // time every layer; Trainer::profile_table() after run()
  // --trace DIR: Chrome trace files of the steps trace_steps records (profile/profiler.h).
  std::string trace_dir;
  TraceSchedule trace_steps;
  int progress = -1;         // -1: a bar on a terminal, plain lines otherwise; 0: quiet; 1: lines
  // The job's world communicator (null: this process alone). The ranks form a mesh of
  // data-, tensor- and pipeline-parallel groups (dist/mesh.h): dp = world / (tp * pp).
  dist::Comm* comm = nullptr;
  // Data parallelism: every data-parallel rank trains on its slice of each global batch =
  // dp * batch * accum; gradients are averaged over the dp group in buckets that start
  // reducing during the last micro-batch's backward: the first bucket_first_mb, the others
  // at most bucket_mb (and small enough that backward has several to overlap).
  LastBatch last_batch = LastBatch::drop;
  double bucket_mb = 25;
  double bucket_first_mb = 1;
  // BatchNorm statistics over the global batch (summed over the dp group in forward and
  // backward) instead of each rank's micro-batch.
  bool sync_bn = false;
  // Stop after the first step at which the measured steps (after warm-up) have run this
  // many seconds (0: run all steps); at least 3 steps are measured. Used by the tuner's
  // probes; all ranks stop at the same step.
  double time_limit = 0;
  // Asked after every step but the last (after run()'s on_step has seen it) with the
  // result so far (steps, losses, gradient norms): true ends the run there. Rank 0's answer
  // counts; all ranks stop at the same step. The tuner's noise-scale measurement stops when
  // its interval is tight enough; the library's fit ends its epochs here (it may call
  // Trainer::evaluate, on every rank, between two steps).
  std::function<bool(const TrainResult&)> stop_early;
  // Measure the gradient noise scale's inputs every step (needs accum >= 2): the squared
  // norm of the first micro-batch's gradient and of the whole global batch's. The noise
  // scale they give, smoothed over steps with this decay (train/noise.h), goes into
  // metrics.jsonl and TrainResult::noise_scale.
  bool measure_noise = false;
  double noise_decay = 0.99;
  DistBackend dist_backend = DistBackend::automatic;
  // Checkpoints (train/checkpoint.h): every `checkpoint_every` steps and/or every
  // `checkpoint_every_minutes` (rank 0's clock), at the end, and on SIGTERM/SIGUSR1, into
  // checkpoint_dir, keeping the newest checkpoint_keep (0: all).
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  double checkpoint_every_minutes = 0;
  int checkpoint_keep = 0;
  // Settings a run resumed from a checkpoint may change beyond the run's length and layout
  // (--resume-change; train/resume_policy.h names them).
  std::vector<std::string> resume_change;
  // Validation during training (train/validation.h): the test split evaluated every
  // eval_every optimizer steps (0: never) through evaluation's own path, on its first
  // eval_batches x batch samples (0: all of it). keep_best ("" none, "val_loss" lower is
  // better, "val_accuracy" higher is better): the best evaluation's checkpoint in best_dir,
  // replaced atomically whenever the metric improves.
  int64_t eval_every = 0;
  int64_t eval_batches = 0;
  std::string keep_best;
  std::string best_dir;
  // GPU: --device, --precision, --cuda-graph.
  std::string device = "cpu";
  Precision precision = Precision::fp32;
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
  double grad_norm = NAN;    // with clip_grad_norm: the gradients' total 2-norm, before clipping
  bool clipped = false;      // with clip_grad_norm: whether the step scaled its gradients down
  std::optional<EvalResult> val = {};  // with eval_every, on its steps: the validation after this step's update
  std::string val_kept = {};           // with keep_best: where its checkpoint went, when it was the best so far
};

// Bytes a rank moved over each group of the mesh per optimizer step (the payload its
// communicators counted, dist::Traffic: collectives plus point-to-point sends), averaged
// over the run's steps; evaluation not included.
// Under --cp, dp is the gradient reduction's group (dp x cp) and cp the ring attention's
// key/value blocks.
struct GroupBytes {
  double tp = 0, dp = 0, pp = 0, embedding = 0;
  double cp = 0;
};

// Where the step's time went on one rank, mean seconds per measured step.
struct StepBreakdown {
  double compute = 0;        // forward and backward, less the two below
  double tp_comm = 0;        // tensor-parallel collectives' layers (counted apart with --profile; else in compute)
  double grad_sync = 0;      // the gradient reduction's exposed part (data-parallel buckets, tied embeddings)
  double pipeline_wait = 0;  // waiting for other stages: the bubble and the transfers
  double data = 0;           // waiting for the loader
  double optimizer = 0;
  double other = 0;          // the rest of the step (the loss's agreement, metrics, checkpoints)
  double total() const { return compute + tp_comm + grad_sync + pipeline_wait + data + optimizer + other; }
};

// One rank of the job, as summary.json reports it.
struct RankReport {
  int rank = 0, stage = 0, dp_rank = 0, tp_rank = 0, cp_rank = 0, ep_rank = 0;
  size_t predicted_memory_bytes = 0, peak_memory_bytes = 0;
  std::vector<size_t> memory_by_kind;  // the plan's, per MemKind (transient kinds before reuse)
  GroupBytes comm_bytes_per_step;
  double step_seconds = 0;  // mean over the measured steps
  double wait_seconds = 0;  // of it, waiting for other pipeline stages (mean per step)
  StepBreakdown breakdown;
};

// A setting that differs from the checkpoint's in a resumed run: its key
// (train/resume_policy.h), the checkpoint's value and this run's.
struct SettingChange {
  std::string key, from, to;
};

struct TrainResult {
  int64_t steps = 0;
  double final_train_loss = 0;
  std::optional<EvalResult> test;
  double samples_per_second = 0;  // excluding the first warmup_excluded steps
  int64_t warmup_excluded = 0;
  double train_seconds = 0;
  double wall_seconds = 0;
  size_t predicted_memory_bytes = 0;  // this rank's
  size_t peak_memory_bytes = 0;
  std::vector<double> losses;
  std::vector<GradNormSample> grad_norms;  // with measure_noise
  double noise_scale = 0;                  // with measure_noise: the smoothed estimate at the end (0: undefined)
  NoiseInterval noise_interval;            // its 95% interval (train/noise.h), or why there is none
  int64_t clipped_steps = 0;               // with clip_grad_norm: the steps (of this process's) that clipped
  // Layout.
  int world_size = 1;
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;  // ep: ranks of an expert group (carved from dp)
  std::string pp_schedule;
  int virtual_stages = 1;
  std::vector<int> pp_split;          // the cut points used, by block
  // Mean over ranks of the share of a step spent waiting for other pipeline stages
  // (measured steps); 0 without pipelining.
  double bubble_fraction = 0;
  std::vector<RankReport> ranks;      // every rank of the job
  GroupBytes comm_bytes_per_step;     // this rank's
  std::string comm_backend;         // what reduced the gradients: "mpi", "nccl", or "" (one process)
  int64_t global_batch = 0;
  // Gradient reduction, first bucket launched .. all reduced, summed over the measured
  // steps, and the share of it that overlapped backward (CPU; not measured on GPUs: 0).
  double comm_seconds = 0;
  double comm_hidden_fraction = 0;
  std::vector<double> rank_step_seconds;  // mean step time of every rank (measured steps)
  int64_t resumed_from = 0;  // the checkpoint's step this run continued from (0: a fresh start)
  std::string resumed_dir;   // that checkpoint's directory
  std::vector<SettingChange> resume_changes;  // the settings changed since it, as accepted
  int stop_signal = 0;       // the signal that stopped the run early after a checkpoint (0: none)
  std::string last_checkpoint;  // the directory of the last checkpoint written
  // Validation during training (eval_every): the evaluations this process ran, the time they
  // took (left out of samples_per_second), and with keep_best the best so far (a resumed
  // run's includes the one it found in best_dir; best_step 0: none yet).
  std::vector<std::pair<int64_t, EvalResult>> validations;
  double validation_seconds = 0;
  int64_t best_step = 0;
  double best_value = NAN;
  int64_t checkpoints = 0;         // written by this run
  double checkpoint_seconds = 0;   // the time training waited for them (the copies; the files are written beside it)
  double checkpoint_write_seconds = 0;  // from each one's start to its rename, summed
  double checkpoint_bytes = 0;     // the size of the last one
  // GPU.
  std::string device = "cpu";
  std::string device_name;
  std::string precision = "fp32";
  bool graph_replay = false;
  int64_t kernels_per_step = 0;     // kernels the captured graphs replay per step (-1: not known)
  int64_t launches_per_step = 0;    // graph launches per step (the optimizer's kernels not counted)
  size_t device_memory_used_bytes = 0;  // cudaMemGetInfo: free before the run - free after the first step
  double gpu_utilization_mean = -1; // NVML, in percent; -1 when unavailable
  int64_t skipped_steps = 0;        // fp16: steps skipped for inf/NaN gradients
  double loss_scale = 0;            // fp16: final loss scale
};

}  // namespace sat
