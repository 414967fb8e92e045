#include "train/noise.h"

#include <cmath>
#include <cstdio>
#include <iterator>

#include "core/error.h"

namespace sat {

double t_quantile_95(double df) {
  static constexpr double table[] = {12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
                                     2.201,  2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
                                     2.080,  2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042};
  constexpr int n = int(std::size(table));
  if (!(df >= 1)) return INFINITY;
  if (df >= n) return 1.96 + 2.4 / df;  // within 0.003 of the exact quantile beyond 30
  const int k = int(df);                // linear between the integer degrees of freedom
  return table[k - 1] + (df - k) * (table[k] - table[k - 1]);
}

NoiseScale::NoiseScale(double decay) {
  SAT_CHECK(decay >= 0 && decay < 1, "internal error: noise scale decay must be in [0, 1), got ", decay);
  keep_ = decay > 0 ? decay : 1;
  take_ = decay > 0 ? 1 - decay : 1;
}

void NoiseScale::add(double small_sq, int64_t b_small, double big_sq, int64_t b_big) {
  SAT_CHECK(b_small >= 1 && b_big > b_small, "internal error: noise scale needs batches b < B, got ", b_small, " and ",
            b_big);
  const double b = double(b_small), B = double(b_big);
  const double g = (B * big_sq - b * small_sq) / (B - b);        // this step's |G|^2
  const double s = (small_sq - big_sq) / (1.0 / b - 1.0 / B);    // and tr(Sigma)
  g2_ = keep_ * g2_ + take_ * g;
  s_ = keep_ * s_ + take_ * s;
  gg_ = keep_ * gg_ + take_ * g * g;
  ss_ = keep_ * ss_ + take_ * s * s;
  gs_ = keep_ * gs_ + take_ * g * s;
  w_ = keep_ * w_ + take_;
  ww_ = keep_ * keep_ * ww_ + take_ * take_;
  ++n_;
}

double NoiseScale::estimate() const {
  const double g2 = gradient_sq(), tr = trace();
  return g2 > 0 && tr > 0 ? tr / g2 : 0;
}

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", v);
  return buf;
}

}  // namespace

NoiseInterval NoiseScale::interval() const {
  NoiseInterval r;
  r.effective_steps = ww_ > 0 ? w_ * w_ / ww_ : 0;
  const double n = r.effective_steps;
  if (n_ < 3 || n < 2.5) {
    r.reason = str_cat("only ", n_, " step", n_ == 1 ? "" : "s", " measured; an interval needs at least 3");
    return r;
  }
  // Means, and the variances of the means (weighted sample variances / effective count).
  const double mg = gradient_sq(), ms = trace(), unbias = n / (n - 1);
  const double vg = std::max(0.0, gg_ / w_ - mg * mg) * unbias / n;
  const double vs = std::max(0.0, ss_ / w_ - ms * ms) * unbias / n;
  const double cgs = (gs_ / w_ - mg * ms) * unbias / n;
  const double z = t_quantile_95(n - 1), z2 = z * z;
  // Fieller: {r : (ms - r mg)^2 <= z^2 (vs - 2 r cgs + r^2 vg)} = {a r^2 - 2 b r + c <= 0}.
  const double a = mg * mg - z2 * vg, b = ms * mg - z2 * cgs, c = ms * ms - z2 * vs;
  const std::string after = str_cat(" after ", n_, " steps");
  if (!(a > 0) || !(mg > 0)) {
    r.reason = str_cat("|G|^2 is not distinguishable from 0", after, " (", number(mg), " +- ",
                       number(z * std::sqrt(vg)), "): the gradient is buried in the noise of these batches, so the interval is unbounded");
    return r;
  }
  const double root = std::sqrt(std::max(0.0, b * b - a * c));
  r.low = (b - root) / a;
  r.high = (b + root) / a;
  r.estimate = ms / mg;
  if (!(r.low > 0)) {
    r.reason = str_cat("tr(Sigma) is not distinguishable from 0", after, " (", number(ms), " +- ",
                       number(z * std::sqrt(vs)), "): the 95% interval [", number(r.low), ", ", number(r.high),
                       "] reaches 0");
    r.estimate = 0;
    return r;
  }
  r.measurable = true;
  return r;
}

}  // namespace sat
