#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "core/alloc.h"

namespace sat {

void cuda_fail(const char* what, const char* call, const char* file, int line) {
  int dev = -1;
  cudaGetDevice(&dev);
  throw Error(str_cat("CUDA error on device ", dev, ": ", what, " (", call, " at ", file, ":", line, ")"));
}

namespace {
std::mutex g_mu;
std::unordered_map<void*, size_t> g_sizes;
size_t g_in_use = 0, g_peak = 0, g_budget = 0, g_failed = 0;
}  // namespace

void cuda_mem_set_budget(size_t bytes) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_budget = bytes;
}

size_t cuda_mem_failed() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_failed;
}

void* cuda_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_budget && g_in_use + bytes > g_budget) {
      ++g_failed;
      throw OutOfMemory(str_cat("out of memory: allocating ", format_bytes(double(bytes)),
                                " on the GPU would exceed the memory budget of ", format_bytes(double(g_budget)),
                                " (", format_bytes(double(g_in_use)), " in use)"));
    }
  }
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    throw OutOfMemory(str_cat("out of GPU memory: asked for ", format_bytes(bytes), ", ", format_bytes(free_b),
                              " free of ", format_bytes(total_b), " (", cudaGetErrorString(e), ")"));
  }
  std::lock_guard<std::mutex> lk(g_mu);
  g_sizes[p] = bytes;
  g_in_use += bytes;
  if (g_in_use > g_peak) g_peak = g_in_use;
  return p;
}

void cuda_free(void* p) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_sizes.find(p);
    if (it != g_sizes.end()) {
      g_in_use -= it->second;
      g_sizes.erase(it);
    }
  }
  cudaFree(p);
}

CudaMemStats cuda_mem_stats() {
  std::lock_guard<std::mutex> lk(g_mu);
  return {g_in_use, g_peak};
}

void cuda_mem_reset_peak() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_peak = g_in_use;
}

CudaCtx* cuda_ctx_create(int device, size_t workspace_bytes) {
  SAT_CUDA_CHECK(cudaSetDevice(device));
  auto* c = new CudaCtx;
  c->device = device;
  try {
    cudaDeviceProp p{};
    SAT_CUDA_CHECK(cudaGetDeviceProperties(&p, device));
    c->sm_count = p.multiProcessorCount;
    c->cc_major = p.major;
    c->cc_minor = p.minor;
    SAT_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    SAT_CUDA_CHECK(cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking));
    SAT_CUBLAS_CHECK(cublasLtCreate(&c->lt));
    SAT_CUBLAS_CHECK(cublasCreate(&c->blas));
    SAT_CUBLAS_CHECK(cublasSetStream(c->blas, c->stream));
    SAT_CUDNN_CHECK(cudnnCreate(&c->dnn));
    SAT_CUDNN_CHECK(cudnnSetStream(c->dnn, c->stream));
    c->workspace_bytes = workspace_bytes;
    c->workspace = cuda_alloc(workspace_bytes);
    // cuBLAS (batched attention GEMMs) gets the same fixed workspace: it must not
    // allocate while a graph is being captured.
    SAT_CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->workspace, c->workspace_bytes));
  } catch (...) {
    cuda_ctx_destroy(c);
    throw;
  }
  return c;
}

void cuda_ctx_destroy(CudaCtx* c) {
  if (!c) return;
  if (c->stream) cudaStreamSynchronize(c->stream);
  if (c->dnn) cudnnDestroy(c->dnn);
  if (c->blas) cublasDestroy(c->blas);
  if (c->lt) cublasLtDestroy(c->lt);
  if (c->copy_stream) cudaStreamDestroy(c->copy_stream);
  if (c->stream) cudaStreamDestroy(c->stream);
  cuda_free(c->workspace);
  delete c;
}

}  // namespace sat
#endif  // SAT_HAVE_CUDA
