// CausalSelfAttention on the GPU (see attention.h): per-head copies of q, k, v, then
// strided-batched GEMMs over all B * n_head heads, with causal softmax kernels between
// them. Every product covers the full T x T square; P and dS are zero above the
// diagonal, so the masked entries contribute nothing.
#include <cmath>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/gemm.h"
#include "nn/layers/attention.h"

namespace sat {
namespace {

// dst [W, B, H, T, D] <- src [B, T, W, H, D] (qkv: W = 3; dy: W = 1).
template <typename T>
__global__ void split_heads_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t B, int64_t Tn, int64_t W,
                                   int64_t H, int64_t D) {
  const int64_t n = W * B * H * Tn * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i;
    const int64_t d = r % D; r /= D;
    const int64_t t = r % Tn; r /= Tn;
    const int64_t h = r % H; r /= H;
    const int64_t b = r % B;
    const int64_t w = r / B;
    dst[i] = src[((b * Tn + t) * W + w) * H * D + h * D + d];
  }
}

// dst [B, T, W, H, D] <- src [W, B, H, T, D] (the inverse of split_heads).
template <typename T>
__global__ void merge_heads_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t B, int64_t Tn, int64_t W,
                                   int64_t H, int64_t D) {
  const int64_t n = W * B * H * Tn * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t r = i;
    const int64_t d = r % D; r /= D;
    const int64_t h = r % H; r /= H;
    const int64_t w = r % W; r /= W;
    const int64_t t = r % Tn;
    const int64_t b = r / Tn;
    dst[i] = src[(((w * B + b) * H + h) * Tn + t) * D + d];
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

constexpr int kBlock = 256;  // threads per block: 8 warps, one row each

// One warp per row of the scores S [rows, T] (rows = B * nh * T; the query index is
// row % T): P[j] = softmax(S[0..i])[j] for j <= i, 0 above. S and P may be the same
// buffer (f32): each lane reads all of its elements before the reductions and then
// writes only the elements it reads itself.
template <typename T>
__global__ void causal_softmax_kernel(const float* S, T* P, int64_t rows, int64_t Tn) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x & 31);
  if (row >= rows) return;  // whole warps leave together
  const int64_t i = row % Tn;
  const float* s = S + row * Tn;
  T* p = P + row * Tn;
  float m = -INFINITY;
  for (int64_t j = lane; j <= i; j += 32) m = fmaxf(m, s[j]);
  m = warp_max(m);
  float sum = 0.0f;
  for (int64_t j = lane; j <= i; j += 32) sum += expf(s[j] - m);
  sum = warp_sum(sum);
  const float inv = 1.0f / sum;
  for (int64_t j = lane; j < Tn; j += 32) p[j] = cuda::from_f<T>(j <= i ? expf(s[j] - m) * inv : 0.0f);
}

// One warp per row: dS[j] = P[j] * (dP[j] - sum_{k<=i} dP[k] P[k]) * scale for j <= i,
// 0 above. dP and dS may be the same buffer (f32), as in the softmax above.
template <typename T>
__global__ void causal_softmax_backward_kernel(const T* P, const float* dP, T* dS, int64_t rows, int64_t Tn,
                                               float scale) {
  const int64_t row = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x & 31);
  if (row >= rows) return;
  const int64_t i = row % Tn;
  const T* p = P + row * Tn;
  const float* g = dP + row * Tn;
  T* out = dS + row * Tn;
  float dot = 0.0f;
  for (int64_t j = lane; j <= i; j += 32) dot += g[j] * cuda::to_f<T>(p[j]);
  dot = warp_sum(dot);
  for (int64_t j = lane; j < Tn; j += 32)
    out[j] = cuda::from_f<T>(j <= i ? cuda::to_f<T>(p[j]) * (g[j] - dot) * scale : 0.0f);
}

unsigned row_blocks(int64_t rows) {
  const int64_t warps = kBlock / 32;
  const int64_t g = (rows + warps - 1) / warps;
  SAT_CHECK(g <= INT32_MAX, "CausalSelfAttention: too many rows for the softmax kernel");
  return unsigned(g < 1 ? 1 : g);
}

