// Causal self-attention under context parallelism (--cp C): this rank holds two chunks of
// each sequence (chunk r and chunk 2C-1-r of 2C, nn/ring_attention.h) and attends to the
// whole sequence through a ring of key/value blocks over LayerCtx::cp_group. The result
// equals CausalSelfAttention's on the full sequence, restricted to this rank's rows.
//
//   in   qkv [B, rows, (n_head + 2 n_kv_head) hs]  (GPT's fused c_attn), or
//        q [B, rows, n_head hs], k, v [B, rows, n_kv_head hs]  (Llama's projections)
//   out  y [B, rows, n_head hs]
// rows = 2 * chunk: this rank's tokens (the sequence is rows * cp long).
//
// No parameters. Saved for backward: the log-sum-exp of every query row [B, n_head, rows]
// (probabilities are recomputed block by block, nothing rows x rows is kept; the output,
// which backward reads, is kept by the engine). Scratch: with the fused input, q, k, v as
// three contiguous tensors (forward and backward) and their gradients (backward); last, the
// ring's buffers (forward: the key/value block held and the one arriving; backward: both
// with their gradients, and delta), so the memory plan counts them. CPU only.
#pragma once
#include <cstdint>

#include "nn/layer.h"

namespace sat {

class RingSelfAttention : public Layer {
 public:
  // n_kv_head 0: n_head. cp ranks in the ring, this one at cp_rank.
  RingSelfAttention(int64_t n_head, int64_t n_kv_head, int cp, int cp_rank);
  const char* kind() const override { return "RingSelfAttention"; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;

 private:
  int64_t n_head_, n_kv_head_;
  int cp_, cp_rank_;
};

}  // namespace sat
