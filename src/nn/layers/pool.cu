// MaxPool2d and AdaptiveAvgPool2d on the GPU, the CPU layers' arithmetic (pool.cpp):
// forward one thread per output element; backward one thread per INPUT element, which
// gathers the gradients of the outputs whose windows hold it (overlapping windows need
// no atomics, din is overwritten once per element, and the terms are added in the CPU's
// order, ascending output index, so f32 results match the CPU bit for bit).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "nn/layers/pool.h"

namespace sat {

namespace {

constexpr int kBlock = 256;

__device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

#define SAT_GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

// ---------------------------------------------------------------- MaxPool2d

// y = max over the window (padding never wins), arg = its flat index ih*W + iw in the
// input plane; ties keep the first maximum in window order, NaN propagates (the last NaN
// is the one recorded, as on the CPU).
template <typename T>
__global__ void maxpool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int32_t* __restrict__ arg,
                                   int64_t total, int64_t H, int64_t W, int64_t Ho, int64_t Wo, int64_t k, int64_t s,
                                   int64_t p) {
  SAT_GRID_STRIDE(i, total) {
    const int64_t ow = i % Wo, t = i / Wo, oh = t % Ho, pl = t / Ho;
    const T* xp = x + pl * H * W;
    const int64_t h0 = imax(oh * s - p, 0), h1 = imin(oh * s - p + k, H);
    const int64_t w0 = imax(ow * s - p, 0), w1 = imin(ow * s - p + k, W);
    float best = -INFINITY;
    int64_t bi = h0 * W + w0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) {
        const float v = cuda::to_f<T>(xp[ih * W + iw]);
        if ((v > best) || (v != v)) {
          best = v;
          bi = ih * W + iw;
        }
      }
    y[i] = cuda::from_f<T>(best);
    arg[i] = int32_t(bi);
  }
}

// dx[ih, iw] = sum of dy over the outputs whose argmax is (ih, iw). The outputs whose
// window holds row ih are oh in [ceil((ih+p-k+1)/s), floor((ih+p)/s)]; the range is
// widened by one on each side (clamped), the argmax test keeps only the right ones.
template <typename T>
__global__ void maxpool_bwd_kernel(const T* __restrict__ dy, const int32_t* __restrict__ arg, T* __restrict__ dx,
                                   int64_t total, int64_t H, int64_t W, int64_t Ho, int64_t Wo, int64_t k, int64_t s,
                                   int64_t p) {
  SAT_GRID_STRIDE(i, total) {
    const int64_t iw = i % W, t = i / W, ih = t % H, pl = t / H;
    const int64_t th = ih + p - k + 1, tw = iw + p - k + 1;
    const int64_t oh_lo = imax((th > 0 ? (th + s - 1) / s : 0) - 1, 0);
    const int64_t oh_hi = imin((ih + p) / s + 1, Ho - 1);
    const int64_t ow_lo = imax((tw > 0 ? (tw + s - 1) / s : 0) - 1, 0);
    const int64_t ow_hi = imin((iw + p) / s + 1, Wo - 1);
    const int32_t me = int32_t(ih * W + iw);
    const int64_t base = pl * Ho * Wo;
    float acc = 0.0f;
    for (int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const int64_t j = base + oh * Wo + ow;
        if (arg[j] == me) acc += cuda::to_f<T>(dy[j]);
      }
    dx[i] = cuda::from_f<T>(acc);
  }
}

// ------------------------------------------------------- AdaptiveAvgPool2d

__device__ __forceinline__ int64_t win_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
__device__ __forceinline__ int64_t win_end(int64_t i, int64_t in, int64_t out) {
  return ((i + 1) * in + out - 1) / out;
}

template <typename T>
__global__ void avgpool_fwd_kernel(const T* __restrict__ x, T* __restrict__ y, int64_t total, int64_t H, int64_t W,
                                   int64_t OH, int64_t OW) {
  SAT_GRID_STRIDE(i, total) {
    const int64_t oj = i % OW, t = i / OW, oi = t % OH, pl = t / OH;
    const T* xp = x + pl * H * W;
    const int64_t h0 = win_start(oi, H, OH), h1 = win_end(oi, H, OH);
    const int64_t w0 = win_start(oj, W, OW), w1 = win_end(oj, W, OW);
    float sum = 0.0f;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) sum += cuda::to_f<T>(xp[ih * W + iw]);
    y[i] = cuda::from_f<T>(sum / float((h1 - h0) * (w1 - w0)));
  }
}

