// GPU utilisation and memory sampling through NVML, loaded at run time with dlopen
// ("libnvidia-ml.so.1", installed with the NVIDIA driver), so the engine needs no NVML
// header or library to build and runs unchanged where there is none. Always compiled.
//
// GpuSampler samples one GPU every interval (100 ms by default) on a background
// thread between start() and stop(). Without the library, a driver or the GPU it is
// asked for, available() is false, reason() says why, and start()/stop() do nothing.
// Nothing here throws or crashes. Note that NVML numbers GPUs in its own (PCI) order,
// which ignores CUDA_VISIBLE_DEVICES; pass the CUDA device's PCI bus id
// (cudaDeviceGetPCIBusId) to sample exactly the GPU the engine runs on.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace sat {

struct GpuSamples {
  int64_t samples = 0;            // samples taken (memory read successfully)
  int64_t util_samples = 0;       // of which the utilisation was read too (not under MIG)
  double mean_util_pct = 0;       // mean GPU utilisation over util_samples, in %
  uint32_t max_util_pct = 0;
  uint64_t max_mem_used = 0;      // bytes, the largest used memory seen
  uint64_t mem_total = 0;         // bytes
};

class GpuSampler {
 public:
  // The GPU with NVML index `nvml_index`, or, when pci_bus_id is not empty, the GPU
  // with that PCI bus id ("0000:3B:00.0", as cudaDeviceGetPCIBusId writes it).
  explicit GpuSampler(unsigned nvml_index = 0, const std::string& pci_bus_id = "", int interval_ms = 100);
  ~GpuSampler();  // stops
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  bool available() const { return available_; }
  const std::string& reason() const { return reason_; }  // why not available; "" if it is

  // start() clears the statistics and samples at once, then every interval;
  // stop() joins the thread. Both are no-ops when unavailable (or already so).
  void start();
  void stop();
  bool running() const { return thread_.joinable(); }
  GpuSamples stats() const;  // so far (while running) or of the last run

 private:
  void sample();
  void loop();

  bool available_ = false;
  std::string reason_;
  void* device_ = nullptr;  // nvmlDevice_t
  bool nvml_initialised_ = false;
  int interval_ms_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  GpuSamples s_;
  double util_sum_ = 0;
};

}  // namespace sat
