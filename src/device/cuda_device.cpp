// The CUDA side of the device seam (backend/device_backend.h): a context per rank, parameters
// on the GPU with the activation dtype's copy, the fused optimizer, NCCL twins of the mesh's
// groups, events between the compute stream and the data-parallel reduction's, squared
// norms on the device, and NVML's utilisation.
#include "device/devices.h"

#include "core/error.h"

#if SAT_HAVE_CUDA
#include <map>

#include "backend/cuda/context.h"
#include "dist/comm.h"
#include "dist/nccl_comm.h"
#include "nn/engine.h"
#include "nn/params.h"
#include "optim/optimizer_cuda.h"
#include "profile/nvml.h"

namespace sat {

namespace {

// CudaOptimizer over a store on the GPU, on the compute stream. It updates what the store's
// update spans say (ZeRO-1: this rank's shard of the flat arrays; ZeRO-2: its piece of every
// unit; ZeRO-3: its shard arrays) and writes the low-precision copy of what it updated.
class GpuOptimizer final : public DeviceOptimizer {
 public:
  GpuOptimizer(const OptimConfig& c, ParamStore& ps, DType act, bool loss_scaling, cudaStream_t stream)
      : opt_(c, ps.shard_len(), act, loss_scaling), ps_(ps), stream_(stream) {
    const size_t lp_size = dtype_size(ps.lp_dtype());
    for (const UpdateSpan& u : ps.update_spans())
      spans_.push_back({u.p, u.g, u.slot, u.n, static_cast<uint8_t*>(ps.flat_lp()) + (u.p - ps.flat_params()) * lp_size});
    // The gradients of the state's range (the inf/NaN check): this rank's shard of them.
    grads_ = ps.flat_grads() + (ps.sharding().stage >= 2 ? 0 : ps.shard_begin());
  }
  void set_lr(float lr) override { lr_ = lr; }
  void set_grad_scale(float s) override { clip_ = s; }
  void step() override {
    opt_.set_lr(lr_, stream_, clip_);
    opt_.step(spans_, grads_, ps_.optimizer_slots() ? ps_.flat_slot(0) : nullptr, stream_);
  }
  const OptimConfig& config() const override { return opt_.config(); }
  int64_t steps() const override { return const_cast<CudaOptimizer&>(opt_).steps_host(); }
  void set_steps(int64_t t) override {
    OptimScalars s = opt_.scalars_host();
    s.step = t;
    opt_.set_scalars_host(s, stream_);
  }
  const float* loss_scale_device() const override { return opt_.loss_scaling() ? opt_.loss_scale_device() : nullptr; }
  int64_t skipped_steps() override { return opt_.scalars_host().skipped; }
  double loss_scale() override { return opt_.scalars_host().loss_scale; }

 private:
  CudaOptimizer opt_;
  ParamStore& ps_;
  std::vector<CudaOptimizer::Span> spans_;
  const float* grads_ = nullptr;
  cudaStream_t stream_;
  float lr_ = 0, clip_ = 1;
};

// Bucket i's all-reduce waits for an event recorded on the compute stream; the compute
// stream waits for the last one before the update.
class GpuStreamOrder final : public StreamOrder {
 public:
  GpuStreamOrder(size_t events, cudaStream_t compute, cudaStream_t comm) : compute_(compute), comm_(comm) {
    ready_.resize(events);
    for (auto& e : ready_) SAT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    SAT_CUDA_CHECK(cudaEventCreateWithFlags(&reduced_, cudaEventDisableTiming));
  }
  ~GpuStreamOrder() override {
    for (auto e : ready_) cudaEventDestroy(e);
    if (reduced_) cudaEventDestroy(reduced_);
  }
  void before(size_t i) override {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    SAT_CUDA_CHECK(cudaStreamIsCapturing(compute_, &cs));
    forked_in_capture_ |= cs == cudaStreamCaptureStatusActive;
    SAT_CUDA_CHECK(cudaEventRecord(ready_.at(i), compute_));
    SAT_CUDA_CHECK(cudaStreamWaitEvent(comm_, ready_[i], 0));
  }
  void seal() override {
    if (!forked_in_capture_) return;
    forked_in_capture_ = false;
    SAT_CUDA_CHECK(cudaEventRecord(reduced_, comm_));
    SAT_CUDA_CHECK(cudaStreamWaitEvent(compute_, reduced_, 0));
  }
  void join(std::vector<std::unique_ptr<dist::Work>>&) override {
    SAT_CUDA_CHECK(cudaEventRecord(reduced_, comm_));
    SAT_CUDA_CHECK(cudaStreamWaitEvent(compute_, reduced_, 0));
  }
  bool host_waits() const override { return false; }