// dx[ih, iw] = sum over the outputs (oi, oj) whose window holds it of dy / window size.
// Output rows holding input row ih: oi in [floor(ih*OH/H), ceil((ih+1)*OH/H) - 1];
// widened by one on each side (clamped), each window is tested explicitly.
template <typename T>
__global__ void avgpool_bwd_kernel(const T* __restrict__ dy, T* __restrict__ dx, int64_t total, int64_t H, int64_t W,
                                   int64_t OH, int64_t OW) {
  SAT_GRID_STRIDE(i, total) {
    const int64_t iw = i % W, t = i / W, ih = t % H, pl = t / H;
    const int64_t oi_lo = imax(ih * OH / H - 1, 0);
    const int64_t oi_hi = imin(((ih + 1) * OH + H - 1) / H, OH - 1);
    const int64_t oj_lo = imax(iw * OW / W - 1, 0);
    const int64_t oj_hi = imin(((iw + 1) * OW + W - 1) / W, OW - 1);
    const T* g = dy + pl * OH * OW;
    float acc = 0.0f;
    for (int64_t oi = oi_lo; oi <= oi_hi; ++oi) {
      const int64_t h0 = win_start(oi, H, OH), h1 = win_end(oi, H, OH);
      if (ih < h0 || ih >= h1) continue;
      for (int64_t oj = oj_lo; oj <= oj_hi; ++oj) {
        const int64_t w0 = win_start(oj, W, OW), w1 = win_end(oj, W, OW);
        if (iw < w0 || iw >= w1) continue;
        acc += cuda::to_f<T>(g[oi * OW + oj]) / float((h1 - h0) * (w1 - w0));
      }
    }
    dx[i] = cuda::from_f<T>(acc);
  }
}

#undef SAT_GRID_STRIDE

}  // namespace

void MaxPool2d::forward_cuda(LayerCtx& c) {
  SAT_CHECK(c.in[0].dtype == act_ && c.out.dtype == act_, "MaxPool2d (CUDA): input and output must be ",
            dtype_name(act_));
  const int64_t total = B_ * C_ * Ho_ * Wo_;
  if (total == 0) return;
  cudaStream_t st = c.cuda->stream;
  cuda::dispatch_float(act_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    maxpool_fwd_kernel<T><<<cuda::grid_stride_blocks(total, kBlock), kBlock, 0, st>>>(static_cast<const T*>(c.in[0].ptr),
                                                                 static_cast<T*>(c.out.ptr), c.saved[0].i32(), total,
                                                                 H_, W_, Ho_, Wo_, k_, s_, p_);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void MaxPool2d::backward_cuda(LayerCtx& c) {
  if (!c.din[0].ptr) return;
  SAT_CHECK(c.dout.dtype == act_ && c.din[0].dtype == act_, "MaxPool2d (CUDA): gradients must be ",
            dtype_name(act_));
  const int64_t total = B_ * C_ * H_ * W_;
  if (total == 0) return;
  cudaStream_t st = c.cuda->stream;
  cuda::dispatch_float(act_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    maxpool_bwd_kernel<T><<<cuda::grid_stride_blocks(total, kBlock), kBlock, 0, st>>>(static_cast<const T*>(c.dout.ptr),
                                                                 c.saved[0].i32(), static_cast<T*>(c.din[0].ptr),
                                                                 total, H_, W_, Ho_, Wo_, k_, s_, p_);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void AdaptiveAvgPool2d::forward_cuda(LayerCtx& c) {
  SAT_CHECK(c.in[0].dtype == act_ && c.out.dtype == act_, "AdaptiveAvgPool2d (CUDA): input and output must be ",
            dtype_name(act_));
  const int64_t total = B_ * C_ * oh_ * ow_;
  if (total == 0) return;
  cudaStream_t st = c.cuda->stream;
  cuda::dispatch_float(act_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    avgpool_fwd_kernel<T><<<cuda::grid_stride_blocks(total, kBlock), kBlock, 0, st>>>(static_cast<const T*>(c.in[0].ptr),
                                                                 static_cast<T*>(c.out.ptr), total, H_, W_, oh_, ow_);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void AdaptiveAvgPool2d::backward_cuda(LayerCtx& c) {
  if (!c.din[0].ptr) return;
  SAT_CHECK(c.dout.dtype == act_ && c.din[0].dtype == act_, "AdaptiveAvgPool2d (CUDA): gradients must be ",
            dtype_name(act_));
  const int64_t total = B_ * C_ * H_ * W_;
  if (total == 0) return;
  cudaStream_t st = c.cuda->stream;
  cuda::dispatch_float(act_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    avgpool_bwd_kernel<T><<<cuda::grid_stride_blocks(total, kBlock), kBlock, 0, st>>>(static_cast<const T*>(c.dout.ptr),
                                                                 static_cast<T*>(c.din[0].ptr), total, H_, W_, oh_,
                                                                 ow_);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace sat
