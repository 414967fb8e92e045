// Comparing a parallel run with the one-process run it must follow (the exactness tests
// of data and pipeline parallelism).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nn/models.h"
#include "nn/params.h"
#include "nn/safetensors.h"
#include "train/config.h"

namespace sat::test {

// The largest relative difference between two loss trajectories, step by step.
inline double max_rel(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::fabs(a[i] - b[i]) / std::max(1e-12, std::fabs(b[i])));
  return m;
}

// Every step's loss of a run's --out DIR (its metrics.jsonl), in order.
inline std::vector<double> metrics_losses(const std::filesystem::path& out) {
  std::vector<double> l;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) l.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return l;
}

// Evaluation counts the same samples and gives the same loss (1e-5) and accuracy.
inline void expect_same_evaluation(const EvalResult& got, const EvalResult& want) {
  EXPECT_EQ(got.samples, want.samples);
  EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::fabs(want.loss));
  EXPECT_NEAR(got.accuracy, want.accuracy, 1e-12);
}

// The largest relative difference (|a - b| / (1e-3 + |b|)) between the parameters of two
// safetensors files of a model: the whole model must be in each (every tensor is loaded).
inline double max_rel_weights(const std::string& model, const std::string& a_path, const std::string& b_path) {
  BuiltModel m = build_model(model_config(model), 1);
  ParamStore a(m.graph->params(), m.graph->states(), 0), b(m.graph->params(), m.graph->states(), 0);
  load_safetensors(a_path, a);
  load_safetensors(b_path, b);
  double worst = 0;
  for (size_t i = 0; i < a.num_params(); ++i) {
    Tensor x = a.param(i), y = b.param(i);
    for (int64_t k = 0; k < x.numel(); ++k)
      worst = std::max(worst, double(std::fabs(x.f32()[k] - y.f32()[k])) / (1e-3 + std::fabs(y.f32()[k])));
  }
  return worst;
}

}  // namespace sat::test