 private:
  cudaStream_t compute_, comm_;
  std::vector<cudaEvent_t> ready_;
  cudaEvent_t reduced_ = nullptr;
  bool forked_in_capture_ = false;  // before() forked comm_ from a capturing compute_
};

// One device double per add(), summed per slot on the host by take().
class GpuNorms final : public SquaredNorms {
 public:
  GpuNorms(size_t pieces, const float* scale, cudaStream_t stream) : scale_(scale), stream_(stream) {
    SAT_CUDA_CHECK(cudaMalloc(&sums_, std::max<size_t>(1, pieces) * sizeof(double)));
    SAT_CUDA_CHECK(cudaMalloc(&partials_, cuda::kSumSquaresPartials * sizeof(double)));
    capacity_ = std::max<size_t>(1, pieces);
  }
  ~GpuNorms() override {
    cudaFree(sums_);
    cudaFree(partials_);
  }
  void add(int slot, const float* g, int64_t n) override {
    SAT_CHECK(slot_of_.size() < capacity_, "internal error: more squared norms than planned");
    cuda::sum_squares(g, n, scale_, sums_ + slot_of_.size(), partials_, stream_);
    slot_of_.push_back(slot);
  }
  std::vector<double> take(int slots) override {
    std::vector<double> v(slot_of_.size()), out(size_t(slots), 0.0);
    // (the compute stream does not block: cudaMemcpy alone would not wait for the sums)
    SAT_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (!v.empty()) SAT_CUDA_CHECK(cudaMemcpy(v.data(), sums_, v.size() * sizeof(double), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < v.size(); ++i)
      if (slot_of_[i] < slots) out[size_t(slot_of_[i])] += v[i];
    slot_of_.clear();
    return out;
  }

 private:
  const float* scale_;
  cudaStream_t stream_;
  double* sums_ = nullptr;
  double* partials_ = nullptr;
  size_t capacity_ = 1;
  std::vector<int> slot_of_;  // the slot of each queued sum, in order
};

class CudaBackend final : public DeviceBackend {
 public:
  CudaBackend(int index, const DeviceOptions& o) : o_(o) {
    if (index < 0) index = dist::local_rank_gpu("--device cuda");
    SAT_CUDA_CHECK(cudaSetDevice(index));
    size_t total = 0;  // the GPU's memory counts from here: the context's workspace is in the plan
    SAT_CUDA_CHECK(cudaMemGetInfo(&free_before_, &total));
    cuda_mem_reset_peak();
    ctx_ = cuda_ctx_create(index);
    ctx_->tf32 = o.tf32;
  }
  ~CudaBackend() override {
    twins_.clear();  // before the streams their operations are ordered on
    if (comm_stream_) cudaStreamDestroy(comm_stream_);
    cuda_ctx_destroy(ctx_);
  }
  Device kind() const override { return Device::cuda; }
  std::string name() const override { return cuda_device_name(ctx_->device); }
  CudaCtx* cuda() const override { return ctx_; }

  void mark() override {}  // counted from the backend's creation
  void reset_peak() override { cuda_mem_reset_peak(); }
  size_t peak_bytes() const override { return cuda_mem_stats().peak; }
  size_t planned_bytes(const MemoryPlan& p) const override { return p.device; }
  size_t used_bytes() const override {
    size_t free_now = 0, total = 0;
    SAT_CUDA_CHECK(cudaMemGetInfo(&free_now, &total));
    return free_before_ > free_now ? free_before_ - free_now : 0;
  }

  void adopt(ParamStore& ps, DType act) override { ps.to_device(Device::cuda, act); }
  void to_host(ParamStore& ps) override { ps.sync_to_host(); }
  std::unique_ptr<DeviceOptimizer> optimizer(const OptimConfig& c, ParamStore& ps) override {
    return std::make_unique<GpuOptimizer>(c, ps, o_.act, o_.loss_scaling, ctx_->stream);
  }

  dist::Comm& group(dist::Comm& host, bool own_stream, bool alone) override {
    if (host.size() == 1 && !alone) return host;
    auto& twin = twins_[&host];
    if (!twin) twin = dist::counted(dist::make_nccl_comm(host, ctx_->device, own_stream ? comm_stream() : ctx_->stream));
    return *twin;
  }
  std::unique_ptr<StreamOrder> stream_order(size_t events) override {
    return std::make_unique<GpuStreamOrder>(events, ctx_->stream, comm_stream());
  }
  std::unique_ptr<SquaredNorms> squared_norms(size_t pieces, const float* scale) override {
    return std::make_unique<GpuNorms>(pieces, scale, ctx_->stream);
  }
  std::unique_ptr<GpuSampler> utilization() override {
    char id[64] = {0};
    const std::string bus = cudaDeviceGetPCIBusId(id, sizeof id, ctx_->device) == cudaSuccess ? id : "";
    return std::make_unique<GpuSampler>(0, bus);
  }
  void synchronize() override { SAT_CUDA_CHECK(cudaStreamSynchronize(ctx_->stream)); }
  void add_into(float* dst, const float* src, int64_t n, bool overwrite) override {
    if (n <= 0) return;
    if (overwrite)
      SAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, ctx_->stream));
    else
      cuda::add_into(dst, src, DType::f32, n, ctx_->stream);
  }
  void zero(void* dst, size_t bytes) override {
    if (bytes) SAT_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, ctx_->stream));
  }
  void refresh_lp(ParamStore& ps) override {
    if (ps.lp_dtype() != DType::f32)
      cuda::convert(ps.flat_params(), DType::f32, ps.flat_lp(), ps.lp_dtype(), ps.lp_size(), ctx_->stream);
  }
  DeviceBuffer buffer(size_t bytes, const char* what) override { return DeviceBuffer(Device::cuda, bytes, what); }

 private:
  // The data-parallel reduction's stream, of the highest priority (its buckets overlap backward).
  cudaStream_t comm_stream() {
    if (!comm_stream_) {
      int least = 0, greatest = 0;
      SAT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      SAT_CUDA_CHECK(cudaStreamCreateWithPriority(&comm_stream_, cudaStreamNonBlocking, greatest));
    }
    return comm_stream_;
  }

  DeviceOptions o_;
  CudaCtx* ctx_ = nullptr;
  size_t free_before_ = 0;
  cudaStream_t comm_stream_ = nullptr;
  std::map<const dist::Comm*, std::unique_ptr<dist::Comm>> twins_;
};

}  // namespace

std::unique_ptr<DeviceBackend> make_cuda_backend(int index, const DeviceOptions& o) {
  return std::make_unique<CudaBackend>(index, o);
}

}  // namespace sat

#else
namespace sat {
std::unique_ptr<DeviceBackend> make_cuda_backend(int, const DeviceOptions&) {
  fail("this saturate was built without the CUDA backend");
}
}  // namespace sat
#endif
