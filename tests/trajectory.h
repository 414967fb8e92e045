// Comparing a parallel run with the one-process run it must follow (the exactness tests
// of data and pipeline parallelism).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

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

// Evaluation counts the same samples and gives the same loss (1e-5) and accuracy.
inline void expect_same_evaluation(const EvalResult& got, const EvalResult& want) {
  EXPECT_EQ(got.samples, want.samples);
  EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::fabs(want.loss));
  EXPECT_NEAR(got.accuracy, want.accuracy, 1e-12);
}

}  // namespace sat::test