struct Dims {
  int64_t B, T, C, nh, hs;
};

Dims dims_of(const Tensor& qkv, int64_t nh) {
  const int64_t C = qkv.shape[2] / 3;
  return {qkv.shape[0], qkv.shape[1], C, nh, C / nh};
}

// Pointer to element `i` of a buffer of dtype t.
void* at(void* p, DType t, int64_t i) { return static_cast<char*>(p) + i * int64_t(dtype_size(t)); }

}  // namespace

void CausalSelfAttention::forward_cuda(LayerCtx& c) {
  SAT_CHECK(c.in.size() == 1 && n_kv_head_ == n_head_, "CausalSelfAttention: grouped-query attention (n_kv_head < "
            "n_head) and separate q, k, v inputs need the CPU engine for now (the GPU kernels take one fused qkv)");
  const Dims d = dims_of(c.in[0], n_head_);
  const DType t = c.in[0].dtype;
  SAT_CHECK(c.out.dtype == t, "CausalSelfAttention: GPU output dtype differs from the input's");
  const int64_t T = d.T, hs = d.hs, heads = d.B * d.nh, hsz = heads * T * hs;
  const float scale = 1.0f / std::sqrt(float(hs));
  cudaStream_t st = c.cuda->stream;
  const bool keep = !c.saved.empty();
  void* qkvh = c.scratch[0].ptr;  // [3, B, nh, T, hs]
  void* yh = c.scratch[1].ptr;    // [B, nh, T, hs]
  void* P = keep ? c.saved[0].ptr : c.scratch[2].ptr;  // [B, nh, T, T], dtype t
  const size_t s_slot = keep ? 2 : 3;
  float* S = t == DType::f32 ? static_cast<float*>(P) : c.scratch[s_slot].f32();  // scores, f32
  void* q = qkvh;
  void* k = at(qkvh, t, hsz);
  void* v = at(qkvh, t, 2 * hsz);

  cuda::dispatch_float(t, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    split_heads_kernel<E><<<cuda::grid_stride_blocks(3 * hsz), 256, 0, st>>>(static_cast<const E*>(c.in[0].ptr),
                                                               static_cast<E*>(qkvh), d.B, T, 3, d.nh, hs);
  });
  SAT_CUDA_LAUNCH_CHECK();
  // S = q k^T / sqrt(hs), per head [T, T] in f32
  cuda::gemm_batched(c.cuda, false, true, T, T, hs, q, t, T * hs, k, t, T * hs, S, DType::f32, T * T, heads, scale,
                     0.0f);
  cuda::dispatch_float(t, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    causal_softmax_kernel<E><<<row_blocks(heads * T), kBlock, 0, st>>>(S, static_cast<E*>(P), heads * T, T);
  });
  SAT_CUDA_LAUNCH_CHECK();
  // y = P v, per head [T, hs]
  cuda::gemm_batched(c.cuda, false, false, T, hs, T, P, t, T * T, v, t, T * hs, yh, t, T * hs, heads, 1.0f, 0.0f);
  cuda::dispatch_float(t, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    merge_heads_kernel<E><<<cuda::grid_stride_blocks(hsz), 256, 0, st>>>(static_cast<const E*>(yh), static_cast<E*>(c.out.ptr),
                                                           d.B, T, 1, d.nh, hs);
  });
  SAT_CUDA_LAUNCH_CHECK();
}

