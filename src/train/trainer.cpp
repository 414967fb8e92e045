#include "train/trainer.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/rng.h"
#include "core/timer.h"
#include "dist/nccl_comm.h"
#include "nn/safetensors.h"
#include "nn/shard.h"
#include "profile/nvml.h"
#include "train/agree.h"
#include "train/checkpoint.h"
#include "train/noise.h"
#include "train/report.h"
#include "train/validate.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#include "optim/optimizer_cuda.h"
#endif

namespace sat {
namespace {

void check_data(const ModelConfig& mc, const BuiltModel& m, const Dataset& ds) {
  Shape want = m.x_shape;
  Shape sample = ds.sample_shape();
  Shape got{};
  got.nd = sample.nd + 1;
  got.d[0] = want[0];
  for (int i = 0; i < sample.nd; ++i) got.d[size_t(i + 1)] = sample[i];
  SAT_CHECK(got == want && ds.sample_dtype() == m.x_dtype, "--data: ", ds.name(), " has samples of shape ",
            sample.str(), " but --model ", mc.name, " expects ", (mc.tokens ? "token sequences " : "images "),
            Shape(std::vector<int64_t>(want.d.begin() + 1, want.d.begin() + want.nd)).str());
  SAT_CHECK(ds.num_classes() <= mc.classes, "--data: ", ds.name(), " has ", ds.num_classes(),
            " classes but the model has ", mc.classes, " outputs");
}

double squared_norm(const float* g, int64_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return s;
}

}  // namespace

namespace {

// One step's times added to the run's: the executor's parts, the wait for the loss from the
// last stage, and what is left of the step's dt.
void add_breakdown(StepBreakdown& b, const StepStats& st, double loss_wait, double dt) {
  b.compute += st.compute_seconds, b.grad_sync += st.reduce_seconds, b.pipeline_wait += st.wait_seconds + loss_wait;
  b.data += st.data_seconds, b.optimizer += st.optimizer_seconds;
  b.other += dt - st.compute_seconds - st.reduce_seconds - st.wait_seconds - loss_wait - st.data_seconds -
             st.optimizer_seconds;
}

StepBreakdown per_step(StepBreakdown b, int64_t steps) {
  const double n = double(std::max<int64_t>(1, steps));
  for (double* x : {&b.compute, &b.tp_comm, &b.grad_sync, &b.pipeline_wait, &b.data, &b.optimizer, &b.other}) *x /= n;
  return b;
}

struct CommReplicaSum : ReplicaSum {
  explicit CommReplicaSum(dist::Comm& c) : comm(c) {}
  void sum(double* v, size_t n) override { comm.all_reduce_sync(v, n, DType::f64, dist::ReduceOp::sum); }
  dist::Comm& comm;
};

}  // namespace

DataOptions data_options_for(const ModelConfig& mc, uint64_t seed) {
  DataOptions o;
  o.model_takes_tokens = mc.tokens;
  o.image_shape = mc.image;
  o.num_classes = mc.classes;
  o.seq_len = mc.seq_len;
  o.vocab = mc.vocab;
  o.seed = seed;
  return o;
}

void fit_to_data(ModelConfig& mc, const Dataset& train) {
  if (mc.tokens) return;
  const Shape sample = train.sample_shape();
  if (mc.family == ModelFamily::file) {  // the file fixes its input
    SAT_CHECK(sample == mc.image, "--data ", train.name(), " has samples of shape ", sample.str(), " but --model ",
              mc.name, " declares its input as ", mc.image.str());
    return;
  }
  if (mc.family != ModelFamily::mlp) {
    mc.image = sample;
    mc.classes = train.num_classes();
    return;
  }
  ModelConfig want = mc;  // the mlp that would fit, for the message
  want.mlp_widths.front() = sample.numel();
  SAT_CHECK(sample.numel() == mc.mlp_widths.front(), "--model ", mc.name, " takes inputs of ", mc.mlp_widths.front(),
            " values, but --data ", train.name(), " has samples of shape ", sample.str(), " (", sample.numel(),
            " values): use --model ", model_spec(want));
  mc.image = sample;
}

// ---- the GPU side ---------------------------------------------------------------------
#if SAT_HAVE_CUDA
struct Trainer::Gpu {
  CudaCtx* ctx = nullptr;
  std::unique_ptr<CudaOptimizer> opt;
  size_t free_before = 0;
  cudaStream_t comm_stream = nullptr;  // the data-parallel reduction's
  // NCCL over the mesh's groups: dp on its own stream (buckets overlap backward), pipeline
  // and tied-weight groups on the compute stream (ordered with the step's work).
  std::unique_ptr<dist::Comm> dp, pp, tie, tp;
  // measure_noise: per chunk |first micro-batch's gradient|^2, then the reduced one's.
  double* norms = nullptr;
  double* norm_partials = nullptr;
  ~Gpu() {
    dp.reset();
    pp.reset();
    tie.reset();
    tp.reset();
    if (comm_stream) cudaStreamDestroy(comm_stream);
    if (norms) cudaFree(norms);
    if (norm_partials) cudaFree(norm_partials);
    cuda_ctx_destroy(ctx);
  }
};
#else
struct Trainer::Gpu {};
#endif

// ---- the executor's hooks -------------------------------------------------------------
class Trainer::Hooks : public StepHooks {
 public:
  explicit Hooks(Trainer& t) : t_(t), batches_(size_t(t.cfg_.accum)) {
    // Flat gradient range of each chunk's parameters (declared in node order, so contiguous).
    const Graph& g = *t.rp_->model.graph;
    ranges_.assign(g.chunks().size(), {t.params_->flat_size(), 0});
    std::vector<bool> seen(g.params().size(), false);
    for (const Node& n : g.nodes())
      for (int pid : n.param_ids) {
        if (seen[size_t(pid)]) continue;
        seen[size_t(pid)] = true;
        auto& r = ranges_[size_t(n.chunk)];
        const int64_t lo = t.params_->offset(size_t(pid));
        const ParamDecl& d = g.params()[size_t(pid)];
        r.first = std::min(r.first, lo);
        r.second = std::max(r.second, lo + d.spec.shape.numel());
        // Tensor parallel: a parameter whole on every rank of the group counts on its first.
        if (!d.shard.split() && t.mesh_->tp_rank() > 0) excluded_.push_back({lo, lo + d.spec.shape.numel()});
        if (!d.shard.partial_grad) continue;
        // Under ZeRO-2/3 the gradients are this rank's pieces: the parameter's part of them.
        if (t.sharded_) {
          auto [at, n] = t.params_->shard_part(size_t(pid));
          if (n > 0) partial_.push_back({at, at + n});
        } else {
          partial_.push_back({lo, lo + d.spec.shape.numel()});
        }
      }
    std::sort(excluded_.begin(), excluded_.end());
    std::sort(partial_.begin(), partial_.end());
  }
  void set_epoch(int64_t e) { epoch_ = e; }
  void begin_step() {
    fetched_ = 0;
    small_sq_ = big_sq_ = 0;
  }
  std::vector<Tensor> data(int chunk, int micro) override {
    const std::vector<int>& wanted = t_.rp_->model.graph->chunks()[size_t(chunk)].data;
    if (wanted.empty()) return {};  // fetched only by the chunk that reads them: the loader keeps that many
    while (fetched_ <= micro) {
      Batch& b = batches_[size_t(fetched_)];
      while (!t_.train_loader_->next(b)) t_.train_loader_->start_epoch(++epoch_);
      ++fetched_;
    }
    const Batch& b = batches_[size_t(micro)];
    std::vector<Tensor> d;
    for (int v : wanted) d.push_back(v == t_.rp_->model.x ? b.x : b.y);
    return d;
  }
  const std::function<void(int)>* node_hook(int, int micro) override {
    return t_.reducer_->node_hook(micro + 1 == t_.cfg_.accum);
  }
  bool accumulates_grads() const override { return t_.reducer_->accumulates_grads(); }
  void after_backward(int chunk, int micro, bool replayed) override {
    t_.reducer_->after_backward(chunk, micro + 1 == t_.cfg_.accum, replayed);
    if (t_.cfg_.measure_noise && micro == 0) small_sq_ += norm(ranges_[size_t(chunk)], int(chunk));
  }
  void reduce_grads() override {
    t_.reducer_->reduce();
    sum_partial_grads();
    if (!t_.cfg_.measure_noise) return;
    const ParamStore& ps = *t_.params_;
    const bool zero = t_.cfg_.zero >= 1 && t_.mesh_->dp() > 1;
    big_sq_ = norm(zero ? std::pair<int64_t, int64_t>{ps.shard_begin(), ps.shard_begin() + ps.shard_len()}
                        : std::pair<int64_t, int64_t>{0, ps.flat_size()},
                   int(ranges_.size()));
  }
  void optimizer_step(float lr) override {
    ParamStore& ps = *t_.params_;
    if (t_.on_gpu()) {
#if SAT_HAVE_CUDA
      Gpu& G = *t_.gpu_;
      G.opt->set_lr(lr, G.ctx->stream);
      G.opt->step(ps.flat_params(), ps.flat_grads(), ps.optimizer_slots() ? ps.flat_slot(0) : nullptr, ps.flat_lp(),
                  G.ctx->stream);
#endif
    } else {
      t_.opt_->step(ps, lr);
    }
    t_.reducer_->after_update();
  }
  // The step's noise-estimator sample (see add_noise_sample), after the step.
  void noise_sample(std::vector<GradNormSample>& out) {
#if SAT_HAVE_CUDA
    if (t_.on_gpu()) {
      std::vector<double> v(ranges_.size() + 1);
      SAT_CUDA_CHECK(cudaMemcpy(v.data(), t_.gpu_->norms, v.size() * sizeof(double), cudaMemcpyDeviceToHost));
      small_sq_ = big_sq_ = 0;
      for (size_t c = 0; c < ranges_.size(); ++c) small_sq_ += v[c];
      big_sq_ = v.back();
    }
#endif
    const dist::Mesh& m = *t_.mesh_;
    const double k = double(t_.cfg_.accum);
    double v[2] = {k * k * small_sq_, big_sq_};  // backward scaled each micro-batch's gradient by 1/accum
    // Each stage holds its own parameters: sum over the pipeline; the first micro-batch's
    // norm is averaged over the data-parallel ranks, the global batch's summed over the
    // ZeRO-1 shards.
    if (m.pp() > 1) m.pp_group().all_reduce_sync(v, 2, DType::f64, dist::ReduceOp::sum);
    if (m.tp() > 1) m.tp_group().all_reduce_sync(v, 2, DType::f64, dist::ReduceOp::sum);  // each element once
    if (m.dp() > 1) {
      m.dp_group().all_reduce_sync(v, 1, DType::f64, dist::ReduceOp::avg);
      if (t_.cfg_.zero >= 1) m.dp_group().all_reduce_sync(v + 1, 1, DType::f64, dist::ReduceOp::sum);
    }
    // fp16: a step skipped for inf/NaN gradients has no usable norms.
    if (std::isfinite(v[0]) && std::isfinite(v[1]))
      out.push_back({v[0], v[1], t_.cfg_.batch, t_.cfg_.batch * t_.cfg_.accum * m.dp()});
  }

