#include "nn/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "backend/cpu/bf16.h"
#include "core/rng.h"
#include "core/timer.h"
#include "nn/params.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#endif

namespace sat {

MemoryPlan plan_memory(const Graph& g, const StepPlan& step, int optimizer_slots, size_t input_bytes,
                       int optimizer_shards) {
  MemoryPlan m;
  auto sizes = ParamStore::predict(g.params(), g.states(), optimizer_slots, optimizer_shards);
  m.by_kind = step.by_kind;
  m.by_kind[size_t(MemKind::parameters)] = sizes.params;
  m.by_kind[size_t(MemKind::gradients)] = g.training() ? sizes.grads : 0;
  m.by_kind[size_t(MemKind::optimizer_state)] = sizes.optimizer;
  m.by_kind[size_t(MemKind::model_state)] = sizes.states;
  m.persistent = sizes.params + (g.training() ? sizes.grads : 0) + sizes.optimizer + sizes.states;
  m.transient = step.arena;
  const std::vector<size_t> live = live_bytes(step);
  m.transient_peak = live.empty() ? 0 : *std::max_element(live.begin(), live.end());
  m.contexts = step.contexts;
  m.inputs = input_bytes;
  // The low-precision copy of the parameters (mixed precision), whole on every rank (ZeRO-3's
  // shard: add_sharded_memory), laid out as the store lays out its parameters.
  const int shards = std::max(optimizer_shards, 1);
  const size_t lp = ParamStore::lp_bytes(g.params(), g.act(), {shards > 1 ? 1 : 0, shards, 0, {}});
  m.by_kind[size_t(MemKind::lp_params)] = lp;
  m.persistent += lp;
  if (g.device() == Device::cuda) {
    // Input slots (contexts + 1, see engine.h): each data input that a layer reads, in its
    // dtype, plus a float32 upload buffer when a float input is converted to bf16/f16.
    size_t slot = 0;
    for (int v : g.inputs()) {
      const Value& val = g.value(v);
      if (val.consumers.empty()) continue;
      slot += val.spec.bytes();
      if (val.spec.dtype == DType::bf16 || val.spec.dtype == DType::f16) slot += size_t(val.spec.shape.numel()) * 4;
    }
    const size_t slots = slot * size_t(step.contexts + 1) + g.nodes().size() * 8 * size_t(step.contexts);  // + seeds
    m.by_kind[size_t(MemKind::workspace)] = kCudaWorkspaceBytes + kCudaStepScalarsBytes;
    m.persistent += kCudaWorkspaceBytes + kCudaStepScalarsBytes;
    m.inputs += slots;
    m.device = m.persistent + m.transient + slots;
  }
  m.by_kind[size_t(MemKind::inputs)] = m.inputs;
  return m;
}

#if SAT_HAVE_CUDA
// The GPU side: the input slots ring, per-context seeds, captured graphs.
struct Engine::Gpu {
  struct Slot {
    std::vector<DeviceBuffer> dev, raw;  // per graph data input: in the value's dtype; f32 upload buffer
    std::vector<PinnedBuffer> staging;   // per graph data input
    PinnedBuffer seeds, loss;            // per node seeds of the forward; its loss
    cudaEvent_t uploaded = nullptr, done = nullptr;
    bool pending = false, has_loss = false;
  };
  std::vector<Slot> slots;
  size_t next = 0;
  std::vector<int> ctx_slot;            // the slot holding each context's micro-batch
  std::vector<DeviceBuffer> seeds_dev;  // per context: one u64 per node
  PinnedBuffer dloss;
  std::map<uint64_t, cudaGraphExec_t> graphs;
  std::map<uint64_t, int64_t> kernels;
  int64_t launches = 0, replayed = 0;
  ~Gpu() {
    for (auto& s : slots) {
      if (s.uploaded) cudaEventDestroy(s.uploaded);
      if (s.done) cudaEventDestroy(s.done);
    }
    for (auto& [k, e] : graphs) cudaGraphExecDestroy(e);
  }
};
#else
struct Engine::Gpu {};
#endif

Engine::Engine(Graph& g, ParamStore& ps, const StepPlan& plan, CudaCtx* cuda) : g_(g), ps_(ps), cuda_(cuda) {
  const Device dev = g.device();
  SAT_CHECK(dev == Device::cpu || cuda, "internal error: a GPU graph needs a CUDA context");
  SAT_CHECK(ps.device() == dev, "internal error: parameters and graph are on different devices");
  SAT_CHECK(dev == Device::cpu || !g.recompute(), "full recomputation needs the CPU engine for now");
  arena_ = DeviceBuffer(dev, plan.arena, "activations arena");
  data_users_.resize(g.values().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (size_t slot = 0; slot < g.nodes()[i].inputs.size(); ++slot) {
      const int v = g.nodes()[i].inputs[slot];
      if (g.value(v).kind == Value::Kind::data) data_users_[size_t(v)].push_back({int(i), int(slot)});
    }
  ctxs_.resize(size_t(plan.contexts));
  for (int k = 0; k < plan.contexts; ++k) build_context(plan.ctx[size_t(k)], ctxs_[size_t(k)]);
  g.chunks();  // computed once, before any call
#if SAT_HAVE_CUDA
  if (dev == Device::cuda) {
    gpu_ = std::make_unique<Gpu>();
    Gpu& G = *gpu_;
    const size_t n = std::max<size_t>(g.nodes().size(), 1);
    G.slots.resize(size_t(plan.contexts + 1));
    for (auto& s : G.slots) {
      for (int v : g.inputs()) {
        const Value& val = g.value(v);
        const bool converts = val.spec.dtype == DType::bf16 || val.spec.dtype == DType::f16;
        const size_t host_bytes = size_t(val.spec.shape.numel()) * (converts ? 4 : dtype_size(val.spec.dtype));
        const bool used = !val.consumers.empty();
        s.dev.emplace_back(Device::cuda, used ? val.spec.bytes() : 0, "input slot");
        s.raw.emplace_back(Device::cuda, used && converts ? host_bytes : 0, "input upload");
        s.staging.emplace_back(used ? host_bytes : 0);
      }
      s.seeds = PinnedBuffer(n * 8);
      s.loss = PinnedBuffer(64);
      SAT_CUDA_CHECK(cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming));
      SAT_CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
    }
    G.ctx_slot.assign(size_t(plan.contexts), -1);
    for (int k = 0; k < plan.contexts; ++k) {
      G.seeds_dev.emplace_back(Device::cuda, n * 8, "seeds");
      for (size_t i = 0; i < g.nodes().size(); ++i)
        ctxs_[size_t(k)].runs[i].ctx.seed_dev = G.seeds_dev.back().as<uint64_t>() + i;
    }
    G.dloss = PinnedBuffer(64);
  }
#endif
}

Engine::~Engine() {
#if SAT_HAVE_CUDA
  if (cuda_) {
    cudaStreamSynchronize(cuda_->stream);
    cudaStreamSynchronize(cuda_->copy_stream);
  }
#endif
}

void Engine::build_context(const StepPlan::Ctx& pc, Context& c) {
  const Graph& g = g_;
  const Device dev = g.device();
  auto at = [&](int64_t off, const TensorSpec& spec) {
    return Tensor(off < 0 ? nullptr : arena_.as<uint8_t>() + off, spec.shape, spec.dtype, dev);
  };
  const auto& vals = g.values();
  const auto& nodes = g.nodes();
  for (size_t v = 0; v < vals.size(); ++v) {
    c.vals.push_back(at(pc.value[v], vals[v].spec));
    c.grads.push_back(at(pc.grad[v], vals[v].spec));
  }
  // Which node touches a parameter first in backward order (the highest node index).
  std::vector<int> first_node(g.params().size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int pid : nodes[i].param_ids) first_node[size_t(pid)] = int(i);
  c.runs.resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    NodeRun& r = c.runs[i];
    LayerCtx& lc = r.ctx;
    for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
      const int v = n.inputs[slot];
      lc.in.push_back(c.vals[size_t(v)]);
      Tensor din = c.grads[size_t(v)];
      if (pc.temp[i][slot] >= 0) {
        Tensor t = at(pc.temp[i][slot], vals[size_t(v)].spec);
        r.grad_adds.push_back({t, din});
        din = t;
      }
      lc.din.push_back(n.needs_backward ? din : Tensor(nullptr, din.shape, din.dtype, dev));
    }
    lc.out = c.vals[size_t(n.output)];
    lc.dout = c.grads[size_t(n.output)];
    for (size_t k = 0; k < n.param_ids.size(); ++k) {
      const size_t pid = size_t(n.param_ids[k]);
      lc.params.push_back(ps_.param(pid));
      lc.params_lp.push_back(ps_.param_lp(pid));
      lc.grads.push_back(ps_.grad(pid));
      lc.accumulate.push_back(true);
      r.first_writer.push_back(first_node[pid] == int(i));
    }
    for (int sid : n.state_ids) lc.states.push_back(ps_.state(size_t(sid)));
    for (size_t k = 0; k < pc.saved[i].size(); ++k) lc.saved.push_back(at(pc.saved[i][k], n.setup.saved[k]));
    for (size_t k = 0; k < pc.sfwd[i].size(); ++k) r.scratch_fwd.push_back(at(pc.sfwd[i][k], n.setup.scratch_fwd[k]));
    for (size_t k = 0; k < pc.sbwd[i].size(); ++k) r.scratch_bwd.push_back(at(pc.sbwd[i][k], n.setup.scratch_bwd[k]));
    for (const Tensor& d : lc.din) r.no_din.push_back(Tensor(nullptr, d.shape, d.dtype, dev));
    r.parts = backward_parts(g, int(i));
    lc.cuda = cuda_;
  }
}

