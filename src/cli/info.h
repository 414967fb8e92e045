// `saturate info`: a model's parameters, FLOPs and the memory plan of saturate train for a
// layout, rendered from one JobPlan (train/plan.h) built for it: every pipeline stage's
// plan and traffic, what ZeRO and recomputation save. With --device cuda, what runs on GPUs
// too (backend/support.h).
#pragma once
#include "cli/args.h"

namespace sat::cli {

int run_info(const RunArgs& a);

}  // namespace sat::cli
