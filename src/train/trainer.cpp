#include "train/trainer.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/rng.h"
#include "core/timer.h"
#include "dist/nccl_comm.h"
#include "profile/nvml.h"
#include "train/noise.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#include "optim/optimizer_cuda.h"
#endif

namespace sat {
namespace {

constexpr int kPrefetch = 2;

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

std::string format_duration(double s) {
  char b[32];
  if (s < 60) std::snprintf(b, sizeof b, "%.0fs", s);
  else if (s < 3600) std::snprintf(b, sizeof b, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(b, sizeof b, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return b;
}

struct Precision { DType act = DType::f32; bool tf32 = false; bool loss_scaling = false; };
Precision parse_precision(const std::string& p, Device dev) {
  Precision r;
  if (p == "fp32") return r;
  SAT_CHECK(p == "tf32" || p == "bf16" || p == "fp16", "--precision: expected fp32, tf32, bf16 or fp16, got '", p, "'");
  SAT_CHECK(dev == Device::cuda, "--precision ", p, " needs --device cuda (the CPU engine computes in fp32)");
  if (p == "tf32") r.tf32 = true;
  if (p == "bf16") r.act = DType::bf16;
  if (p == "fp16") { r.act = DType::f16; r.loss_scaling = true; }
  return r;
}

}  // namespace

#if SAT_HAVE_CUDA
struct Trainer::Gpu {
  CudaCtx* ctx = nullptr;
  std::unique_ptr<CudaOptimizer> opt;
  std::map<int, cudaGraphExec_t> graphs;  // key: slot * 4 + first * 2 + last
  std::map<int, int64_t> graph_kernels;
  size_t free_before = 0;
  // Gradient reduction over NCCL: on its own stream, so that buckets reduce while the
  // compute stream runs the rest of backward. Each bucket's all-reduce waits for an event
  // recorded on the compute stream after its last gradient; the compute stream waits for
  // `reduced` (recorded after the last bucket) before the optimizer. Under graph capture
  // the events fork the comm stream into the graph and join it back.
  std::unique_ptr<dist::Comm> nccl;
  cudaStream_t comm_stream = nullptr;
  std::vector<cudaEvent_t> bucket_ready;
  cudaEvent_t reduced = nullptr;
  std::vector<dist::WorkPtr> works;  // this step's eager reductions (complete once the step is)
  // measure_noise: the two squared norms of a step, and the sum's scratch (device).
  double* norms = nullptr;
  double* norm_partials = nullptr;
  ~Gpu() {
    works.clear();
    nccl.reset();
    for (auto e : bucket_ready) cudaEventDestroy(e);
    if (reduced) cudaEventDestroy(reduced);
    if (comm_stream) cudaStreamDestroy(comm_stream);
    if (norms) cudaFree(norms);
    if (norm_partials) cudaFree(norm_partials);
    for (auto& [k, g] : graphs) cudaGraphExecDestroy(g);
    cuda_ctx_destroy(ctx);
  }
};
#else
struct Trainer::Gpu {};
#endif

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

struct Trainer::CommReplicaSum : ReplicaSum {
  explicit CommReplicaSum(dist::Comm& c) : comm(c) {}
  void sum(double* v, size_t n) override { comm.all_reduce_sync(v, n, DType::f64, dist::ReduceOp::sum); }
  dist::Comm& comm;
};

MemoryPlan Trainer::plan_for(const Graph& g, const TrainConfig& cfg, const Dataset& train, const Dataset* test,
                             int world) {
  size_t inputs = BatchLoader::buffer_bytes(train, cfg.batch, kPrefetch);
  if (test && cfg.evaluate) inputs += BatchLoader::buffer_bytes(*test, cfg.batch, kPrefetch);
  return Engine::plan_memory(g, optimizer_slots(resolve_optim(cfg.optim)), inputs, cfg.zero >= 1 ? world : 1);
}

MemoryPlan Trainer::plan(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test,
                         int world) {
  ModelConfig m = mc;
  m.device = resolve_device(cfg.device);
  m.act = parse_precision(cfg.precision, m.device).act;
  if (world <= 0) world = cfg.comm ? cfg.comm->size() : 1;
  return plan_for(*build_model(m, cfg.batch, true).graph, cfg, train, test, world);
}

Trainer::Trainer(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test)
    : mc_(mc), cfg_(cfg), train_(train), test_(cfg.evaluate ? test : nullptr) {
  SAT_CHECK(cfg.batch >= 1, "--batch: expected a positive micro-batch size, got ", cfg.batch);
  SAT_CHECK(cfg.accum >= 1, "--accum: expected a positive number of micro-batches, got ", cfg.accum);
  SAT_CHECK(cfg.steps >= 0 && cfg.epochs >= 0, "--steps/--epochs: expected a non-negative number");
  SAT_CHECK(cfg.bucket_mb > 0, "--bucket-mb: expected a positive size, got ", cfg.bucket_mb);
  SAT_CHECK(cfg.zero == 0 || cfg.zero == 1, "--zero: expected 0 or 1 (ZeRO stage), got ", cfg.zero);
  SAT_CHECK(!cfg.measure_noise || cfg.accum >= 2, "internal error: measuring the gradient noise scale needs accum >= 2");
  cfg_.optim = resolve_optim(cfg.optim);
  cfg_.schedule = resolve_schedule(cfg.schedule);
  if (cfg.comm) {
    comm_ = cfg.comm;
  } else {
    own_comm_ = dist::make_self_comm();
    comm_ = own_comm_.get();
  }
  int dev_index = 0;
  mc_.device = resolve_device(cfg.device, &dev_index);
  const Precision prec = parse_precision(cfg.precision, mc_.device);
  mc_.act = prec.act;
  const std::string& be = cfg.dist_backend;
  SAT_CHECK(be == "auto" || be == "mpi" || be == "nccl", "--dist-backend: expected auto, mpi or nccl, got '", be, "'");
  const int world = comm_->size();
  SAT_CHECK(mc_.device == Device::cuda || be != "nccl",
            "--dist-backend nccl needs --device cuda (NCCL reduces GPU memory; the CPU engine reduces over mpi)");
  SAT_CHECK(mc_.device == Device::cpu || be != "mpi" || world == 1,
            "--dist-backend mpi reduces host memory; GPU training reduces its gradients over nccl (--dist-backend "
            "auto or nccl)");
  SAT_CHECK(mc_.device == Device::cpu || cfg.zero == 0 || world == 1,
            "--zero 1 needs --device cpu for now (ZeRO-1 on GPUs is not built yet)");
  SAT_CHECK(mc_.device == Device::cpu || !cfg.sync_bn || world == 1,
            "--sync-bn needs --device cpu for now (synchronised BatchNorm on GPUs is not built yet)");
  const bool gpu_nccl = mc_.device == Device::cuda && (be == "nccl" || world > 1);
  // One GPU per rank, picked by the rank's place on its node (as torchrun's LOCAL_RANK).
  if (mc_.device == Device::cuda && world > 1 && cfg.device.find(':') == std::string::npos)
    dev_index = dist::local_rank_gpu("--device " + cfg.device);
  model_ = build_model(mc_, cfg.batch, true);
  check_data(mc, model_, train);
  if (test_) check_data(mc, model_, *test_);
  SAT_CHECK(train.size() >= cfg.batch, "--batch ", cfg.batch, " is larger than the training set (", train.size(),
            " samples of ", train.name(), ")");
  const int shards = cfg.zero >= 1 ? comm_->size() : 1;
  plan_ = plan_for(*model_.graph, cfg_, train, test_, comm_->size());
  mem_base_ = mem_stats().current;
  mem_reset_peak();
  params_ = std::make_unique<ParamStore>(model_.graph->params(), model_.graph->states(), optimizer_slots(cfg_.optim),
                                         shards, shards > 1 ? comm_->rank() : 0);
  params_->init(cfg.seed);
  // Every rank starts from rank 0's parameters and states (the same seed gives the same
  // values already; the broadcast makes it true for any initialisation).
  if (comm_->size() > 1) {
    comm_->broadcast_sync(params_->flat_params(), size_t(params_->flat_size()), DType::f32, 0);
    for (size_t i = 0; i < params_->num_states(); ++i) {
      Tensor t = params_->host_state(i);
      comm_->broadcast_sync(t.ptr, size_t(t.numel()), t.dtype, 0);
    }
  }
#if SAT_HAVE_CUDA
  if (mc_.device == Device::cuda) {
    gpu_ = std::make_unique<Gpu>();
    size_t total_b = 0;
    SAT_CUDA_CHECK(cudaSetDevice(dev_index));
    SAT_CUDA_CHECK(cudaMemGetInfo(&gpu_->free_before, &total_b));
    cuda_mem_reset_peak();
    gpu_->ctx = cuda_ctx_create(dev_index);
    gpu_->ctx->tf32 = prec.tf32;
    params_->to_device(Device::cuda, prec.act);
    gpu_->opt = std::make_unique<CudaOptimizer>(cfg_.optim, params_->flat_size(), prec.act, prec.loss_scaling);
    if (gpu_nccl) {
      int least = 0, greatest = 0;
      SAT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      SAT_CUDA_CHECK(cudaStreamCreateWithPriority(&gpu_->comm_stream, cudaStreamNonBlocking, greatest));
      SAT_CUDA_CHECK(cudaEventCreateWithFlags(&gpu_->reduced, cudaEventDisableTiming));
      gpu_->nccl = dist::make_nccl_comm(*comm_, dev_index, gpu_->comm_stream);
    }
    if (cfg.measure_noise) {
      SAT_CUDA_CHECK(cudaMalloc(&gpu_->norms, 2 * sizeof(double)));
      SAT_CUDA_CHECK(cudaMalloc(&gpu_->norm_partials, cuda::kSumSquaresPartials * sizeof(double)));
    }
  }
#else
  (void)gpu_nccl;
#endif
  engine_ = std::make_unique<Engine>(*model_.graph, *params_, gpu_ ? gpu_ctx() : nullptr);
  if (cfg.sync_bn && comm_->size() > 1) {
    replica_sum_ = std::make_unique<CommReplicaSum>(*comm_);
    engine_->set_replica_sum(replica_sum_.get());
  }
  opt_ = std::make_unique<Optimizer>(cfg_.optim);
  const int rank = comm_->rank();
  train_loader_ = std::make_unique<BatchLoader>(train, cfg.batch, cfg.shuffle, cfg.seed, true, kPrefetch,
                                                Sharding{rank, world, cfg.accum, cfg.last_batch});
  if (test_)
    test_loader_ = std::make_unique<BatchLoader>(*test_, cfg.batch, false, cfg.seed, false, kPrefetch, Sharding{rank, world});
  if ((world > 1 || gpu_nccl) && cfg.zero == 0) plan_buckets();
#if SAT_HAVE_CUDA
  if (gpu_ && gpu_->nccl) {
    gpu_->bucket_ready.resize(buckets_.size());
    for (auto& e : gpu_->bucket_ready) SAT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
#endif
}

Trainer::~Trainer() = default;

std::string Trainer::gpu_pci_bus_id() const {
#if SAT_HAVE_CUDA
  char id[64] = {0};
  if (gpu_ && cudaDeviceGetPCIBusId(id, sizeof id, gpu_->ctx->device) == cudaSuccess) return id;
#endif
  return "";
}

CudaCtx* Trainer::gpu_ctx() const {
#if SAT_HAVE_CUDA
  return gpu_ ? gpu_->ctx : nullptr;
#else
  return nullptr;
#endif
}

void Trainer::plan_buckets() {
  // A parameter's gradient is final after the backward of the lowest-numbered node that
  // uses it (backward runs nodes in reverse). Flat offsets follow declaration (forward)
  // order, so buckets are cut from the end of the gradient array towards its start.
  const Graph& g = *model_.graph;
  std::vector<int> final_after(g.params().size(), int(g.nodes().size()));
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (int pid : g.nodes()[i].param_ids) final_after[size_t(pid)] = std::min(final_after[size_t(pid)], int(i));
  const int64_t cap = std::max<int64_t>(16, int64_t(cfg_.bucket_mb * 1024 * 1024 / 4));
  const ParamStore& ps = *params_;
  int64_t hi = ps.flat_size();
  int ready = int(g.nodes().size());
  for (size_t k = ps.num_params(); k-- > 0;) {
    const int64_t lo = ps.offset(k);
    ready = std::min(ready, final_after[k]);
    if (hi - lo >= cap || k == 0) {
      buckets_.push_back({lo, hi, ready});
      hi = lo;
      ready = int(g.nodes().size());
    }
  }
}

TrainResult Trainer::run(const std::function<void(const StepMetrics&)>& on_step) {
  TrainResult r;
  const double t_start = now_seconds();
  const int64_t per_epoch = train_loader_->batches_per_epoch();
  SAT_CHECK(per_epoch >= cfg_.accum || cfg_.steps > 0, "--accum ", cfg_.accum, " x --batch ", cfg_.batch,
            " is more than one epoch of ", train_.name(), " (", train_.size(), " samples)");
  int64_t total = cfg_.steps > 0 ? cfg_.steps : cfg_.epochs * (per_epoch / cfg_.accum);
  SAT_CHECK(total >= 1, "--epochs/--steps: nothing to train (", cfg_.steps > 0 ? "0 steps" : "0 epochs", ")");
  const int64_t global_batch = cfg_.batch * cfg_.accum * comm_->size();
  r.world_size = comm_->size();
  r.global_batch = global_batch;
  r.warmup_excluded = cfg_.warmup_excluded >= 0 ? cfg_.warmup_excluded : std::min<int64_t>(3, total / 5);
  r.predicted_memory_bytes = plan_.total();

  const bool tty = isatty(STDERR_FILENO);
  const int progress = cfg_.progress >= 0 ? cfg_.progress : (tty ? 2 : 1);
  const int64_t line_every = std::max<int64_t>(1, total / 20);

  std::ofstream metrics;
  if (!cfg_.out_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cfg_.out_dir, ec);
    SAT_CHECK(!ec, "--out: cannot create directory ", cfg_.out_dir, ": ", ec.message());
    metrics.open(cfg_.out_dir + "/metrics.jsonl", std::ios::trunc);
    SAT_CHECK(metrics, "--out: cannot write ", cfg_.out_dir, "/metrics.jsonl");
  }

  int64_t epoch = 0;
  train_loader_->start_epoch(epoch);
  Batch batch;
  double t_measure = 0;
  double comm_window = 0, comm_exposed = 0, measured_step_seconds = 0;
  const bool graphs = on_gpu() && cfg_.cuda_graph;
  std::unique_ptr<GpuSampler> sampler;
  if (on_gpu()) {
    sampler = std::make_unique<GpuSampler>(0, gpu_pci_bus_id());
    sampler->start();
  }
  NoiseScale noise(cfg_.noise_decay);
  const double t_train = now_seconds();
  for (int64_t step = 0; step < total; ++step) {
    const double t0 = now_seconds();
    if (step == r.warmup_excluded) {
      t_measure = t0;
      engine_->set_profiling(cfg_.profile && !on_gpu());  // time layers after warm-up only
      comm_window = comm_exposed = 0;
    }
    const float lr = schedule_lr(cfg_.schedule, cfg_.optim.lr, step, total);
    double loss = on_gpu() ? step_gpu(step, lr, epoch, batch, graphs && step >= 1, step + 1 < total,
                                      cfg_.measure_noise ? &r.grad_norms : nullptr)
                           : step_cpu(step, lr, epoch, batch, comm_window, comm_exposed,
                                      cfg_.measure_noise ? &r.grad_norms : nullptr);
    SAT_CHECK(std::isfinite(loss) || (on_gpu() && cfg_.precision == "fp16"), "training diverged: the loss of step ", step + 1, " is ", loss,
              " (try a smaller --lr)");
    const double dt = now_seconds() - t0;
    if (step >= r.warmup_excluded) measured_step_seconds += dt;
    StepMetrics m{step + 1, loss, lr, dt, double(global_batch) / dt};
    if (cfg_.measure_noise) {
      // A step without norms (fp16: skipped for inf/NaN gradients) leaves the estimate as it was.
      if (size_t(noise.count()) < r.grad_norms.size()) {
        const GradNormSample& g = r.grad_norms.back();
        noise.add(g.small_sq, g.b_small, g.big_sq, g.b_big);
      }
      m.noise_scale = noise.estimate();
    }
    r.losses.push_back(loss);
    if (metrics.is_open()) {
      char line[320];
      int n = std::snprintf(line, sizeof line,
                            "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"samples_per_second\": %.6g, \"seconds\": %.6g",
                            (long long)m.step, m.loss, m.lr, m.samples_per_second, m.seconds);
      if (cfg_.measure_noise) std::snprintf(line + n, sizeof line - size_t(n), ", \"noise_scale\": %.6g", m.noise_scale);
      metrics << line << "}\n" << std::flush;
    }
    if (on_step) on_step(m);
    if (cfg_.time_limit > 0 && step + 1 < total && step >= r.warmup_excluded + 2) {
      // Every rank stops at the same step: rank 0's clock decides.
      double stop = now_seconds() - t_measure >= cfg_.time_limit ? 1 : 0;
      if (comm_->size() > 1) comm_->broadcast_sync(&stop, 1, DType::f64, 0);
      if (stop > 0) total = step + 1;
    }
    if (progress == 2) {
      double frac = double(step + 1) / double(total);
      double elapsed = now_seconds() - t_train;
      int filled = int(frac * 30);
      std::fprintf(stderr, "\r[%.*s%*s] step %lld/%lld  loss %.4f  %.0f samples/s  ETA %s   ", filled,
                   "##############################", 30 - filled, "", (long long)(step + 1), (long long)total, loss,
                   m.samples_per_second, format_duration(elapsed / frac - elapsed).c_str());
      if (step + 1 == total) std::fprintf(stderr, "\n");
    } else if (progress == 1 && ((step + 1) % line_every == 0 || step + 1 == total)) {
      std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.3g  %.0f samples/s\n", (long long)(step + 1),
                   (long long)total, loss, double(lr), m.samples_per_second);
    }
  }
  if (sampler) sampler->stop();
  const double t_end = now_seconds();
  engine_->set_profiling(false);
  r.comm_backend = comm_->size() > 1 ? comm_->backend_name() : "";
#if SAT_HAVE_CUDA
  if (gpu_ && gpu_->nccl) r.comm_backend = gpu_->nccl->backend_name();
#endif
  r.comm_seconds = comm_window;
  r.comm_hidden_fraction = comm_window > 0 ? std::clamp(1.0 - comm_exposed / comm_window, 0.0, 1.0) : 0.0;
  {
    const int64_t measured_steps = std::max<int64_t>(1, total - r.warmup_excluded);
    std::vector<double> all(size_t(comm_->size()));
    double mine = measured_step_seconds / double(measured_steps);
    comm_->all_gather(&mine, all.data(), 1, DType::f64)->wait();
    r.rank_step_seconds = all;
  }
  // Per-rank BatchNorm statistics differ between ranks: evaluate (and save) rank 0's,
  // as DDP does by broadcasting its buffers.
  if (comm_->size() > 1 && !cfg_.sync_bn)
    for (size_t i = 0; i < params_->num_states(); ++i) {
      if (on_gpu()) {
#if SAT_HAVE_CUDA
        // The states live on the GPU: broadcast there (the last step has finished: step_gpu
        // waited for it), before finish_gpu copies them to the host.
        Tensor t = params_->state(i);
        gpu_->nccl->broadcast(t.ptr, size_t(t.numel()), t.dtype, 0)->wait();
#endif
      } else {
        Tensor t = params_->host_state(i);
        comm_->broadcast_sync(t.ptr, size_t(t.numel()), t.dtype, 0);
      }
    }
  if (on_gpu()) {
    finish_gpu(r);
    if (sampler && sampler->available() && sampler->stats().util_samples > 0)
      r.gpu_utilization_mean = sampler->stats().mean_util_pct;
  }
  r.noise_scale = noise.estimate();
  r.steps = total;
  r.final_train_loss = r.losses.empty() ? NAN : r.losses.back();
  r.train_seconds = t_end - t_train;
  const int64_t measured = total - r.warmup_excluded;
  r.samples_per_second = measured > 0 ? double(measured * global_batch) / (t_end - t_measure) : 0;
  if (test_) {
    if (progress) std::fprintf(stderr, "evaluating on %s (%lld samples)\n", test_->name().c_str(), (long long)test_->size());
    r.test = evaluate();
  }
  r.peak_memory_bytes = mem_stats().peak - mem_base_;
#if SAT_HAVE_CUDA
  if (on_gpu()) {
    r.predicted_memory_bytes = plan_.device;
    r.peak_memory_bytes = cuda_mem_stats().peak;
  }
#endif
  r.wall_seconds = now_seconds() - t_start;
  return r;
}

namespace {
double squared_norm(const float* g, int64_t n) {
  double s = 0;
#pragma omp parallel for reduction(+ : s) schedule(static)
  for (int64_t i = 0; i < n; ++i) s += double(g[i]) * double(g[i]);
  return s;
}
}  // namespace

void Trainer::add_noise_sample(double small_sq, double big_sq, bool big_sharded, std::vector<GradNormSample>& norms) {
  const int world = comm_->size();
  const double k = double(cfg_.accum);
  double v[2] = {k * k * small_sq, big_sq};  // backward scaled each micro-batch's gradient by 1/accum
  if (world > 1) {
    comm_->all_reduce_sync(v, 1, DType::f64, dist::ReduceOp::avg);
    if (big_sharded) comm_->all_reduce_sync(v + 1, 1, DType::f64, dist::ReduceOp::sum);
  }
  // fp16: a step skipped for inf/NaN gradients has no usable norms.
  if (std::isfinite(v[0]) && std::isfinite(v[1]))
    norms.push_back({v[0], v[1], cfg_.batch, cfg_.batch * cfg_.accum * world});
}

// One optimizer step on the CPU: accum micro-batches, then (data parallel) the
// gradient buckets, reduced while backward runs (ZeRO-1: reduce-scattered after it),
// then the update.
double Trainer::step_cpu(int64_t step, float lr, int64_t& epoch, Batch& batch, double& comm_window,
                         double& comm_exposed, std::vector<GradNormSample>* norms) {
  const int world = comm_->size();
  double loss_sum = 0;
  std::vector<dist::WorkPtr> works;
  std::vector<bool> launched(buckets_.size(), false);
  double t_first = -1, cpu_first = 0;
  const bool zero = cfg_.zero >= 1 && world > 1;
  double small_sq = 0;  // measure_noise: |this rank's first micro-batch's gradient|^2, as backward left it
  auto launch = [&](size_t b) {
    if (t_first < 0) t_first = now_seconds(), cpu_first = thread_cpu_seconds();
    launched[b] = true;
    const Bucket& bk = buckets_[b];
    works.push_back(comm_->all_reduce(params_->flat_grads() + bk.lo, size_t(bk.hi - bk.lo), DType::f32,
                                      dist::ReduceOp::avg));
  };
  for (int64_t micro = 0; micro < cfg_.accum; ++micro) {
    while (!train_loader_->next(batch)) train_loader_->start_epoch(++epoch);
    engine_->bind(model_.x, batch.x);
    engine_->bind(model_.y, batch.y);
    float loss = engine_->forward(true, mix_seed(cfg_.seed, uint64_t(step * cfg_.accum + micro)));
    const bool reduce = world > 1 && !zero && micro + 1 == cfg_.accum;
    if (reduce) engine_->set_backward_hook([&](int node) { launch_ready(launched, node, launch); });
    engine_->backward(1.0f / float(cfg_.accum), micro == 0);
    engine_->set_backward_hook({});
    loss_sum += loss;
    // Noise scale: this rank's first micro-batch alone.
    if (norms && micro == 0) small_sq = squared_norm(params_->flat_grads(), params_->flat_size());
  }
  double loss = loss_sum / double(cfg_.accum);
  if (world > 1) {
    const double t_bwd_end = now_seconds(), cpu_bwd_end = thread_cpu_seconds();
    if (zero) {
      // ZeRO-1: each rank gets the average gradient of its shard only, and updates it.
      if (t_first < 0) t_first = t_bwd_end, cpu_first = cpu_bwd_end;
      float* g = params_->flat_grads();
      comm_->reduce_scatter(g, g + params_->shard_begin(), size_t(params_->shard_len()), DType::f32,
                            dist::ReduceOp::avg)->wait();
    } else {
      launch_ready(launched, -1, launch);
      for (auto& w : works) w->wait();
    }
    const double t_done = now_seconds();
    // Hidden: the part of the reduction's window during which this thread computed the
    // rest of backward. Its CPU time counts, not the wall time: on a busy machine the
    // thread may wait for a core after starting the reduction, which overlaps nothing.
    const double window = t_done - t_first;
    const double overlapped = std::clamp(std::min(t_bwd_end - t_first, cpu_bwd_end - cpu_first), 0.0, window);
    comm_window += window;
    comm_exposed += window - overlapped;
    // The reported loss is the mean over the whole global batch (equal micro-batches).
    comm_->all_reduce_sync(&loss, 1, DType::f64, dist::ReduceOp::avg);
  }
  // The global batch's gradient (under ZeRO-1 each rank holds its shard of it).
  if (norms)
    add_noise_sample(small_sq,
                     zero ? squared_norm(params_->flat_grads() + params_->shard_begin(), params_->shard_len())
                          : squared_norm(params_->flat_grads(), params_->flat_size()),
                     zero, *norms);
  if (std::isfinite(loss)) {
    opt_->step(*params_, lr);
    // ZeRO-1: every rank updated its shard; gather the whole parameter array back.
    if (zero) {
      float* p = params_->flat_params();
      comm_->all_gather(p + params_->shard_begin(), p, size_t(params_->shard_len()), DType::f32)->wait();
    }
  }
  return loss;
}

#if SAT_HAVE_CUDA
// One optimizer step on the GPU. Micro-batches alternate between the engine's two input
// slots: while one computes, the next is staged (host copy into pinned memory) and
// uploaded on the copy stream. With graphs, each (slot, first, last) variant of a
// micro-batch (forward, backward and, on the last, the optimizer) is captured once and
// replayed; the first step always runs eagerly (library heuristics, algorithm caches).
double Trainer::step_gpu(int64_t step, float lr, int64_t& epoch, Batch& batch, bool graphs, bool prefetch_next,
                         std::vector<GradNormSample>* norms) {
  Gpu& G = *gpu_;
  cudaStream_t st = G.ctx->stream;
  double loss_sum = 0;
  const float* scale = G.opt->loss_scaling() ? G.opt->loss_scale_device() : nullptr;
  // Gradient buckets over NCCL (see Gpu): each bucket's all-reduce is queued on the comm
  // stream as soon as backward has queued its last gradient.
  std::vector<bool> launched(buckets_.size(), false);
  auto launch = [&](size_t b) {
    launched[b] = true;
    const Bucket& bk = buckets_[b];
    SAT_CUDA_CHECK(cudaEventRecord(G.bucket_ready[b], st));
    SAT_CUDA_CHECK(cudaStreamWaitEvent(G.comm_stream, G.bucket_ready[b], 0));
    G.works.push_back(G.nccl->all_reduce(params_->flat_grads() + bk.lo, size_t(bk.hi - bk.lo), DType::f32,
                                         dist::ReduceOp::avg));
  };
  auto drain = [&](int slot) {
    if (gpu_pending_[size_t(slot)]) {
      loss_sum += engine_->wait_slot(slot);
      gpu_pending_[size_t(slot)] = false;
    }
  };
  auto stage = [&](int slot) {
    drain(slot);
    while (!train_loader_->next(batch)) train_loader_->start_epoch(++epoch);
    engine_->stage_input(slot, model_.x, batch.x);
    engine_->stage_input(slot, model_.y, batch.y);
    engine_->queue_upload(slot);
  };
  engine_->set_dloss(1.0f / float(cfg_.accum), G.opt->loss_scaling() ? G.opt->loss_scale_device() : nullptr);
  for (int64_t micro = 0; micro < cfg_.accum; ++micro) {
    const int slot = int(gpu_micro_ % 2);
    const bool first = micro == 0, last = micro + 1 == cfg_.accum;
    if (!gpu_staged_) stage(slot);
    gpu_staged_ = false;
    drain(slot);
    engine_->use_slot(slot);
    engine_->set_seed(slot, mix_seed(cfg_.seed, uint64_t(step * cfg_.accum + micro)));
    auto body = [&](bool capturing) {
      engine_->queue_forward(slot, true);
      if (last && G.nccl) {
        std::fill(launched.begin(), launched.end(), false);
        engine_->set_backward_hook([&](int node) { launch_ready(launched, node, launch); });
      }
      engine_->queue_backward(first);
      engine_->set_backward_hook({});
      // Noise scale: this rank's first micro-batch alone (backward scaled it by 1/accum).
      if (norms && first)
        cuda::sum_squares(params_->flat_grads(), params_->flat_size(), scale, G.norms, G.norm_partials, st);
      if (last) {
        if (G.nccl) {
          launch_ready(launched, -1, launch);
          SAT_CUDA_CHECK(cudaEventRecord(G.reduced, G.comm_stream));
          SAT_CUDA_CHECK(cudaStreamWaitEvent(st, G.reduced, 0));
        }
        if (norms)
          cuda::sum_squares(params_->flat_grads(), params_->flat_size(), scale, G.norms + 1, G.norm_partials, st);
        if (capturing) G.opt->upload_lr(st);
        G.opt->step(params_->flat_params(), params_->flat_grads(),
                    params_->optimizer_slots() ? params_->flat_slot(0) : nullptr, params_->flat_lp(), st);
      }
    };
    if (last) {
      if (graphs) G.opt->set_lr_host(lr);
      else G.opt->set_lr(lr, st);
    }
    const int key = slot * 4 + (first ? 2 : 0) + (last ? 1 : 0);
    if (graphs) {
      auto it = G.graphs.find(key);
      if (it == G.graphs.end()) {
        cudaGraph_t graph;
        SAT_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        body(true);
        SAT_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
        size_t n = 0;
        SAT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &n));
        std::vector<cudaGraphNode_t> nodes(n);
        SAT_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &n));
        int64_t kernels = 0;
        for (auto nd : nodes) {
          cudaGraphNodeType t;
          SAT_CUDA_CHECK(cudaGraphNodeGetType(nd, &t));
          kernels += t == cudaGraphNodeTypeKernel;
        }
        cudaGraphExec_t exec;
        SAT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
        SAT_CUDA_CHECK(cudaGraphDestroy(graph));
        it = G.graphs.emplace(key, exec).first;
        G.graph_kernels[key] = kernels;
      }
      SAT_CUDA_CHECK(cudaGraphLaunch(it->second, st));
    } else {
      body(false);
    }
    engine_->queue_slot_done(slot);
    gpu_pending_[size_t(slot)] = true;
    ++gpu_micro_;
  }
  // Stage the next step's first micro-batch now, so its upload overlaps this step.
  if (prefetch_next) {
    stage(int(gpu_micro_ % 2));
    gpu_staged_ = true;
  }
  drain(0);
  drain(1);
  G.works.clear();  // complete: the compute stream waited for them before the optimizer
  double loss = loss_sum / double(cfg_.accum);
  const int world = comm_->size();
  // The reported loss is the mean over the whole global batch (equal micro-batches).
  if (world > 1) comm_->all_reduce_sync(&loss, 1, DType::f64, dist::ReduceOp::avg);
  if (norms) {
    double v[2] = {0, 0};
    SAT_CUDA_CHECK(cudaMemcpy(v, G.norms, sizeof v, cudaMemcpyDeviceToHost));
    add_noise_sample(v[0], v[1], false, *norms);
  }
  return loss;
}