void Engine::point_inputs(Context& c, int v, const Tensor& t) {
  c.vals[size_t(v)] = t;
  for (auto& [node, slot] : data_users_[size_t(v)]) c.runs[size_t(node)].ctx.in[size_t(slot)] = t;
}

void Engine::set_replica_sum(ReplicaSum* r) {
  SAT_CHECK(!r || device() == Device::cpu, "statistics over the global batch (--sync-bn) need the CPU engine");
  for (Context& c : ctxs_)
    for (NodeRun& run : c.runs) run.ctx.replicas = r;
}

void Engine::set_group(dist::Comm* group) {
  for (Context& c : ctxs_)
    for (NodeRun& run : c.runs) run.ctx.group = group;
}

void Engine::set_ep_group(dist::Comm* group) {
  for (Context& c : ctxs_)
    for (NodeRun& run : c.runs) run.ctx.ep_group = group;
}

void Engine::set_cp_group(dist::Comm* group) {
  for (Context& c : ctxs_)
    for (NodeRun& run : c.runs) run.ctx.cp_group = group;
}

// On the GPU the hooks decide on the host between nodes (ZeRO's gathers and reductions on
// the collectives' stream): the segments run eagerly, never replayed as CUDA graphs.
void Engine::set_node_hooks(NodeHooks* h) { node_hooks_ = h; }

