// GPU ReLU, GELU and SiLU: the CPU formulas (activation.cpp) element by element, in float32,
// loading and storing the activation dtype. GELU uses expf where the CPU uses vexp (both
// within a few ulp of exp); so does SiLU, clamping exp's argument at 88 as vexp does (an
// inf e would make the backward's e s inf * 0).
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/reduce.cuh"
#include "nn/layers/activation.h"

namespace sat {

namespace {
constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

template <typename T>
__global__ void relu_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = cuda::to_f(x[i]);
    y[i] = cuda::from_f<T>(v < 0.0f ? 0.0f : v);  // NaN passes through
  }
}

template <typename T>
__global__ void relu_bwd(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dx[i] = cuda::to_f(y[i]) > 0.0f ? dy[i] : cuda::from_f<T>(0.0f);
}

// The exact GELU (gelu(approximate='none')): x Phi(x); backward Phi(x) + x phi(x).
template <typename T>
__global__ void gelu_erf_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = cuda::to_f(x[i]);
    y[i] = cuda::from_f<T>(0.5f * v * (1.0f + erff(v * 0.70710678118654752f)));
  }
}

template <typename T>
__global__ void gelu_erf_bwd(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = cuda::to_f(x[i]);
    const float cdf = 0.5f * (1.0f + erff(v * 0.70710678118654752f)), pdf = 0.39894228040143268f * expf(-0.5f * v * v);
    dx[i] = cuda::from_f<T>(cuda::to_f(dy[i]) * (cdf + v * pdf));
  }
}

template <typename T>
__global__ void gelu_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = cuda::to_f(x[i]);
    const float u = kBeta * (v + kKappa * v * v * v);
    y[i] = cuda::from_f<T>(v / (1.0f + expf(-2.0f * u)));
  }
}

template <typename T>
__global__ void gelu_bwd(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = cuda::to_f(x[i]);
    const float v2 = v * v;
    const float u = kBeta * (v + kKappa * v2 * v);
    const float du = kBeta * (1.0f + 3.0f * kKappa * v2);
    const float sg = 1.0f / (1.0f + expf(-2.0f * u));
    dx[i] = cuda::from_f<T>(cuda::to_f(dy[i]) * (sg + 2.0f * v * sg * (1.0f - sg) * du));
  }
}

// SiLU: x / (1 + e), e = exp(min(-x, 88)); backward s (1 + x e s), s = 1 / (1 + e).
template <typename T>
__global__ void silu_fwd(const T* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = cuda::to_f(x[i]);
    y[i] = cuda::from_f<T>(v / (1.0f + expf(fminf(-v, 88.0f))));
  }
}

template <typename T>
__global__ void silu_bwd(const T* __restrict__ x, const T* __restrict__ dy, T* __restrict__ dx, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = cuda::to_f(x[i]);
    const float e = expf(fminf(-v, 88.0f)), sg = 1.0f / (1.0f + e);
    dx[i] = cuda::from_f<T>(cuda::to_f(dy[i]) * (sg * (1.0f + v * (e * sg))));
  }
}
}  // namespace

void ReLU::forward_cuda(LayerCtx& c) {
  const int64_t n = c.in[0].numel();
  if (n == 0) return;
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    relu_fwd<T><<<cuda::grid_stride_blocks(n), 256, 0, c.cuda->stream>>>(static_cast<const T*>(c.in[0].ptr),
                                                                          static_cast<T*>(c.out.ptr), n);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void ReLU::backward_cuda(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  const int64_t n = c.out.numel();
  if (n == 0) return;
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    relu_bwd<T><<<cuda::grid_stride_blocks(n), 256, 0, c.cuda->stream>>>(
        static_cast<const T*>(c.out.ptr), static_cast<const T*>(c.dout.ptr), static_cast<T*>(c.din[0].ptr), n);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void GELU::forward_cuda(LayerCtx& c) {
  const int64_t n = c.in[0].numel();
  if (n == 0) return;
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto* k = exact_ ? gelu_erf_fwd<T> : gelu_fwd<T>;
    k<<<cuda::grid_stride_blocks(n), 256, 0, c.cuda->stream>>>(static_cast<const T*>(c.in[0].ptr),
                                                                static_cast<T*>(c.out.ptr), n);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void GELU::backward_cuda(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  const int64_t n = c.in[0].numel();
  if (n == 0) return;
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    auto* k = exact_ ? gelu_erf_bwd<T> : gelu_bwd<T>;
    k<<<cuda::grid_stride_blocks(n), 256, 0, c.cuda->stream>>>(
        static_cast<const T*>(c.in[0].ptr), static_cast<const T*>(c.dout.ptr), static_cast<T*>(c.din[0].ptr), n);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void SiLU::forward_cuda(LayerCtx& c) {
  const int64_t n = c.in[0].numel();
  if (n == 0) return;
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    silu_fwd<T><<<cuda::grid_stride_blocks(n), 256, 0, c.cuda->stream>>>(static_cast<const T*>(c.in[0].ptr),
                                                                          static_cast<T*>(c.out.ptr), n);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void SiLU::backward_cuda(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  const int64_t n = c.in[0].numel();
  if (n == 0) return;
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    silu_bwd<T><<<cuda::grid_stride_blocks(n), 256, 0, c.cuda->stream>>>(
        static_cast<const T*>(c.in[0].ptr), static_cast<const T*>(c.dout.ptr), static_cast<T*>(c.din[0].ptr), n);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace sat
