#include "train/noise.h"

#include "core/error.h"

namespace sat {

NoiseScale::NoiseScale(double decay) {
  SAT_CHECK(decay >= 0 && decay < 1, "internal error: noise scale decay must be in [0, 1), got ", decay);
  keep_ = decay > 0 ? decay : 1;
  take_ = decay > 0 ? 1 - decay : 1;
}

void NoiseScale::add(double small_sq, int64_t b_small, double big_sq, int64_t b_big) {
  SAT_CHECK(b_small >= 1 && b_big > b_small, "internal error: noise scale needs batches b < B, got ", b_small, " and ",
            b_big);
  const double b = double(b_small), B = double(b_big);
  g2_ = keep_ * g2_ + take_ * (B * big_sq - b * small_sq) / (B - b);
  s_ = keep_ * s_ + take_ * (small_sq - big_sq) / (1.0 / b - 1.0 / B);
  w_ = keep_ * w_ + take_;
  ++n_;
}

double NoiseScale::estimate() const {
  const double g2 = gradient_sq(), tr = trace();
  return g2 > 0 && tr > 0 ? tr / g2 : 0;
}

}  // namespace sat
