// LayerNorm over the last dimension, PyTorch's nn.LayerNorm(dim, eps):
//   y = (x - mean) / sqrt(var + eps) * weight + bias, var biased (divided by dim).
//   input  x [..., dim] (rows = numel / dim), output y [..., dim]
//   params "weight" [dim] (ones), "bias" [dim] (zeros)
//   saved  mean [rows], rstd [rows] = 1 / sqrt(var + eps)  (for backward)
#pragma once
#include "nn/layer.h"

namespace sat {

class LayerNorm : public Layer {
 public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  const char* kind() const override { return "LayerNorm"; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;

 private:
  int64_t dim_;
  float eps_;
};

}  // namespace sat
