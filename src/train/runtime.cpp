#include "train/runtime.h"

#include "train/agree.h"
#include "train/sharded_dp.h"
#include "train/validate.h"

namespace sat {

namespace {

void check_data(const ModelConfig& mc, const BuiltModel& m, const Dataset& ds) {
  Shape want = m.x_shape;
  if (m.config.cp > 1) want.d[1] *= m.config.cp;  // --cp: the samples are whole sequences, cut per rank
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

void broadcast_into(dist::Comm& dp, ParamStore& ps) {
  if (dp.size() <= 1) return;
  dp.broadcast_sync(ps.flat_params(), size_t(ps.flat_size()), DType::f32, 0);
  for (size_t i = 0; i < ps.num_states(); ++i) {
    Tensor t = ps.host_state(i);
    dp.broadcast_sync(t.ptr, size_t(t.numel()), t.dtype, 0);
  }
}

}  // namespace

struct RankRuntime::ReplicaSumOverComm : ReplicaSum {
  explicit ReplicaSumOverComm(dist::Comm& c) : comm(c) {}
  void sum(double* v, size_t n) override { comm.all_reduce_sync(v, n, DType::f64, dist::ReduceOp::sum); }
  dist::Comm& comm;
};

RankRuntime::RankRuntime(JobPlan* job, const ModelConfig& model, const TrainConfig& config, const Dataset& train_set,
                         const Dataset* test_set)
    : mc(model), cfg(config), train(train_set), test(config.evaluate ? test_set : nullptr) {
  cfg.optim = resolve_optim(config.optim);
  cfg.schedule = resolve_schedule(config.schedule, cfg.optim.lr);
  if (config.comm) {
    world = config.comm;
  } else {
    own_comm_ = dist::make_self_comm();
    world = own_comm_.get();
  }
  connect(job, model, world->size());
  build_state();
  build_step();
}

RankRuntime::~RankRuntime() {
  exec.reset();
  clip.reset(), noise.reset(), partial_sum.reset(), feed.reset(), sync.reset();
  train_loader.reset(), test_loader.reset();
  optimizer.reset();
  engine.reset();
  // The graph's layers go before the device side they enqueue on: a tensor-parallel layer
  // keeps the Works of its NCCL collectives until it is destroyed.
  if (plan) plan->model.graph.reset();
  params.reset();
  own_job_.reset();
  device.reset();
  mesh.reset();
}

// The job's agreement and validation, the mesh, the device, and this rank's stage of the plan.
void RankRuntime::connect(JobPlan* given, const ModelConfig& model, int world_size) {
  // Before any collective whose size depends on them: every rank trains the same thing.
  fingerprint = config_fingerprint(model, cfg, train, test);
  agree_on_config(*world, fingerprint);
  validate_run(model, cfg, world_size);
  mesh = std::make_unique<dist::Mesh>(*world, cfg.tp, cfg.pp, cfg.cp, cfg.ep);
  mc = resolved_model(model, cfg, mesh->tp_rank(), nullptr, mesh->cp_rank(), mesh->ep_rank());
  DeviceOptions o;
  o.act = mc.act;
  o.tf32 = cfg.precision == Precision::tf32;
  o.loss_scaling = cfg.precision == Precision::fp16;
  o.gpu_per_rank = world_size > 1;
  device = make_device_backend(cfg.device, o);
  if (!given) own_job_ = std::make_unique<JobPlan>(mc, cfg, train, test, mesh->dp());
  job = given ? given : own_job_.get();
  SAT_CHECK(job->model().tp_rank == mesh->tp_rank() && job->model().cp_rank == mesh->cp_rank() &&
                job->model().ep_rank == mesh->ep_rank() && job->dp() == mesh->dp() && job->config().batch == cfg.batch,
            "internal error: the job's plan is not this rank's");
  plan = &job->stage(mesh->pp_rank());
  check_data(model, plan->model, train);
  if (test) check_data(model, plan->model, *test);
  SAT_CHECK(train.size() >= cfg.batch, "--batch ", cfg.batch, " is larger than the training set (", train.size(),
            " samples of ", train.name(), ")");
}

// The parameters (on the device, initialised alike on every replica), the device side of the
// groups, the engine and the optimizer.
void RankRuntime::build_state() {
  const dist::Mesh& m = *mesh;
  const Graph& g = *plan->model.graph;
  const int shards = cfg.zero >= 1 ? m.dp() : 1;
  const StoreSharding sharding = cfg.zero >= 2 ? plan->shards.sharding(m.dp_rank())
                                               : StoreSharding{shards > 1 ? 1 : 0, shards, shards > 1 ? m.dp_rank() : 0, {}};
  device->mark();
  params = std::make_unique<ParamStore>(g.params(), g.states(), optimizer_slots(cfg.optim), sharding);
  init_params();
  device->adopt(*params, mc.act);
  // The NCCL twins are made in this order on every rank (each is a collective).
  // Under context parallelism the cp ranks of a replica share its parameters: the gradients
  // are averaged over dp x cp (each cp rank's covers its tokens of the same sequences).
  groups.reduces = m.dp() * m.cp() > 1 || cfg.dist_backend == DistBackend::nccl;
  groups.dp = groups.reduces ? &device->group(m.dp_cp_group(), true, true) : &m.dp_cp_group();
  groups.pp = m.pp() > 1 ? &device->group(m.pp_group()) : nullptr;
  groups.tp = &device->group(m.tp_group());
  const bool tied = !g.tied_copies().empty() || !g.tied_remote().empty();
  groups.tie = tied && m.embedding_group() ? &device->group(*m.embedding_group()) : nullptr;
  if (cfg.zero >= 2) {  // before the engine: the gathered parameters live in its staging arena
    auto s = std::make_unique<ShardedDP>(g, *params, plan->shards, *groups.dp, groups.tie, *device);
    sharded = s.get();
    sync = std::move(s);
  }
  engine = std::make_unique<Engine>(*plan->model.graph, *params, plan->step, device->cuda());
  if (sharded) engine->set_node_hooks(sharded);
  if (m.tp() > 1) engine->set_group(groups.tp);
  if (m.ep_group()) engine->set_ep_group(m.ep_group());
  if (m.cp() > 1) engine->set_cp_group(m.cp_group());
  if (cfg.sync_bn && m.dp() > 1) {
    replica_sum_ = std::make_unique<ReplicaSumOverComm>(m.dp_group());
    engine->set_replica_sum(replica_sum_.get());
  }
  optimizer = device->optimizer(cfg.optim, *params);
  engine->set_dloss(1.0f / float(cfg.accum), optimizer->loss_scale_device());
}

// Every replica starts from dp rank 0's parameters and states (the same seed gives the same
// values already, each parameter drawn by its name wherever it lives; the broadcast makes it
// true for any initialisation). Under --ep the replicas of a store are the ranks that hold
// the same experts. ZeRO-3 keeps only its pieces: the full parameters are drawn in a store of
// their own, dropped once sharded (the measured peak then starts again: the plan is the step's).
void RankRuntime::init_params() {
  if (params->sharding().stage < 3) {
    params->init(cfg.seed);
    broadcast_store(*params);
    agree_on_replicas(*world, replica_group(), store_checksum(*params), "initialisation");
    return;
  }
  {
    const Graph& g = *plan->model.graph;
    ParamStore full(g.params(), g.states(), 0);
    full.init(cfg.seed);
    broadcast_store(full);
    agree_on_replicas(*world, replica_group(), store_checksum(full), "initialisation");
    params->shard_from(full);
  }
  device->reset_peak();
}

// The loaders, the gradient reduction, the step's parts and the executor of the schedule.
void RankRuntime::build_step() {
  const dist::Mesh& m = *mesh;
  const Graph& g = *plan->model.graph;
  if (plan->reads_data) {
    train_loader = std::make_unique<BatchLoader>(train, cfg.batch, cfg.shuffle, cfg.seed, true,
                                                 Sharding{m.dp_rank(), m.dp(), cfg.accum, cfg.last_batch},
                                                 loader_options(cfg, plan->loader_keep));
    if (test)
      test_loader = std::make_unique<BatchLoader>(*test, cfg.batch, false, cfg.seed, false,
                                                  Sharding{m.dp_rank(), m.dp()}, loader_options(cfg));
    feed = std::make_unique<BatchFeed>(*train_loader, g, plan->model.x, cfg.accum);
    if (m.cp() > 1) feed->set_cut(std::make_unique<ContextCut>(m.cp(), m.cp_rank(), int(cfg.accum)));
  }
  if (!sync) {
    const BucketOptions bo{cfg.bucket_mb, std::min(cfg.bucket_first_mb, cfg.bucket_mb)};
    sync = std::make_unique<GradReducer>(g, *params, *groups.dp, groups.tie, bo, cfg.zero >= 1,
                                         cfg.dist_backend == DistBackend::nccl, device.get(), m.expert_dp_group());
  }
  partial_sum = std::make_unique<PartialGradSum>(g, *params, *groups.tp, sharded != nullptr);
  if (partial_sum->empty()) partial_sum.reset();
  if (cfg.measure_noise)
    noise = std::make_unique<NoiseProbe>(g, *params, m, cfg, *device, optimizer->loss_scale_device());
  if (cfg.optim.clip_grad_norm > 0)
    clip = std::make_unique<GradClip>(g, *params, m, cfg.zero >= 1, cfg.optim.clip_grad_norm, *device,
                                      optimizer->loss_scale_device(), *optimizer);
  exec = std::make_unique<Executor>(*engine, plan->actions, plan->ctx_of, groups.pp);
  exec->capture_from_second_step(cfg.cuda_graph);
  parts.data = feed.get();
  parts.sync = sync.get();
  // In order: the gradients made final (the sequence-parallel sums), measured, then clipped.
  for (GradHook* h : {static_cast<GradHook*>(partial_sum.get()), static_cast<GradHook*>(noise.get()),
                      static_cast<GradHook*>(clip.get())})
    if (h) parts.grad_hooks.push_back(h);
  parts.optimizer = optimizer.get();
}

const ParamStore& RankRuntime::unsharded(std::unique_ptr<ParamStore>& keep) const {
  if (!sharded || params->sharding().stage < 3) return *params;
  keep = sharded->unsharded();
  return *keep;
}

void RankRuntime::broadcast_store(ParamStore& ps) const { broadcast_into(replica_group(), ps); }

dist::Comm& RankRuntime::replica_group() const {
  return mesh->expert_dp_group() ? *mesh->expert_dp_group() : mesh->dp_group();
}

void RankRuntime::sync_states_from_first_replica() {
  if (mesh->dp() <= 1 || cfg.sync_bn) return;
  for (size_t i = 0; i < params->num_states(); ++i) {  // where the states live: the device side
    Tensor t = params->state(i);
    groups.dp->broadcast(t.ptr, size_t(t.numel()), t.dtype, 0)->wait();
  }
}

GroupBytes RankRuntime::traffic() const {
  const dist::Mesh& m = *mesh;
  auto twin = [](const dist::Comm* dev, const dist::Comm* host) {
    return dev && host && dev != host && dev->traffic() ? dev->traffic()->total() : 0.0;
  };
  return {m.traffic_of("tp").total() + twin(groups.tp, &m.tp_group()),
          m.traffic_of(m.cp() > 1 ? "dp_cp" : "dp").total() + twin(groups.dp, &m.dp_cp_group()) +
              m.traffic_of("expert_dp").total(),  // --ep: the experts' part of the reduction
          m.traffic_of("pp").total() + twin(groups.pp, &m.pp_group()),
          m.traffic_of("embedding").total() + twin(groups.tie, m.embedding_group()),
          m.traffic_of("cp").total()};
}

}  // namespace sat
