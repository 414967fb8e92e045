#include "profile/nvml.h"

#include <dlfcn.h>

#include <chrono>
#include <exception>
#include <type_traits>

#include "core/error.h"

namespace sat {
namespace {

// The few NVML types and functions used, declared here from the NVML API reference
// (nvml.h is not needed to build): every function returns nvmlReturn_t, an enum
// whose NVML_SUCCESS is 0; nvmlDevice_t is an opaque pointer.
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlUtilization_t {
  unsigned int gpu;     // % of the last sample period in which a kernel ran
  unsigned int memory;  // % of it in which device memory was read or written
};
struct nvmlMemory_t {
  unsigned long long total, free, used;  // bytes
};

struct Nvml {
  std::string error;  // why the library is unusable; "" when loaded
  nvmlReturn_t (*init)() = nullptr;                                    // nvmlInit_v2
  nvmlReturn_t (*shutdown)() = nullptr;                                // nvmlShutdown
  nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t*) = nullptr;     // nvmlDeviceGetHandleByIndex_v2
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;        // nvmlDeviceGetHandleByPciBusId_v2
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;  // nvmlDeviceGetUtilizationRates
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;            // nvmlDeviceGetMemoryInfo
  const char* (*error_string)(nvmlReturn_t) = nullptr;                      // nvmlErrorString

  std::string describe(nvmlReturn_t r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return s ? str_cat(s, " (NVML error ", r, ")") : str_cat("NVML error ", r);
  }
};

// Loaded once per process and never unloaded (samplers may live until exit).
const Nvml& nvml() {
  static const Nvml lib = [] {
    Nvml n;
    void* h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      n.error = str_cat("NVML is not available: libnvidia-ml.so.1 could not be loaded (", e ? e : "unknown error",
                        "); is the NVIDIA driver installed?");
      return n;
    }
    std::string missing;
    auto sym = [&](auto& fn, const char* name, bool required) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn && required) missing += str_cat(missing.empty() ? "" : ", ", name);
    };
    sym(n.init, "nvmlInit_v2", true);
    sym(n.shutdown, "nvmlShutdown", true);
    sym(n.by_index, "nvmlDeviceGetHandleByIndex_v2", true);
    sym(n.by_pci, "nvmlDeviceGetHandleByPciBusId_v2", false);
    sym(n.utilization, "nvmlDeviceGetUtilizationRates", true);
    sym(n.memory, "nvmlDeviceGetMemoryInfo", true);
    sym(n.error_string, "nvmlErrorString", false);
    if (!missing.empty()) n.error = str_cat("NVML is not usable: libnvidia-ml.so.1 lacks ", missing);
    return n;
  }();
  return lib;
}

}  // namespace

GpuSampler::GpuSampler(unsigned nvml_index, const std::string& pci_bus_id, int interval_ms)
    : interval_ms_(interval_ms < 1 ? 1 : interval_ms) {
  try {
    const Nvml& n = nvml();
    if (!n.error.empty()) {
      reason_ = n.error;
      return;
    }
    nvmlReturn_t r = n.init();
    if (r != kNvmlSuccess) {
      reason_ = str_cat("NVML could not be initialised: ", n.describe(r));
      return;
    }
    nvml_initialised_ = true;
    nvmlDevice_t dev = nullptr;
    if (!pci_bus_id.empty()) {
      if (!n.by_pci) {
        reason_ = "NVML is too old: libnvidia-ml.so.1 lacks nvmlDeviceGetHandleByPciBusId_v2";
        return;
      }
      r = n.by_pci(pci_bus_id.c_str(), &dev);
      if (r != kNvmlSuccess) {
        reason_ = str_cat("NVML has no GPU with PCI bus id ", pci_bus_id, ": ", n.describe(r));
        return;
      }
    } else {
      r = n.by_index(nvml_index, &dev);
      if (r != kNvmlSuccess) {
        reason_ = str_cat("NVML has no GPU ", nvml_index, ": ", n.describe(r));
        return;
      }
    }
    nvmlMemory_t m{};
    r = n.memory(dev, &m);
    if (r != kNvmlSuccess) {
      reason_ = str_cat("NVML cannot read the GPU's memory use: ", n.describe(r));
      return;
    }
    device_ = dev;
    s_.mem_total = m.total;
    available_ = true;
  } catch (const std::exception& e) {
    available_ = false;
    reason_ = str_cat("NVML: ", e.what());
  }
}

GpuSampler::~GpuSampler() {
  stop();
  if (nvml_initialised_) nvml().shutdown();  // NVML counts initialisations
}

void GpuSampler::start() {
  if (!available_ || thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = false;
    const uint64_t total = s_.mem_total;
    s_ = GpuSamples{};
    s_.mem_total = total;
    util_sum_ = 0;
  }
  try {
    thread_ = std::thread([this] { loop(); });
  } catch (const std::exception& e) {
    available_ = false;
    reason_ = str_cat("could not start the GPU sampling thread: ", e.what());
  }
}

void GpuSampler::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void GpuSampler::loop() {
  try {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      lk.unlock();
      sample();
      lk.lock();
      cv_.wait_for(lk, std::chrono::milliseconds(interval_ms_), [this] { return stop_; });
    }
  } catch (...) {
    // Sampling is best effort: a failure ends it (stats keep what was gathered).
  }
}

void GpuSampler::sample() {
  const Nvml& n = nvml();
  nvmlMemory_t m{};
  nvmlUtilization_t u{};
  const bool mem_ok = n.memory(device_, &m) == kNvmlSuccess;
  const bool util_ok = n.utilization(device_, &u) == kNvmlSuccess;
  if (!mem_ok) return;
  std::lock_guard<std::mutex> lk(mu_);
  ++s_.samples;
  s_.mem_total = m.total;
  if (m.used > s_.max_mem_used) s_.max_mem_used = m.used;
  if (util_ok) {
    ++s_.util_samples;
    util_sum_ += double(u.gpu);
    if (u.gpu > s_.max_util_pct) s_.max_util_pct = u.gpu;
  }
}

GpuSamples GpuSampler::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  GpuSamples s = s_;
  s.mean_util_pct = s.util_samples > 0 ? util_sum_ / double(s.util_samples) : 0.0;
  return s;
}

}  // namespace sat