void CausalSelfAttention::backward_cuda(LayerCtx& c) {
  SAT_CHECK(c.in.size() == 1 && n_kv_head_ == n_head_, "CausalSelfAttention: grouped-query attention (n_kv_head < "
            "n_head) and separate q, k, v inputs need the CPU engine for now (the GPU kernels take one fused qkv)");
  if (!c.din[0].defined()) return;
  SAT_CHECK(!recompute_, "CausalSelfAttention: selective recomputation (--recompute selective) needs the CPU engine "
            "for now (the GPU kernels do not recompute the probabilities yet)");
  SAT_CHECK(!c.saved.empty(), "CausalSelfAttention: backward called on a layer set up without training");
  const Dims d = dims_of(c.in[0], n_head_);
  const DType t = c.in[0].dtype;
  SAT_CHECK(c.dout.dtype == t && c.din[0].dtype == t, "CausalSelfAttention: GPU gradients must have the input's dtype");
  const int64_t T = d.T, hs = d.hs, heads = d.B * d.nh, hsz = heads * T * hs;
  const float scale = 1.0f / std::sqrt(float(hs));
  cudaStream_t st = c.cuda->stream;
  const void* P = c.saved[0].ptr;    // [B, nh, T, T], dtype t, zero above the diagonal
  void* qkvh = c.scratch[0].ptr;     // [3, B, nh, T, hs]
  void* dyh = c.scratch[1].ptr;      // [B, nh, T, hs]
  void* dqkvh = c.scratch[2].ptr;    // [3, B, nh, T, hs]
  float* dP = c.scratch[3].f32();    // [B, nh, T, T]
  void* dS = t == DType::f32 ? static_cast<void*>(dP) : c.scratch[4].ptr;  // dtype t
  void* q = qkvh;
  void* k = at(qkvh, t, hsz);
  void* v = at(qkvh, t, 2 * hsz);
  void* dq = dqkvh;
  void* dk = at(dqkvh, t, hsz);
  void* dv = at(dqkvh, t, 2 * hsz);

  cuda::dispatch_float(t, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    split_heads_kernel<E><<<cuda::grid_stride_blocks(3 * hsz), 256, 0, st>>>(static_cast<const E*>(c.in[0].ptr),
                                                               static_cast<E*>(qkvh), d.B, T, 3, d.nh, hs);
    SAT_CUDA_LAUNCH_CHECK();
    split_heads_kernel<E><<<cuda::grid_stride_blocks(hsz), 256, 0, st>>>(static_cast<const E*>(c.dout.ptr), static_cast<E*>(dyh),
                                                           d.B, T, 1, d.nh, hs);
    SAT_CUDA_LAUNCH_CHECK();
  });
  // dv = P^T dy, per head [T, hs]
  cuda::gemm_batched(c.cuda, true, false, T, hs, T, P, t, T * T, dyh, t, T * hs, dv, t, T * hs, heads, 1.0f, 0.0f);
  // dP = dy v^T, per head [T, T] in f32
  cuda::gemm_batched(c.cuda, false, true, T, T, hs, dyh, t, T * hs, v, t, T * hs, dP, DType::f32, T * T, heads, 1.0f,
                     0.0f);
  // dS = P * (dP - rowsum(dP * P)) / sqrt(hs), zero above the diagonal
  cuda::dispatch_float(t, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    causal_softmax_backward_kernel<E><<<row_blocks(heads * T), kBlock, 0, st>>>(
        static_cast<const E*>(P), dP, static_cast<E*>(dS), heads * T, T, scale);
  });
  SAT_CUDA_LAUNCH_CHECK();
  // dq = dS k, dk = dS^T q, per head [T, hs]
  cuda::gemm_batched(c.cuda, false, false, T, hs, T, dS, t, T * T, k, t, T * hs, dq, t, T * hs, heads, 1.0f, 0.0f);
  cuda::gemm_batched(c.cuda, true, false, T, hs, T, dS, t, T * T, q, t, T * hs, dk, t, T * hs, heads, 1.0f, 0.0f);
  cuda::dispatch_float(t, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    merge_heads_kernel<E><<<cuda::grid_stride_blocks(3 * hsz), 256, 0, st>>>(static_cast<const E*>(dqkvh),
                                                               static_cast<E*>(c.din[0].ptr), d.B, T, 3, d.nh, hs);
  });
  SAT_CUDA_LAUNCH_CHECK();
}

}  // namespace sat
