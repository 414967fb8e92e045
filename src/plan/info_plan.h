// The plan `saturate info` renders, and the same as JSON (the library's saturate::info_json):
// saturate train's JobPlan of a model for one layout, precision, optimizer and number of
// data-parallel ranks, on data of the model's default shapes (none generated).
#pragma once
#include <memory>
#include <string>

#include "data/dataset.h"
#include "train/plan.h"

namespace sat {

struct InfoPlan {
  // cfg: the layout, precision, optimizer, prefetch and loader workers (validated here, as
  // saturate train validates them); gpu: the GPU engine's plan (planned on any machine).
  InfoPlan(const ModelConfig& model, const TrainConfig& cfg, int ranks, bool gpu);
  bool gpu = false;
  int ranks = 1;
  DataSplit data;
  std::unique_ptr<JobPlan> job;
};

// The model's size and work, and each pipeline stage's memory rows (as info prints them,
// summing to total_bytes), step arena, memory by kind and the bytes communicated per step.
std::string info_json(InfoPlan& p);

}  // namespace sat
