// Linear (fully connected), PyTorch's nn.Linear: y = x W^T + b.
//   input  x [..., in]    any leading dims, flattened to rows = numel / in
//   output y [..., out]
//   params "weight" [out, in] (PyTorch layout), "bias" [out] (when bias = true)
// GPU (linear.cu): cuBLASLt GEMMs on the activation dtype (x and the weight's low-precision
// copy), the bias fused into the forward GEMM's epilogue; dW in f32 straight from the GEMM
// (beta = 1 accumulates), db by a column-sum kernel.
// CPU under bf16 with AVX512-BF16 (linear_bf16.cpp): oneDNN's inner product on bf16 x, W
// (ctx.params_lp) and y with float32 accumulation; dW and db in float32 into the gradients.
// Default inits are PyTorch's: weight and bias U(-1/sqrt(in), 1/sqrt(in)).
// Tied weight: with tied_weight = "transformer.wte.weight" the weight is that earlier
// parameter (GPT's lm_head shares the token embedding [vocab, dim]) and there is no bias;
// the engine makes the second user accumulate into the shared gradient.
// Tensor parallelism (Megatron-LM's ColumnParallelLinear and RowParallelLinear), with
// in and out the full layer's features and the rank's part taken in setup:
//   column: this rank computes out / parts of the outputs: weight rows (and bias) split
//           along dim 0 with the given stride (qkv: 3, so each rank holds its heads' q, k
//           and v); the input is the same on every rank (after TPCopy or TPAllGather).
//   row:    this rank reads in / parts of the inputs (a column-parallel layer's output):
//           weight split along dim 1; the output is a partial sum that TPAllReduce or
//           TPReduceScatter completes; the bias is whole on every rank and added by part 0
//           only, so the sum has it once (its gradient, from the whole output gradient,
//           is the same on every rank).
// A tied column-parallel weight (the vocabulary-parallel output head) is the tied
// parameter's part, which must be split the same way.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include "nn/layer.h"

namespace sat {

struct LinearTP {
  enum class Split { none, column, row };
  Split split = Split::none;
  TPRank tp;
  int stride = 1;  // column: the output features are `stride` blocks, each split over the ranks
};

class Linear : public Layer {
 public:
  Linear(int64_t in, int64_t out, bool bias = true, std::optional<ParamInit> w_init = std::nullopt,
         std::optional<ParamInit> b_init = std::nullopt, std::string tied_weight = "", LinearTP tp = {});
  const char* kind() const override { return "Linear"; }
  bool backward_reads_output() const override { return false; }
  bool product_param(int) const override { return true; }  // the weight and the bias (cuBLASLt's epilogue)
  bool bf16_native_cpu() const override;  // oneDNN and AVX512-BF16 (linear_bf16.cpp)
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  // Zero-bubble split (nn/layer.h): dX alone, then dW and db (the float32 code only).
  bool splits_backward() const override { return !onednn_; }
  void backward_input(LayerCtx& c) override;
  SAT_CUDA_LAYER


 private:
  int64_t in_, out_;  // this rank's features (the full layer's without tensor parallelism)
  bool bias_;
  bool add_bias_;  // bias_, except on the parts > 0 of a row-parallel layer
  LinearTP tp_;
  ParamInit w_init_, b_init_;
  std::string tied_;
  // Native bf16 on the CPU (linear_bf16.cpp): oneDNN's primitives and their scratch slots;
  // null: the float32 code (OpenBLAS).
  struct Dnnl;
  std::shared_ptr<Dnnl> onednn_;
  void setup_bf16(LayerSetup& s);
  void forward_bf16(LayerCtx& c);
  void backward_bf16(LayerCtx& c);
};

}  // namespace sat
