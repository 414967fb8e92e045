// The optimizer on the GPU: SGD (momentum, Nesterov, weight decay) and AdamW with the
// update rules of optim/optimizer.cpp, plus fp16 dynamic loss scaling with the rules
// of PyTorch's GradScaler. Included only by code compiled with the CUDA backend.
//
// Everything that changes from step to step (learning rate, gradient clipping's
// coefficient, Adam step counter, loss scale, "this step had inf/NaN gradients") lives in
// one small struct in DEVICE
// memory (OptimScalars) and the kernels read it from there, so the step can be
// captured once as a CUDA graph and replayed: nothing per-step is a kernel argument.
//
// One step() queues, on the given stream:
//   (a) with loss scaling: found_inf = 0, then one pass over the gradients that sets
//       found_inf when any is inf or NaN;
//   (b) a one-thread kernel: the gradient multiplier grad_scale (1 / loss scale, or
//       1, times the clip coefficient), and unless found_inf: ++step and the step's Adam bias corrections
//       (computed in float64 as the CPU optimizer does); with found_inf: ++skipped;
//   (c) the fused update over the flat arrays (float4 loads and stores when every
//       array is 16-byte aligned), which also writes the low-precision copy of each
//       parameter (bf16/f16; none under f32); a step with found_inf changes nothing;
//   (d) with loss scaling: GradScaler.update() on the device (backoff on found_inf,
//       growth after growth_interval clean steps in a row).
// The gradients are never modified: each is multiplied by grad_scale where it is
// used (PyTorch's unscale_ multiplies in float32 by the same factor, so the update is
// the same; a loss scale is a power of 2, so unscaling then clipping, two products in
// PyTorch, is this one product exactly).
//
// Learning rate protocol. The lr (with the clip coefficient beside it) reaches the device
// by cudaMemcpyAsync from pinned host floats (so the copy can be part of a captured graph;
// the copy reads the host floats when it EXECUTES, not when it is queued):
//  * eager steps: set_lr(lr, stream) before each step() (host write + queued copy);
//  * CUDA graph: capture upload_lr(stream) once in the graph, before step() (best at
//    the graph's start); before each replay call set_lr_host(lr), which first waits
//    until the copy queued by the previous launch has executed (an event recorded
//    right after the copy, captured as an external event node), so a host that runs
//    ahead of the GPU never overwrites a value a queued replay has still to read.
//    The wait ends as soon as the previous replay has started its copy, so the host
//    stays up to one step ahead. Never call set_lr / set_lr_host while capturing.
#pragma once
#if SAT_HAVE_CUDA
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace sat {

// Per-step values, in device memory (read by the host only through the *_host calls).
struct OptimScalars {
  int64_t step = 0;            // optimizer steps applied (Adam's t); skipped steps do not count
  int64_t skipped = 0;         // steps skipped because of inf/NaN gradients
  int64_t growth_tracker = 0;  // clean steps in a row since the last loss-scale change
  float lr = 0;                // learning rate of the next step (upload_lr)
  float clip = 1;              // gradient clipping's coefficient of the next step (upload_lr, after lr)
  float grad_scale = 1;        // gradients are multiplied by this before use (clip / loss_scale)
  float loss_scale = 1;        // the loss is multiplied by this before backward (1 without scaling)
  int32_t found_inf = 0;       // this step's gradients hold inf/NaN: the step is skipped
  float step_size = 0;         // AdamW: lr / (1 - beta1^t)
  float bc2_sqrt = 1;          // AdamW: sqrt(1 - beta2^t)
  float decay = 1;             // AdamW: 1 - lr * weight_decay
};

// PyTorch's GradScaler defaults.
struct LossScaleConfig {
  float init_scale = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};

class CudaOptimizer {
 public:
  // On the current CUDA device. `lp` is the dtype of the low-precision parameter copy
  // written by step() (bf16, f16, or f32 for none); loss_scaling enables (a) and (d).
  CudaOptimizer(const OptimConfig& c, int64_t flat_size, DType lp, bool loss_scaling,
                const LossScaleConfig& ls = {});
  ~CudaOptimizer();
  CudaOptimizer(const CudaOptimizer&) = delete;
  CudaOptimizer& operator=(const CudaOptimizer&) = delete;

  // One step over the flat arrays (flat_size floats each; slots holds
  // optimizer_slots(config()) arrays back to back, may be null when there are none;
  // params_lp is flat_size values of dtype lp, ignored under f32). Capturable.
  void step(float* params, const float* grads, float* slots, void* params_lp, cudaStream_t stream);
  // A contiguous range of the update (ZeRO: this rank's shard, or one piece of it per unit):
  // n parameters at params, their gradients at grads, their state at slot offset `slot` of
  // each slot array, their low-precision copy at params_lp.
  struct Span {
    float* params;
    const float* grads;
    int64_t slot;
    int64_t n;
    void* params_lp;
  };
  // One step over spans that together cover the state (flat_size floats of each slot array,
  // of the gradients at `grads`: the inf/NaN check's range). Capturable.
  void step(const std::vector<Span>& spans, const float* grads, float* slots, cudaStream_t stream);

  // See the protocol at the top of this file. clip: the next step's gradient clipping
  // coefficient (train/grad_clip.h; 1: none), uploaded with the lr.
  void set_lr(float lr, cudaStream_t stream, float clip = 1.0f);  // set_lr_host + upload_lr; not while capturing
  void set_lr_host(float lr, float clip = 1.0f);  // host side only; may wait for the previous upload
  void upload_lr(cudaStream_t stream);            // capturable

  // params_lp = params rounded to lp (after loading parameters; step() keeps it current).
  void write_lp(const float* params, void* params_lp, cudaStream_t stream) const;

  // Device scalars, read after the work queued so far on the last stream used
  // (synchronises; never while capturing).
  OptimScalars scalars_host();
  float loss_scale_host() { return scalars_host().loss_scale; }
  int64_t skipped_steps_host() { return scalars_host().skipped; }
  int64_t steps_host() { return scalars_host().step; }
  // Replaces the device scalars (resuming from a checkpoint); synchronises.
  void set_scalars_host(const OptimScalars& s, cudaStream_t stream);

  // The current loss scale in device memory (1 without loss scaling): backward is
  // seeded with it. Updated by step (d), after the update of the same step.
  const float* loss_scale_device() const;
  const OptimScalars* scalars_device() const { return d_; }

  const OptimConfig& config() const { return c_; }
  int64_t flat_size() const { return n_; }
  DType lp_dtype() const { return lp_; }
  bool loss_scaling() const { return loss_scaling_; }

 private:
  void release() noexcept;
  void update(const Span& sp, float* slots, cudaStream_t stream);

  OptimConfig c_;
  int64_t n_;
  DType lp_;
  bool loss_scaling_;
  LossScaleConfig ls_;
  int max_blocks_ = 1;
  OptimScalars* d_ = nullptr;        // device
  float* h_lr_ = nullptr;            // pinned, source of upload_lr's copy: lr, clip
  OptimScalars* h_io_ = nullptr;     // pinned staging for scalars_host / set_scalars_host
  cudaEvent_t lr_copied_ = nullptr;  // recorded after each upload_lr copy
  cudaStream_t last_stream_ = nullptr;
};

}  // namespace sat
#endif  // SAT_HAVE_CUDA
