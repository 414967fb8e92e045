#include "backend/device.h"

#include <cstdlib>

#include "core/error.h"

#if SAT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

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

}  // namespace sat
