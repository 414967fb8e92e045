// Least-squares fit of a line y = intercept + slope * x to measured times, each point
// weighed by 1 / y^2 so that every point counts by its relative error (a sweep of message
// or matrix sizes spans several orders of magnitude: plain least squares would fit the
// largest points and ignore the latency the small ones show).
#pragma once
#include <cstddef>
#include <vector>

#include "core/error.h"

namespace sat {

struct LineFit {
  double intercept = 0, slope = 0;
};

// y > 0 at every point; at least two distinct x.
inline LineFit fit_line_relative(const std::vector<double>& x, const std::vector<double>& y) {
  SAT_ASSERT(x.size() == y.size() && x.size() >= 2);
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    SAT_ASSERT(y[i] > 0);
    const double w = 1.0 / (y[i] * y[i]);
    sw += w, sx += w * x[i], sy += w * y[i], sxx += w * x[i] * x[i], sxy += w * x[i] * y[i];
  }
  const double det = sw * sxx - sx * sx;
  SAT_ASSERT(det > 0);
  LineFit f;
  f.slope = (sw * sxy - sx * sy) / det;
  f.intercept = (sy - f.slope * sx) / sw;
  return f;
}

// The same with the intercept held at zero: y = slope * x.
inline double fit_slope_relative(const std::vector<double>& x, const std::vector<double>& y) {
  double sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (y[i] * y[i]);
    sxx += w * x[i] * x[i], sxy += w * x[i] * y[i];
  }
  SAT_ASSERT(sxx > 0);
  return sxy / sxx;
}

}  // namespace sat
