#include "nn/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <cstring>

#include "core/timer.h"

#include "core/rng.h"
#include "nn/params.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#endif

namespace sat {
namespace {

// Buffer ids of one planned step.
struct StepBuffers {
  ArenaPlanner planner;
  std::vector<int> value, grad;                       // per value (-1: none / external)
  std::vector<std::vector<int>> saved, sfwd, sbwd;    // per node
  std::vector<std::vector<int>> temp;                 // per node, per input slot: extra-consumer grad temp
};

StepBuffers plan_step(const Graph& g) {
  StepBuffers b;
  const auto& nodes = g.nodes();
  const auto& vals = g.values();
  const int N = int(nodes.size());
  const bool train = g.training();
  auto bwd_t = [&](int i) { return 2 * N - 1 - i; };
  b.value.assign(vals.size(), -1);
  b.grad.assign(vals.size(), -1);
  b.saved.resize(size_t(N));
  b.sfwd.resize(size_t(N));
  b.sbwd.resize(size_t(N));
  b.temp.resize(size_t(N));
  for (size_t v = 0; v < vals.size(); ++v) {
    const Value& val = vals[v];
    if (val.producer < 0) continue;  // graph input: bound from outside
    int p = val.producer;
    int last_use = p;
    for (auto& c : val.consumers) last_use = std::max(last_use, c.first);
    if (int(v) == g.loss() || int(v) == g.logits()) last_use = N - 1;
    int end = train ? bwd_t(p) : last_use;
    b.value[v] = b.planner.add(val.name, MemKind::activations, val.spec.bytes(), p, end);
    if (train && val.needs_grad) {
      int first_consumer_bwd = val.consumers.empty() ? bwd_t(p) : bwd_t(val.consumers.back().first);
      for (auto& c : val.consumers) first_consumer_bwd = std::min(first_consumer_bwd, bwd_t(c.first));
      b.grad[v] = b.planner.add(val.name + ".grad", MemKind::activation_grads, val.spec.bytes(),
                                first_consumer_bwd, bwd_t(p));
    }
  }
  for (int i = 0; i < N; ++i) {
    const Node& n = nodes[size_t(i)];
    for (auto& s : n.setup.saved)
      b.saved[size_t(i)].push_back(b.planner.add(n.name + ".saved", MemKind::saved, s.bytes(), i, train ? bwd_t(i) : i));
    for (auto& s : n.setup.scratch_fwd)
      b.sfwd[size_t(i)].push_back(b.planner.add(n.name + ".scratch", MemKind::scratch, s.bytes(), i, i));
    b.temp[size_t(i)].assign(n.inputs.size(), -1);
    if (!train || !n.needs_backward) continue;
    for (auto& s : n.setup.scratch_bwd)
      b.sbwd[size_t(i)].push_back(b.planner.add(n.name + ".scratch", MemKind::scratch, s.bytes(), bwd_t(i), bwd_t(i)));
    // A value read by several consumers: the last consumer (first in backward order)
    // writes its gradient; the others write a temporary that is then added in.
    for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
      const Value& in = vals[size_t(n.inputs[slot])];
      if (!in.needs_grad) continue;
      std::pair<int, int> me{i, int(slot)};
      if (in.consumers.back() != me)
        b.temp[size_t(i)][slot] = b.planner.add(in.name + ".grad+", MemKind::activation_grads, in.spec.bytes(),
                                                bwd_t(i), bwd_t(i));
    }
  }
  b.planner.solve();
  return b;
}

}  // namespace

MemoryPlan Engine::plan_memory(const Graph& g, int optimizer_slots, size_t input_bytes, int optimizer_shards) {
  MemoryPlan m;
  auto sizes = ParamStore::predict(g.params(), g.states(), optimizer_slots, optimizer_shards);
  m.by_kind[size_t(MemKind::parameters)] = sizes.params;
  m.by_kind[size_t(MemKind::gradients)] = g.training() ? sizes.grads : 0;
  m.by_kind[size_t(MemKind::optimizer_state)] = sizes.optimizer;
  m.by_kind[size_t(MemKind::model_state)] = sizes.states;
  m.persistent = sizes.params + (g.training() ? sizes.grads : 0) + sizes.optimizer + sizes.states;
  StepBuffers b = plan_step(g);
  for (size_t i = 0; i < b.planner.size(); ++i) m.by_kind[size_t(b.planner[int(i)].kind)] += b.planner[int(i)].bytes;
  m.transient = b.planner.arena_bytes();
  m.inputs = input_bytes;
  if (g.device() == Device::cuda) {
    // Device input slots: each graph input in its dtype, plus a float32 upload buffer
    // when a float input is converted to bf16/f16 on the device.
    size_t slots = 0;
    for (int v : g.inputs()) {
      const TensorSpec& sp = g.value(v).spec;
      slots += sp.bytes();
      if (sp.dtype == DType::bf16 || sp.dtype == DType::f16) slots += size_t(sp.shape.numel()) * 4;
    }
    slots *= Engine::kInputSlots;
    slots += g.nodes().size() * 8;  // per-node seeds
    const size_t lp = ParamStore::lp_bytes(g.params(), g.act());
    m.by_kind[size_t(MemKind::lp_params)] = lp;
    m.by_kind[size_t(MemKind::workspace)] = kCudaWorkspaceBytes;
    m.persistent += lp + kCudaWorkspaceBytes;
    m.inputs += slots;
    m.device = m.persistent + m.transient + slots;
  }
  m.by_kind[size_t(MemKind::inputs)] = m.inputs;
  return m;
}

