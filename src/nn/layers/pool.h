// Pooling layers, NCHW, PyTorch semantics (floor mode). GPU path in pool.cu.
#pragma once
#include <cstdint>

#include "nn/layer.h"

namespace sat {

// Max pooling over k x k windows; padded positions never win. The argmax of every
// output (flat index ih*W + iw into its input plane, as PyTorch's indices) is saved
// for backward. Ties keep the first maximum in window order; NaN propagates.
class MaxPool2d : public Layer {
 public:
  explicit MaxPool2d(int64_t kernel, int64_t stride = 0 /* = kernel */, int64_t padding = 0);

  const char* kind() const override { return "MaxPool2d"; }
  bool backward_reads_inputs() const override { return false; }
  bool backward_reads_output() const override { return false; }
  bool bf16_native_cpu() const override;  // bf16 activations read and written as they are
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

 private:
  int64_t k_, s_, p_;
  int64_t B_ = 0, C_ = 0, H_ = 0, W_ = 0, Ho_ = 0, Wo_ = 0;  // fixed by setup()
  DType act_ = DType::f32;  // activation dtype (GPU)
  template <class L> void forward_as(LayerCtx& c);  // activations stored as L::T (cpu::StoreF32, StoreBf16)
  template <class L> void backward_as(LayerCtx& c);
};

// Adaptive average pooling to [out_h, out_w]: output row i averages input rows
// [floor(i*H/out_h), ceil((i+1)*H/out_h)), likewise for columns (windows may overlap).
class AdaptiveAvgPool2d : public Layer {
 public:
  AdaptiveAvgPool2d(int64_t out_h, int64_t out_w);

  const char* kind() const override { return "AdaptiveAvgPool2d"; }
  bool backward_reads_inputs() const override { return false; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

 private:
  int64_t oh_, ow_;
  int64_t B_ = 0, C_ = 0, H_ = 0, W_ = 0;  // fixed by setup()
  DType act_ = DType::f32;  // activation dtype (GPU)
};

}  // namespace sat
