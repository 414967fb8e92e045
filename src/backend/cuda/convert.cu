// Dtype conversion and fill: the glue of mixed precision (inputs to bf16, parameters
// to their low-precision copies, results back to f32 for checks).
#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/reduce.cuh"

#include <type_traits>

namespace sat::cuda {
namespace {

template <typename S, typename D>
__global__ void convert_kernel(const S* __restrict__ s, D* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = from_f<D>(to_f<S>(s[i]));
}

template <typename D>
__global__ void fill_kernel(D* __restrict__ d, float v, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = from_f<D>(v);
}

template <typename T>
__global__ void add_kernel(T* __restrict__ d, const T* __restrict__ s, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    d[i] = from_f<T>(to_f<T>(d[i]) + to_f<T>(s[i]));
}

__global__ void scale_scalar_kernel(float* x, const float* scale) { *x *= *scale; }

// Sum of squares in two fixed-shape stages (kSumSquaresPartials blocks, then one), so the
// result does not depend on timing: the same input gives the same double every run.
__global__ void sumsq_partial_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ partials) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void sumsq_final_kernel(const double* __restrict__ partials, int np, const float* scale, double* out) {
  double s = 0;
  for (int i = int(threadIdx.x); i < np; i += int(blockDim.x)) s += partials[i];
  s = block_sum(s);
  if (threadIdx.x == 0) {
    const double k = scale ? double(*scale) : 1.0;
    *out = s / (k * k);
  }
}

template <typename S>
void convert_from(const S* s, void* d, DType dt, int64_t n, cudaStream_t st) {
  switch (dt) {
    case DType::f32: convert_kernel<<<grid_stride_blocks(n), 256, 0, st>>>(s, static_cast<float*>(d), n); break;
    case DType::bf16: convert_kernel<<<grid_stride_blocks(n), 256, 0, st>>>(s, static_cast<__nv_bfloat16*>(d), n); break;
    case DType::f16: convert_kernel<<<grid_stride_blocks(n), 256, 0, st>>>(s, static_cast<__half*>(d), n); break;
    default: fail("cuda::convert: unsupported destination dtype ", dtype_name(dt));
  }
  SAT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void convert(const void* src, DType st, void* dst, DType dt, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (st == dt) {
    SAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(st), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  switch (st) {
    case DType::f32: convert_from(static_cast<const float*>(src), dst, dt, n, stream); break;
    case DType::bf16: convert_from(static_cast<const __nv_bfloat16*>(src), dst, dt, n, stream); break;
    case DType::f16: convert_from(static_cast<const __half*>(src), dst, dt, n, stream); break;
    default: fail("cuda::convert: unsupported source dtype ", dtype_name(st));
  }
}

void fill(void* dst, DType t, float value, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  switch (t) {
    case DType::f32: fill_kernel<<<grid_stride_blocks(n), 256, 0, stream>>>(static_cast<float*>(dst), value, n); break;
    case DType::bf16: fill_kernel<<<grid_stride_blocks(n), 256, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), value, n); break;
    case DType::f16: fill_kernel<<<grid_stride_blocks(n), 256, 0, stream>>>(static_cast<__half*>(dst), value, n); break;
    default: fail("cuda::fill: unsupported dtype ", dtype_name(t));
  }
  SAT_CUDA_LAUNCH_CHECK();
}

void add_into(void* dst, const void* src, DType t, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  dispatch_float(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_kernel<<<grid_stride_blocks(n), 256, 0, stream>>>(static_cast<T*>(dst), static_cast<const T*>(src), n);
  });
  SAT_CUDA_LAUNCH_CHECK();
}

void scale_scalar(float* x, const float* scale, cudaStream_t stream) {
  scale_scalar_kernel<<<1, 1, 0, stream>>>(x, scale);
  SAT_CUDA_LAUNCH_CHECK();
}

void sum_squares(const float* x, int64_t n, const float* scale, double* out, double* partials, cudaStream_t stream) {
  sumsq_partial_kernel<<<kSumSquaresPartials, 256, 0, stream>>>(x, n, partials);
  SAT_CUDA_LAUNCH_CHECK();
  sumsq_final_kernel<<<1, 256, 0, stream>>>(partials, kSumSquaresPartials, scale, out);
  SAT_CUDA_LAUNCH_CHECK();
}

}  // namespace sat::cuda
