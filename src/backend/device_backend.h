// The device seam of training: what one rank's training needs from the device it runs on,
// behind one interface with a host (CPU) and a CUDA implementation, as ggml's backends are.
// The interface is here, below everything (it names the types it passes, no more); the
// implementations are in src/device/, which builds them from the layers above (the
// optimizers of optim/, the NCCL communicators of dist/, NVML's sampler of profile/).
// Nothing in train/ asks which device it runs on; it asks this: the engine's context, where
// parameters live, the optimizer's update, the device side of the mesh's groups (NCCL twins
// on GPUs), how asynchronous collectives are ordered with the step's compute, squared norms
// for the noise scale, memory figures and the device's utilisation.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "core/tensor.h"

namespace sat {

struct CudaCtx;
struct MemoryPlan;
struct OptimConfig;
class ParamStore;
class DeviceOptimizer;
class GpuSampler;
namespace dist {
class Comm;
class Work;
}  // namespace dist

// How a step's asynchronous collectives are ordered with its compute. On the host by waiting
// for them (the default); on a GPU by events between the compute stream and the stream the
// collectives run on, with nothing waiting on the host (a step can be captured as a graph).
class StreamOrder {
 public:
  virtual ~StreamOrder() = default;
  // Before collective `i` is queued: it comes after the compute queued so far.
  virtual void before(size_t i) = 0;
  // Every collective in `works` completes before the compute queued next.
  virtual void join(std::vector<std::unique_ptr<dist::Work>>& works) = 0;
  // Whether join waits on the host (so that its time can be measured there).
  virtual bool host_waits() const = 0;
  // The end of a region that may be captured as a CUDA graph: collectives forked from the
  // compute stream inside the capture join it here, since a capture cannot end with work
  // on another stream unjoined (join() then finds them done). Nothing to do elsewhere.
  virtual void seal() {}
};

// Squared norms of gradient ranges (the gradient noise scale's inputs): add() computes (or,
// on a GPU, queues) |g|^2 of a range into a slot, take() returns every slot's sum and clears
// them (on a GPU it waits for the device). The ranges may be scaled by the fp16 loss scale.
class SquaredNorms {
 public:
  virtual ~SquaredNorms() = default;
  virtual void add(int slot, const float* g, int64_t n) = 0;
  virtual std::vector<double> take(int slots) = 0;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  virtual Device kind() const = 0;
  virtual std::string name() const = 0;             // the GPU's name; "" on the host
  virtual CudaCtx* cuda() const { return nullptr; }  // the engine's context (null on the host)

  // Memory: mark() starts counting (the bytes in use then are the base; a GPU counts from its
  // backend's creation, which allocates the context's workspace of the plan), reset_peak()
  // starts the peak again; peak_bytes() is the most in use above the base since, and
  // planned_bytes() the plan's figure to compare it with; used_bytes() what the device
  // reports used since mark() (0 where it reports nothing).
  virtual void mark() = 0;
  virtual void reset_peak() = 0;
  virtual size_t peak_bytes() const = 0;
  virtual size_t planned_bytes(const MemoryPlan& p) const = 0;
  virtual size_t used_bytes() const { return 0; }

  // Parameters: moved where the engine computes (adopt, with the activation dtype's copy), and
  // their host copies made current (to_host; on the host they are the parameters).
  virtual void adopt(ParamStore& ps, DType act) { (void)ps, (void)act; }
  virtual void to_host(ParamStore& ps) { (void)ps; }
  virtual std::unique_ptr<DeviceOptimizer> optimizer(const OptimConfig& c, ParamStore& ps) = 0;

  // The device side of a mesh group: the group itself on the host; on a GPU its NCCL twin,
  // made once and kept, ordered on the compute stream or, with own_stream, on a stream of its
  // own (the data-parallel reduction's). A group of one stays the host group unless alone.
  virtual dist::Comm& group(dist::Comm& host, bool own_stream = false, bool alone = false) {
    (void)own_stream, (void)alone;
    return host;
  }
  // Ordering of the collectives of a reduction of `events` buckets (see StreamOrder).
  virtual std::unique_ptr<StreamOrder> stream_order(size_t events) = 0;
  // pieces: the most add() calls between two take() calls. scale: the fp16 loss scale in
  // device memory the norms are divided by (null: 1).
  virtual std::unique_ptr<SquaredNorms> squared_norms(size_t pieces, const float* scale) = 0;
  // The device's utilisation sampled while training (null where none can be read).
  virtual std::unique_ptr<GpuSampler> utilization() = 0;
  virtual void synchronize() {}

  // The ZeRO paths' work on the store's memory, queued in the step's order (on a GPU on the
  // compute stream, after what StreamOrder joined): dst = src, or dst += src, over n floats
  // (a reduced bucket's piece into the gradient shard); bytes of zeros (a bucket's padding);
  // the store's low-precision copy refreshed from its parameters (after a gather).
  virtual void add_into(float* dst, const float* src, int64_t n, bool overwrite) = 0;
  virtual void zero(void* dst, size_t bytes) = 0;
  virtual void refresh_lp(ParamStore& ps) = 0;
  // Memory of `bytes` on this device (ZeRO's staging arena).
  virtual DeviceBuffer buffer(size_t bytes, const char* what) = 0;
};

}  // namespace sat