Engine::Engine(Graph& g, ParamStore& ps, CudaCtx* cuda) : g_(g), ps_(ps), cuda_(cuda) {
  const Device dev = g.device();
  SAT_CHECK(dev == Device::cpu || cuda, "internal error: a GPU graph needs a CUDA context");
  SAT_CHECK(ps.device() == dev, "internal error: parameters and graph are on different devices");
  StepBuffers b = plan_step(g);
  arena_ = DeviceBuffer(dev, b.planner.arena_bytes(), "activations arena");
  auto at = [&](int id, const TensorSpec& spec) {
    if (id < 0) return Tensor(nullptr, spec.shape, spec.dtype, dev);
    return Tensor(arena_.as<uint8_t>() + b.planner[id].offset, spec.shape, spec.dtype, dev);
  };
  const auto& vals = g.values();
  const auto& nodes = g.nodes();
  for (size_t v = 0; v < vals.size(); ++v) {
    vals_.push_back(at(b.value[v], vals[v].spec));
    grads_.push_back(at(b.grad[v], vals[v].spec));
  }
  input_users_.resize(vals.size());
  // Which node touches a parameter first in backward order (the highest node index).
  std::vector<int> first_node(g.params().size(), -1);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int pid : nodes[i].param_ids) first_node[size_t(pid)] = int(i);
  runs_.resize(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    NodeRun& r = runs_[i];
    LayerCtx& c = r.ctx;
    for (size_t slot = 0; slot < n.inputs.size(); ++slot) {
      int v = n.inputs[slot];
      c.in.push_back(vals_[size_t(v)]);
      SAT_ASSERT(slot < 64);  // (node, slot) of a graph input's users is packed as node*64+slot
      if (vals[size_t(v)].producer < 0) input_users_[size_t(v)].push_back(int(i * 64 + slot));
      Tensor din = grads_[size_t(v)];
      if (b.temp[i][slot] >= 0) {
        Tensor t = at(b.temp[i][slot], vals[size_t(v)].spec);
        r.grad_adds.push_back({t, din});
        din = t;
      }
      c.din.push_back(n.needs_backward ? din : Tensor(nullptr, din.shape, din.dtype, dev));
    }
    c.out = vals_[size_t(n.output)];
    c.dout = grads_[size_t(n.output)];
    for (size_t k = 0; k < n.param_ids.size(); ++k) {
      size_t pid = size_t(n.param_ids[k]);
      c.params.push_back(ps.param(pid));
      c.params_lp.push_back(ps.param_lp(pid));
      c.grads.push_back(ps.grad(pid));
      c.accumulate.push_back(true);
      r.first_writer.push_back(first_node[pid] == int(i));
    }
    for (int sid : n.state_ids) c.states.push_back(ps.state(size_t(sid)));
    for (size_t k = 0; k < b.saved[i].size(); ++k) c.saved.push_back(at(b.saved[i][k], n.setup.saved[k]));
    for (size_t k = 0; k < b.sfwd[i].size(); ++k) r.scratch_fwd.push_back(at(b.sfwd[i][k], n.setup.scratch_fwd[k]));
    for (size_t k = 0; k < b.sbwd[i].size(); ++k) r.scratch_bwd.push_back(at(b.sbwd[i][k], n.setup.scratch_bwd[k]));
    c.cuda = cuda_;
  }
  if (dev == Device::cuda) setup_cuda();
}

Engine::~Engine() { destroy_cuda(); }

