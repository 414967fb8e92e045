// GPU Add, Flatten and Dropout (see elementwise.h). Flatten and Add's backward are
// device-to-device copies on the stream. Dropout draws the CPU's mask bit for bit: the same
// splitmix64 hash of (seed, layer name, element pair), with the seed read from *c.seed_dev
// (the step's seed in device memory, so a captured graph sees each step's value).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/reduce.cuh"
#include "nn/layers/elementwise.h"

namespace sat {

namespace {

// Device twins of splitmix64 and mix_seed in core/rng.h (same constants, same results).
__device__ __forceinline__ uint64_t splitmix64_dev(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
__device__ __forceinline__ uint64_t mix_seed_dev(uint64_t a, uint64_t b) {
  return splitmix64_dev(a ^ splitmix64_dev(b + 0x632BE59BD9B4E019ull));
}

template <typename T>
__global__ void add_fwd(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = cuda::from_f<T>(cuda::to_f(a[i]) + cuda::to_f(b[i]));
}

// One splitmix64 hash per pair of elements (2k, 2k+1): the low 32 bits decide element 2k,
// the high 32 bits element 2k+1; kept when the draw >= threshold (as Dropout::apply).
template <typename T>
__global__ void dropout_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t n,
                               const uint64_t* __restrict__ seed_dev, uint64_t name_hash, uint32_t threshold,
                               float scale, uint64_t pair_offset) {
  const uint64_t seed = mix_seed_dev(*seed_dev, name_hash);
  const int64_t pairs = (n + 1) / 2;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < pairs; k += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64_dev(seed + (pair_offset + uint64_t(k)) * 0x9E3779B97F4A7C15ull);
    const int64_t i = 2 * k;
    dst[i] = cuda::from_f<T>(uint32_t(h) >= threshold ? cuda::to_f(src[i]) * scale : 0.0f);
    if (i + 1 < n) dst[i + 1] = cuda::from_f<T>(uint32_t(h >> 32) >= threshold ? cuda::to_f(src[i + 1]) * scale : 0.0f);
  }
}

void copy_d2d(const Tensor& dst, const Tensor& src, cudaStream_t st) {
  SAT_ASSERT(dst.bytes() == src.bytes());
  if (dst.bytes() == 0) return;
  SAT_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, dst.bytes(), cudaMemcpyDeviceToDevice, st));
}

}  // namespace

// ---- Add ----

void Add::forward_cuda(LayerCtx& c) {
  const int64_t n = c.out.numel();
  if (n == 0) return;
  cuda::dispatch_float(c.out.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    add_fwd<T><<<cuda::grid_stride_blocks(n), 256, 0, c.cuda->stream>>>(
        static_cast<const T*>(c.in[0].ptr), static_cast<const T*>(c.in[1].ptr), static_cast<T*>(c.out.ptr), n);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void Add::backward_cuda(LayerCtx& c) {
  for (size_t i = 0; i < 2; ++i)
    if (c.din[i].defined()) copy_d2d(c.din[i], c.dout, c.cuda->stream);
}

// ---- Flatten ----

void Flatten::forward_cuda(LayerCtx& c) { copy_d2d(c.out, c.in[0], c.cuda->stream); }

void Flatten::backward_cuda(LayerCtx& c) {
  if (c.din[0].defined()) copy_d2d(c.din[0], c.dout, c.cuda->stream);
}

// ---- Dropout ----

void Dropout::apply_cuda(const LayerCtx& c, const Tensor& src, const Tensor& dst) const {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (!c.training || p_ == 0.0f) {
    copy_d2d(dst, src, c.cuda->stream);
    return;
  }
  if (p_ >= 1.0f) {  // everything dropped; all-zero bytes are +0 in f32, bf16 and f16
    SAT_CUDA_CHECK(cudaMemsetAsync(dst.ptr, 0, dst.bytes(), c.cuda->stream));
    return;
  }
  SAT_CHECK(c.seed_dev != nullptr, "Dropout: the GPU step has no device seed (LayerCtx::seed_dev)");
  const uint32_t threshold = uint32_t(std::min(4294967295.0, std::ldexp(double(p_), 32)));
  const float scale = 1.0f / (1.0f - p_);
  const int64_t pairs = (n + 1) / 2;
  cuda::dispatch_float(dst.dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    dropout_kernel<T><<<cuda::grid_stride_blocks(pairs), 256, 0, c.cuda->stream>>>(
        static_cast<const T*>(src.ptr), static_cast<T*>(dst.ptr), n, c.seed_dev, name_hash_, threshold, scale, pair_offset_);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

void Dropout::forward_cuda(LayerCtx& c) { apply_cuda(c, c.in[0], c.out); }

void Dropout::backward_cuda(LayerCtx& c) {
  if (c.din[0].defined()) apply_cuda(c, c.dout, c.din[0]);
}

}  // namespace sat
