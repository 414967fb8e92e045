// Linear (fully connected), PyTorch's nn.Linear: y = x W^T + b.
//   input  x [..., in]    any leading dims, flattened to rows = numel / in
//   output y [..., out]
//   params "weight" [out, in] (PyTorch layout), "bias" [out] (when bias = true)
// GPU (linear.cu): cuBLASLt GEMMs on the activation dtype (x and the weight's low-precision
// copy), the bias fused into the forward GEMM's epilogue; dW in f32 straight from the GEMM
// (beta = 1 accumulates), db by a column-sum kernel.
// Default inits are PyTorch's: weight and bias U(-1/sqrt(in), 1/sqrt(in)).
// Tied weight: with tied_weight = "transformer.wte.weight" the weight is that earlier
// parameter (GPT's lm_head shares the token embedding [vocab, dim]) and there is no bias;
// the engine makes the second user accumulate into the shared gradient.
#pragma once
#include <optional>
#include <string>

#include "nn/layer.h"

namespace sat {

class Linear : public Layer {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, std::optional<ParamInit> w_init = std::nullopt,
         std::optional<ParamInit> b_init = std::nullopt, std::string tied_weight = "");
  const char* kind() const override { return "Linear"; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return bias_; }

 private:
  int64_t in_, out_;
  bool bias_;
  ParamInit w_init_, b_init_;
  std::string tied_;
};

}  // namespace sat