 private:
  // |gradient|^2 of the flat range (on the GPU: enqueued into norms[slot]).
  double norm(std::pair<int64_t, int64_t> r, int slot) {
    const ParamStore& ps = *t_.params_;
    if (r.second <= r.first) return 0;
#if SAT_HAVE_CUDA
    if (t_.on_gpu()) {
      Gpu& G = *t_.gpu_;
      const float* scale = G.opt->loss_scaling() ? G.opt->loss_scale_device() : nullptr;
      cuda::sum_squares(ps.flat_grads() + r.first, r.second - r.first, scale, G.norms + slot, G.norm_partials,
                        G.ctx->stream);
      return 0;
    }
#endif
    (void)slot;
    double sum = 0;
    int64_t at = r.first;
    for (auto [lo, hi] : excluded_) {
      if (hi <= at) continue;
      if (lo >= r.second) break;
      if (lo > at) sum += squared_norm(ps.flat_grads() + at, lo - at);
      at = std::max(at, hi);
    }
    if (at < r.second) sum += squared_norm(ps.flat_grads() + at, r.second - at);
    return sum;
  }

  // Sequence parallelism: LayerNorm gradients are each rank's part of the sum over the
  // tokens; the tensor-parallel group adds them up (after the data-parallel average, which
  // is linear: the order does not matter).
  void sum_partial_grads() {
    dist::Comm* tp = t_.tp_comm();
    for (size_t k = 0; k < partial_.size();) {
      int64_t lo = partial_[k].first, hi = partial_[k].second;
      // Neighbours separated by padding only go together (not pieces: there the gap may
      // hold a part of another parameter).
      for (++k; !t_.sharded_ && k < partial_.size() && partial_[k].first <= ((hi + 15) / 16) * 16; ++k)
        hi = partial_[k].second;
      tp->all_reduce(t_.params_->flat_grads() + lo, size_t(hi - lo), DType::f32, dist::ReduceOp::sum)->wait();
    }
  }

