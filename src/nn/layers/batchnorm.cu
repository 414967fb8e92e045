// BatchNorm2d on the GPU: the CPU layer's arithmetic (batchnorm.cpp) with one block per
// channel. A channel's statistics are block reductions in float32 over its B*H*W
// elements (two passes: mean, then the sum of squared deviations), combined in double
// like the CPU; no atomics, so results are deterministic. Activations (x, y, dx, dy)
// are in the activation dtype; weights, gradients, running statistics and the saved
// mean and 1/std are f32.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/reduce.cuh"
#include "backend/cuda/dtype.cuh"
#include "nn/layers/batchnorm.h"

namespace sat {

namespace {

constexpr int kBlock = 512;  // threads per channel block (a multiple of 32, at most 1024)

// Element i of channel ch's n = B*HW elements (image b = i / HW, pixel i % HW).
__device__ __forceinline__ int64_t chan_index(int64_t i, int64_t ch, int64_t C, int64_t HW) {
  const int64_t b = i / HW;
  return (b * C + ch) * HW + (i - b * HW);
}

// One block per channel: statistics (training: batch, updating the running ones; eval:
// running), saved mean and 1/std, then y = x * scale + shift.
template <typename T>
__global__ void bn_forward_kernel(const T* __restrict__ x, T* __restrict__ y, const float* __restrict__ w,
                                  const float* __restrict__ bias, float* __restrict__ rm, float* __restrict__ rv,
                                  float* __restrict__ mean_s, float* __restrict__ invstd_s, int64_t* nbt, int64_t B,
                                  int64_t C, int64_t HW, float eps, float momentum, bool train) {
  const int64_t ch = blockIdx.x, n = B * HW;
  double mean, invstd;  // the same value in every thread
  if (train) {
    float part = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) part += cuda::to_f<T>(x[chan_index(i, ch, C, HW)]);
    const float sum = cuda::block_sum(part);
    mean = double(sum) / double(n);
    const float mf = float(mean);
    part = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float d = cuda::to_f<T>(x[chan_index(i, ch, C, HW)]) - mf;
      part += d * d;
    }
    const double sq = double(cuda::block_sum(part));
    const double var = sq / double(n);  // biased: normalisation uses it
    invstd = 1.0 / sqrt(var + double(eps));
    if (threadIdx.x == 0) {
      const double m = momentum;
      rm[ch] = float((1.0 - m) * double(rm[ch]) + m * mean);
      rv[ch] = float((1.0 - m) * double(rv[ch]) + m * (sq / double(n - 1)));  // unbiased
      if (ch == 0) ++*nbt;
    }
  } else {
    mean = rm[ch];  // nobody writes the running statistics in eval
    invstd = 1.0 / sqrt(double(rv[ch]) + double(eps));
  }
  if (threadIdx.x == 0) {
    mean_s[ch] = float(mean);
    invstd_s[ch] = float(invstd);
  }
  const float scale = float(double(w[ch]) * invstd);
  const float shift = float(double(bias[ch]) - mean * double(w[ch]) * invstd);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t k = chan_index(i, ch, C, HW);
    y[k] = cuda::from_f<T>(cuda::to_f<T>(x[k]) * scale + shift);
  }
}

// One block per channel: dgamma, dbeta and (dx != nullptr) the input gradient.
template <typename T>
__global__ void bn_backward_kernel(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx,
                                   const float* __restrict__ w, const float* __restrict__ mean_s,
                                   const float* __restrict__ invstd_s, float* __restrict__ dw, float* __restrict__ db,
                                   int64_t B, int64_t C, int64_t HW, bool acc_w, bool acc_b, bool train) {
  const int64_t ch = blockIdx.x, n = B * HW;
  const float mean = mean_s[ch], invstd = invstd_s[ch];
  float a0 = 0.0f, a1 = 0.0f;  // sum(dy), sum(dy * (x - mean))
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t k = chan_index(i, ch, C, HW);
    const float g = cuda::to_f<T>(dy[k]);
    a0 += g;
    a1 += g * (cuda::to_f<T>(x[k]) - mean);
  }
  const double sdy = cuda::block_sum(a0);
  const double sdyx = cuda::block_sum(a1);
  const double sdy_xhat = sdyx * double(invstd);  // sum(dy * xhat)
  if (threadIdx.x == 0) {
    dw[ch] = acc_w ? dw[ch] + float(sdy_xhat) : float(sdy_xhat);
    db[ch] = acc_b ? db[ch] + float(sdy) : float(sdy);
  }
  if (!dx) return;  // uniform over the block
  const double a = double(w[ch]) * double(invstd);
  float k_dy = float(a), k_x = 0.0f, k_c = 0.0f;  // dx = k_dy*dy + k_x*(x - mean) + k_c
  if (train) {
    // dx = a * (dy - mean(dy) - xhat * mean(dy * xhat)): the batch statistics depend on x.
    k_c = float(-a * sdy / double(n));
    k_x = float(-a * double(invstd) * sdy_xhat / double(n));
  }
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t k = chan_index(i, ch, C, HW);
    dx[k] = cuda::from_f<T>(k_dy * cuda::to_f<T>(dy[k]) + k_x * (cuda::to_f<T>(x[k]) - mean) + k_c);
  }
}

}  // namespace

void BatchNorm2d::forward_cuda(LayerCtx& c) {
  const int64_t C = C_, B = B_, HW = HW_, n = B * HW;
  const bool train = c.training;
  if (train) {
    SAT_CHECK(n > 1, "BatchNorm2d: expected more than 1 value per channel when training, got input [", B, ", ",
              C, ", ", HW, " pixels]");
  }
  SAT_CHECK(c.in[0].dtype == act_ && c.out.dtype == act_, "BatchNorm2d (CUDA): input and output must be ",
            dtype_name(act_));
  cudaStream_t st = c.cuda->stream;
  cuda::dispatch_float(act_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bn_forward_kernel<T><<<unsigned(C), kBlock, 0, st>>>(
        static_cast<const T*>(c.in[0].ptr), static_cast<T*>(c.out.ptr), c.params[0].f32(), c.params[1].f32(),
        c.states[0].f32(), c.states[1].f32(), c.saved[0].f32(), c.saved[1].f32(),
        static_cast<int64_t*>(c.states[2].ptr), B, C, HW, eps_, momentum_, train);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void BatchNorm2d::backward_cuda(LayerCtx& c) {
  const int64_t C = C_, B = B_, HW = HW_;
  SAT_CHECK(c.in[0].dtype == act_ && c.dout.dtype == act_ && (!c.din[0].ptr || c.din[0].dtype == act_),
            "BatchNorm2d (CUDA): activations must be ", dtype_name(act_));
  cudaStream_t st = c.cuda->stream;
  cuda::dispatch_float(act_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    bn_backward_kernel<T><<<unsigned(C), kBlock, 0, st>>>(
        static_cast<const T*>(c.in[0].ptr), static_cast<const T*>(c.dout.ptr), static_cast<T*>(c.din[0].ptr),
        c.params[0].f32(), c.saved[0].f32(), c.saved[1].f32(), c.grads[0].f32(), c.grads[1].f32(), B, C, HW,
        c.accumulate[0], c.accumulate[1], c.training);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace sat
