// SGD (momentum, Nesterov, weight decay) and AdamW with PyTorch's exact update rules
// and defaults, each one fused pass over the flat parameter/gradient/state arrays.
#pragma once
#include <memory>
#include <string>

#include "nn/params.h"

namespace sat {

struct OptimConfig {
  std::string name = "sgd";  // sgd | adamw
  float lr = 0.01f;
  float momentum = 0.0f;     // sgd
  bool nesterov = false;     // sgd
  float weight_decay = -1;   // < 0: PyTorch's default (sgd 0, adamw 0.01)
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;  // adamw (--betas, --eps)
  // > 0: the gradients are scaled so that their total 2-norm over the whole model is at most
  // this, as torch.nn.utils.clip_grad_norm_ (train/grad_clip.h); 0: no clipping.
  float clip_grad_norm = 0;
};

// Validates the config (sat::Error naming the flag) and fills defaults.
OptimConfig resolve_optim(OptimConfig c);
int optimizer_slots(const OptimConfig& c);  // float arrays of state per parameter

class Optimizer {
 public:
  explicit Optimizer(const OptimConfig& c) : c_(resolve_optim(c)) {}
  // One update of every parameter with learning rate lr (the schedule's value), its gradients
  // first multiplied by grad_scale in place (gradient clipping's coefficient; 1: as they are).
  void step(ParamStore& ps, float lr, float grad_scale = 1.0f);
  int64_t steps() const { return t_; }
  void set_steps(int64_t t) { t_ = t; }  // resuming: AdamW's bias correction goes on from there
  const OptimConfig& config() const { return c_; }
  // Parameters the last step left not finite (of the spans this rank updates).
  int64_t last_nonfinite() const { return nonfinite_; }

 private:
  int64_t update(ParamStore& ps, const UpdateSpan& s, float lr);
  OptimConfig c_;
  int64_t t_ = 0;
  int64_t nonfinite_ = 0;
};

// The optimizer of one rank's parameters on their device, behind one interface: the host's
// (Optimizer above) or the GPU's (optim/optimizer_cuda.h), made by the device
// (backend/device_backend.h: DeviceBackend::optimizer). The step loop sets the learning rate
// of each step; the executor's optimizer action calls step().
class DeviceOptimizer {
 public:
  virtual ~DeviceOptimizer() = default;
  virtual void set_lr(float lr) = 0;
  // The next step reads every gradient multiplied by s (gradient clipping's coefficient,
  // train/grad_clip.h; after the loss scale's unscaling under fp16). 1 until set.
  virtual void set_grad_scale(float s) = 0;
  virtual void step() = 0;  // one update of this rank's parameters (its shard, under ZeRO)
  virtual const OptimConfig& config() const = 0;
  virtual int64_t steps() const = 0;      // updates applied (AdamW's t)
  virtual void set_steps(int64_t t) = 0;  // resuming: the bias correction goes on from t
  // Parameters the last step left not finite (counted on the host; 0 where not counted).
  virtual int64_t last_nonfinite() const { return 0; }
  // fp16 loss scaling: the scale backward is seeded with, in device memory (null: none).
  virtual const float* loss_scale_device() const { return nullptr; }
  // After the run (reads the device): steps skipped for inf/NaN gradients, the last scale.
  virtual int64_t skipped_steps() { return 0; }
  virtual double loss_scale() { return 0; }
};

// The host's: Optimizer over a ParamStore that lives in host memory.
std::unique_ptr<DeviceOptimizer> host_optimizer(const OptimConfig& c, ParamStore& ps);

struct ScheduleConfig {
  std::string name = "constant";  // constant | step | cosine
  int64_t warmup = 0;             // linear warm-up steps (all schedules)
  double warmup_fraction = 0;     // or this share of the run's steps, whichever is more
  int64_t step_size = 0;          // step: decay every step_size steps (0: a third of the run)
  float gamma = 0.1f;             // step: factor per decay
  // cosine: the lr at the last step (CosineAnnealingLR's eta_min); step: the floor the decayed
  // lr stops at. The warm-up (from base / warmup up to base) is not affected.
  float min_lr = 0.0f;
};
// Validates the schedule (sat::Error naming the flag; --min-lr at most base_lr, --lr's).
ScheduleConfig resolve_schedule(ScheduleConfig s, float base_lr);
// The warm-up steps of a run of `total` optimizer steps.
int64_t warmup_steps(const ScheduleConfig& s, int64_t total);
// Learning rate of optimizer step `step` (0-based) out of `total`.
float schedule_lr(const ScheduleConfig& s, float base_lr, int64_t step, int64_t total);

}  // namespace sat
