// Runs a Graph (a whole model or one pipeline stage) with the buffers a StepPlan lays
// out: one arena for everything transient in a step, and one context (a set of buffers)
// per micro-batch in flight. Parameters, gradients, optimizer and model state live in
// the ParamStore.
//
// The protocol is the same on both devices:
//   forward(ctx, chunk, training, seed, data)   the chunk's nodes on micro-batch data
//   backward(ctx, chunk, first_micro, hook)     from its output gradients
//   value(ctx, v) / grad(ctx, v)                where received inputs and the gradients of
//                                               sent outputs arrive, what is sent
//   take_losses()                               the losses of the forwards so far
// On the CPU every call runs to completion. On the GPU (a graph built for Device::cuda
// and a CudaCtx) the calls enqueue work on the context's stream and take_losses() waits
// for it; a data input is staged through pinned memory and uploaded on the copy stream
// into one of contexts + 1 input slots, so the next micro-batch's upload overlaps the
// current one's compute; with set_graphs(true) each distinct forward and backward is
// captured once as a CUDA graph and replayed.
#pragma once
#include <array>
#include <functional>
#include <map>
#include <vector>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/plan.h"
#include "nn/graph.h"
#include "nn/params.h"
#include "nn/step_plan.h"

namespace sat {

struct CudaCtx;

// Called around every node of a forward or backward (on the GPU too, whose segments then
// run eagerly, not as CUDA graphs): the seam where work tied to
// node boundaries plugs in (fully sharded data parallelism gathers a unit's parameters
// before its first node and reduce-scatters its gradients after its last).
class NodeHooks {
 public:
  virtual ~NodeHooks() = default;
  virtual void before_forward(int node) = 0;
  virtual void after_forward(int node) = 0;
  virtual void before_backward(int node) = 0;
  virtual void after_backward(int node) = 0;
};

// Told after each node's backward in a micro-batch's backward when its parameters'
// gradients may be final (Engine::backward's `ready`): data parallelism starts reducing a
// gradient bucket as soon as its last parameter is final.
class GradReady {
 public:
  virtual ~GradReady() = default;
  virtual void grads_ready(int node) = 0;
  // The backward's work is all queued (on a GPU with graphs on, inside the graph's capture).
  virtual void backward_queued() {}
};

// Told how long every node's call took on the CPU: the seam per-layer profiles and traces
// plug into (null: nothing is timed, nothing is read from the clock). A recompute is the
// forward of a node run again inside a backward (full recomputation); grad_hook the
// backward's hook after the node (data parallelism launching the buckets it completed).
enum class NodePhase : uint8_t { forward, backward, recompute, grad_hook };
class NodeTimer {
 public:
  virtual ~NodeTimer() = default;
  virtual void node_timed(int node, NodePhase phase, double t0, double t1) = 0;
};

// Which part of a backward a call runs: all of it, or (zero-bubble schedules) the input
// gradients only, or later the parameter gradients only (Layer::backward_input/_weight).
enum class BackwardPart : uint8_t { whole, input, weight };

struct MemoryPlan {
  std::array<size_t, size_t(MemKind::kCount)> by_kind{};  // transient kinds: before reuse
  size_t persistent = 0;  // parameters, gradients, optimizer state, model state
  size_t transient = 0;   // the step arena, after lifetime reuse
  size_t transient_peak = 0;  // the most of it live at once (the arena's packing may leave gaps)
  size_t inputs = 0;      // input batch buffers of the prefetching loader (+ GPU input slots)
  size_t staging = 0;     // ZeRO-2/3: gathered parameters and gradient buckets, after lifetime reuse
  int contexts = 1;       // micro-batches in flight (each with its own buffers)
  size_t total() const { return persistent + transient + inputs + staging; }
  size_t device = 0;      // GPU: the part of total() in device memory (0 on the CPU)
};

// The memory of running graph g with step plan `step`: persistent state (optimizer
// state for one of `optimizer_shards` shards, ZeRO-1), the arena, the loader's host
// buffers (`input_bytes`) and, on the GPU, the low-precision parameter copy, the library
// workspace and the input slots (MemoryPlan::device). Nothing is allocated.
MemoryPlan plan_memory(const Graph& g, const StepPlan& step, int optimizer_slots, size_t input_bytes,
                       int optimizer_shards = 1);

class Engine {
 public:
  // cuda: required when the graph was built for Device::cuda (parameters already moved
  // with ParamStore::to_device).
  Engine(Graph& g, ParamStore& ps, const StepPlan& plan, CudaCtx* cuda = nullptr);
  ~Engine();