void Engine::set_dloss(float dloss, const float* scale_dev) {
  dloss_ = dloss;
  dloss_scale_ = scale_dev;
}

void Engine::forward(int ctx, int chunk, bool training, uint64_t seed, const std::vector<Tensor>& data) {
  SAT_CHECK(!training || g_.training(), "internal error: training step on an inference graph");
  const Chunk& ch = g_.chunks().at(size_t(chunk));
  SAT_CHECK(data.size() == ch.data.size(), "internal error: chunk ", chunk, " reads ", ch.data.size(),
            " data inputs, given ", data.size());
  for (size_t k = 0; k < data.size(); ++k) {
    const Value& val = g_.value(ch.data[k]);
    const bool converts = data[k].dtype == DType::f32 && (val.spec.dtype == DType::bf16 || val.spec.dtype == DType::f16);
    SAT_CHECK(data[k].shape == val.spec.shape && (data[k].dtype == val.spec.dtype || converts), "input ", val.name,
              " expects ", val.spec.shape.str(), " ", dtype_name(val.spec.dtype), ", got ", data[k].shape.str(), " ",
              dtype_name(data[k].dtype));
  }
  if (device() == Device::cuda) {
    forward_gpu(ctx, chunk, training, seed, data);
    return;
  }
  Context& c = ctxs_.at(size_t(ctx));
  for (size_t k = 0; k < data.size(); ++k) point_inputs(c, ch.data[k], data[k]);
  run_forward_nodes(c, ch, training, seed);
  if (ch.has_loss) {
    loss_sum_ += double(c.vals[size_t(g_.loss())].f32()[0]);
    ++loss_count_;
  }
}

bool Engine::backward(int ctx, int chunk, bool first_micro, GradReady* hook, BackwardPart part) {
  SAT_CHECK(g_.training(), "internal error: backward needs a training graph");
  if (device() == Device::cuda) {
    SAT_CHECK(part == BackwardPart::whole, "internal error: the GPU engine runs whole backwards only");
    return backward_gpu(ctx, chunk, first_micro, hook);
  }
  const Chunk& ch = g_.chunks().at(size_t(chunk));
  Context& c = ctxs_.at(size_t(ctx));
  if (ch.has_loss && part != BackwardPart::weight) c.grads[size_t(g_.loss())].f32()[0] = dloss_;
  run_backward_nodes(c, ch, first_micro, part == BackwardPart::input ? nullptr : hook, part);
  return false;
}

