// `saturate info`: a model's parameters, FLOPs and the memory plan of saturate train for a
// layout, rendered from one JobPlan (train/plan.h) built for it: every pipeline stage's
// plan and traffic, what ZeRO and recomputation save. With --device cuda, what runs on GPUs
// too (backend/support.h).
#pragma once
#include <memory>
#include <string>

#include "cli/args.h"
#include "data/dataset.h"
#include "train/plan.h"

namespace sat::cli {

// The plan info renders: `saturate train`'s JobPlan of `model` for the layout, precision,
// optimizer and ranks of `a`, on data of the model's default shapes (none generated).
struct InfoPlan {
  InfoPlan(const RunArgs& a, const ModelConfig& model);
  bool gpu = false;  // --device cuda: the GPU engine's plan
  DataSplit data;
  std::unique_ptr<JobPlan> job;
};

int run_info(const RunArgs& a);

// The same plan as JSON (the library's saturate::info_json): the model's size and work, and
// each pipeline stage's memory rows (as info prints them), total, step arena, memory by kind
// and the bytes communicated per step.
std::string info_json(const RunArgs& a, const ModelConfig& model);

}  // namespace sat::cli
