// Rotary position embeddings (RoPE), Llama / GPT-NeoX's "rotate half" convention, as
// HuggingFace's apply_rotary_pos_emb with its rope_theta (10000 unless given):
//   in   x [B, T, n hs]  n heads of hs channels (hs even), token t at position t
//   out  y [B, T, n hs]  per head, with H = hs / 2, i < H and a = t * theta^(-2i / hs):
//        y[i]     = x[i] cos a - x[i + H] sin a
//        y[i + H] = x[i + H] cos a + x[i] sin a
// A layer of its own, applied to q and to k, rather than fused into the attention: the
// attention's GEMMs read q and k in place through their row stride, so a fused rotation
// would need rotated copies per head anyway; alone, it is tested by itself and leaves
// CausalSelfAttention (and the GPT models' goldens) untouched. The cost is its output, the
// rotated q and k, kept for the attention's backward.
// Backward is the inverse rotation (no saved buffers). The cos/sin table [T, hs] is
// scratch, computed in each call in float32 as PyTorch computes it (inv_freq, then t *
// inv_freq, then cos and sin). Under tensor parallelism a rank's q and k hold whole heads,
// and the sequence is whole inside the tensor-parallel region: nothing to split.
// Context parallelism (cp > 1): the input is rank cp_rank's two chunks of a sequence of
// T * cp tokens (nn/ring_attention.h), and row t is rotated by its true position in it.
// CPU only: forward_cuda/backward_cuda are the base class's, which refuse by name.
#pragma once
#include <cstdint>

#include "nn/layer.h"

namespace sat {

class Rotary : public Layer {
 public:
  explicit Rotary(int64_t head_size, float theta = 10000.0f, int cp = 1, int cp_rank = 0);
  const char* kind() const override { return "Rotary"; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;

 private:
  int64_t hs_;
  float theta_;
  int cp_, cp_rank_;
};

}  // namespace sat