  // Runs chunk `chunk` forward in context ctx. data: one tensor per Chunk::data input
  // (loader batches on the host; on the CPU they must stay valid until the context's
  // backward has run). seed: the micro-batch's seed (dropout).
  void forward(int ctx, int chunk, bool training, uint64_t seed, const std::vector<Tensor>& data = {});
  // Runs chunk `chunk` backward in context ctx, from the gradients of its sent outputs
  // (already in grad(ctx, v)) and, in the chunk with the loss, d(objective)/d(loss) of
  // set_dloss(). first_micro: parameter gradients are overwritten (no zeroing pass),
  // otherwise accumulated. ready (may be null) is told after each node's backward. Returns
  // true when a captured CUDA graph was replayed: `ready` then was not called on the host
  // (what it enqueued at capture is part of the graph).
  // part (CPU): input runs every node's input-gradient part (and sets d(loss)): nothing
  // touches the parameters' gradients, `ready` is not told; weight, later, every node's
  // parameter-gradient part in the same order, first_micro and `ready` as for whole.
  bool backward(int ctx, int chunk, bool first_micro, GradReady* ready = nullptr,
                BackwardPart part = BackwardPart::whole);
  // d(objective)/d(loss) for backward, multiplied on the device by *scale when scale is
  // given (fp16 loss scaling). Stays in effect until changed.
  void set_dloss(float dloss, const float* scale_dev = nullptr);
  // The sum and count of the losses computed by forwards since the last call (waits for
  // them on the GPU).
  std::pair<double, int> take_losses();
  // Buffers of a context (device memory on the GPU): a received input or a computed value;
  // the gradient of a sent output (to receive into) or of a received input (to send).
  Tensor value(int ctx, int v) const { return ctxs_[size_t(ctx)].vals[size_t(v)]; }
  Tensor grad(int ctx, int v) const { return ctxs_[size_t(ctx)].grads[size_t(v)]; }
  // A value as float32 on the host (waits for the GPU).
  std::vector<float> read_f32(int ctx, int v) const;
  // Waits until every queued operation has finished (GPU; nothing on the CPU).
  void synchronize();
  Device device() const { return g_.device(); }
  CudaCtx* cuda() const { return cuda_; }
  const Graph& graph() const { return g_; }

  // GPU: capture each distinct forward/backward as a CUDA graph from now on (the first
  // step runs eagerly: library heuristics and caches settle first).
  void set_graphs(bool on) { graphs_on_ = on; }
  // Graph launches and the kernels they replayed since the last call (GPU with graphs).
  std::pair<int64_t, int64_t> take_launches();

  // Times every node's call on the CPU from now on (null: none). t must outlive its use.
  void set_node_timer(NodeTimer* t) { timer_ = t; }
  // Layers that can use statistics of the global batch (BatchNorm) sum them over the
  // replicas through r (CPU; null: per-replica statistics). r must outlive its use.
  void set_replica_sum(ReplicaSum* r);
  // The tensor-parallel group that the graph's tensor-parallel layers communicate over
  // (LayerCtx::group); it must outlive its use and work on the step's memory (host memory on
  // the CPU; device memory on the step's stream on the GPU).
  void set_group(dist::Comm* group);
  // The expert-parallel group of every layer (LayerCtx::ep_group; CPU, host memory).
  void set_ep_group(dist::Comm* group);
  // The context-parallel group of RingSelfAttention layers (LayerCtx::cp_group; --cp).
  void set_cp_group(dist::Comm* group);
  // Hooks around every node (null: none; on the GPU no segment is captured while set). h
  // must outlive its use.
  void set_node_hooks(NodeHooks* h);

 private:
  struct NodeRun {
    LayerCtx ctx;
    std::vector<Tensor> scratch_fwd, scratch_bwd;
    std::vector<bool> first_writer;  // per param slot: first node in backward order to touch it
    std::vector<std::pair<Tensor, Tensor>> grad_adds;  // after backward: second += first
    BackwardParts parts;       // what its input and weight parts hold (backward_parts)
    std::vector<Tensor> no_din;  // ctx.din unset, swapped in for the weight part
  };
  struct Context {
    std::vector<Tensor> vals, grads;  // per value
    std::vector<NodeRun> runs;        // per node
  };
  void build_context(const StepPlan::Ctx& pc, Context& c);
  void point_inputs(Context& c, int v, const Tensor& t);
  void run_forward_nodes(Context& c, const Chunk& ch, bool training, uint64_t seed);
  void run_backward_nodes(Context& c, const Chunk& ch, bool first_micro, GradReady* ready,
                          BackwardPart part = BackwardPart::whole);
  // Node i's call for `part` (CPU); false when the part is empty for it.
  bool run_backward_part(NodeRun& r, int i, BackwardPart part);
  // Full recomputation: before node i's backward, when i is the last node of a recompute
  // unit, runs the unit's forward again (training, the seeds of the context's forward).
  void recompute_unit(Context& c, int i);
  // GPU (engine.cpp, under SAT_HAVE_CUDA).
  struct Gpu;
  void forward_gpu(int ctx, int chunk, bool training, uint64_t seed, const std::vector<Tensor>& data);
  bool backward_gpu(int ctx, int chunk, bool first_micro, GradReady* ready);

  Graph& g_;
  ParamStore& ps_;
  CudaCtx* cuda_ = nullptr;
  DeviceBuffer arena_;
  std::vector<Context> ctxs_;
  // (node, slot) of every reader of each data input (the loader's batches are bound there)
  std::vector<std::vector<std::pair<int, int>>> data_users_;
  double loss_sum_ = 0;
  int loss_count_ = 0;
  float dloss_ = 1.0f;
  const float* dloss_scale_ = nullptr;
  bool graphs_on_ = false;
  NodeHooks* node_hooks_ = nullptr;
  NodeTimer* timer_ = nullptr;
  std::unique_ptr<Gpu> gpu_;
};

}  // namespace sat
