// Causal multi-head self-attention, the core of GPT-2 / nanoGPT's CausalSelfAttention
// (without its two Linear projections and without dropout), generalized to grouped-query
// attention (Llama): n_kv_head key/value heads shared by groups of n_head / n_kv_head
// query heads (query head h reads key/value head h / (n_head / n_kv_head)). n_kv_head =
// n_head (the default) is ordinary multi-head attention, computed exactly as before.
//
//   in   qkv [B, T, 3C]  the output of c_attn: q = qkv[..., 0:C], k = qkv[..., C:2C],
//                        v = qkv[..., 2C:3C]; head h uses channels h*hs .. (h+1)*hs
//                        of each, hs = C / n_head.
//   out  y   [B, T, C]   y[b, t, h*hs + j] = sum_{s <= t} P[b, h, t, s] v[b, s, h*hs + j],
//                        P = softmax(q k^T / sqrt(hs) + causal mask) per row.
// Grouped (CPU only: a GPU setup plans it, the GPU kernels refuse it yet), either input form:
//   in   qkv [B, T, (n_head + 2 n_kv_head) hs]  q, then k, then v, each head-major;
//   or   q [B, T, n_head hs], k [B, T, n_kv_head hs], v [B, T, n_kv_head hs] (three
//        inputs: Llama's separate q_proj, k_proj, v_proj, which tensor parallelism splits
//        column-wise with stride 1; a fused GQA projection's q, k and v blocks differ in
//        width, which ParamShard's equal-block stride cannot describe);
//   out  y [B, T, n_head hs].
// Backward loops over (batch, key/value head) and the group's query heads in turn, so
// that dk and dv accumulate over the group without atomics.
//
// No parameters. Memory:
//  * training: the probabilities P [B, n_head, T, T] f32 are saved for backward
//    (B * n_head * T^2 * 4 bytes: 2 MiB for gpt-mini B=8, T=128, 4 heads; 384 MiB for
//    GPT-2 small at B=8, T=1024, 12 heads). Only the causal lower triangle is meaningful;
//    the upper triangle is stored as zeros. Backward scratch: dS [slots, T, T].
//  * inference (setup with training=false): P is forward scratch [slots, T, T] instead.
//  * selective recomputation (recompute = true, training; runs on the CPU only: the GPU
//    plans it, P [B, n_head, T, T] recomputed into backward scratch, but its backward
//    refuses it, so that a planner can weigh it on any machine): P is not saved. Forward
//    computes it into forward scratch [slots, T, T] as inference does, and backward
//    recomputes each head's P from q and k (kept: they are the input) into backward
//    scratch [slots, T, T], beside dS, with the same code as forward, so backward sees
//    bitwise the same P. It costs the q k^T GEMMs and the softmax again: half the
//    forward's FLOPs (not counted in flops_bwd, which stays the model's).
//  slots = min(sat::cpu::num_threads() at setup time, B * n_head): one T x T matrix per
//  thread; forward/backward never run more threads than there are slots.
// CPU: one OpenMP loop over (batch, head); per head, single-threaded BLAS GEMMs on row
// blocks of the causal triangle, and vectorized softmax rows (see attention.cpp).
// GPU (attention.cu, buffers declared only when set up for Device::cuda): q, k, v are
// copied per head into scratch [3, B, n_head, T, hs]; strided-batched cuBLASLt GEMMs over
// all B * n_head heads compute the full T x T scores in f32, a causal softmax kernel
// (float32 math) writes P in the activation dtype (zeros above the diagonal; saved when
// training), and y = P v is copied back to [B, T, C]. Backward: dv = P^T dy, dP = dy v^T
// (f32), dS = P * (dP - rowsum(dP * P)) / sqrt(hs) in the activation dtype, dq = dS k,
// dk = dS^T q. Scratch per call: forward 4 B T C activations plus the f32 scores
// [B, n_head, T, T] (none under f32: computed in P); backward 7 B T C activations plus
// dP f32 and dS [B, n_head, T, T] (dS in place in dP under f32).
#pragma once
#include <cstdint>

#include "nn/layer.h"

namespace sat {

class CausalSelfAttention : public Layer {
 public:
  // n_kv_head 0: n_head (multi-head attention); else n_head % n_kv_head == 0.
  explicit CausalSelfAttention(int64_t n_head, bool recompute = false, int64_t n_kv_head = 0);
  const char* kind() const override { return "CausalSelfAttention"; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER
  int64_t n_head() const { return n_head_; }
  int64_t n_kv_head() const { return n_kv_head_; }
  bool recompute() const { return recompute_; }

 private:
  int64_t n_head_, n_kv_head_;
  bool recompute_;
};

}  // namespace sat
