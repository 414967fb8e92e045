#include "backend/device.h"

#include <cstdlib>
#include <fstream>

#include "core/alloc.h"
#include "core/error.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#endif

#include <cstdlib>
#include <cstring>

namespace sat {

bool cuda_built() { return SAT_HAVE_CUDA != 0; }

int cuda_device_count() {
#if SAT_HAVE_CUDA
  static int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      (void)cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return c;
  }();
  return n;
#else
  return 0;
#endif
}

std::string cuda_device_name(int device) {
#if SAT_HAVE_CUDA
  cudaDeviceProp p{};
  if (device < cuda_device_count() && cudaGetDeviceProperties(&p, device) == cudaSuccess) return p.name;
#else
  (void)device;
#endif
  return "";
}

std::string cuda_unavailable_reason() {
#if SAT_HAVE_CUDA
  int c = 0;
  cudaError_t e = cudaGetDeviceCount(&c);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice)
      return str_cat("no NVIDIA driver or GPU found (", cudaGetErrorString(e), ")");
    return cudaGetErrorString(e);
  }
  return c > 0 ? "" : "no CUDA device";
#else
  return "saturate was built without the CUDA backend";
#endif
}

size_t cuda_free_memory(int device) {
#if SAT_HAVE_CUDA
  if (cuda_device_count() <= device) return 0;
  size_t free_b = 0, total_b = 0;
  int prev = 0;
  if (cudaGetDevice(&prev) != cudaSuccess) return 0;
  if (cudaSetDevice(device) != cudaSuccess) return 0;
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = 0;
  cudaSetDevice(prev);
  return free_b;
#else
  (void)device;
  return 0;
#endif
}

void device_mem_set_budget(Device d, size_t bytes) {
  if (d == Device::cpu) return mem_set_budget(bytes);
#if SAT_HAVE_CUDA
  cuda_mem_set_budget(bytes);
#endif
}

size_t device_mem_failed(Device d) {
  if (d == Device::cpu) return mem_stats().failed;
#if SAT_HAVE_CUDA
  return cuda_mem_failed();
#else
  return 0;
#endif
}

size_t host_available_memory() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("MemAvailable:", 0) == 0) return size_t(std::strtoull(line.c_str() + 13, nullptr, 10)) * 1024;
  return 0;
}

Device resolve_device(const std::string& name, int* index) {
  int idx = 0;
  Device d;
  if (name == "auto") {
    d = cuda_device_count() > 0 ? Device::cuda : Device::cpu;
  } else if (name == "cpu") {
    d = Device::cpu;
  } else if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    d = Device::cuda;
    if (name.size() > 5) {
      char* end = nullptr;
      long v = std::strtol(name.c_str() + 5, &end, 10);
      SAT_CHECK(end && *end == 0 && v >= 0, "--device: expected cpu, cuda, cuda:N or auto, got '", name, "'");
      idx = int(v);
    }
    int n = cuda_device_count();
    SAT_CHECK(n > 0, "--device ", name, ": no usable GPU (", cuda_unavailable_reason(), ")");
    SAT_CHECK(idx < n, "--device ", name, ": only ", n, " GPU(s) present");
  } else {
    fail("--device: expected cpu, cuda, cuda:N or auto, got '", name, "'");
  }
  if (index) *index = idx;
  return d;
}

DeviceBuffer::DeviceBuffer(Device d, size_t bytes, const char* what) : n_(bytes), d_(d) {
  if (bytes == 0) return;
  if (d == Device::cpu) {
    p_ = mem_alloc(bytes, what);
    return;
  }
#if SAT_HAVE_CUDA
  p_ = cuda_alloc(bytes);
#else
  fail("internal error: GPU memory requested without the CUDA backend (", what, ")");
#endif
}

DeviceBuffer::~DeviceBuffer() {
  if (!p_) return;
  if (d_ == Device::cpu) mem_free(p_);
#if SAT_HAVE_CUDA
  else cuda_free(p_);
#endif
}

void device_copy(void* dst, Device dd, const void* src, Device sd, size_t bytes) {
  if (bytes == 0) return;
  if (dd == Device::cpu && sd == Device::cpu) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if SAT_HAVE_CUDA
  SAT_CUDA_CHECK(cudaDeviceSynchronize());
  SAT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  // From pageable memory cudaMemcpy may return before its DMA lands, and kernels on the
  // non-blocking compute streams are not ordered after it: wait for the device.
  SAT_CUDA_CHECK(cudaDeviceSynchronize());
#else
  fail("internal error: GPU copy without the CUDA backend");
#endif
}

void device_memset(void* dst, Device dev, int value, size_t bytes) {
  if (bytes == 0) return;
  if (dev == Device::cpu) {
    std::memset(dst, value, bytes);
    return;
  }
#if SAT_HAVE_CUDA
  SAT_CUDA_CHECK(cudaMemset(dst, value, bytes));
  SAT_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) {
  if (bytes == 0) return;
#if SAT_HAVE_CUDA
  if (cuda_device_count() > 0) {
    SAT_CUDA_CHECK(cudaMallocHost(&p_, bytes));
    return;
  }
#endif
  p_ = std::malloc(bytes);
  SAT_CHECK(p_, "out of host memory allocating ", bytes, " pinned bytes");
}

PinnedBuffer::~PinnedBuffer() {
  if (!p_) return;
#if SAT_HAVE_CUDA
  if (cuda_device_count() > 0) {
    cudaFreeHost(p_);
    return;
  }
#endif
  std::free(p_);
}

}  // namespace sat