void Engine::bind(int v, const Tensor& t) {
  const Value& val = g_.value(v);
  SAT_CHECK(val.producer < 0, "internal error: binding a computed value");
  const bool converts = t.dtype == DType::f32 && (val.spec.dtype == DType::bf16 || val.spec.dtype == DType::f16);
  SAT_CHECK(t.shape == val.spec.shape && (t.dtype == val.spec.dtype || converts), "input ", val.name, " expects ",
            val.spec.shape.str(), " ", dtype_name(val.spec.dtype), ", got ", t.shape.str(), " ", dtype_name(t.dtype));
  if (device() == Device::cuda) {
    stage_input(0, v, t);  // forward() uploads it
    return;
  }
  vals_[size_t(v)] = t;
  for (int u : input_users_[size_t(v)]) runs_[size_t(u / 64)].ctx.in[size_t(u % 64)] = t;
}

float Engine::forward(bool training, uint64_t seed) {
  SAT_CHECK(!training || g_.training(), "internal error: training step on an inference graph");
  if (device() == Device::cuda) {
    // Synchronous GPU path (evaluation, tests): the batch was staged by bind().
    queue_upload(0);
    use_slot(0);
    set_seed(0, seed);
    queue_forward(0, training);
    queue_slot_done(0);
    return wait_slot(0);
  }
  run_forward_nodes(training, seed);
  if (g_.loss() < 0) return std::nanf("");
  return vals_[size_t(g_.loss())].f32()[0];
}

void Engine::set_replica_sum(ReplicaSum* r) {
  SAT_CHECK(!r || device() == Device::cpu, "statistics over the global batch (--sync-bn) need the CPU engine");
  for (NodeRun& run : runs_) run.ctx.replicas = r;
}

void Engine::run_forward_nodes(bool training, uint64_t seed) {
  auto& nodes = g_.nodes();
  const bool gpu = device() == Device::cuda;
  for (size_t i = 0; i < nodes.size(); ++i) {
    NodeRun& r = runs_[i];
    r.ctx.training = training;
    r.ctx.seed = mix_seed(seed, i);
    r.ctx.scratch = r.scratch_fwd;
    double t0 = profile_ ? now_seconds() : 0;
    if (gpu) nodes[i].layer->forward_cuda(r.ctx);
    else nodes[i].layer->forward(r.ctx);
    if (!profile_) continue;
    times_.resize(nodes.size());
    times_[i].fwd += now_seconds() - t0;
    times_[i].calls++;
  }
}

void Engine::backward(float dloss, bool first_micro) {
  SAT_CHECK(g_.training() && g_.loss() >= 0, "internal error: backward needs a training graph with a loss");
  if (device() == Device::cuda) {
    set_dloss(dloss, dloss_scale_);
    queue_backward(first_micro);
    queue_slot_done(0);
    wait_slot(0);
    return;
  }
  grads_[size_t(g_.loss())].f32()[0] = dloss;
  run_backward_nodes(first_micro);
}

void Engine::run_backward_nodes(bool first_micro) {
  auto& nodes = g_.nodes();
  const bool gpu = device() == Device::cuda;
  for (size_t i = nodes.size(); i-- > 0;) {
    if (!nodes[i].needs_backward) continue;
    NodeRun& r = runs_[i];
    for (size_t k = 0; k < r.first_writer.size(); ++k) r.ctx.accumulate[k] = !(first_micro && r.first_writer[k]);
    r.ctx.scratch = r.scratch_bwd;
    double t0 = profile_ ? now_seconds() : 0;
    if (gpu) {
      nodes[i].layer->backward_cuda(r.ctx);
#if SAT_HAVE_CUDA
      for (auto& [tmp, dst] : r.grad_adds) cuda::add_into(dst.ptr, tmp.ptr, dst.dtype, tmp.numel(), cuda_->stream);
#endif
    } else {
      nodes[i].layer->backward(r.ctx);
      for (auto& [tmp, dst] : r.grad_adds) {
        const float* s = tmp.f32();
        float* d = dst.f32();
        int64_t n = tmp.numel();
#pragma omp parallel for simd if (n > 65536)
        for (int64_t k = 0; k < n; ++k) d[k] += s[k];
      }
    }
    if (profile_) times_[i].bwd += now_seconds() - t0;
    if (hook_) hook_(int(i));
  }
}

