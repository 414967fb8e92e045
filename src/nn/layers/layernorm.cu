// GPU LayerNorm (see layernorm.h and the CPU formulas in layernorm.cpp).
//   forward:  one block per row; two passes (mean, then mean of squared deviations) in
//             float32, as the CPU; saves mean and rstd (f32).
//   backward: din one block per row; dweight/dbias in two deterministic stages: partial sums
//             over chunks of rows into scratch (one thread per feature column and row lane),
//             then one thread per feature adds the chunks in order (in double, as the CPU).
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/reduce.cuh"
#include "nn/layers/layernorm.h"

namespace sat {

namespace {

template <typename T>
__global__ void ln_fwd(const T* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
                       T* __restrict__ y, float* __restrict__ mean, float* __restrict__ rstd, int64_t D, float eps) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  T* yr = y + r * D;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) s += cuda::to_f(xr[j]);
  const float m = cuda::block_sum(s) / float(D);
  float q = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float d = cuda::to_f(xr[j]) - m;
    q += d * d;
  }
  const float rs = 1.0f / sqrtf(cuda::block_sum(q) / float(D) + eps);
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) yr[j] = cuda::from_f<T>((cuda::to_f(xr[j]) - m) * rs * w[j] + b[j]);
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy * weight.
template <typename T>
__global__ void ln_bwd_dx(const T* __restrict__ x, const float* __restrict__ w, const T* __restrict__ dy,
                          const float* __restrict__ mean, const float* __restrict__ rstd, T* __restrict__ dx,
                          int64_t D) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * D;
  const T* dyr = dy + r * D;
  T* dxr = dx + r * D;
  const float m = mean[r], rs = rstd[r];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float g = cuda::to_f(dyr[j]) * w[j];
    sg += g;
    sgx += g * (cuda::to_f(xr[j]) - m) * rs;
  }
  const float mg = cuda::block_sum(sg) / float(D);
  const float mgx = cuda::block_sum(sgx) / float(D);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xh = (cuda::to_f(xr[j]) - m) * rs;
    dxr[j] = cuda::from_f<T>(rs * (cuda::to_f(dyr[j]) * w[j] - mg - xh * mgx));
  }
}

// Stage 1 of dweight/dbias. Block (32, kLanes): threadIdx.x is a feature column of the
// block's 32, threadIdx.y a row lane; blockIdx.y a chunk of rows_per_chunk rows. Writes
// pw/pb[chunk, col] = sum over the chunk's rows of dy * xhat and dy (zero for an empty chunk).
constexpr int kLanes = 8;

template <typename T>
__global__ void ln_bwd_partial(const T* __restrict__ x, const T* __restrict__ dy, const float* __restrict__ mean,
                               const float* __restrict__ rstd, float* __restrict__ pw, float* __restrict__ pb,
                               int64_t rows, int64_t D, int64_t rows_per_chunk) {
  __shared__ float sw[kLanes][32], sb[kLanes][32];
  const int64_t j = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float aw = 0.0f, ab = 0.0f;
  if (j < D)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kLanes) {
      const float g = cuda::to_f(dy[r * D + j]);
      aw += g * ((cuda::to_f(x[r * D + j]) - mean[r]) * rstd[r]);
      ab += g;
    }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && j < D) {
    float tw = 0.0f, tb = 0.0f;
    for (int l = 0; l < kLanes; ++l) {
      tw += sw[l][threadIdx.x];
      tb += sb[l][threadIdx.x];
    }
    pw[chunk * D + j] = tw;
    pb[chunk * D + j] = tb;
  }
}

// Stage 2: dw[j] = (acc ? dw[j] : 0) + sum over chunks of pw[., j] (and the same for db).
__global__ void ln_bwd_final(const float* __restrict__ pw, const float* __restrict__ pb, float* __restrict__ dw,
                             float* __restrict__ db, int64_t chunks, int64_t D, bool acc_w, bool acc_b) {
  for (int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; j < D; j += int64_t(gridDim.x) * blockDim.x) {
    double tw = 0.0, tb = 0.0;
    for (int64_t k = 0; k < chunks; ++k) {
      tw += double(pw[k * D + j]);
      tb += double(pb[k * D + j]);
    }
    dw[j] = float((acc_w ? double(dw[j]) : 0.0) + tw);
    db[j] = float((acc_b ? double(db[j]) : 0.0) + tb);
  }
}

}  // namespace

void LayerNorm::forward_cuda(LayerCtx& c) {
  const int64_t D = dim_, rows = c.in[0].numel() / D;
  if (rows == 0) return;
  SAT_CHECK(rows < (int64_t(1) << 31), "LayerNorm: ", rows, " rows exceed the GPU grid limit");
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ln_fwd<T><<<unsigned(rows), cuda::row_threads(D), 0, c.cuda->stream>>>(
        static_cast<const T*>(c.in[0].ptr), c.params[0].f32(), c.params[1].f32(), static_cast<T*>(c.out.ptr),
        c.saved[0].f32(), c.saved[1].f32(), D, eps_);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void LayerNorm::backward_cuda(LayerCtx& c) {
  const int64_t D = dim_, rows = c.in[0].numel() / D;
  const int64_t chunks = grad_chunks(rows);
  const int64_t rows_per_chunk = rows == 0 ? 1 : (rows + chunks - 1) / chunks;
  SAT_ASSERT(c.scratch.size() >= 2 && c.scratch[0].numel() == chunks * D && c.scratch[1].numel() == chunks * D);
  cudaStream_t st = c.cuda->stream;
  cuda::dispatch_float(c.in[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* x = static_cast<const T*>(c.in[0].ptr);
    const T* dy = static_cast<const T*>(c.dout.ptr);
    if (c.din[0].defined() && rows > 0) {
      ln_bwd_dx<T><<<unsigned(rows), cuda::row_threads(D), 0, st>>>(x, c.params[0].f32(), dy, c.saved[0].f32(),
                                                                    c.saved[1].f32(), static_cast<T*>(c.din[0].ptr), D);
      SAT_CUDA_LAUNCH_CHECK();
    }
    const dim3 grid(unsigned((D + 31) / 32), unsigned(chunks));
    ln_bwd_partial<T><<<grid, dim3(32, kLanes), 0, st>>>(x, dy, c.saved[0].f32(), c.saved[1].f32(),
                                                          c.scratch[0].f32(), c.scratch[1].f32(), rows, D,
                                                          rows_per_chunk);
    SAT_CUDA_LAUNCH_CHECK();
  });
  ln_bwd_final<<<cuda::grid_stride_blocks(D), 256, 0, st>>>(c.scratch[0].f32(), c.scratch[1].f32(), c.grads[0].f32(),
                                                             c.grads[1].f32(), chunks, D, c.accumulate[0],
                                                             c.accumulate[1]);
  SAT_CUDA_LAUNCH_CHECK();
}

}  // namespace sat
