#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/text.h"

namespace sat {

OptimConfig resolve_optim(OptimConfig c) {
  check_choice("--optimizer", c.name, {"sgd", "adamw"});
  SAT_CHECK(c.lr > 0 && std::isfinite(c.lr), "--lr: expected a positive number, got ", c.lr);
  SAT_CHECK(c.momentum >= 0 && c.momentum < 1, "--momentum: expected a value in [0, 1), got ", c.momentum);
  SAT_CHECK(!c.nesterov || c.momentum > 0, "--nesterov needs --momentum > 0 (as in PyTorch)");
  if (c.weight_decay < 0) c.weight_decay = c.name == "adamw" ? 0.01f : 0.0f;
  SAT_CHECK(std::isfinite(c.weight_decay), "--weight-decay: expected a number >= 0");
  SAT_CHECK(c.beta1 >= 0 && c.beta1 < 1 && c.beta2 >= 0 && c.beta2 < 1, "--betas: expected values in [0, 1), got ",
            c.beta1, ",", c.beta2);
  SAT_CHECK(c.eps >= 0 && std::isfinite(c.eps), "--eps: expected a number >= 0, got ", c.eps);
  SAT_CHECK(c.clip_grad_norm >= 0 && std::isfinite(c.clip_grad_norm), "--clip-grad-norm: expected a number > 0, got ",
            c.clip_grad_norm);
  return c;
}

int optimizer_slots(const OptimConfig& c) {
  if (c.name == "adamw") return 2;
  return c.momentum > 0 ? 1 : 0;
}

void Optimizer::step(ParamStore& ps, float lr, float grad_scale) {
  ++t_;
  nonfinite_ = 0;
  // The flat arrays, or under ZeRO this rank's shard of them (one span per unit under ZeRO-2).
  for (const UpdateSpan& s : ps.update_spans()) {
    // Clipping: the store's gradients scaled in place first, as clip_grad_norm_'s g.mul_(c)
    // (a pass only on the steps that clip: the update's own loop is unchanged).
    if (grad_scale != 1.0f) {
      float* g = const_cast<float*>(s.g);
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < s.n; ++i) g[i] *= grad_scale;
    }
    nonfinite_ += update(ps, s, lr);
  }
}

// Each loop also counts the updated values that are not finite: a compare in a pass that
// is bound by memory, instead of another pass over the parameters to find a divergence.
int64_t Optimizer::update(ParamStore& ps, const UpdateSpan& s, float lr) {
  const int64_t n = s.n;
  float* p = s.p;
  const float* g = s.g;
  const float wd = c_.weight_decay;
  int64_t bad = 0;
  if (c_.name == "sgd") {
    // torch.optim.SGD: d = g + wd p; buf = momentum buf + d (buf = d on the first step);
    // d = nesterov ? d + momentum buf : buf; p -= lr d.
    const float mu = c_.momentum;
    if (mu == 0) {
#pragma omp parallel for simd schedule(static) reduction(+ : bad)
      for (int64_t i = 0; i < n; ++i) {
        const float pi = p[i] - lr * (g[i] + wd * p[i]);
        p[i] = pi;
        bad += std::isfinite(pi) ? 0 : 1;
      }
      return bad;
    }
    float* buf = ps.flat_slot(0) + s.slot;
    const bool first = t_ == 1, nest = c_.nesterov;
#pragma omp parallel for simd schedule(static) reduction(+ : bad)
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] + wd * p[i];
      float b = first ? d : mu * buf[i] + d;
      buf[i] = b;
      const float pi = p[i] - lr * (nest ? d + mu * b : b);
      p[i] = pi;
      bad += std::isfinite(pi) ? 0 : 1;
    }
    return bad;
  }
  // torch.optim.AdamW (1.13, single-tensor path):
  //   p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  //   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
  float* m = ps.flat_slot(0) + s.slot;
  float* v = ps.flat_slot(1) + s.slot;
  const float b1 = c_.beta1, b2 = c_.beta2, eps = c_.eps;
  const double bc1 = 1.0 - std::pow(double(b1), double(t_));
  const double bc2 = 1.0 - std::pow(double(b2), double(t_));
  const float step_size = float(lr / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float decay = 1.0f - lr * wd;
#pragma omp parallel for simd schedule(static) reduction(+ : bad)
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i];
    float pi = p[i] * decay;
    float mi = b1 * m[i] + (1.0f - b1) * gi;
    float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float pn = pi - step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
    p[i] = pn;
    bad += std::isfinite(pn) ? 0 : 1;
  }
  return bad;
}

