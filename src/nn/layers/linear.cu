// Linear on the GPU: y = x W^T + b as one cuBLASLt GEMM with the bias in its epilogue;
// backward dX = dY W, dW (+)= dY^T X (f32 output from act-dtype inputs) and db (+)= the
// column sums of dY. x is [rows, in] with rows = numel / in (leading dims flattened).
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/gemm.h"
#include "nn/layers/linear.h"

namespace sat {
namespace {

constexpr int kColsPerBlock = 32;
constexpr int kRowLanes = 16;

// db[j] (+)= sum_r dy[r, j] for dy [rows, cols]. One block per 32 columns: thread
// (x, y) sums rows y, y + 16, ... of column x (adjacent threads read adjacent columns),
// then thread y == 0 adds the 16 partial sums in a fixed order (deterministic).
template <typename T>
__global__ void column_sums_kernel(const T* __restrict__ dy, int64_t rows, int64_t cols, float* __restrict__ db,
                                   bool accumulate) {
  __shared__ float part[kRowLanes][kColsPerBlock + 1];
  const int64_t col = int64_t(blockIdx.x) * kColsPerBlock + threadIdx.x;
  float acc = 0.0f;
  if (col < cols)
    for (int64_t r = threadIdx.y; r < rows; r += kRowLanes) acc += cuda::to_f<T>(dy[r * cols + col]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    float s = 0.0f;
    for (int i = 0; i < kRowLanes; ++i) s += part[i][threadIdx.x];
    db[col] = accumulate ? db[col] + s : s;
  }
}

void column_sums(const void* dy, DType t, int64_t rows, int64_t cols, float* db, bool accumulate, cudaStream_t st) {
  const int64_t blocks = (cols + kColsPerBlock - 1) / kColsPerBlock;
  if (blocks <= 0) return;
  SAT_CHECK(blocks <= INT32_MAX, "Linear: too many output features for the bias-gradient kernel");
  cuda::dispatch_float(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    column_sums_kernel<T><<<unsigned(blocks), dim3(kColsPerBlock, kRowLanes), 0, st>>>(static_cast<const T*>(dy), rows,
                                                                                      cols, db, accumulate);
  });
  SAT_CUDA_LAUNCH_CHECK();
}

}  // namespace

void Linear::forward_cuda(LayerCtx& c) {
  const DType t = c.in[0].dtype;
  SAT_CHECK(c.params_lp[0].dtype == t && c.out.dtype == t, "Linear: GPU forward expects input, output and weight in ",
            dtype_name(t));
  const int64_t rows = c.in[0].numel() / in_;
  if (rows == 0) return;
  GemmEpilogue ep;
  if (add_bias_) ep.bias = c.params_lp[1].ptr;  // act dtype, the type of the output
  // Y [rows, out] = X [rows, in] W^T, W [out, in]
  cuda::gemm(c.cuda, false, true, rows, out_, in_, c.in[0].ptr, t, c.params_lp[0].ptr, t, c.out.ptr, t, 1.0f, 0.0f,
             ep);
}

void Linear::backward_cuda(LayerCtx& c) {
  const DType t = c.in[0].dtype;
  SAT_CHECK(c.dout.dtype == t && c.params_lp[0].dtype == t && c.grads[0].dtype == DType::f32,
            "Linear: GPU backward expects dout and the weight copy in ", dtype_name(t), " and f32 gradients");
  const int64_t rows = c.in[0].numel() / in_;
  cudaStream_t st = c.cuda->stream;
  // dW [out, in] (+)= dY^T [out, rows] X [rows, in], written in f32
  if (rows > 0)
    cuda::gemm(c.cuda, true, false, out_, in_, rows, c.dout.ptr, t, c.in[0].ptr, t, c.grads[0].ptr, DType::f32, 1.0f,
               c.accumulate[0] ? 1.0f : 0.0f);
  else if (!c.accumulate[0])
    SAT_CUDA_CHECK(cudaMemsetAsync(c.grads[0].ptr, 0, c.grads[0].bytes(), st));
  // db [out] (+)= column sums of dY [rows, out]
  if (bias_) column_sums(c.dout.ptr, t, rows, out_, c.grads[1].f32(), c.accumulate[1], st);
  // dX [rows, in] = dY [rows, out] W [out, in]
  if (c.din[0].defined() && rows > 0)
    cuda::gemm(c.cuda, false, false, rows, in_, out_, c.dout.ptr, t, c.params_lp[0].ptr, t, c.din[0].ptr, t, 1.0f,
               0.0f);
}

}  // namespace sat