void Trainer::finish_gpu(TrainResult& r) {
  Gpu& G = *gpu_;
  SAT_CUDA_CHECK(cudaStreamSynchronize(G.ctx->stream));
  r.device = "cuda";
  r.device_name = cuda_device_name(G.ctx->device);
  r.precision = cfg_.precision;
  r.graph_replay = !G.graphs.empty();
  // Kernels of one step: from the captured graphs (with graphs off, capture one step's
  // variants just to count them; nothing is launched).
  auto kernels_of = [&](int key) -> int64_t {
    auto it = G.graph_kernels.find(key);
    return it == G.graph_kernels.end() ? -1 : it->second;
  };
  int64_t k = 0;
  bool known = true;
  for (int64_t micro = 0; micro < cfg_.accum; ++micro) {
    int key = (micro == 0 ? 2 : 0) + (micro + 1 == cfg_.accum ? 1 : 0);
    int64_t a = kernels_of(key), b = kernels_of(4 + key);
    int64_t v = a >= 0 ? a : b;
    if (v < 0) known = false;
    else k += v;
  }
  r.kernels_per_step = known ? k : -1;
  r.launches_per_step = r.graph_replay ? cfg_.accum : r.kernels_per_step;
  size_t free_now = 0, total_b = 0;
  SAT_CUDA_CHECK(cudaMemGetInfo(&free_now, &total_b));
  r.device_memory_used_bytes = G.free_before > free_now ? G.free_before - free_now : 0;
  auto sc = G.opt->scalars_host();
  r.skipped_steps = sc.skipped;
  r.loss_scale = sc.loss_scale;
  params_->sync_to_host();
}
#else
double Trainer::step_gpu(int64_t, float, int64_t&, Batch&, bool, bool, std::vector<GradNormSample>*) {
  fail("no CUDA backend");
}
void Trainer::finish_gpu(TrainResult&) {}
#endif