ScheduleConfig resolve_schedule(ScheduleConfig s, float base_lr) {
  check_choice("--schedule", s.name, {"constant", "step", "cosine"});
  SAT_CHECK(s.warmup >= 0, "--warmup: expected a number of steps >= 0");
  SAT_CHECK(s.warmup_fraction >= 0 && s.warmup_fraction <= 1, "--warmup: expected a share of the steps in [0, 1]");
  SAT_CHECK(std::isfinite(s.min_lr) && s.min_lr >= 0 && s.min_lr <= base_lr, "--min-lr: expected a learning rate from 0 "
            "to --lr (", base_lr, "), got ", s.min_lr);
  SAT_CHECK(s.min_lr == 0 || s.name != "constant", "--min-lr applies to --schedule cosine and step (the floor they "
            "decay to), not constant");
  return s;
}

int64_t warmup_steps(const ScheduleConfig& s, int64_t total) {
  return std::max<int64_t>(s.warmup, int64_t(std::ceil(s.warmup_fraction * double(std::max<int64_t>(total, 0)))));
}

// After the linear warm-up (from base / warmup up to base, whatever min_lr is), each schedule
// as PyTorch defines it over the steps after the warm-up: StepLR's base * gamma^(t / size),
// held at min_lr once it would go below; CosineAnnealingLR's
// min + (base - min) (1 + cos(pi t / T)) / 2 with T the steps to the last one, which takes min.
float schedule_lr(const ScheduleConfig& schedule, float base, int64_t step, int64_t total) {
  ScheduleConfig s = schedule;
  s.warmup = warmup_steps(schedule, total);
  if (s.warmup > 0 && step < s.warmup) return base * float(step + 1) / float(s.warmup);
  if (s.name == "constant") return base;
  if (s.name == "step") {
    int64_t size = s.step_size > 0 ? s.step_size : std::max<int64_t>(1, total / 3);
    return std::max(s.min_lr, base * std::pow(s.gamma, float((step - s.warmup) / size)));
  }
  int64_t span = std::max<int64_t>(1, total - s.warmup - 1);
  double progress = std::min(1.0, double(step - s.warmup) / double(span));
  const double minlr = s.min_lr;
  return float(minlr + 0.5 * (double(base) - minlr) * (1.0 + std::cos(M_PI * progress)));
}

namespace {
class HostOptimizer final : public DeviceOptimizer {
 public:
  HostOptimizer(const OptimConfig& c, ParamStore& ps) : opt_(c), ps_(ps) {}
  void set_lr(float lr) override { lr_ = lr; }
  void set_grad_scale(float s) override { grad_scale_ = s; }
  void step() override {
    opt_.step(ps_, lr_, grad_scale_);
    ps_.refresh_lp_after_update();
  }
  const OptimConfig& config() const override { return opt_.config(); }
  int64_t steps() const override { return opt_.steps(); }
  void set_steps(int64_t t) override { opt_.set_steps(t); }
  int64_t last_nonfinite() const override { return opt_.last_nonfinite(); }

 private:
  Optimizer opt_;
  ParamStore& ps_;
  float lr_ = 0, grad_scale_ = 1;
};
}  // namespace

std::unique_ptr<DeviceOptimizer> host_optimizer(const OptimConfig& c, ParamStore& ps) {
  return std::make_unique<HostOptimizer>(c, ps);
}

}  // namespace sat