std::vector<float> Engine::read_f32(int v) const {
  Tensor t = vals_[size_t(v)];
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.device == Device::cpu) {
    SAT_ASSERT(t.dtype == DType::f32);
    std::copy(t.f32(), t.f32() + t.numel(), out.begin());
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

std::string Engine::profile_report() const {
  struct Row { double fwd = 0, bwd = 0, flops = 0; int n = 0; };
  std::map<std::string, Row> by_kind;
  double total = 0;
  int64_t calls = 1;
  for (size_t i = 0; i < times_.size(); ++i) {
    const Node& n = g_.nodes()[i];
    Row& r = by_kind[n.layer->kind()];
    r.fwd += times_[i].fwd;
    r.bwd += times_[i].bwd;
    r.flops += n.setup.flops_fwd + n.setup.flops_bwd;
    r.n++;
    total += times_[i].fwd + times_[i].bwd;
    calls = std::max<int64_t>(calls, times_[i].calls);
  }
  std::vector<std::pair<std::string, Row>> rows(by_kind.begin(), by_kind.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.fwd + a.second.bwd > b.second.fwd + b.second.bwd; });
  std::string out = "layer kind            count  forward ms  backward ms   share  GFLOP/s   (per micro-batch, over " +
                    std::to_string(calls) + " forward calls)\n";
  char line[256];
  for (auto& [kind, r] : rows) {
    double t = r.fwd + r.bwd;
    std::snprintf(line, sizeof line, "%-20s %6d %11.3f %12.3f %6.1f%% %8.1f\n", kind.c_str(), r.n, 1e3 * r.fwd / double(calls),
                  1e3 * r.bwd / double(calls), total > 0 ? 100 * t / total : 0.0, t > 0 ? r.flops * double(calls) / t / 1e9 : 0.0);
    out += line;
  }
  return out;
}

// ---- GPU step pieces ----
#if SAT_HAVE_CUDA
namespace {
cudaEvent_t ev(void* e) { return static_cast<cudaEvent_t>(e); }
}  // namespace

void Engine::setup_cuda() {
  const auto& ins = g_.inputs();
  slots_.resize(ins.size());
  for (size_t k = 0; k < ins.size(); ++k) {
    const Value& val = g_.value(ins[k]);
    const bool converts = val.spec.dtype == DType::bf16 || val.spec.dtype == DType::f16;
    const DType host_t = converts ? DType::f32 : val.spec.dtype;
    const size_t host_bytes = size_t(val.spec.shape.numel()) * dtype_size(host_t);
    for (int s = 0; s < kInputSlots; ++s) {
      InputSlot& sl = slots_[k][size_t(s)];
      sl.dev = DeviceBuffer(Device::cuda, val.spec.bytes(), "input slot");
      if (converts) sl.raw = DeviceBuffer(Device::cuda, host_bytes, "input upload");
      sl.staging = PinnedBuffer(host_bytes);
      std::memset(sl.staging.data(), 0, host_bytes);
      sl.value = Tensor(sl.dev.data(), val.spec.shape, val.spec.dtype, Device::cuda);
    }
  }
  const size_t n = g_.nodes().size();
  seeds_dev_ = DeviceBuffer(Device::cuda, std::max<size_t>(n, 1) * 8, "seeds");
  for (int s = 0; s < kInputSlots; ++s) {
    seeds_host_[size_t(s)] = PinnedBuffer(std::max<size_t>(n, 1) * 8);
    loss_host_[size_t(s)] = PinnedBuffer(64);
    cudaEvent_t a, b;
    SAT_CUDA_CHECK(cudaEventCreateWithFlags(&a, cudaEventDisableTiming));
    SAT_CUDA_CHECK(cudaEventCreateWithFlags(&b, cudaEventDisableTiming));
    uploaded_[size_t(s)] = a;
    done_[size_t(s)] = b;
  }
  dloss_host_ = PinnedBuffer(64);
  *dloss_host_.as<float>() = 1.0f;
  for (size_t i = 0; i < n; ++i) runs_[i].ctx.seed_dev = seeds_dev_.as<uint64_t>() + i;
  use_slot(0);
}

void Engine::destroy_cuda() {
  if (!cuda_) return;
  cudaStreamSynchronize(cuda_->stream);
  cudaStreamSynchronize(cuda_->copy_stream);
  for (int s = 0; s < kInputSlots; ++s) {
    if (uploaded_[size_t(s)]) cudaEventDestroy(ev(uploaded_[size_t(s)]));
    if (done_[size_t(s)]) cudaEventDestroy(ev(done_[size_t(s)]));
  }
}

void Engine::stage_input(int slot, int v, const Tensor& host) {
  const auto& ins = g_.inputs();
  size_t k = size_t(std::find(ins.begin(), ins.end(), v) - ins.begin());
  SAT_ASSERT(k < ins.size());
  InputSlot& sl = slots_[k][size_t(slot)];
  SAT_ASSERT(host.bytes() == sl.staging.bytes());
  std::memcpy(sl.staging.data(), host.ptr, host.bytes());
}