  Trainer& t_;
  std::vector<Batch> batches_;  // this step's micro-batches (the loader keeps them valid)
  int fetched_ = 0;
  int64_t epoch_ = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  std::vector<std::pair<int64_t, int64_t>> excluded_;  // flat ranges counted on another tp rank
  std::vector<std::pair<int64_t, int64_t>> partial_;   // flat ranges of partial gradients
  double small_sq_ = 0, big_sq_ = 0;
};

// ---- construction ---------------------------------------------------------------------
MemoryPlan Trainer::plan(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test,
                         int world, int stage) {
  if (world <= 0) world = cfg.comm ? cfg.comm->size() : 1;
  dist::Mesh::check(world, cfg.tp, cfg.pp);
  return plan_rank(resolved_model(mc, cfg), cfg, train, test, stage, world / (cfg.tp * cfg.pp)).memory;
}

Trainer::Trainer(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test)
    : Trainer(nullptr, mc, cfg, train, test) {}

Trainer::Trainer(JobPlan& job, const TrainConfig& cfg) : Trainer(&job, job.model(), cfg, job.train(), job.test()) {}

Trainer::Trainer(JobPlan* job, const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test)
    : mc_(mc), cfg_(cfg), train_(train), test_(cfg.evaluate ? test : nullptr) {
  cfg_.optim = resolve_optim(cfg.optim);
  cfg_.schedule = resolve_schedule(cfg.schedule);
  if (cfg.comm) {
    world_ = cfg.comm;
  } else {
    own_comm_ = dist::make_self_comm();
    world_ = own_comm_.get();
  }
  // Before any collective whose size depends on them: every rank trains the same thing.
  agree_on_config(*world_, config_fingerprint(mc, cfg_, train, test_));
  const int world = world_->size();
  validate_run(mc, cfg, world);
  mesh_ = std::make_unique<dist::Mesh>(*world_, cfg.tp, cfg.pp);
  const dist::Mesh& m = *mesh_;
  int dev_index = 0;
  mc_ = resolved_model(mc, cfg, m.tp_rank(), &dev_index);
  const bool cuda = mc_.device == Device::cuda;
  // One GPU per rank, picked by the rank's place on its node (as torchrun's LOCAL_RANK).
  if (cuda && world > 1 && cfg.device.find(':') == std::string::npos)
    dev_index = dist::local_rank_gpu("--device " + cfg.device);
  if (!job) own_job_ = std::make_unique<JobPlan>(mc_, cfg_, train, test_, m.dp());
  job_ = job ? job : own_job_.get();
  SAT_CHECK(job_->model().tp_rank == m.tp_rank() && job_->dp() == m.dp() && job_->config().batch == cfg.batch,
            "internal error: the job's plan is not this rank's");
  rp_ = &job_->stage(m.pp_rank());
  check_data(mc, rp_->model, train);
  if (test_) check_data(mc, rp_->model, *test_);
  SAT_CHECK(train.size() >= cfg.batch, "--batch ", cfg.batch, " is larger than the training set (", train.size(),
            " samples of ", train.name(), ")");
  const Graph& g = *rp_->model.graph;
  const int shards = cfg.zero >= 1 ? m.dp() : 1;
  const StoreSharding sharding =
      cfg.zero >= 2 ? rp_->shards.sharding(m.dp_rank()) : StoreSharding{shards > 1 ? 1 : 0, shards, shards > 1 ? m.dp_rank() : 0, {}};
  mem_base_ = mem_stats().current;
  mem_reset_peak();
  params_ = std::make_unique<ParamStore>(g.params(), g.states(), optimizer_slots(cfg_.optim), sharding);
  init_params();
  const bool nccl_dp = cuda && (cfg.dist_backend == DistBackend::nccl || m.dp() > 1);
  if (cuda) setup_gpu(dev_index, nccl_dp);
  dist::Comm* tie = g.tied_copies().empty() && g.tied_remote().empty() ? nullptr : m.embedding_group();
  if (cfg.zero >= 2) {
    reducer_ = std::make_unique<ShardedDP>(g, *params_, rp_->shards, m.dp_group(), tie);
    sharded_ = static_cast<ShardedDP*>(reducer_.get());
  }
  engine_ = std::make_unique<Engine>(*rp_->model.graph, *params_, rp_->step, gpu_ctx());
  if (sharded_) engine_->set_node_hooks(sharded_);
  if (m.tp() > 1) engine_->set_group(tp_comm());
  if (cfg.sync_bn && m.dp() > 1) {
    replica_sum_ = std::make_unique<CommReplicaSum>(m.dp_group());
    engine_->set_replica_sum(replica_sum_.get());
  }
  opt_ = std::make_unique<Optimizer>(cfg_.optim);
  setup_step(nccl_dp);
}

// The loaders, the data-parallel reduction and the executor of this rank's schedule.
void Trainer::setup_step(bool nccl_dp) {
  const dist::Mesh& m = *mesh_;
  const Graph& g = *rp_->model.graph;
  if (rp_->reads_data) {
    train_loader_ = std::make_unique<BatchLoader>(train_, cfg_.batch, cfg_.shuffle, cfg_.seed, true, kPrefetch,
                                                  Sharding{m.dp_rank(), m.dp(), cfg_.accum, cfg_.last_batch},
                                                  rp_->loader_keep);
    if (test_)
      test_loader_ = std::make_unique<BatchLoader>(*test_, cfg_.batch, false, cfg_.seed, false, kPrefetch,
                                                   Sharding{m.dp_rank(), m.dp()});
  }
  const BucketOptions bo{cfg_.bucket_mb, std::min(cfg_.bucket_first_mb, cfg_.bucket_mb)};
  dist::Comm* tie = g.tied_copies().empty() && g.tied_remote().empty() ? nullptr : m.embedding_group();
  dist::Comm* pp = m.pp() > 1 ? &m.pp_group() : nullptr;
#if SAT_HAVE_CUDA
  if (gpu_) {
    reducer_ = std::make_unique<GradReducer>(g, *params_, gpu_->dp ? *gpu_->dp : m.dp_group(),
                                             tie ? gpu_->tie.get() : nullptr, bo, false, nccl_dp, gpu_->ctx->stream,
                                             gpu_->comm_stream);
    if (pp) pp = gpu_->pp.get();
  }
#endif
  if (!reducer_) reducer_ = std::make_unique<GradReducer>(g, *params_, m.dp_group(), tie, bo, cfg_.zero >= 1);
  comm_backend_ = m.dp() > 1 || nccl_dp ? (gpu_ && nccl_dp ? "nccl" : m.dp_group().backend_name()) : "";
  exec_ = std::make_unique<Executor>(*engine_, rp_->actions, rp_->ctx_of, pp);
  hooks_ = std::make_unique<Hooks>(*this);
  setup_profiler();
}

// --profile and --trace: the profiler on the step's seams (the engine's timer is attached
// per step, by begin_step's answer).
void Trainer::setup_profiler() {
  if (!cfg_.profile && cfg_.trace_dir.empty()) return;
  const dist::Mesh& m = *mesh_;
  ProfileOptions o;
  o.table = cfg_.profile;
  o.trace_dir = cfg_.trace_dir;
  o.schedule = cfg_.trace_steps;
  o.rank = m.rank(), o.world = m.size();
  o.backend = world_->backend_name();
  o.stages = m.pp(), o.stage = m.pp_rank();
  o.optimizer = opt_->config().name == "adamw" ? "AdamW" : "SGD";  // PyTorch's class names
  profiler_ = std::make_unique<Profiler>(*rp_->model.graph, rp_->step, rp_->actions, rp_->memory, o);
  if (cfg_.trace_dir.empty()) return;
  exec_->set_observer(profiler_.get());
  auto watch = [&](dist::Comm* c, const char* name) {
    if (auto* counting = dynamic_cast<dist::CountingComm*>(c)) counting->observe(profiler_.get(), name);
  };
  watch(&m.tp_group(), "tp"), watch(&m.dp_group(), "dp"), watch(&m.pp_group(), "pp");
  watch(m.embedding_group(), "embedding");
}

// The graph's layers go before the GPU side they enqueue on: a tensor-parallel layer keeps
// the Works of its NCCL collectives (complete once the engine has waited for its streams)
// until it is destroyed, while their communicators still exist.
Trainer::~Trainer() {
  hooks_.reset();
  exec_.reset();
  engine_.reset();
  rp_->model.graph.reset();
}

namespace {
// Every data-parallel replica starts from dp rank 0's parameters and states (the same
// seed gives the same values already; the broadcast makes it true for any initialisation).
void broadcast_store(dist::Comm& dp, ParamStore& ps) {
  if (dp.size() <= 1) return;
  dp.broadcast_sync(ps.flat_params(), size_t(ps.flat_size()), DType::f32, 0);
  for (size_t i = 0; i < ps.num_states(); ++i) {
    Tensor t = ps.host_state(i);
    dp.broadcast_sync(t.ptr, size_t(t.numel()), t.dtype, 0);
  }
}
}  // namespace

// Whether every value of this rank's parameters (its stage, its shard) is finite: host
// copies, so on a GPU after sync_to_host.
bool Trainer::params_finite() const {
  const ParamStore& ps = *params_;
  const float* p = ps.device() == Device::cpu ? ps.flat_params() : ps.host_flat_params();
  const int64_t n = ps.sharding().stage >= 3 ? ps.shard_len() : ps.flat_size();
  int64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
  for (int64_t i = 0; i < n; ++i) bad += std::isfinite(p[i]) ? 0 : 1;
  return bad == 0;
}

// After each optimizer step on the CPU: the first step whose update left a parameter of
// this rank not finite (the loss can stay finite a while: an embedding row no batch reads).
// The optimizer counts them as it updates (its shard, under ZeRO: every value has a rank
// that updates it, and check_params_finite agrees over the job).
void Trainer::note_nonfinite_params(int64_t step) {
  if (first_nonfinite_step_ == 0 && opt_ && !on_gpu() && opt_->last_nonfinite() > 0) first_nonfinite_step_ = step;
}

// The error of a step whose loss is not finite (every rank has the same loss): with the step
// whose update first left this rank's parameters not finite, when that came before.
std::string Trainer::diverged_message(int64_t step, double loss) const {
  std::string m = str_cat("training diverged: the loss of step ", step, " is ", loss);
  if (first_nonfinite_step_ > 0 && first_nonfinite_step_ < step)
    m += str_cat(" (the parameters first became non-finite in the update of step ", first_nonfinite_step_, ")");
  return m + "; try a smaller --lr; nothing was saved";
}

// After the last step, on every rank alike (the first bad step is agreed over the job): a
// run whose parameters are not finite fails instead of saving them and reporting success.
void Trainer::check_params_finite(int64_t steps) {
  double first = first_nonfinite_step_ > 0 ? double(first_nonfinite_step_) : params_finite() ? 0 : double(steps);
  double v[1] = {first > 0 ? first : 1e300};
  if (world_->size() > 1) world_->all_reduce_sync(v, 1, DType::f64, dist::ReduceOp::min);
  SAT_CHECK(v[0] >= 1e300, "training diverged: the parameters are not finite after step ", int64_t(v[0]), " of ",
            steps, " (the loss was still finite; try a smaller --lr); nothing was saved");
}

void Trainer::broadcast_initial_state() { broadcast_store(mesh_->dp_group(), *params_); }

// ZeRO-3 keeps only its pieces: the full parameters are drawn in a store of their own,
// which is dropped once sharded (the measured peak then starts again: the plan is the step's).
void Trainer::init_params() {
  if (params_->sharding().stage < 3) {
    params_->init(cfg_.seed);
    broadcast_initial_state();
    agree_on_replicas(*world_, mesh_->dp_group(), store_checksum(*params_), "initialisation");
    return;
  }
  {
    const Graph& g = *rp_->model.graph;
    ParamStore full(g.params(), g.states(), 0);
    full.init(cfg_.seed);
    broadcast_store(mesh_->dp_group(), full);
    agree_on_replicas(*world_, mesh_->dp_group(), store_checksum(full), "initialisation");
    params_->shard_from(full);
  }
  mem_reset_peak();
}

const ParamStore& Trainer::unsharded(std::unique_ptr<ParamStore>& keep) {
  if (!sharded_ || params_->sharding().stage < 3) return *params_;
  keep = sharded_->unsharded();
  return *keep;
}

dist::Comm* Trainer::tp_comm() const {
#if SAT_HAVE_CUDA
  if (gpu_ && gpu_->tp) return gpu_->tp.get();
#endif
  return &mesh_->tp_group();
}

CudaCtx* Trainer::gpu_ctx() const {
#if SAT_HAVE_CUDA
  return gpu_ ? gpu_->ctx : nullptr;
#else
  return nullptr;
#endif
}

void Trainer::setup_gpu(int dev_index, bool nccl_dp) {
#if SAT_HAVE_CUDA
  gpu_ = std::make_unique<Gpu>();
  Gpu& G = *gpu_;
  const dist::Mesh& m = *mesh_;
  size_t total_b = 0;
  SAT_CUDA_CHECK(cudaSetDevice(dev_index));
  SAT_CUDA_CHECK(cudaMemGetInfo(&G.free_before, &total_b));
  cuda_mem_reset_peak();
  G.ctx = cuda_ctx_create(dev_index);
  G.ctx->tf32 = cfg_.precision == Precision::tf32;
  params_->to_device(Device::cuda, mc_.act);
  G.opt = std::make_unique<CudaOptimizer>(cfg_.optim, params_->flat_size(), mc_.act, cfg_.precision == Precision::fp16);
  if (nccl_dp) {
    int least = 0, greatest = 0;
    SAT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    SAT_CUDA_CHECK(cudaStreamCreateWithPriority(&G.comm_stream, cudaStreamNonBlocking, greatest));
    G.dp = dist::counted(dist::make_nccl_comm(m.dp_group(), dev_index, G.comm_stream));
  }
  if (m.pp() > 1) G.pp = dist::counted(dist::make_nccl_comm(m.pp_group(), dev_index, G.ctx->stream));
  // The tensor-parallel layers' collectives run on the compute stream, in the step's order.
  if (m.tp() > 1) G.tp = dist::counted(dist::make_nccl_comm(m.tp_group(), dev_index, G.ctx->stream));
  const Graph& g = *rp_->model.graph;
  if (!g.tied_copies().empty() || !g.tied_remote().empty())
    G.tie = dist::counted(dist::make_nccl_comm(*m.embedding_group(), dev_index, G.ctx->stream));
  if (cfg_.measure_noise) {
    SAT_CUDA_CHECK(cudaMalloc(&G.norms, (g.chunks().size() + 1) * sizeof(double)));
    SAT_CUDA_CHECK(cudaMalloc(&G.norm_partials, cuda::kSumSquaresPartials * sizeof(double)));
  }
#else
  (void)dev_index;
  (void)nccl_dp;
  fail("this saturate was built without the CUDA backend");
#endif
}

// ---- the run --------------------------------------------------------------------------
// The step's mean loss on every rank: computed by the stage with the loss, averaged over
// its data-parallel group and broadcast along the pipeline (the wait counts as bubble).
double Trainer::step_loss(double loss_sum, int losses, double& wait) {
  const dist::Mesh& m = *mesh_;
  double loss = losses > 0 ? loss_sum / double(cfg_.accum) : 0;
  if (losses > 0 && m.dp() > 1) m.dp_group().all_reduce_sync(&loss, 1, DType::f64, dist::ReduceOp::avg);
  if (m.pp() > 1) {
    const double t0 = now_seconds();
    m.pp_group().broadcast_sync(&loss, 1, DType::f64, m.pp() - 1);
    if (m.pp_rank() != m.pp() - 1) wait += now_seconds() - t0;
  }
  return loss;
}

TrainResult Trainer::run(const std::function<void(const StepMetrics&)>& on_step) {
  TrainResult r;
  const double t_start = now_seconds();
  const dist::Mesh& m = *mesh_;
  const int64_t per_epoch = BatchLoader::train_steps(train_.size(), cfg_.batch, cfg_.accum, m.dp(), cfg_.last_batch);
  SAT_CHECK(per_epoch >= 1 || cfg_.steps > 0, "--accum ", cfg_.accum, " x --batch ", cfg_.batch,
            " is more than one epoch of ", train_.name(), " (", train_.size(), " samples)");
  int64_t total = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * per_epoch;
  SAT_CHECK(total >= 1, "--epochs/--steps: nothing to train (", cfg_.steps > 0 ? "0 steps" : "0 epochs", ")");
  const int64_t global_batch = cfg_.batch * cfg_.accum * m.dp();
  r.global_batch = global_batch;
  const int64_t start = resume_ ? std::min(resume_->step, total) : 0;  // steps already done
  if (resume_) r.losses = resume_->losses, r.resumed_from = resume_->step;
  r.warmup_excluded = cfg_.warmup_excluded >= 0 ? cfg_.warmup_excluded : std::min<int64_t>(3, (total - start) / 5);
  r.predicted_memory_bytes = rp_->memory.total();
  StepReporter reporter(cfg_.progress, cfg_.out_dir, cfg_.measure_noise, resume_ ? resume_->step : 0);
  if (train_loader_) train_loader_->start_epoch(resume_ ? resume_->epoch : 0, resume_ ? resume_->step_in_epoch * cfg_.accum : 0);
  if (resume_) hooks_->set_epoch(resume_->epoch);
  double last_save = now_seconds();
  double t_measure = 0;
  StepBreakdown spent;  // summed over the measured steps
  std::unique_ptr<GpuSampler> sampler;
  if (on_gpu()) {
    std::string bus_id;
#if SAT_HAVE_CUDA
    char id[64] = {0};
    if (cudaDeviceGetPCIBusId(id, sizeof id, gpu_->ctx->device) == cudaSuccess) bus_id = id;
#endif
    sampler = std::make_unique<GpuSampler>(0, bus_id);
    sampler->start();
  }
  NoiseScale noise(cfg_.noise_decay);
#if SAT_HAVE_CUDA
  const float* scale = on_gpu() && gpu_->opt->loss_scaling() ? gpu_->opt->loss_scale_device() : nullptr;
#else
  const float* scale = nullptr;
#endif
  engine_->set_dloss(1.0f / float(cfg_.accum), scale);
  const GroupBytes traffic_before = traffic();
  const double t_train = now_seconds();
  for (int64_t step = start; step < total; ++step) {
    const double t0 = now_seconds();
    if (step - start == r.warmup_excluded) {
      t_measure = t0;
      reducer_->reset_timing();
    }
    const bool measured = step - start >= r.warmup_excluded;
    if (profiler_) engine_->set_node_timer(profiler_->begin_step(step + 1, measured) ? profiler_.get() : nullptr);
    const float lr = schedule_lr(cfg_.schedule, cfg_.optim.lr, step, total);
    hooks_->begin_step();
    StepStats st = exec_->run_step([&](int micro) { return mix_seed(cfg_.seed, uint64_t(step * cfg_.accum + micro)); },
                                   lr, *hooks_);
    double wait = st.wait_seconds;
    const double loss = step_loss(st.loss_sum, st.losses, wait);
    if (cfg_.measure_noise) hooks_->noise_sample(r.grad_norms);
    if (on_gpu() && cfg_.cuda_graph && step == 0) engine_->set_graphs(true);  // the first step runs eagerly
    SAT_CHECK(std::isfinite(loss) || (on_gpu() && cfg_.precision == Precision::fp16), diverged_message(step + 1, loss));
    const double dt = now_seconds() - t0;
    if (profiler_) profiler_->end_step(t0, t0 + dt);
    if (measured) add_breakdown(spent, st, wait - st.wait_seconds, dt);
    StepMetrics sm{step + 1, loss, lr, dt, double(global_batch) / dt};
    if (cfg_.measure_noise) {
      // A step without norms (fp16: skipped for inf/NaN gradients) leaves the estimate as it was.
      if (size_t(noise.count()) < r.grad_norms.size()) {
        const GradNormSample& gs = r.grad_norms.back();
        noise.add(gs.small_sq, gs.b_small, gs.big_sq, gs.b_big);
      }
      sm.noise_scale = noise.estimate();
    }
    r.losses.push_back(loss);
    note_nonfinite_params(step + 1);
    // Before stop_early is asked, so that it sees this step (the library's epoch ends decide there).
    if (on_step) on_step(sm);
    const bool timed = cfg_.time_limit > 0 && step - start >= r.warmup_excluded + 2;
    if ((timed || cfg_.stop_early) && step + 1 < total) {
      // Every rank stops at the same step: rank 0's clock (and answer) decides.
      r.steps = step + 1;
      double stop = (timed && now_seconds() - t_measure >= cfg_.time_limit) || (cfg_.stop_early && cfg_.stop_early(r));
      if (world_->size() > 1) world_->broadcast_sync(&stop, 1, DType::f64, 0);
      if (stop > 0) total = step + 1;
    }
    reporter.step(sm, total, now_seconds() - t_train);
    if (!cfg_.checkpoint_dir.empty()) {
      const CkptDecision d = checkpoint_due(step + 1, last_save);
      if (d.finish) finish_checkpoint();
      const bool last = d.signal || step + 1 == total;  // the run ends here: complete before going on
      if (d.save || last) save_checkpoint(cfg_.checkpoint_dir, step + 1, total, r.losses, last), last_save = now_seconds();
      if (d.signal) r.stop_signal = d.signal, total = step + 1;
    }
  }
  if (sampler) {
    sampler->stop();
    if (sampler->available() && sampler->stats().util_samples > 0) r.gpu_utilization_mean = sampler->stats().mean_util_pct;
  }
  const double t_end = now_seconds();
  engine_->set_node_timer(nullptr);
  if (profiler_) profiler_->finish();
  r.noise_scale = noise.estimate();
  if (cfg_.measure_noise) r.noise_interval = noise.interval();
  r.steps = total;
  const int64_t ran = std::max<int64_t>(1, total - start);  // steps this process ran
  const GroupBytes moved = traffic();
  r.comm_bytes_per_step = {(moved.tp - traffic_before.tp) / double(ran), (moved.dp - traffic_before.dp) / double(ran),
                           (moved.pp - traffic_before.pp) / double(ran),
                           (moved.embedding - traffic_before.embedding) / double(ran)};
  r.final_train_loss = r.losses.empty() ? NAN : r.losses.back();
  r.train_seconds = t_end - t_train;
  const int64_t measured = total - start - r.warmup_excluded;
  r.samples_per_second = measured > 0 ? double(measured * global_batch) / (t_end - t_measure) : 0;
  finish_checkpoint();
  r.checkpoints = ckpt_stats_.written, r.checkpoint_seconds = ckpt_stats_.paused;
  r.checkpoint_write_seconds = ckpt_stats_.written_seconds;
  r.checkpoint_bytes = ckpt_stats_.last_bytes, r.last_checkpoint = ckpt_stats_.last;
  finish(r, total);
  check_params_finite(total);
  if (test_ && !r.stop_signal) {  // stopping for preemption: no time for evaluation
    if (world_->rank() == 0 && cfg_.progress != 0)
      std::fprintf(stderr, "evaluating on %s (%lld samples)\n", test_->name().c_str(), (long long)test_->size());
    r.test = evaluate();
  }
  r.peak_memory_bytes = mem_stats().peak - mem_base_;
#if SAT_HAVE_CUDA
  if (on_gpu()) {
    r.predicted_memory_bytes = rp_->memory.device;
    r.peak_memory_bytes = cuda_mem_stats().peak;
  }
#endif
  gather_ranks(r, split_tp_comm(per_step(spent, measured)));
  r.wall_seconds = now_seconds() - t_start;
  return r;
}

// After the last step: the layout, the reduction's timing, BatchNorm statistics and the
// GPU's figures.
void Trainer::finish(TrainResult& r, [[maybe_unused]] int64_t total) {
  const dist::Mesh& m = *mesh_;
  r.world_size = m.size();
  r.dp = m.dp();
  r.tp = m.tp();
  r.pp = m.pp();
  r.pp_schedule = pipe_schedule_name(cfg_.pp_schedule);
  r.virtual_stages = cfg_.virtual_stages;
  r.pp_split.assign(rp_->split.cuts.begin() + 1, rp_->split.cuts.end() - 1);
  r.comm_backend = comm_backend_;
  // (ZeRO-2/3 measure only the seconds the step waited for its gathers and reductions: no
  // part of them counts as hidden.)
  r.comm_seconds = reducer_->window_seconds();
  r.comm_hidden_fraction = r.comm_seconds > 0
                               ? std::clamp(1.0 - reducer_->exposed_seconds() / r.comm_seconds, 0.0, 1.0)
                               : 0.0;
  sync_states_from_first_replica();
  r.precision = precision_name(cfg_.precision);
#if SAT_HAVE_CUDA
  if (on_gpu()) {
    Gpu& G = *gpu_;
    engine_->synchronize();
    r.device = "cuda";
    r.device_name = cuda_device_name(G.ctx->device);
    auto [launches, kernels] = engine_->take_launches();
    r.graph_replay = launches > 0;
    const int64_t measured = std::max<int64_t>(1, total - 1);  // graphs replay from the second step on
    r.launches_per_step = launches / measured;
    r.kernels_per_step = r.graph_replay ? kernels / measured : -1;
    size_t free_now = 0, total_b = 0;
    SAT_CUDA_CHECK(cudaMemGetInfo(&free_now, &total_b));
    r.device_memory_used_bytes = G.free_before > free_now ? G.free_before - free_now : 0;
    auto sc = G.opt->scalars_host();
    r.skipped_steps = sc.skipped;
    r.loss_scale = sc.loss_scale;
    params_->sync_to_host();
  }
#endif
}

// Per-replica BatchNorm statistics differ between data-parallel ranks: evaluate (and
// save) the first replica's, as DDP does by broadcasting its buffers.
void Trainer::sync_states_from_first_replica() {
  dist::Comm& dp = mesh_->dp_group();
  if (dp.size() <= 1 || cfg_.sync_bn) return;
  for (size_t i = 0; i < params_->num_states(); ++i) {
#if SAT_HAVE_CUDA
    if (on_gpu()) {  // the states live on the GPU: broadcast there
      Tensor t = params_->state(i);
      gpu_->dp->broadcast(t.ptr, size_t(t.numel()), t.dtype, 0)->wait();
      continue;
    }
#endif
    Tensor t = params_->host_state(i);
    dp.broadcast_sync(t.ptr, size_t(t.numel()), t.dtype, 0);
  }
}

// With layers timed (--profile), the tensor-parallel collectives' layers move from compute
// to tp_comm.
StepBreakdown Trainer::split_tp_comm(StepBreakdown b) const {
  if (!profiler_ || profiler_->measured_steps() == 0) return b;
  b.tp_comm = std::min(b.compute, profiler_->tp_comm_seconds());
  b.compute -= b.tp_comm;
  return b;
}

// Every rank's place, memory, step time and its breakdown (t: this rank's, per measured
// step; its parts add up to the step), gathered on every rank.
void Trainer::gather_ranks(TrainResult& r, const StepBreakdown& t) {
  const dist::Mesh& m = *mesh_;
  const GroupBytes& c = r.comm_bytes_per_step;
  std::vector<double> mine{double(m.rank()), double(m.pp_rank()), double(m.dp_rank()), double(m.tp_rank()),
                           double(r.predicted_memory_bytes), double(r.peak_memory_bytes), t.total(), t.pipeline_wait,
                           c.tp, c.dp, c.pp, c.embedding, t.compute, t.tp_comm, t.grad_sync, t.pipeline_wait, t.data,
                           t.optimizer, t.other};
  constexpr size_t kFixed = 19;
  for (size_t b : rp_->memory.by_kind) mine.push_back(double(b));
  const size_t n = mine.size();
  std::vector<double> all(n * size_t(m.size()));
  world_->all_gather(mine.data(), all.data(), n, DType::f64)->wait();
  double bubble = 0;
  for (int k = 0; k < m.size(); ++k) {
    const double* a = all.data() + n * size_t(k);
    RankReport rr;
    rr.rank = int(a[0]), rr.stage = int(a[1]), rr.dp_rank = int(a[2]), rr.tp_rank = int(a[3]);
    rr.predicted_memory_bytes = size_t(a[4]), rr.peak_memory_bytes = size_t(a[5]);
    rr.step_seconds = a[6], rr.wait_seconds = a[7];
    rr.comm_bytes_per_step = {a[8], a[9], a[10], a[11]};
    rr.breakdown = {a[12], a[13], a[14], a[15], a[16], a[17], a[18]};
    for (size_t i = kFixed; i < n; ++i) rr.memory_by_kind.push_back(size_t(a[i]));
    r.ranks.push_back(rr);
    r.rank_step_seconds.push_back(rr.step_seconds);
    bubble += rr.step_seconds > 0 ? rr.wait_seconds / rr.step_seconds : 0;
  }
  r.bubble_fraction = m.pp() > 1 ? bubble / double(m.size()) : 0;
}

// The payload bytes each group of the mesh has moved so far (on GPUs, plus what their NCCL
// twins moved: the gradients, activations and tensor-parallel collectives).
GroupBytes Trainer::traffic() const {
  const dist::Mesh& m = *mesh_;
  GroupBytes b{m.traffic_of("tp").total(), m.traffic_of("dp").total(), m.traffic_of("pp").total(),
               m.traffic_of("embedding").total()};
#if SAT_HAVE_CUDA
  if (gpu_) {
    auto add = [](double& to, const std::unique_ptr<dist::Comm>& c) {
      if (c && c->traffic()) to += c->traffic()->total();
    };
    add(b.tp, gpu_->tp), add(b.dp, gpu_->dp), add(b.pp, gpu_->pp), add(b.embedding, gpu_->tie);
  }
#endif
  return b;
}

// ---- evaluation -----------------------------------------------------------------------
// Every test sample once, through the pipeline: each batch's forward runs stage after
// stage (virtual stage after virtual stage), the stage with the loss counts, the sums
// are added over the data-parallel ranks and broadcast along the pipeline.
EvalResult Trainer::evaluate(const EvalSink& sink) {
  SAT_CHECK(test_, "internal error: no test split to evaluate");
  const dist::Mesh& m = *mesh_;
  SAT_CHECK(!sink || m.dp() == 1, "internal error: predictions of a data-parallel rank's shard");
  const Graph& g = *rp_->model.graph;
  const int P = m.pp(), V = cfg_.virtual_stages, s = m.pp_rank();
  dist::Comm* pp = m.pp() > 1 ? &m.pp_group() : nullptr;
#if SAT_HAVE_CUDA
  if (pp && on_gpu()) pp = gpu_->pp.get();
#endif
  // Sums over this rank's shard: loss * valid rows, valid rows, correct, counted, samples.
  double sums[5] = {0, 0, 0, 0, 0};
  const bool classify = !mc_.tokens;
  const int64_t batches = BatchLoader::eval_batches(test_->size(), cfg_.batch, m.dp());
  if (test_loader_) test_loader_->start_epoch(0);
  Batch b;
  auto exchange = [&](const std::vector<int>& values, bool send, int peer) {
    std::vector<dist::P2POp> ops;
    for (int v : values) {
      Tensor t = engine_->value(0, v);
      ops.push_back({send, t.ptr, size_t(t.numel()), peer});
    }
    if (!ops.empty()) pp->p2p(ops, g.act())->wait();
  };
  for (int64_t i = 0; i < batches; ++i) {
    if (test_loader_) SAT_CHECK(test_loader_->next(b), "internal error: the test loader ended early");
    for (int vs = 0; vs < P * V; ++vs) {
      if (vs % P != s) continue;
      const int c = vs / P;
      const Chunk& ch = g.chunks()[size_t(c)];
      if (vs > 0) exchange(ch.received, false, (s + P - 1) % P);
      std::vector<Tensor> data;
      for (int v : ch.data) data.push_back(v == rp_->model.x ? b.x : b.y);
      engine_->forward(0, c, false, 0, data);
      if (vs + 1 < P * V) exchange(ch.sent, true, (s + 1) % P);
      if (!ch.has_loss) continue;
      const float loss = float(engine_->take_losses().first);
      const int32_t* y = b.y.i32();
      const int64_t rows = b.y.numel();
      int64_t valid = 0;
      for (int64_t k = 0; k < rows; ++k) valid += y[k] >= 0;
      if (valid > 0) sums[0] += double(loss) * double(valid);
      sums[1] += double(valid);
      sums[4] += double(b.valid);
      if (!sink && (!classify || valid == 0)) continue;
      std::vector<float> host = engine_->read_f32(0, rp_->model.logits);
      const int64_t C = engine_->value(0, rp_->model.logits).shape[-1];
      if (sink) sink(EvalBatch{b, i * cfg_.batch, host.data(), C});
      if (!classify) continue;
      for (int64_t k = 0; k < rows; ++k) {
        if (y[k] < 0) continue;
        const float* l = host.data() + k * C;
        sums[2] += double(std::max_element(l, l + C) - l) == double(y[k]);
        sums[3] += 1;
      }
    }
  }
  if (g.loss() >= 0 && m.dp() > 1) m.dp_group().all_reduce_sync(sums, 5, DType::f64, dist::ReduceOp::sum);
  if (P > 1) m.pp_group().broadcast_sync(sums, 5, DType::f64, P - 1);
  EvalResult e;
  e.samples = int64_t(sums[4]);
  e.loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  if (classify) e.accuracy = sums[3] > 0 ? sums[2] / sums[3] : NAN;
  return e;
}

// ---- weights --------------------------------------------------------------------------
void Trainer::load_weights(const std::string& path) {
  if (std::filesystem::is_directory(path)) {  // a checkpoint's parameters
    load_checkpoint(resolve_checkpoint(path, "--init-weights"), true);
    return;
  }
  // Names of the whole model: a stage skips the tensors of the others.
  const Graph& whole = *job_->whole().graph;
  std::set<std::string> names;
  for (auto& p : whole.params()) names.insert(p.name);
  for (auto& s : whole.states()) names.insert(s.name);
  if (params_->sharding().stage >= 3) {  // read in full, keep the pieces
    const Graph& g = *rp_->model.graph;
    ParamStore full(g.params(), g.states(), 0);
    load_safetensors(path, full, mesh_->pp() > 1 ? &names : nullptr);
    agree_on_replicas(*world_, mesh_->dp_group(), store_checksum(full), "--init-weights " + path);
    broadcast_store(mesh_->dp_group(), full);
    params_->shard_from(full);
    return;
  }
  load_safetensors(path, *params_, mesh_->pp() > 1 ? &names : nullptr);
  // Before the broadcast, which would hide it: a rank that read another file of that name.
  agree_on_replicas(*world_, mesh_->dp_group(), store_checksum(*params_), "--init-weights " + path);
  if (mesh_->dp() > 1) broadcast_initial_state();
}

namespace {
// Declarations of the full tensors of (possibly tensor-parallel) parameters.
std::vector<ParamDecl> full_decls(const std::vector<ParamDecl>& ps) {
  std::vector<ParamDecl> out = ps;
  for (auto& d : out) {
    d.spec.shape = d.full_shape();
    d.shard = {};
  }
  return out;
}
}  // namespace

// This stage's parameters as full tensors on the tensor-parallel group's first rank
// (collective over the group; nullptr elsewhere): each split parameter's parts are
// all-gathered and put in their places.
std::unique_ptr<ParamStore> Trainer::gather_tensor_parallel(const ParamStore& mine) {
  dist::Comm& tp = mesh_->tp_group();
  const bool root = tp.rank() == 0;
  const Graph& g = *rp_->model.graph;
  auto out = root ? std::make_unique<ParamStore>(full_decls(g.params()), g.states(), 0) : nullptr;
  std::vector<float> parts;
  for (size_t i = 0; i < mine.num_params(); ++i) {
    const ParamDecl& d = mine.decl(i);
    Tensor local = mine.host_param(i);
    if (d.shard.split()) {  // collective: every rank of the group takes part
      parts.resize(size_t(local.numel() * tp.size()));
      tp.all_gather(local.ptr, parts.data(), size_t(local.numel()), DType::f32)->wait();
    }
    if (!root) continue;
    Tensor full = out->host_param(i);
    if (!d.shard.split()) std::copy(local.f32(), local.f32() + local.numel(), full.f32());
    else
      for (int r = 0; r < tp.size(); ++r) shard_insert_part(d, r, parts.data() + r * local.numel(), full.ptr);
  }
  for (size_t i = 0; root && i < mine.num_states(); ++i) {
    Tensor src = mine.host_state(i), dst = out->host_state(i);
    std::copy(src.u8(), src.u8() + src.bytes(), dst.u8());
  }
  return out;
}

// The whole model on global rank 0: the tensor-parallel parts of each stage of the first
// data-parallel replica are gathered on its first tp rank, which sends the stage's full
// tensors there. nullptr on other ranks (and on rank 0 when its own store is the model).
std::unique_ptr<ParamStore> Trainer::gather_whole_model(const ParamStore& own) {
  const dist::Mesh& m = *mesh_;
  if (m.dp_rank() != 0) return nullptr;
  std::unique_ptr<ParamStore> stage = m.tp() > 1 ? gather_tensor_parallel(own) : nullptr;
  if (m.tp_rank() != 0 || m.pp() == 1) return stage;
  const ParamStore& mine = stage ? *stage : own;
  dist::Comm& pp = m.pp_group();
  if (m.pp_rank() != 0) {
    pp.send(mine.host_flat_params(), size_t(mine.flat_size()), DType::f32, 0)->wait();
    for (size_t i = 0; i < mine.num_states(); ++i) {
      Tensor t = mine.host_state(i);
      pp.send(t.ptr, t.bytes(), DType::u8, 0)->wait();
    }
    return nullptr;
  }
  const Graph& whole = *job_->whole().graph;
  auto out = std::make_unique<ParamStore>(full_decls(whole.params()), whole.states(), 0);
  auto copy_in = [&](const ParamStore& from) {
    for (size_t i = 0; i < from.num_params(); ++i) {
      const int k = out->find_param(from.decl(i).name);
      Tensor src = from.host_param(i), dst = out->host_param(size_t(k));
      std::copy(src.f32(), src.f32() + src.numel(), dst.f32());
    }
    for (size_t i = 0; i < from.num_states(); ++i) {
      Tensor src = from.host_state(i), dst = out->host_state(size_t(out->find_state(from.state_decl(i).name)));
      std::copy(src.u8(), src.u8() + src.bytes(), dst.u8());
    }
  };
  for (int s = m.pp() - 1; s >= 0; --s) {  // stage 0 last: its copy of a tied weight wins
    if (s == 0) {
      copy_in(mine);
      continue;
    }
    const RankPlan& other = job_->stage(s);
    const Graph& og = *other.model.graph;
    ParamStore ps(full_decls(og.params()), og.states(), 0);
    pp.recv(ps.flat_params(), size_t(ps.flat_size()), DType::f32, s)->wait();
    for (size_t i = 0; i < ps.num_states(); ++i) {
      Tensor t = ps.host_state(i);
      pp.recv(t.ptr, t.bytes(), DType::u8, s)->wait();
    }
    copy_in(ps);
  }
  return out;
}

void Trainer::save_weights(const std::string& path) {
  std::unique_ptr<ParamStore> full;
  const ParamStore& own = unsharded(full);
  std::unique_ptr<ParamStore> whole = gather_whole_model(own);
  if (world_->rank() != 0) return;
  save_safetensors(path, whole ? *whole : own, mc_.name);
}

}  // namespace sat
