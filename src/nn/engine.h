// Runs a Graph: one arena for everything transient in a step (activations, saved
// buffers, activation gradients, scratch), laid out by the ArenaPlanner from the
// lifetimes of a static step:
//   forward of node i at time i, backward of node i at time 2N-1-i;
//   the output of node i lives [i, 2N-1-i] (its consumers' backward may read it),
//   its gradient from the first consumer's backward to its own backward,
//   saved buffers [i, 2N-1-i], scratch only during the call that uses it.
// Parameters, gradients, optimizer and model state live in the ParamStore.
//
// On the GPU (a graph built with Device::cuda, and a CudaCtx) the same plan is laid out
// in device memory and every node runs its forward_cuda/backward_cuda on the context's
// stream. Graph inputs then live in the engine: kInputSlots device copies of each,
// filled from pinned staging buffers on the copy stream, so the upload of the next
// micro-batch overlaps the current one's compute. The queue_* calls only enqueue work
// (they can be captured into a CUDA graph); forward()/backward() are the synchronous
// versions used by evaluation and tests.
#pragma once
#include <array>
#include <functional>
#include <vector>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/plan.h"
#include "nn/graph.h"
#include "nn/params.h"

namespace sat {

struct CudaCtx;

struct MemoryPlan {
  std::array<size_t, size_t(MemKind::kCount)> by_kind{};  // transient kinds: before reuse
  size_t persistent = 0;  // parameters, gradients, optimizer state, model state
  size_t transient = 0;   // the step arena, after lifetime reuse
  size_t inputs = 0;      // input batch buffers of the prefetching loader (+ GPU input slots)
  size_t total() const { return persistent + transient + inputs; }
  size_t device = 0;      // GPU: the part of total() in device memory (0 on the CPU)
};

class Engine {
 public:
  // cuda: required when the graph was built for Device::cuda (parameters already moved
  // with ParamStore::to_device).
  Engine(Graph& g, ParamStore& ps, CudaCtx* cuda = nullptr);
  ~Engine();

  // The plan for a graph, without allocating anything. input_bytes: host-side loader
  // buffers. On the GPU the device part (parameters, their low-precision copy,
  // gradients, optimizer state, the step arena, the input slots and the library
  // workspace) is also returned in MemoryPlan::device.
  // optimizer_shards: ZeRO-1, optimizer state for one of that many shards (ParamStore).
  static MemoryPlan plan_memory(const Graph& g, int optimizer_slots, size_t input_bytes, int optimizer_shards = 1);

  void bind(int value, const Tensor& t);  // a graph input: points at a loader batch
  // Runs forward; returns the loss value (NaN if the graph has no loss).
  float forward(bool training, uint64_t seed);
  // Runs backward from d(objective)/d(loss) = dloss. With first_micro, parameter
  // gradients are overwritten (no separate zeroing pass); otherwise accumulated.
  void backward(float dloss, bool first_micro);

  Tensor value(int v) const { return vals_[size_t(v)]; }
  // Called after each node's backward (CPU), with the node index: data parallelism
  // starts reducing a gradient bucket as soon as its last parameter is final.
  void set_backward_hook(std::function<void(int)> hook) { hook_ = std::move(hook); }
  // Layers that can use statistics of the global batch (BatchNorm) sum them over the
  // replicas through r (CPU; null: per-replica statistics). r must outlive its use.
  void set_replica_sum(ReplicaSum* r);
  // A value as float32 on the host (synchronises on the GPU).
  std::vector<float> read_f32(int v) const;
  Device device() const { return g_.device(); }

  // ---- GPU step pieces (see the top of this file); all enqueue on the stream. ----
  static constexpr int kInputSlots = 2;
  // Host: copies a loader batch into the pinned staging of `slot` (the caller makes
  // sure the slot's previous micro-batch has finished: wait_slot()).
  void stage_input(int slot, int v, const Tensor& host);
  // Copy stream: staging -> device raw buffers of `slot`; the compute stream waits for it.
  void queue_upload(int slot);
  // Points the layers at `slot`'s device inputs (host-side bookkeeping, not enqueued).
  void use_slot(int slot);
  // Host: per-node seeds for the next micro-batch of `slot` (read by queue_forward).
  void set_seed(int slot, uint64_t seed);
  // d(objective)/d(loss) for backward, multiplied on the device by *scale when scale is
  // given (fp16 loss scaling). Stays in effect until changed.
  void set_dloss(float dloss, const float* scale_dev = nullptr);
  void queue_forward(int slot, bool training);  // includes input conversion and seeds
  void queue_backward(bool first_micro);
  // Records the end of `slot`'s work; wait_slot() blocks the host until then and
  // returns that micro-batch's loss.
  void queue_slot_done(int slot);
  float wait_slot(int slot);
  CudaCtx* cuda() const { return cuda_; }

  // Per-node timing (off by default): seconds spent in each node's forward and backward.
  void set_profiling(bool on) { profile_ = on; }
  struct NodeTime { double fwd = 0, bwd = 0; int64_t calls = 0; };
  const std::vector<NodeTime>& node_times() const { return times_; }
  // A table of time per layer kind, largest first.
  std::string profile_report() const;
  size_t arena_bytes() const { return arena_.bytes(); }
  const Graph& graph() const { return g_; }

 private:
  struct NodeRun {
    LayerCtx ctx;
    std::vector<Tensor> scratch_fwd, scratch_bwd;
    std::vector<bool> first_writer;  // per param slot: first node in backward order to touch it
    std::vector<std::pair<Tensor, Tensor>> grad_adds;  // after backward: second += first
  };
  void run_forward_nodes(bool training, uint64_t seed);
  void run_backward_nodes(bool first_micro);
  void setup_cuda();
  void destroy_cuda();

  std::function<void(int)> hook_;
  Graph& g_;
  ParamStore& ps_;
  CudaCtx* cuda_ = nullptr;
  DeviceBuffer arena_;
  // GPU: per graph input, per slot: device buffer in the value's dtype, the raw upload
  // buffer (== it unless a float input is converted to bf16/f16), pinned staging.
  struct InputSlot { DeviceBuffer dev, raw; PinnedBuffer staging; Tensor value; };
  std::vector<std::array<InputSlot, kInputSlots>> slots_;  // per graph input (g.inputs() order)
  DeviceBuffer seeds_dev_;  // u64 per node
  std::array<PinnedBuffer, kInputSlots> seeds_host_, loss_host_;
  PinnedBuffer dloss_host_;
  const float* dloss_scale_ = nullptr;
  std::array<void*, kInputSlots> uploaded_{}, done_{};  // cudaEvent_t
  std::vector<Tensor> vals_, grads_;
  std::vector<NodeRun> runs_;
  std::vector<std::vector<int>> input_users_;
  bool profile_ = false;
  std::vector<NodeTime> times_;  // graph input value -> (node, slot) to rebind
};

}  // namespace sat