void Engine::run_forward_nodes(Context& c, const Chunk& ch, bool training, uint64_t seed) {
  auto& nodes = g_.nodes();
  const bool gpu = device() == Device::cuda;
  for (int i = ch.begin; i < ch.end; ++i) {
    NodeRun& r = c.runs[size_t(i)];
    r.ctx.training = training;
    r.ctx.seed = mix_seed(seed, nodes[size_t(i)].seed_key);
    r.ctx.scratch = r.scratch_fwd;
    if (node_hooks_) node_hooks_->before_forward(i);
    const double t0 = timer_ ? now_seconds() : 0;
    if (gpu) nodes[size_t(i)].layer->forward_cuda(r.ctx);
    else nodes[size_t(i)].layer->forward(r.ctx);
    if (timer_) timer_->node_timed(i, NodePhase::forward, t0, now_seconds());
    if (node_hooks_) node_hooks_->after_forward(i);
  }
}

void Engine::run_backward_nodes(Context& c, const Chunk& ch, bool first_micro, GradReady* hook, BackwardPart part) {
  auto& nodes = g_.nodes();
  const bool gpu = device() == Device::cuda;
  for (int i = ch.end; i-- > ch.begin;) {
    if (node_hooks_) node_hooks_->before_backward(i);  // before recomputing: it may gather the unit's parameters
    if (part != BackwardPart::weight) recompute_unit(c, i);
    if (!nodes[size_t(i)].needs_backward) continue;
    NodeRun& r = c.runs[size_t(i)];
    for (size_t k = 0; k < r.first_writer.size(); ++k) r.ctx.accumulate[k] = !(first_micro && r.first_writer[k]);
    r.ctx.scratch = r.scratch_bwd;
    const double t0 = timer_ ? now_seconds() : 0;
    if (gpu) {
      nodes[size_t(i)].layer->backward_cuda(r.ctx);
#if SAT_HAVE_CUDA
      for (auto& [tmp, dst] : r.grad_adds) cuda::add_into(dst.ptr, tmp.ptr, dst.dtype, tmp.numel(), cuda_->stream);
#endif
    } else if (run_backward_part(r, i, part)) {
      if (part != BackwardPart::weight)
        for (auto& [tmp, dst] : r.grad_adds) cpu::add_into(dst, tmp);
    }
    if (timer_) timer_->node_timed(i, NodePhase::backward, t0, now_seconds());
    if (node_hooks_) node_hooks_->after_backward(i);
    if (hook) {
      const double h0 = timer_ ? now_seconds() : 0;
      hook->grads_ready(i);
      if (timer_) timer_->node_timed(i, NodePhase::grad_hook, h0, now_seconds());
    }
  }
}

bool Engine::run_backward_part(NodeRun& r, int i, BackwardPart part) {
  Layer& layer = *g_.nodes()[size_t(i)].layer;
  const BackwardParts p = r.parts;
  switch (part) {
    case BackwardPart::whole:
      layer.backward(r.ctx);
      return true;
    case BackwardPart::input:
      if (!p.input) return false;
      if (p.weight) layer.backward_input(r.ctx);
      else layer.backward(r.ctx);
      return true;
    case BackwardPart::weight:
      if (!p.weight) return false;
      std::swap(r.ctx.din, r.no_din);  // the input gradients were written by the input part
      if (p.input) layer.backward_weight(r.ctx);
      else layer.backward(r.ctx);
      std::swap(r.ctx.din, r.no_din);
      return true;
  }
  return false;
}

void Engine::recompute_unit(Context& c, int i) {
  auto& nodes = g_.nodes();
  const Node& last = nodes[size_t(i)];
  if (last.rc_last != i) return;
  for (int j = last.rc_first; j <= i; ++j) {
    NodeRun& r = c.runs[size_t(j)];
    // r.ctx.seed is still the one this context's forward drew (dropout masks repeat).
    r.ctx.training = true;
    r.ctx.recomputing = true;
    r.ctx.scratch = r.scratch_fwd;
    const double t0 = timer_ ? now_seconds() : 0;
    nodes[size_t(j)].layer->forward(r.ctx);
    r.ctx.recomputing = false;
    if (timer_) timer_->node_timed(j, NodePhase::recompute, t0, now_seconds());
  }
}

