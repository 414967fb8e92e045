// The two-batch estimator of the gradient noise scale B_simple = tr(Sigma) / |G|^2
// (McCandlish et al., "An Empirical Model of Large-Batch Training", appendix A): from
// squared gradient norms at two batch sizes b < B,
//   |G|^2 ~ (B |G_B|^2 - b |G_b|^2) / (B - b),   tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B),
// each unbiased; both are averaged over steps before their ratio is taken. The tuner
// takes the plain mean over its steps; training (--noise-scale) takes exponential
// moving averages, so the estimate follows a noise scale that grows as the loss falls.
//
// The ratio of two noisy means can be anything when |G|^2 is buried in noise (its
// per-step estimate is then as often negative as positive), so interval() gives a 95%
// confidence interval by Fieller's method for a ratio of means: the set of ratios r for
// which mean(tr) - r mean(|G|^2) is within z standard errors of 0, with the variances and
// covariance of the per-step estimates (weighted as the averages are; t quantiles for
// few steps). When mean(|G|^2) is not distinguishable from 0 that set is unbounded, and
// the estimate is "not measurable yet", as it is when the interval reaches 0 or below.
#pragma once
#include <cstdint>
#include <string>

namespace sat {

struct NoiseInterval {
  bool measurable = false;
  double estimate = 0;          // B_simple (ratio of the averages); 0 when not measurable
  double low = 0, high = 0;     // the 95% interval (when measurable: 0 < low <= estimate <= high < inf)
  double effective_steps = 0;   // the number of independent steps the weights amount to
  std::string reason;           // when not measurable: why, in words (no leading "not measurable")
};

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
  // The 95% interval of the averaged estimate (Fieller), or why there is none.
  NoiseInterval interval() const;

 private:
  double keep_, take_;  // g2 = keep * g2 + take * x (and the same for the weight w)
  double g2_ = 0, s_ = 0, w_ = 0;
  double gg_ = 0, ss_ = 0, gs_ = 0, ww_ = 0;  // weighted second moments; ww: sum of squared weights
  int n_ = 0;
};

// The two-sided 95% quantile of Student's t with `df` degrees of freedom (1.96 as df grows).
double t_quantile_95(double df);

}  // namespace sat
