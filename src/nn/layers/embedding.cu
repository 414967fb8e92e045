// GPU Embedding and GPTEmbedding (see embedding.h). Forward gathers rows of the f32
// weights into the activation dtype, one thread per output element. Backward scatter-adds
// dout rows into the f32 weight gradient with atomicAdd (repeated ids add up; the order,
// and so the last bits, may vary run to run), after zeroing it unless accumulating. The
// position gradient of GPTEmbedding is a plain per-(t, feature) sum over the batch, in order.
// Ids outside [0, num) (the datasets validate them, see embedding.h) give NaN rows and no
// gradient instead of an out-of-bounds access.
#include <cmath>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/reduce.cuh"
#include "nn/layers/embedding.h"

namespace sat {

namespace {

// y[i, j] = w[idx[i] - lo, j] (+ wpe[i % T, j] when wpe is given), i < n, j < D; w holds
// rows [lo, lo + rows) of a vocabulary of num (vocabulary parallel: ids of other ranks'
// rows give zero, plus the positions).
template <typename T>
__global__ void embed_fwd(const int32_t* __restrict__ idx, const float* __restrict__ w,
                          const float* __restrict__ wpe, T* __restrict__ y, int64_t n, int64_t D, int64_t num,
                          int64_t T_len, int64_t lo, int64_t rows) {
  const int64_t total = n * D;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / D, j = e - i * D;
    const int64_t id = idx[i];
    float v;
    if (id >= 0 && id < num) {
      const int64_t row = id - lo;
      v = row >= 0 && row < rows ? w[row * D + j] : 0.0f;
      if (wpe != nullptr) v = v + wpe[(i % T_len) * D + j];
    } else {
      v = NAN;
    }
    y[e] = cuda::from_f<T>(v);
  }
}

// dw[idx[i] - lo, j] += dy[i, j] for ids in [lo, lo + rows).
template <typename T>
__global__ void embed_scatter_add(const int32_t* __restrict__ idx, const T* __restrict__ dy, float* __restrict__ dw,
                                  int64_t n, int64_t D, int64_t lo, int64_t rows) {
  const int64_t total = n * D;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / D, j = e - i * D;
    const int64_t row = int64_t(idx[i]) - lo;
    if (row >= 0 && row < rows) atomicAdd(dw + row * D + j, cuda::to_f(dy[e]));
  }
}

// dwpe[t, j] = (acc ? dwpe[t, j] : 0) + sum_b dy[b, t, j] for t < T; rows t >= T are zeroed
// unless accumulating (as the CPU).
template <typename T>
__global__ void wpe_grad(const T* __restrict__ dy, float* __restrict__ dwpe, int64_t B, int64_t T_len,
                         int64_t max_t, int64_t D, bool acc) {
  const int64_t total = max_t * D;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e / D, j = e - t * D;
    float g = acc ? dwpe[e] : 0.0f;
    if (t < T_len)
      for (int64_t b = 0; b < B; ++b) g += cuda::to_f(dy[(b * T_len + t) * D + j]);
    dwpe[e] = g;
  }
}

void gather(const LayerCtx& c, const float* wpe, int64_t n, int64_t D, int64_t num, int64_t T_len, int64_t lo = 0,
            int64_t rows = -1) {
  if (rows < 0) rows = num;
  const int64_t total = n * D;
  if (total == 0) return;
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    embed_fwd<T><<<cuda::grid_stride_blocks(total), 256, 0, c.cuda->stream>>>(
        c.in[0].i32(), c.params[0].f32(), wpe, static_cast<T*>(c.out.ptr), n, D, num, T_len, lo, rows);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

// Zeroes grads[0] unless accumulating, then scatter-adds dout into it.
void scatter(const LayerCtx& c, int64_t n, int64_t D, int64_t lo, int64_t rows) {
  cudaStream_t st = c.cuda->stream;
  if (!c.accumulate[0]) SAT_CUDA_CHECK(cudaMemsetAsync(c.grads[0].ptr, 0, c.grads[0].bytes(), st));
  const int64_t total = n * D;
  if (total == 0) return;
  cuda::dispatch_float(c.dout.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    embed_scatter_add<T><<<cuda::grid_stride_blocks(total), 256, 0, st>>>(
        c.in[0].i32(), static_cast<const T*>(c.dout.ptr), c.grads[0].f32(), n, D, lo, rows);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace

// ---- Embedding ----

// Rows [lo_, lo_ + rows_) of the vocabulary (all of it unless vocabulary parallel).
void Embedding::forward_cuda(LayerCtx& c) { gather(c, nullptr, c.in[0].numel(), dim_, num_, 1, lo_, rows_); }

void Embedding::backward_cuda(LayerCtx& c) { scatter(c, c.in[0].numel(), dim_, lo_, rows_); }

// ---- GPTEmbedding ----

void GPTEmbedding::forward_cuda(LayerCtx& c) {
  const int64_t T_len = c.in[0].shape[1];
  gather(c, tp_.index == 0 ? c.params[1].f32() : nullptr, c.in[0].numel(), dim_, vocab_, T_len < 1 ? 1 : T_len, lo_,
         rows_);
}

void GPTEmbedding::backward_cuda(LayerCtx& c) {
  const int64_t B = c.in[0].shape[0], T_len = c.in[0].shape[1], D = dim_;
  scatter(c, B * T_len, D, lo_, rows_);
  const int64_t total = max_t_ * D;
  cuda::dispatch_float(c.dout.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    wpe_grad<T><<<cuda::grid_stride_blocks(total), 256, 0, c.cuda->stream>>>(
        static_cast<const T*>(c.dout.ptr), c.grads[1].f32(), B, T_len, max_t_, D, c.accumulate[1]);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace sat
