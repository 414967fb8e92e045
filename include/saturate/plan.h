// saturate as a C++ library: plans. What `saturate plan --json` writes (the planner's best
// layouts of a model over a cluster, their memory and predicted speed) and what `saturate
// info` prints (the memory plan of one layout, row by row), as JSON text for a model of
// this library: the CLI's own planners, not a copy.
#pragma once
#include <cstdint>
#include <string>

#include "saturate/model.h"

namespace saturate {

// saturate plan's flags, by their names.
struct PlanOptions {
  int gpus = 8;
  std::string gpu = "a100-80gb";  // a built-in kind (saturate plan --help lists them), a hardware JSON file, or "this"
  int gpus_per_node = 0;          // 0: the hardware's
  int64_t global_batch = 0;       // samples per optimizer step (required)
  std::string precision;          // "": bf16 on GPUs, fp32 on the CPU
  std::string optimizer = "adamw";
  std::string layout;             // fields fixed ("tp=2,pp=1"), the rest searched
  std::string memory_budget;      // bytes per device ("40GiB"; "": the hardware's)
  int top = 5;
  bool runnable_only = false;     // only layouts `saturate train` runs on the device today
  std::string engine = "saturate";  // the engine modelled: saturate, megatron, deepspeed or fsdp2
};

// The JSON `saturate plan --json` writes: "best" and "layouts" (dp, tp, pp, micro_batch,
// accum, memory_bytes_per_gpu, memory_at_peak, fits, step_seconds, samples_per_second,
// mfu, command, ...), "run" (the command of the fastest runnable layout), "why".
std::string plan_json(const Model& model, const PlanOptions& options);

// saturate info's flags, by their names: the layout planned on `ranks` data-parallel ranks.
struct InfoOptions {
  int64_t batch = 64;  // micro-batch per rank
  int64_t accum = 1;
  int ranks = 1;
  int tp = 1, pp = 1, zero = 0;
  std::string recompute = "none";
  std::string precision = "fp32";
  std::string optimizer = "adamw";
  std::string device = "cpu";  // or "cuda": the GPU engine's plan (planned on any machine)
};

// The plan `saturate info` prints, as JSON: the model ("parameters", "flops_per_sample",
// "input_shape", ...), its "memory" rows ({"name", "bytes", "note"}, live at the step's
// peak, summing to "total_bytes"), "step_arena_bytes", and per pipeline stage the same
// ("stages", with "memory_by_kind" and "communicated_per_step").
std::string info_json(const Model& model, const InfoOptions& options = {});

}  // namespace saturate
