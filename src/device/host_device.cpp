// The host's side of the device seam: parameters, activations and collectives in host
// memory (counted by core/alloc.h), the host optimizer, collectives waited for.
#include "device/devices.h"

#include "backend/device.h"
#include "core/alloc.h"
#include "dist/comm.h"
#include "nn/engine.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "profile/nvml.h"

namespace sat {

namespace {

class HostOrder final : public StreamOrder {
 public:
  void before(size_t) override {}
  void join(std::vector<std::unique_ptr<dist::Work>>& works) override {
    for (auto& w : works) w->wait();
  }
  bool host_waits() const override { return true; }
};

double squared_norm(const float* g, int64_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return s;
}

class HostNorms final : public SquaredNorms {
 public:
  void add(int slot, const float* g, int64_t n) override {
    if (sums_.size() <= size_t(slot)) sums_.resize(size_t(slot) + 1, 0.0);
    sums_[size_t(slot)] += squared_norm(g, n);
  }
  std::vector<double> take(int slots) override {
    std::vector<double> out(size_t(slots), 0.0);
    for (size_t i = 0; i < sums_.size() && i < out.size(); ++i) out[i] = sums_[i];
    sums_.assign(sums_.size(), 0.0);
    return out;
  }

 private:
  std::vector<double> sums_;
};

// The host: parameters, activations and collectives in host memory, counted by core/alloc.h.
class HostBackend final : public DeviceBackend {
 public:
  Device kind() const override { return Device::cpu; }
  std::string name() const override { return ""; }
  void mark() override {
    base_ = mem_stats().current;
    mem_reset_peak();
  }
  void reset_peak() override { mem_reset_peak(); }
  size_t peak_bytes() const override {
    const size_t peak = mem_stats().peak;
    return peak > base_ ? peak - base_ : 0;
  }
  size_t planned_bytes(const MemoryPlan& p) const override { return p.total(); }
  // bf16: the store's host low-precision copy, which the layers read.
  void adopt(ParamStore& ps, DType act) override { ps.to_device(Device::cpu, act); }
  std::unique_ptr<DeviceOptimizer> optimizer(const OptimConfig& c, ParamStore& ps) override {
    return host_optimizer(c, ps);
  }
  std::unique_ptr<SquaredNorms> squared_norms(size_t, const float*) override { return std::make_unique<HostNorms>(); }
  std::unique_ptr<StreamOrder> stream_order(size_t) override { return host_stream_order(); }
  std::unique_ptr<GpuSampler> utilization() override { return nullptr; }

 private:
  size_t base_ = 0;
};

}  // namespace

std::unique_ptr<StreamOrder> host_stream_order() { return std::make_unique<HostOrder>(); }

std::unique_ptr<DeviceBackend> make_host_backend() { return std::make_unique<HostBackend>(); }

std::unique_ptr<DeviceBackend> make_device_backend(const std::string& device, const DeviceOptions& o) {
  int index = 0;
  if (resolve_device(device, &index) == Device::cpu) return make_host_backend();
  return make_cuda_backend(o.gpu_per_rank && device.find(':') == std::string::npos ? -1 : index, o);
}

}  // namespace sat