std::vector<float> Engine::read_f32(int ctx, int v) const {
  Tensor t = ctxs_.at(size_t(ctx)).vals[size_t(v)];
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.device == Device::cpu) {
    cpu::to_f32(t, out.data(), false);
    return out;
  }
#if SAT_HAVE_CUDA
  CudaBuffer tmp(out.size() * 4);
  cuda::convert(t.ptr, t.dtype, tmp.get(), DType::f32, t.numel(), cuda_->stream);
  SAT_CUDA_CHECK(cudaStreamSynchronize(cuda_->stream));
  SAT_CUDA_CHECK(cudaMemcpy(out.data(), tmp.get(), out.size() * 4, cudaMemcpyDeviceToHost));
#endif
  return out;
}

// ---- GPU ------------------------------------------------------------------------------
#if SAT_HAVE_CUDA
namespace {

// Runs `work` (which only enqueues on `st`) eagerly, or, with graphs on, as the CUDA graph
// captured for `key` the first time it is seen. Returns true when `work` did not run on
// the host (a graph captured earlier was replayed).
bool enqueue(bool graphs_on, uint64_t key, cudaStream_t st, std::map<uint64_t, cudaGraphExec_t>& graphs,
             std::map<uint64_t, int64_t>& kernels, int64_t& launches, int64_t& replayed,
             const std::function<void()>& work) {
  if (!graphs_on) {
    work();
    return false;
  }
  auto it = graphs.find(key);
  const bool replay = it != graphs.end();
  if (!replay) {
    cudaGraph_t graph;
    SAT_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    work();
    SAT_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
    size_t n = 0;
    SAT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    SAT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
    int64_t k = 0;
    for (auto nd : nodes) {
      cudaGraphNodeType t;
      SAT_CUDA_CHECK(cudaGraphNodeGetType(nd, &t));
      k += t == cudaGraphNodeTypeKernel;
    }
    cudaGraphExec_t exec;
    SAT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    SAT_CUDA_CHECK(cudaGraphDestroy(graph));
    it = graphs.emplace(key, exec).first;
    kernels[key] = k;
  }
  SAT_CUDA_CHECK(cudaGraphLaunch(it->second, st));
  ++launches;
  replayed += kernels[key];
  return replay;
}

uint64_t graph_key(int kind, int ctx, int chunk, int slot, bool a, bool b) {
  return uint64_t(kind) | uint64_t(ctx) << 4 | uint64_t(chunk) << 20 | uint64_t(slot) << 28 | uint64_t(a) << 44 |
         uint64_t(b) << 45;
}

}  // namespace

void Engine::forward_gpu(int ctx, int chunk, bool training, uint64_t seed, const std::vector<Tensor>& data) {
  const Chunk& ch = g_.chunks()[size_t(chunk)];
  Gpu& G = *gpu_;
  cudaStream_t st = cuda_->stream;
  const int si = int(G.next++ % G.slots.size());
  Gpu::Slot& s = G.slots[size_t(si)];
  if (s.pending) {  // the slot's previous micro-batch must be finished with it
    SAT_CUDA_CHECK(cudaEventSynchronize(s.done));
    if (s.has_loss) loss_sum_ += double(*s.loss.as<float>()), ++loss_count_;
    s.pending = false;
  }
  Context& c = ctxs_.at(size_t(ctx));
  const auto& ins = g_.inputs();
  for (size_t k = 0; k < data.size(); ++k) {
    const size_t idx = size_t(std::find(ins.begin(), ins.end(), ch.data[k]) - ins.begin());
    std::memcpy(s.staging[idx].data(), data[k].ptr, data[k].bytes());
    void* dst = s.raw[idx].data() ? s.raw[idx].data() : s.dev[idx].data();
    SAT_CUDA_CHECK(cudaMemcpyAsync(dst, s.staging[idx].data(), data[k].bytes(), cudaMemcpyHostToDevice,
                                   cuda_->copy_stream));
    const Value& val = g_.value(ch.data[k]);
    point_inputs(c, ch.data[k], Tensor(s.dev[idx].data(), val.spec.shape, val.spec.dtype, Device::cuda));
  }
  if (!data.empty()) {
    SAT_CUDA_CHECK(cudaEventRecord(s.uploaded, cuda_->copy_stream));
    SAT_CUDA_CHECK(cudaStreamWaitEvent(st, s.uploaded, 0));
  }
  uint64_t* seeds = s.seeds.as<uint64_t>();
  for (size_t i = 0; i < g_.nodes().size(); ++i) seeds[i] = mix_seed(seed, g_.nodes()[i].seed_key);
  // The seeds and the loss travel through pinned memory that a replayed graph reads and
  // writes at every replay; the host updates them between replays.
  enqueue(graphs_on_ && !node_hooks_, graph_key(0, ctx, chunk, si, training, false), st, G.graphs, G.kernels,
          G.launches, G.replayed, [&] {
            for (size_t k = 0; k < data.size(); ++k) {
              const size_t idx = size_t(std::find(ins.begin(), ins.end(), ch.data[k]) - ins.begin());
              if (s.raw[idx].data())
                cuda::convert(s.raw[idx].data(), DType::f32, s.dev[idx].data(), g_.value(ch.data[k]).spec.dtype,
                              data[k].numel(), st);
            }
            SAT_CUDA_CHECK(cudaMemcpyAsync(G.seeds_dev[size_t(ctx)].data(), s.seeds.data(), g_.nodes().size() * 8,
                                           cudaMemcpyHostToDevice, st));
            run_forward_nodes(c, ch, training, seed);
            if (ch.has_loss)
              SAT_CUDA_CHECK(cudaMemcpyAsync(s.loss.data(), c.vals[size_t(g_.loss())].ptr, 4, cudaMemcpyDeviceToHost, st));
          });
  SAT_CUDA_CHECK(cudaEventRecord(s.done, st));
  s.pending = true;
  s.has_loss = ch.has_loss;
  G.ctx_slot[size_t(ctx)] = si;
}

