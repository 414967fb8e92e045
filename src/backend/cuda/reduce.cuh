// Warp and block reductions for kernels that reduce a row (norms, softmax, losses).
// Every reduction has a fixed order for a given block size, so results are
// deterministic run to run.
//
// block_*: every thread of the block must call it (it synchronises); blockDim.x must be
// a multiple of 32 and at most 1024 (pick it with row_threads). The result is returned
// to every thread. Consecutive calls in one kernel are safe (each starts with a barrier
// before reusing its shared slots).
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace sat::cuda {

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// fmaxf: a NaN operand is ignored; callers that must propagate NaN track it separately.
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ int warp_or(int v) {
  for (int o = 16; o > 0; o >>= 1) v |= __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T>
__device__ __forceinline__ T block_sum(T v) {
  __shared__ T sh[32];
  const int lane = int(threadIdx.x) & 31, wid = int(threadIdx.x) >> 5, nw = int(blockDim.x) >> 5;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading sh
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : T(0);
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v) {
  __shared__ float sh[32];
  const int lane = int(threadIdx.x) & 31, wid = int(threadIdx.x) >> 5, nw = int(blockDim.x) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : -INFINITY;
  return warp_max(v);
}

__device__ __forceinline__ int block_or(int v) {
  __shared__ int sh[32];
  const int lane = int(threadIdx.x) & 31, wid = int(threadIdx.x) >> 5, nw = int(blockDim.x) >> 5;
  v = warp_or(v);
  __syncthreads();
  if (lane == 0) sh[wid] = v;
  __syncthreads();
  v = lane < nw ? sh[lane] : 0;
  return warp_or(v);
}

// Threads for a block that walks a row of n elements: n rounded up to a multiple of 32,
// clamped to [32, max_threads] (max_threads a multiple of 32, <= 1024).
inline int row_threads(int64_t n, int max_threads = 512) {
  int64_t t = (n + 31) / 32 * 32;
  if (t < 32) t = 32;
  if (t > max_threads) t = max_threads;
  return int(t);
}

}  // namespace sat::cuda
