// `saturate plan`: the fastest layout that fits, for a model, a number of devices of one kind
// and a global batch. A layout is the data/tensor/pipeline split of the devices (the mesh of
// dist/mesh.h: tp fastest, then dp, then pp), the micro-batch and accumulation, the pipeline
// schedule, recomputation, sequence parallelism and the ZeRO stage. For each the planner
// predicts the step time from the cost model (plan/cost.h):
//   * every stage's forward and backward per micro-batch from its nodes' costs, tensor-parallel
//     collectives included (over the node's link when tp fits in a node);
//   * the pipeline by simulating the schedule's own action lists (train/schedule.h, the lists
//     the executor runs) with those costs and the point-to-point transfer of the cut's
//     activations, which gives the bubble;
//   * the data-parallel gradient reduction after the last micro-batch's backward, overlapped
//     with it by buckets, and ZeRO's collectives (ZeRO-1: all-gather after the update; ZeRO-2:
//     reduce-scatter per micro-batch; ZeRO-3: all-gathers before forward and backward too);
//   * the optimizer's update of this rank's parameters.
// and the memory of every rank from the step's exact plan (train/plan.h) for the precision:
// the search prunes with an estimate from the same node sizes, and the layouts it reports are
// planned exactly (the first, the second and the last stage and the one with the most blocks;
// every stage of pipelines of up to 4 stages: the others hold fewer micro-batches of the same
// blocks).
#pragma once
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "nn/engine.h"
#include "nn/models.h"
#include "plan/hardware.h"
#include "plan/memory_formula.h"
#include "train/config.h"
#include "train/layout.h"
#include "train/schedule.h"

