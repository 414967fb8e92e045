// LayerNorm over the last dimension, PyTorch's nn.LayerNorm(dim, eps):
//   y = (x - mean) / sqrt(var + eps) * weight + bias, var biased (divided by dim).
//   input  x [..., dim] (rows = numel / dim), output y [..., dim]
//   params "weight" [dim] (ones), "bias" [dim] (zeros)
//   saved  mean [rows], rstd [rows] = 1 / sqrt(var + eps)  (for backward), always f32
// x and y have the activation dtype (f32 on the CPU); statistics are float32 on both devices.
// On the GPU, backward also declares two scratch buffers [grad_chunks(rows), dim]: per-chunk
// partial sums of dweight and dbias, added up in a second kernel (deterministic, no atomics).
#pragma once
#include "nn/layer.h"

namespace sat {

class LayerNorm : public Layer {
 public:
  // sequence_parallel: this rank normalises part of the tokens, so its weight and bias
  // gradients are partial sums over the tensor-parallel group (ParamShard::partial_grad).
  explicit LayerNorm(int64_t dim, float eps = 1e-5f, bool sequence_parallel = false);
  const char* kind() const override { return "LayerNorm"; }
  bool backward_reads_output() const override { return false; }
  bool bf16_native_cpu() const override;  // bf16 activations read and written as they are
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  // Zero-bubble split (nn/layer.h): dx alone, then dweight and dbias (CPU).
  bool splits_backward() const override { return true; }
  void backward_input(LayerCtx& c) override;
  SAT_CUDA_LAYER
  // Row chunks of the GPU's two-stage parameter-gradient reduction (>= 1).
  static int64_t grad_chunks(int64_t rows) {
    const int64_t k = (rows + 63) / 64;  // chunks of at least ~64 rows
    return k < 1 ? 1 : (k > 128 ? 128 : k);
  }

 private:
  int64_t dim_;
  float eps_;
  bool sequence_parallel_;
  template <class L> void forward_as(LayerCtx& c);  // activations stored as L::T (cpu::StoreF32, StoreBf16)
  template <class L> void backward_as(LayerCtx& c);
  template <class L> void input_grad_as(LayerCtx& c);
  template <class L> void param_grads_as(LayerCtx& c);
};

}  // namespace sat