bool Engine::backward_gpu(int ctx, int chunk, bool first_micro, GradReady* hook) {
  const Chunk& ch = g_.chunks()[size_t(chunk)];
  Gpu& G = *gpu_;
  cudaStream_t st = cuda_->stream;
  Context& c = ctxs_.at(size_t(ctx));
  *G.dloss.as<float>() = dloss_;
  const bool hooked = hook != nullptr;
  const int si = G.ctx_slot[size_t(ctx)];  // the layers read its inputs in backward too
  const bool replayed =
      enqueue(graphs_on_ && !node_hooks_, graph_key(1, ctx, chunk, std::max(si, 0), first_micro, hooked), st, G.graphs, G.kernels,
          G.launches, G.replayed, [&] {
            if (ch.has_loss) {
              float* dl = c.grads[size_t(g_.loss())].f32();
              SAT_CUDA_CHECK(cudaMemcpyAsync(dl, G.dloss.data(), 4, cudaMemcpyHostToDevice, st));
              if (dloss_scale_) cuda::scale_scalar(dl, dloss_scale_, st);
            }
            run_backward_nodes(c, ch, first_micro, hook);
            if (hook) hook->backward_queued();
          });
  if (si >= 0) SAT_CUDA_CHECK(cudaEventRecord(G.slots[size_t(si)].done, st));  // its inputs are free after this
  return replayed;
}

std::pair<double, int> Engine::take_losses() {
  if (gpu_)
    for (auto& s : gpu_->slots) {
      if (!s.pending) continue;
      SAT_CUDA_CHECK(cudaEventSynchronize(s.done));
      if (s.has_loss) loss_sum_ += double(*s.loss.as<float>()), ++loss_count_;
      s.pending = false;
    }
  std::pair<double, int> r{loss_sum_, loss_count_};
  loss_sum_ = 0;
  loss_count_ = 0;
  return r;
}

void Engine::synchronize() {
  if (cuda_) SAT_CUDA_CHECK(cudaStreamSynchronize(cuda_->stream));
}

std::pair<int64_t, int64_t> Engine::take_launches() {
  if (!gpu_) return {0, 0};
  std::pair<int64_t, int64_t> r{gpu_->launches, gpu_->replayed};
  gpu_->launches = gpu_->replayed = 0;
  return r;
}
#else
void Engine::forward_gpu(int, int, bool, uint64_t, const std::vector<Tensor>&) { fail("no CUDA backend"); }
bool Engine::backward_gpu(int, int, bool, GradReady*) { fail("no CUDA backend"); }
std::pair<double, int> Engine::take_losses() {
  std::pair<double, int> r{loss_sum_, loss_count_};
  loss_sum_ = 0;
  loss_count_ = 0;
  return r;
}
void Engine::synchronize() {}
std::pair<int64_t, int64_t> Engine::take_launches() { return {0, 0}; }
#endif

}  // namespace sat
