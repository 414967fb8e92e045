// Simple element-wise layers, in the activation dtype (f32 on the CPU; f32, bf16 or f16 on
// the GPU, computed in float32).
//   Add:     inputs a, b of one shape (a residual connection) -> a + b, same shape;
//            backward gives dout to both inputs.
//   Flatten: [B, d1, d2, ...] -> [B, d1*d2*...] (a copy: every layer owns its output buffer).
//   Dropout: same shape. Training with 0 < p: each element kept with probability 1 - p and
//            scaled by 1 / (1 - p), else zeroed. The mask is not stored: it is a hash of
//            (ctx.seed, the layer's name, element index), so forward and backward agree and a
//            re-run of the same step reproduces it. Eval mode or p == 0: identity.
#pragma once
#include <cstdint>

#include "nn/layer.h"

namespace sat {

class Add : public Layer {
 public:
  Add() = default;
  const char* kind() const override { return "Add"; }
  bool bf16_native_cpu() const override;  // bf16 tensors as they are
  bool backward_reads_inputs() const override { return false; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER
};

class Flatten : public Layer {
 public:
  Flatten() = default;
  const char* kind() const override { return "Flatten"; }
  bool bf16_native_cpu() const override;  // bf16 tensors as they are
  bool backward_reads_inputs() const override { return false; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER
};

// Context parallelism (--cp, CPU): a rank's activations hold its two chunks of each sequence
// (nn/ring_attention.h), `rows` tokens of each; cp 1: whole sequences.
struct CpRows {
  int cp = 1, rank = 0;
  int64_t rows = 0;
};

class Dropout : public Layer {
 public:
  // rows: under sequence parallelism this rank holds part `index` of the rows of the
  // activations (TPAllGather): its mask is that part of the whole tensor's mask. cp: under
  // context parallelism the rows are the rank's chunks, and the mask is theirs of the whole
  // sequences' (the width must then be even: a row holds whole pairs of draws).
  explicit Dropout(float p, TPRank rows = {}, CpRows cp = {});
  const char* kind() const override { return "Dropout"; }
  bool backward_reads_inputs() const override { return false; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER
  float p() const { return p_; }

 private:
  // out[i] = in[i] * (kept ? scale : 0); both forward (x -> y) and backward (dy -> dx).
  void apply(const LayerCtx& c, const float* src, float* dst, int64_t n) const;
#if SAT_HAVE_CUDA
  void apply_cuda(const LayerCtx& c, const Tensor& src, const Tensor& dst) const;  // the GPU twin
#endif
  float p_;
  TPRank rows_;
  uint64_t pair_offset_ = 0;  // of this rank's first element pair in the whole tensor
  CpRows cp_;
  int64_t width_ = 0, first_row_ = 0;  // --cp: a row's elements; this part's first row of the rank's
  uint64_t pair_of(int64_t k) const;   // the whole tensor's pair of this rank's pair k
  uint64_t name_hash_ = 0;  // so that two Dropout layers of one step draw different masks
};

}  // namespace sat
