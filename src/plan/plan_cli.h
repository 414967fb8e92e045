// `saturate plan`: the command's settings and its run (the CLI parses flags into PlanArgs).
#pragma once
#include <string>

#include "nn/models.h"

namespace sat {

namespace dist {
class Comm;
}
struct PlanRequest;

struct PlanArgs {
  std::string model = "gpt2-124m";
  std::string gpu = "a100-80gb";  // a built-in kind, a JSON file, or "this"
  int gpus = 8;
  int gpus_per_node = 0;          // 0: the hardware's
  long long global_batch = 0;
  std::string precision;          // "": bf16 on GPUs, fp32 on the CPU
  std::string optimizer = "adamw";
  std::string layout;             // --layout: fields fixed, the rest searched
  std::string memory_budget;      // --memory-budget: bytes per device ("" : the hardware's)
  std::string memory_limit;       // --memory-limit, its old name (hidden; one of the two)
  int top = 5;
  double expert_imbalance = 1;    // --expert-imbalance (PlanRequest::expert_imbalance)
  bool runnable_only = false;     // --runnable-only: only the layouts `saturate train` runs on the device today
  std::string out_dir, json_file;
  std::string calibrate;          // RUNS.json
  std::string compare;            // RUNS.json: published runs against the prediction
  std::string engine = "saturate";  // the engine modelled (plan/memory_formula.h)
};

// Returns the exit status; sat::Error for bad input.
int run_plan(const PlanArgs& a);

// --gpus and --global-batch checked (sat::Error naming the flag).
void check_plan_args(const PlanArgs& a);
// The planner's request for `model` (a.model only names it in the printed commands):
// the hardware (world: the ranks that measure `--gpu this` together, or null), precision,
// optimizer, --layout's filter and the memory budget.
PlanRequest plan_request(const PlanArgs& a, const ModelConfig& model, dist::Comm* world);

}  // namespace sat
