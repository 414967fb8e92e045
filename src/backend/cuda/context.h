// The CUDA backend's per-device context and its check macros. Included only by code
// compiled with the backend (.cu files, and .cpp files under #if SAT_HAVE_CUDA).
//
// Every library call goes through a check macro that names the call, file and line
// (llm.c's cudaCheck); a failure throws sat::Error, so nothing is lost and the CLI
// exits cleanly with the message.
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>

#include "backend/device.h"
#include "core/error.h"
#include "core/tensor.h"

namespace sat {

[[noreturn]] void cuda_fail(const char* what, const char* call, const char* file, int line);

#define SAT_CUDA_CHECK(call)                                                       \
  do {                                                                             \
    cudaError_t sat_e_ = (call);                                                   \
    if (sat_e_ != cudaSuccess) ::sat::cuda_fail(cudaGetErrorString(sat_e_), #call, __FILE__, __LINE__); \
  } while (0)
#define SAT_CUBLAS_CHECK(call)                                                     \
  do {                                                                             \
    cublasStatus_t sat_s_ = (call);                                                \
    if (sat_s_ != CUBLAS_STATUS_SUCCESS) ::sat::cuda_fail(cublasGetStatusString(sat_s_), #call, __FILE__, __LINE__); \
  } while (0)
#define SAT_CUDNN_CHECK(call)                                                      \
  do {                                                                             \
    cudnnStatus_t sat_s_ = (call);                                                 \
    if (sat_s_ != CUDNN_STATUS_SUCCESS) ::sat::cuda_fail(cudnnGetErrorString(sat_s_), #call, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: launch-configuration errors surface here, not later.
#define SAT_CUDA_LAUNCH_CHECK() SAT_CUDA_CHECK(cudaGetLastError())

// One per device and engine. All work of a step is queued on `stream`; the input
// pipeline copies on `copy_stream`. `workspace` is a fixed scratch area for cuBLASLt
// and cuDNN (part of the memory plan), so no library allocates during a step and the
// step can be captured as a CUDA graph.
struct CudaCtx {
  int device = 0;
  cudaStream_t stream = nullptr;
  cudaStream_t copy_stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  cudnnHandle_t dnn = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  bool tf32 = false;        // --precision tf32: float32 GEMMs/convolutions on tensor cores
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
};


// Creates streams and handles on `device` and allocates the workspace (counted in
// the device memory statistics). Destroy with cuda_ctx_destroy.
CudaCtx* cuda_ctx_create(int device, size_t workspace_bytes = kCudaWorkspaceBytes);
void cuda_ctx_destroy(CudaCtx* c);

// Device memory, counted (the device twin of mem_alloc in core/alloc.h): throws
// sat::OutOfMemory naming the bytes asked for and free when cudaMalloc fails.
void* cuda_alloc(size_t bytes);
void cuda_free(void* p);
struct CudaMemStats { size_t in_use = 0, peak = 0; };
CudaMemStats cuda_mem_stats();
void cuda_mem_reset_peak();
// A budget for cuda_alloc (0 = none): beyond it, OutOfMemory before cudaMalloc is asked.
void cuda_mem_set_budget(size_t bytes);
size_t cuda_mem_failed();  // allocations refused by the budget so far

// Owns one device allocation.
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(size_t bytes) : p_(bytes ? cuda_alloc(bytes) : nullptr), n_(bytes) {}
  ~CudaBuffer() { cuda_free(p_); }
  CudaBuffer(CudaBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; o.n_ = 0; }
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    if (this != &o) { cuda_free(p_); p_ = o.p_; n_ = o.n_; o.p_ = nullptr; o.n_ = 0; }
    return *this;
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  void* get() const { return p_; }
  template <typename T> T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }
 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

namespace cuda {

// Blocks of 256 threads, enough blocks for n elements (at least 1).
inline unsigned grid_for(int64_t n, int block = 256) {
  int64_t g = (n + block - 1) / block;
  return unsigned(g < 1 ? 1 : g);
}

// Grid for a grid-stride loop over n elements with `block` threads: enough blocks to
// cover n, capped (the loop covers the rest), at least 1.
inline unsigned grid_stride_blocks(int64_t n, int block = 256) {
  int64_t g = (n + block - 1) / block;
  if (g < 1) g = 1;
  if (g > 65535 * 4) g = 65535 * 4;
  return unsigned(g);
}

// dst[i] = (dst dtype) src[i] for f32, bf16 and f16 in any combination, on `stream`.
void convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n, cudaStream_t stream);
// dst[i] = value (f32, bf16 or f16 destination).
void fill(void* dst, DType t, float value, int64_t n, cudaStream_t stream);
// dst[i] += src[i] (same float dtype), float32 arithmetic.
void add_into(void* dst, const void* src, DType t, int64_t n, cudaStream_t stream);
// *x *= *scale, both f32 scalars in device memory (seeds backward with the loss scale).
void scale_scalar(float* x, const float* scale, cudaStream_t stream);
// *out = sum(x[i]^2) / (*scale)^2 in float64 (scale: an f32 scalar in device memory, or
// null for 1), deterministic for a given n. partials: kSumSquaresPartials doubles of
// device scratch. Capturable. (The gradient noise scale's squared norms, unscaled by
// the fp16 loss scale.)
constexpr int kSumSquaresPartials = 256;
void sum_squares(const float* x, int64_t n, const float* scale, double* out, double* partials, cudaStream_t stream);

}  // namespace cuda
}  // namespace sat
