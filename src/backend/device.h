// Which devices this process can use. Always compiled: without the CUDA backend (or
// without a driver or GPU) the answer is simply "no GPU", and the engine uses the CPU.
#pragma once
#include <string>
#include <utility>

#include "core/tensor.h"

namespace sat {

// cuBLASLt/cuDNN workspace per CUDA context: 32 MiB (cuBLASLt's advice for Hopper).
constexpr size_t kCudaWorkspaceBytes = size_t(32) << 20;
// The fused optimizer's scalars on the device (sizeof(OptimScalars): step, learning rate,
// loss scale...), one block per CUDA optimizer; planned with the workspace.
constexpr size_t kCudaStepScalarsBytes = 56;

bool cuda_built();            // the binary contains the CUDA backend
int cuda_device_count();      // 0 without the backend, a driver or a GPU
std::string cuda_device_name(int device);  // "NVIDIA H100 80GB HBM3"
// The reason no GPU is usable ("no CUDA driver", "built without CUDA", ...); "" if one is.
std::string cuda_unavailable_reason();
// Free memory on GPU `device` in bytes (cudaMemGetInfo); 0 without a usable GPU.
size_t cuda_free_memory(int device);
// The memory budget of a device's allocations (0 = none): host buffers (core/alloc.h)
// or GPU buffers. An allocation beyond it throws OutOfMemory and is counted in
// device_mem_failed().
void device_mem_set_budget(Device d, size_t bytes);
size_t device_mem_failed(Device d);
// Available host memory (MemAvailable of /proc/meminfo); 0 when unknown.
size_t host_available_memory();

// The --device choice: "cpu", "cuda", "cuda:N" or "auto" (cuda when a GPU is present).
// Throws sat::Error naming --device for an unknown name or a missing GPU.
Device resolve_device(const std::string& name, int* index = nullptr);

// Memory on a device: host memory (counted by core/alloc.h) or GPU memory (counted
// by the CUDA backend). Lets device-agnostic code (the engine, the parameter store)
// own buffers without CUDA headers.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device d, size_t bytes, const char* what);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept { swap(o); return *this; }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return p_; }
  template <typename T> T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }
  Device device() const { return d_; }
 private:
  void swap(DeviceBuffer& o) noexcept { std::swap(p_, o.p_); std::swap(n_, o.n_); std::swap(d_, o.d_); }
  void* p_ = nullptr;
  size_t n_ = 0;
  Device d_ = Device::cpu;
};

// Synchronous copy between any two devices (a whole-device barrier on the GPU side:
// for setup, checkpoints and tests, not for the training step).
void device_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes);
void device_memset(void* dst, Device dev, int value, size_t bytes);

// Page-locked host memory (plain host memory without the CUDA backend): staging for
// asynchronous copies and values a captured CUDA graph reads at every replay.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept { std::swap(p_, o.p_); std::swap(n_, o.n_); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept { std::swap(p_, o.p_); std::swap(n_, o.n_); return *this; }
  void* data() const { return p_; }
  template <typename T> T* as() const { return static_cast<T*>(p_); }
  size_t bytes() const { return n_; }
 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace sat
