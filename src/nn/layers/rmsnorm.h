// RMSNorm over the last dimension (Llama's LlamaRMSNorm, torch.nn.RMSNorm):
//   y = x * rsqrt(mean(x^2) + eps) * weight
//   input  x [..., dim] (rows = numel / dim), output y [..., dim]
//   params "weight" [dim] (ones)
//   saved  rstd [rows] = 1 / sqrt(mean(x^2) + eps), f32 (for backward)
// CPU only: forward_cuda/backward_cuda are the base class's, which refuse by name.
#pragma once
#include "nn/layer.h"

namespace sat {

class RMSNorm : public Layer {
 public:
  // sequence_parallel: this rank normalises part of the tokens, so its weight gradient is a
  // partial sum over the tensor-parallel group (ParamShard::partial_grad), as LayerNorm's.
  explicit RMSNorm(int64_t dim, float eps = 1e-5f, bool sequence_parallel = false);
  const char* kind() const override { return "RMSNorm"; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  // Zero-bubble split (nn/layer.h): dx alone, then dweight.
  bool splits_backward() const override { return true; }
  void backward_input(LayerCtx& c) override;

 private:
  void param_grads(LayerCtx& c);
  int64_t dim_;
  float eps_;
  bool sequence_parallel_;
};

}  // namespace sat