EvalResult Trainer::evaluate() {
  SAT_CHECK(test_loader_, "internal error: no test split to evaluate");
  EvalResult e;
  // Sums over this rank's shard, then over all ranks: loss * valid rows, valid rows,
  // correct, counted, samples.
  double sums[5] = {0, 0, 0, 0, 0};
  const bool classify = !mc_.tokens;
  test_loader_->start_epoch(0);
  Batch b;
  std::vector<float> host_logits;
  while (test_loader_->next(b)) {
    engine_->bind(model_.x, b.x);
    engine_->bind(model_.y, b.y);
    float loss = engine_->forward(false, 0);
    const int32_t* y = b.y.i32();
    const int64_t rows = b.y.numel();
    int64_t valid = 0;
    for (int64_t i = 0; i < rows; ++i) valid += y[i] >= 0;
    if (valid > 0) sums[0] += double(loss) * double(valid);
    sums[1] += double(valid);
    if (classify && valid > 0) {
      Tensor logits = engine_->value(model_.logits);
      const int64_t C = logits.shape[-1];
      const float* lg = logits.device == Device::cpu ? logits.f32() : (host_logits = engine_->read_f32(model_.logits)).data();
      for (int64_t i = 0; i < rows; ++i) {
        if (y[i] < 0) continue;
        const float* l = lg + i * C;
        int64_t best = 0;
        for (int64_t c = 1; c < C; ++c)
          if (l[c] > l[best]) best = c;
        sums[2] += best == y[i];
        sums[3] += 1;
      }
    }
    sums[4] += double(b.valid);
  }
  if (comm_->size() > 1) comm_->all_reduce_sync(sums, 5, DType::f64, dist::ReduceOp::sum);
  e.samples = int64_t(sums[4]);
  e.loss = sums[1] > 0 ? sums[0] / sums[1] : NAN;
  if (classify) e.accuracy = sums[3] > 0 ? sums[2] / sums[3] : NAN;
  return e;
}

}  // namespace sat