void Engine::queue_upload(int slot) {
  for (auto& per : slots_) {
    InputSlot& sl = per[size_t(slot)];
    void* dst = sl.raw.data() ? sl.raw.data() : sl.dev.data();
    SAT_CUDA_CHECK(cudaMemcpyAsync(dst, sl.staging.data(), sl.staging.bytes(), cudaMemcpyHostToDevice, cuda_->copy_stream));
  }
  SAT_CUDA_CHECK(cudaEventRecord(ev(uploaded_[size_t(slot)]), cuda_->copy_stream));
  SAT_CUDA_CHECK(cudaStreamWaitEvent(cuda_->stream, ev(uploaded_[size_t(slot)]), 0));
}

void Engine::use_slot(int slot) {
  const auto& ins = g_.inputs();
  for (size_t k = 0; k < ins.size(); ++k) {
    const Tensor& t = slots_[k][size_t(slot)].value;
    vals_[size_t(ins[k])] = t;
    for (int u : input_users_[size_t(ins[k])]) runs_[size_t(u / 64)].ctx.in[size_t(u % 64)] = t;
  }
}

void Engine::set_seed(int slot, uint64_t seed) {
  uint64_t* h = seeds_host_[size_t(slot)].as<uint64_t>();
  for (size_t i = 0; i < g_.nodes().size(); ++i) h[i] = mix_seed(seed, i);
}

void Engine::set_dloss(float dloss, const float* scale_dev) {
  *dloss_host_.as<float>() = dloss;
  dloss_scale_ = scale_dev;
}

void Engine::queue_forward(int slot, bool training) {
  cudaStream_t st = cuda_->stream;
  for (auto& per : slots_) {
    InputSlot& sl = per[size_t(slot)];
    if (sl.raw.data()) cuda::convert(sl.raw.data(), DType::f32, sl.dev.data(), sl.value.dtype, sl.value.numel(), st);
  }
  const size_t n = g_.nodes().size();
  // The seeds and (below) the loss travel through pinned memory that a replayed graph
  // reads and writes at every replay; the host updates them between replays.
  SAT_CUDA_CHECK(cudaMemcpyAsync(seeds_dev_.data(), seeds_host_[size_t(slot)].data(), n * 8, cudaMemcpyHostToDevice, st));
  run_forward_nodes(training, seeds_host_[size_t(slot)].as<uint64_t>()[0]);
  if (g_.loss() >= 0)
    SAT_CUDA_CHECK(cudaMemcpyAsync(loss_host_[size_t(slot)].data(), vals_[size_t(g_.loss())].ptr, 4,
                                   cudaMemcpyDeviceToHost, st));
}

void Engine::queue_backward(bool first_micro) {
  cudaStream_t st = cuda_->stream;
  float* dl = grads_[size_t(g_.loss())].f32();
  SAT_CUDA_CHECK(cudaMemcpyAsync(dl, dloss_host_.data(), 4, cudaMemcpyHostToDevice, st));
  if (dloss_scale_) cuda::scale_scalar(dl, dloss_scale_, st);
  run_backward_nodes(first_micro);
}

void Engine::queue_slot_done(int slot) {
  SAT_CUDA_CHECK(cudaEventRecord(ev(done_[size_t(slot)]), cuda_->stream));
}

float Engine::wait_slot(int slot) {
  SAT_CUDA_CHECK(cudaEventSynchronize(ev(done_[size_t(slot)])));
  return g_.loss() >= 0 ? *loss_host_[size_t(slot)].as<float>() : std::nanf("");
}
#else
void Engine::setup_cuda() { fail("this saturate was built without the CUDA backend"); }
void Engine::destroy_cuda() {}
void Engine::stage_input(int, int, const Tensor&) { fail("no CUDA backend"); }
void Engine::queue_upload(int) { fail("no CUDA backend"); }
void Engine::use_slot(int) { fail("no CUDA backend"); }
void Engine::set_seed(int, uint64_t) { fail("no CUDA backend"); }
void Engine::set_dloss(float, const float*) { fail("no CUDA backend"); }
void Engine::queue_forward(int, bool) { fail("no CUDA backend"); }
void Engine::queue_backward(bool) { fail("no CUDA backend"); }
void Engine::queue_slot_done(int) { fail("no CUDA backend"); }
float Engine::wait_slot(int) { fail("no CUDA backend"); }
#endif

}  // namespace sat
