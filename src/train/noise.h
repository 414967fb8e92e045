// The two-batch estimator of the gradient noise scale B_simple = tr(Sigma) / |G|^2
// (McCandlish et al., "An Empirical Model of Large-Batch Training", appendix A): from
// squared gradient norms at two batch sizes b < B,
//   |G|^2 ~ (B |G_B|^2 - b |G_b|^2) / (B - b),   tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B),
// each unbiased; both are averaged over steps before their ratio is taken. The tuner
// takes the plain mean over its few steps; training (--noise-scale) takes exponential
// moving averages, so the estimate follows a noise scale that grows as the loss falls.
#pragma once
#include <cstdint>

namespace sat {

class NoiseScale {
 public:
  // decay 0: the plain mean of every step added; 0 < decay < 1: exponential moving
  // averages with that decay per step, bias-corrected as Adam's moments are.
  explicit NoiseScale(double decay = 0);
  void add(double small_sq, int64_t b_small, double big_sq, int64_t b_big);
  int count() const { return n_; }
  double gradient_sq() const { return w_ > 0 ? g2_ / w_ : 0; }  // |G|^2
  double trace() const { return w_ > 0 ? s_ / w_ : 0; }         // tr(Sigma)
  double estimate() const;  // B_simple; 0 while |G|^2 or tr(Sigma) is not positive

 private:
  double keep_, take_;  // g2 = keep * g2 + take * x (and the same for the weight w)
  double g2_ = 0, s_ = 0, w_ = 0;
  int n_ = 0;
};

}  // namespace sat
