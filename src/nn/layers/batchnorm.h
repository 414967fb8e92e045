// BatchNorm2d with PyTorch's semantics: batch statistics (biased variance) in training,
// running statistics in eval; running_var is updated with the unbiased variance.
// GPU path in batchnorm.cu (our own kernels, one block per channel).
#pragma once
#include <cstdint>

#include "nn/layer.h"

namespace sat {

class BatchNorm2d : public Layer {
 public:
  explicit BatchNorm2d(int64_t channels, float eps = 1e-5f, float momentum = 0.1f);

  const char* kind() const override { return "BatchNorm2d"; }
  bool backward_reads_output() const override { return false; }
  bool bf16_native_cpu() const override;  // bf16 activations read and written as they are
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

  int64_t channels() const { return C_; }

 private:
  int64_t C_;
  float eps_, momentum_;
  int64_t B_ = 0, HW_ = 0;  // fixed by setup()
  DType act_ = DType::f32;  // activation dtype (GPU: x, y, dx, dy)
  // The CPU code over activations stored as L::T (float32, or bf16 under native bf16).
  template <class L> void forward_as(LayerCtx& c);
  template <class L> void backward_as(LayerCtx& c);
};

}  // namespace sat