namespace sat {

// The layout's fields in a TrainConfig (the default cut of the pipeline); the rest is kept.
void apply_layout(const Layout& l, TrainConfig& cfg);

// --layout: the fields given; the search chooses the others.
struct LayoutFilter {
  std::optional<int> dp, tp, pp, v, zero, cp, ep;
  std::optional<int64_t> micro;
  std::optional<PipeSchedule> schedule;
  std::optional<Recompute> recompute;
  std::optional<bool> sp;
  bool empty() const;
};
// sat::Error naming --layout and the field: unknown field, a value that is not a positive
// integer (zero 0..3), an unknown schedule or recomputation, sp not on/off.
LayoutFilter parse_layout(const std::string& s);

struct PlanRequest {
  ModelConfig model;         // the family and its sizes; the planner sets tp, device and act
  std::string model_arg;     // --model as given, for the printed command ("": model.name)
  Hardware hw;
  int gpus = 1;
  int gpus_per_node = 8;
  int64_t global_batch = 0;  // samples per optimizer step
  DType precision = DType::bf16;  // activations and GEMM inputs; f32 on the CPU
  std::string optimizer = "adamw";
  float momentum = 0;        // sgd: a momentum buffer per parameter when > 0 (memory and update)
  LayoutFilter filter;
  // MoE under --ep: the tokens the busiest rank's experts take over the mean (1: balanced;
  // the router's load in summary.json gives it for a trained model).
  double expert_imbalance = 1;
  double memory_limit = 0;   // bytes per device (0: the hardware's memory)
  int top = 5;
  // The `top` are the fastest of each mesh (dp, tp, pp) first, then the next fastest of
  // any mesh when there are fewer meshes than `top`. For layout tuning, which times the
  // top few: layouts of one mesh that differ only in the ZeRO stage or the schedule teach
  // less than another mesh does.
  bool one_per_mesh = false;
  bool exact_memory = true;  // plan the reported layouts exactly (false: the estimate, for fitting)
  // The data-parallel reduction overlaps backward by buckets, as saturate's does (false: it
  // starts after the last backward, as in engines that reduce after the pipeline's flush).
  // GPUs only: on CPU processes (`this`) it is never hidden.
  bool overlap_dp = true;
  // Only the layouts `saturate train` runs on the planned device today (refusals() empty,
  // train/validate.h): --runnable-only. The others are counted in PlanResult::not_runnable.
  bool runnable_only = false;
  // The engine whose memory and communication are modelled (memory_formula.h): saturate's own
  // (its exact plans), or Megatron-LM, DeepSpeed or FSDP2 by their published formulas.
  EngineModel engine;
};

// A rank's memory by what it holds, as live at its peak: rows that sum to MemoryPlan::total()
// (the tables of `saturate plan` and `saturate info`).
struct MemoryRow {
  std::string what;  // "name (note)", or the name alone
  double bytes = 0;
  std::string name, note;  // what, split: the kind and what qualifies it (`info` prints them apart)
};
// The persistent kinds (whole, or this rank's shard under ZeRO), the step arena's transient
// kinds live at the arena's peak (arena_peak: live_at_peak of the step) and the gaps its
// packing leaves, the ZeRO-2/3 staging arena (split into its gathered units and gradient
// buckets live at its peak when staging_peak gives them, else whole) and the input
// batches. `lp`: the low-precision copy's dtype (f32: none).
using KindBytes = std::array<size_t, size_t(MemKind::kCount)>;
std::vector<MemoryRow> memory_rows(const MemoryPlan& m, const KindBytes& arena_peak, const KindBytes& staging_peak,
                                   int zero, DType lp);


struct Prediction {
  Layout layout;
  double step_seconds = 0;
  double samples_per_second = 0, tokens_per_second = 0;
  double tflops_per_gpu = 0, mfu = 0;  // model FLOPs (no recomputation) per second per device
  double bubble_fraction = 0;          // the pipeline simulation's idle share
  double compute_seconds = 0;          // the busiest stage's forward and backward (collectives of tp included)
  double tp_comm_seconds = 0;          // of it, tensor-parallel collectives
  double pp_comm_seconds = 0;          // point-to-point transfers on the busiest stage's path
  double cp_comm_seconds = 0;          // context parallelism's ring transfers not hidden behind attention
  double ep_comm_seconds = 0;          // expert parallelism's all-to-alls (dispatch and combine, both passes)
  double dp_exposed_seconds = 0;       // data-parallel / ZeRO communication not hidden behind backward
  double optimizer_seconds = 0;
  double memory_bytes = 0;  // the most any rank needs (estimate, or exact when memory_exact)
  int memory_stage = 0;     // the pipeline stage that needs it
  bool memory_exact = false;
  bool memory_formula = false;  // from the published formulas of the engine modelled (memory_formula.h)
  double allocator_bytes = 0;   // of memory_bytes, what the engine's allocator holds at its peak (formula)
  MemoryPlan memory;        // that rank's exact plan (when memory_exact)
  std::vector<MemoryRow> memory_rows;  // and its bytes live at the peak, by kind (memory_rows)
  bool fits = false;
};

struct PlanResult {
  std::vector<Prediction> best;        // fastest first, planned exactly, fitting (at most `top`)
  std::vector<Prediction> considered;  // every layout timed (memory estimated), for the plot
  int64_t layouts = 0;                 // layouts enumerated
  int64_t over_memory = 0;             // of them, estimated not to fit
  int64_t slower = 0;                  // of them, slower than the best by a lower bound (not simulated)
  int64_t not_runnable = 0;            // of them, refused by `saturate train` on the device (runnable_only)
  int64_t uncut = 0;                   // of them, pipelines a value would cross two cuts of (train/plan.h: cut_problem)
  std::optional<Prediction> smallest;  // the layout with the least memory (when none fits)
  ScheduleSim timeline;                // the best layout's pipeline simulation
  std::string why;                     // why the best wins
  double seconds = 0;                  // the search's own time
  double model_parameters = 0, model_flops_per_sample = 0;
  int64_t tokens_per_sample = 0;       // GPT: the context; 0 otherwise
};

// The search (sat::Error when no layout can form the global batch, with what would).
PlanResult plan_layouts(const PlanRequest& r);
// One layout, fully given (filter without gaps), planned exactly.
Prediction predict_layout(const PlanRequest& r, const Layout& l);

std::string plan_json(const PlanResult& p, const PlanRequest& r);
std::string plan_html(const PlanResult& p, const PlanRequest& r);
std::string plan_text(const PlanResult& p, const PlanRequest& r);

}  // namespace sat
