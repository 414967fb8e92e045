// Planning a rank's part of a training job before anything is allocated: the cut of the
// model into pipeline stages, this rank's stage graph, its schedule, the contexts its
// micro-batches use, and its memory. One free function that train, tune and info share:
// the plan the trainer runs is the plan that is reported.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/dataset.h"
#include "nn/engine.h"
#include "nn/models.h"
#include "nn/step_plan.h"
#include "train/config.h"
#include "train/schedule.h"
#include "train/sharded_dp.h"

namespace sat {

// The model cut into stages * virtual_stages pieces between blocks: piece k holds
// blocks [cuts[k], cuts[k + 1]); chunk c of stage s is piece c * stages + s (Megatron's
// interleaving), or in a V (zb-v) piece s for chunk 0 and 2 * stages - 1 - s for chunk 1.
struct StageSplit {
  int stages = 1, virtual_stages = 1;
  bool v_shape = false;
  int blocks = 1;
  std::vector<int> cuts;  // stages * virtual_stages + 1 entries: 0, ..., blocks
  // Whole-model node ranges of stage s's chunks, in chunk order (for build_model).
  std::vector<std::pair<int, int>> nodes_of(const Graph& whole, int stage) const;
  std::string describe(const Graph& whole) const;  // "blocks 0-2 | 3" (with the layer names)
};

// Checks the pipeline flags against the model (sat::Error naming --pp, --pp-split,
// --virtual-stages or --pp-schedule) and cuts it: at cfg.pp_split, or balanced by the
// blocks' FLOPs (the slowest stage sets the pace) and, among cuts within 5% of the best
// in FLOPs, by memory (each piece gets the same number of blocks under the interleaved
// schedule, as Megatron requires).
StageSplit split_model(const Graph& whole, const TrainConfig& cfg, const std::string& model_name);

// Every value crosses at most one cut: a stage sends its outputs to the next piece only, so a
// value read two or more pieces after the one that makes it (a skip connection across
// blocks) has no message to travel by. "" when the split carries every value; otherwise one
// line naming the value, its reader and --pp (train refuses the layout with it, plan skips it).
std::string cut_problem(const Graph& whole, const StageSplit& sp, const std::string& model_name);

// The pipeline flags alone (no model needed): schedule, micro-batches, stages.
void check_pipeline(const TrainConfig& cfg);

// The loaders of a rank that reads data (data/loader.h): the training loader and, when the
// run evaluates, the test loader, each with `workers` reading threads.
struct LoaderPlan {
  int workers = 0;                     // reading threads per loader (0: the step reads)
  int prefetch = 0;                    // batches read ahead
  int train_slots = 0, test_slots = 0;  // ring batch slots (0: no such loader)
  size_t ring_bytes = 0;     // both rings: counted through sat::Buffer, MemoryPlan::inputs' loader part
  size_t scratch_bytes = 0;  // the reading threads' own (Dataset::worker_scratch_bytes): host memory
                             // the datasets hold, not counted by the allocator nor in MemoryPlan
  size_t order_bytes = 0;    // the epochs' sample orders, 8 bytes a sample per loader (host, not counted)
  // "2 workers per loader, 2 batches ahead: rings of 3 + 2 batches (training + test) 1.2 MiB (in the
  // plan), the reading threads' own 0 B (host, the dataset's scratch), the epoch orders 547 KiB (host)"
  std::string describe() const;
};

// Everything one rank runs, decided before anything is allocated.
struct RankPlan {
  BuiltModel model;             // this rank's stage (the whole model without pipelining)
  StageSplit split;
  int stage = 0;
  ScheduleSpec schedule;
  std::vector<Action> actions;  // one optimizer step
  std::vector<std::vector<int>> ctx_of;  // [chunk][micro]: the context it uses
  StepPlan step;
  ShardPlan shards;             // ZeRO-2/3 (stage 0 otherwise)
  MemoryPlan memory;
  bool reads_data = false;      // some chunk reads the loader's batches
  int loader_keep = 1;          // loader batches that must stay valid at once
  LoaderPlan loader;            // the loaders' threads and host memory (when reads_data)
  double flops_per_sample = 0;  // this stage's forward + backward, per sample
  int64_t model_parameters = 0;     // of the whole model (all stages, all tensor-parallel parts)
  double model_flops_per_sample = 0;  // of the whole model, forward + backward
};

// The plan of one job as this process sees it, built once per command and shared by
// validation, `info`, the trainer and --save-weights: the whole model (the cut, the
// parameters' names), the cut into stages, the unsplit model's size and work, and each
// stage's RankPlan, planned on first use and kept. No graph is built twice.
class JobPlan {
 public:
  // mc: the model as the job runs it (validate.h: resolved_model); dp: data-parallel ranks
  // (ZeRO-1 shards the optimizer state over them); test: evaluation's loader buffers are part
  // of the plan when given and cfg.evaluate. sat::Error naming the pipeline flags when the
  // model cannot be cut so. train and test must outlive the plan.
  JobPlan(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test, int dp);
  JobPlan(JobPlan&&) = default;
  ~JobPlan();

  const ModelConfig& model() const { return mc_; }
  const TrainConfig& config() const { return cfg_; }
  int dp() const { return dp_; }
  const Dataset& train() const { return *train_; }
  const Dataset* test() const { return test_; }
  // This tensor-parallel rank's whole model (under --ep with this rank's experts only), and
  // the unsplit one, every expert on one rank (tp 1 and ep 1: the same).
  const BuiltModel& whole() const;
  const BuiltModel& unsplit() const { return full_ ? *full_ : whole(); }
  const StageSplit& split() const { return split_; }
  int64_t model_parameters() const { return parameters_; }
  double model_flops_per_sample() const { return flops_; }
  // The plan of pipeline stage s (0..pp-1), made on first use.
  RankPlan& stage(int s);
  // Stage s's memory with the same graphs under another ZeRO stage or optimizer (`info`'s
  // comparisons: nothing is built again).
  MemoryPlan memory_with(int s, const TrainConfig& other);

 private:
  RankPlan plan_stage(int s);
  ModelConfig mc_;
  TrainConfig cfg_;
  const Dataset* train_;
  const Dataset* test_;
  int dp_;
  std::unique_ptr<BuiltModel> whole_, full_;  // whole_ moves into stage 0's plan without pipelining
  StageSplit split_;
  int64_t parameters_ = 0;
  double flops_ = 0;
  std::vector<std::unique_ptr<RankPlan>> stages_;
};

// One stage's plan on its own (a JobPlan's stage, for callers that need no other).
RankPlan plan_rank(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test, int stage,
                   int dp);
// The payload bytes this rank will move over each group of the mesh per optimizer step
// (GroupBytes, as the communicators count them): the tensor-parallel layers' collectives
// (LayerSetup::comm_*) of every micro-batch and the sequence-parallel LayerNorm gradients;
// the data-parallel gradient reduction (ZeRO-1: reduce-scatter and all-gather) and the
// step's loss; the pipeline's activations and gradients and the loss broadcast; the tied
// embedding's gradients. dp: data-parallel ranks.
GroupBytes predict_comm(const RankPlan& plan, const TrainConfig& cfg, int dp);

// The loaders' options of a run: cfg's prefetch depth and workers; `keep` batches valid at once.
LoaderOptions loader_options(const TrainConfig& cfg, int keep = 1);
// The loaders of a rank reading `train` (and `test` when given and cfg.evaluate), keeping
// `keep` training batches valid at once.
LoaderPlan plan_loaders(const TrainConfig& cfg, const Dataset& train, const Dataset* test, int keep);

}  // namespace sat
