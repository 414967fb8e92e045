// Loads and stores of f32 / bf16 / f16 as float: every kernel computes in float32
// and converts at the memory boundary, so one template covers all precisions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "core/error.h"
#include "core/tensor.h"

namespace sat::cuda {

template <typename T> __device__ __forceinline__ float to_f(T v);
template <> __device__ __forceinline__ float to_f<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_f<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ __forceinline__ float to_f<__half>(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f(float v);
template <> __device__ __forceinline__ float from_f<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) { return __float2bfloat16(v); }
template <> __device__ __forceinline__ __half from_f<__half>(float v) { return __float2half(v); }

// Calls f with a null pointer of the C++ type of a floating dtype:
//   dispatch_float(t, [&](auto* tag) { using T = std::remove_pointer_t<decltype(tag)>; ... });
template <typename F>
void dispatch_float(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(static_cast<float*>(nullptr)); break;
    case DType::bf16: f(static_cast<__nv_bfloat16*>(nullptr)); break;
    case DType::f16: f(static_cast<__half*>(nullptr)); break;
    default: fail("CUDA kernel: unsupported activation dtype ", dtype_name(t));
  }
}

}  // namespace sat::cuda
