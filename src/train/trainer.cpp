#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/io.h"
#include "core/rng.h"
#include "core/timer.h"
#include "optim/optimizer.h"
#include "train/checkpoint.h"
#include "train/runtime.h"
#include "train/validation.h"
#include "train/weights.h"

namespace sat {

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
  const bool table = train.is_table(), named = !train.class_names().empty();  // classes of their own (csv.h, images.h)
  const std::string counts = str_cat(sample.numel(), table ? " features and " : " values and ", train.num_classes(),
                                     " classes"), data = table ? "the table (--data)" : "--data " + train.name();
  if (mc.family == ModelFamily::file) {  // the file fixes its input
    SAT_CHECK(sample == mc.image, "--data ", train.name(), " has samples of shape ", sample.str(), " but --model ",
              mc.name, " declares its input as ", mc.image.str());
    SAT_CHECK(!named || mc.classes == train.num_classes(), "--model ", mc.name, " has ", mc.classes, " outputs, but ",
              data, " has ", counts, "; expected as many outputs as classes");
    return;
  }
  ModelConfig want = mc;  // the mlp that would fit, for the messages
  if (table && want.family != ModelFamily::mlp) want = model_config("mlp");
  want.mlp_widths.front() = sample.numel();
  if (named) want.mlp_widths.back() = want.classes = train.num_classes();
  if (mc.family != ModelFamily::mlp) {
    SAT_CHECK(!table, "--model ", mc.name, " takes images, but the table (--data) has rows of ", counts,
              ": use --model ", model_spec(want), " (mlp:FEATURES-HIDDEN...-CLASSES) or a model file");
    mc.image = sample;
    mc.classes = train.num_classes();
    return;
  }
  SAT_CHECK(!named || (sample.numel() == mc.mlp_widths.front() && mc.classes == train.num_classes()), "--model ",
            mc.name, " takes ", mc.mlp_widths.front(), " inputs and has ", mc.classes, " outputs, but ", data, " has ",
            counts, ": use --model ", model_spec(want), " (mlp:FEATURES-HIDDEN...-CLASSES)");
  SAT_CHECK(sample.numel() == mc.mlp_widths.front(), "--model ", mc.name, " takes inputs of ", mc.mlp_widths.front(),
            " values, but --data ", train.name(), " has samples of shape ", sample.str(), " (", sample.numel(),
            " values): use --model ", model_spec(want));
  mc.image = sample;
}

// ---- construction ---------------------------------------------------------------------
MemoryPlan Trainer::plan(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test,
                         int world, int stage) {
  if (world <= 0) world = cfg.comm ? cfg.comm->size() : 1;
  dist::Mesh::check(world, cfg.tp, cfg.pp, cfg.cp, cfg.ep);
  return plan_rank(resolved_model(mc, cfg), cfg, train, test, stage, cfg.dp_of(world)).memory;
}

Trainer::Trainer(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test)
    : Trainer(nullptr, mc, cfg, train, test) {}

Trainer::Trainer(JobPlan& job, const TrainConfig& cfg) : Trainer(&job, job.model(), cfg, job.train(), job.test()) {}

Trainer::Trainer(JobPlan* job, const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test) {
  rt_ = std::make_unique<RankRuntime>(job, mc, cfg, train, test);
  if (cfg.profile || !cfg.trace_dir.empty()) profile_ = std::make_unique<ProfileObserver>(*rt_);
  checkpointer_ = std::make_unique<Checkpointer>(*rt_);
}

Trainer::~Trainer() = default;

ParamStore& Trainer::params() { return *rt_->params; }
const BuiltModel& Trainer::model() const { return rt_->plan->model; }
const MemoryPlan& Trainer::memory_plan() const { return rt_->plan->memory; }
const RankPlan& Trainer::rank_plan() const { return *rt_->plan; }
const JobPlan& Trainer::job_plan() const { return *rt_->job; }
const dist::Mesh& Trainer::mesh() const { return *rt_->mesh; }

std::string Trainer::profile_table(double gemm_peak) const { return profile_ ? profile_->profiler().table(gemm_peak) : ""; }

std::vector<std::string> Trainer::trace_files() const {
  return profile_ ? profile_->profiler().files() : std::vector<std::string>{};
}

EvalResult Trainer::evaluate(const EvalSink& sink) { return sat::evaluate(*rt_, sink); }

void Trainer::load_weights(const std::string& path) {
  check_input_path("--init-weights", path, true);  // a FIFO or device: refused, not waited on
  if (std::filesystem::is_directory(path))  // a checkpoint's parameters
    checkpointer_->load(resolve_checkpoint(path, "--init-weights"), true);
  else
    sat::load_weights(*rt_, path);
}

void Trainer::save_weights(const std::string& path) { sat::save_weights(*rt_, path); }

// ---- the run --------------------------------------------------------------------------
// Where the run starts (a resumed one goes on from its checkpoint's step and data
// position) and ends, and the steps left out of the measured speed.
RunState Trainer::begin_run() const {
  const RankRuntime& rt = *rt_;
  const TrainConfig& cfg = rt.cfg;
  const dist::Mesh& m = *rt.mesh;
  RunState run;
  run.t_start = now_seconds();
  const int64_t per_epoch = BatchLoader::train_steps(rt.train.size(), cfg.batch, cfg.accum, m.dp(), cfg.last_batch);
  SAT_CHECK(per_epoch >= 1 || cfg.steps > 0, "--accum ", cfg.accum, " x --batch ", cfg.batch,
            " is more than one epoch of ", rt.train.name(), " (", rt.train.size(), " samples)");
  run.total = cfg.steps > 0 ? cfg.steps : cfg.epochs * per_epoch;
  SAT_CHECK(run.total >= 1, "--epochs/--steps: nothing to train (", cfg.steps > 0 ? "0 steps" : "0 epochs", ")");
  run.global_batch = run.result.global_batch = cfg.global_batch(m.size());
  run.start = resume_ ? std::min(resume_->step, run.total) : 0;  // steps already done
  if (resume_) {
    run.result.losses = resume_->losses, run.result.resumed_from = resume_->step;
    run.result.resumed_dir = resume_->dir, run.result.resume_changes = resume_->changes;
  }
  run.result.warmup_excluded =
      cfg.warmup_excluded >= 0 ? cfg.warmup_excluded : std::min<int64_t>(3, (run.total - run.start) / 5);
  run.result.predicted_memory_bytes = rt.device->planned_bytes(rt.plan->memory);
  if (rt.train_loader)
    rt.train_loader->start_epoch(resume_ ? resume_->epoch : 0, resume_ ? resume_->step_in_epoch * cfg.accum : 0);
  if (rt.feed && resume_) rt.feed->set_epoch(resume_->epoch);
  return run;
}

// The step's mean loss on every rank: computed by the stage with the loss, averaged over
// its data-parallel group and broadcast along the pipeline (the wait counts as bubble).
double Trainer::step_loss(const StepStats& st, double& wait) const {
  const dist::Mesh& m = *rt_->mesh;
  double loss = st.losses > 0 ? st.loss_sum / double(rt_->cfg.accum) : 0;
  // (--cp: over dp x cp, each context-parallel rank's loss being its tokens' of the same samples)
  if (st.losses > 0 && m.dp() * m.cp() > 1) m.dp_cp_group().all_reduce_sync(&loss, 1, DType::f64, dist::ReduceOp::avg);
  if (m.pp() > 1) {
    const double t0 = now_seconds();
    const int root = loss_stage(rt_->cfg.schedule_spec());
    m.pp_group().broadcast_sync(&loss, 1, DType::f64, root);
    if (m.pp_rank() != root) wait += now_seconds() - t0;
  }
  return loss;
}

TrainResult Trainer::run(const std::function<void(const StepMetrics&)>& on_step) {
  RankRuntime& rt = *rt_;
  const TrainConfig& cfg = rt.cfg;
  RunState run = begin_run();
  // What watches the run, in order: each is told of every step, then of the run's end.
  std::vector<std::unique_ptr<RunObserver>> own;
  std::unique_ptr<HealthObserver> health = health_observer(rt);
  own.push_back(measure_observer(rt));
  own.push_back(clip_observer(rt));
  if (cfg.measure_noise) own.push_back(noise_observer(rt));
  if (on_step) own.push_back(callback_observer(on_step));
  own.push_back(stop_observer(rt));
  own.push_back(moe_load_observer(rt));
  if (cfg.eval_every > 0) own.push_back(validation_observer(rt, *checkpointer_, run));  // before progress writes it
  own.push_back(progress_observer(rt, resume_ ? resume_->step : 0));
  own.push_back(utilization_observer(rt));
  std::vector<RunObserver*> watch{health.get()};
  for (auto& o : own)
    if (o) watch.push_back(o.get());
  if (profile_) watch.push_back(profile_.get());
  if (!cfg.checkpoint_dir.empty()) watch.push_back(checkpointer_.get());
  watch.insert(watch.end(), extra_.begin(), extra_.end());

  const GroupBytes traffic_before = rt.traffic();
  run.t_train = now_seconds();
  for (run.step = run.start; run.step < run.total; ++run.step) {
    const double t0 = now_seconds();
    for (RunObserver* o : watch) o->step_begins(run);
    const float lr = schedule_lr(cfg.schedule, cfg.optim.lr, run.step, run.total);
    rt.optimizer->set_lr(lr);
    const StepStats st = rt.exec->run_step(
        [&](int micro) { return mix_seed(cfg.seed, uint64_t(run.step * cfg.accum + micro)); }, rt.parts);
    double loss_wait = 0;
    const double loss = step_loss(st, loss_wait);
    const double dt = now_seconds() - t0;
    StepDone done{{run.step + 1, loss, lr, dt, double(run.global_batch) / dt}, st, loss_wait, t0};
    run.result.losses.push_back(loss);
    for (RunObserver* o : watch) o->step_ends(done, run);
  }
  run.t_end = now_seconds();
  const GroupBytes moved = rt.traffic();
  const double ran = double(std::max<int64_t>(1, run.total - run.start));  // steps this process ran
  run.result.comm_bytes_per_step = {(moved.tp - traffic_before.tp) / ran, (moved.dp - traffic_before.dp) / ran,
                                    (moved.pp - traffic_before.pp) / ran,
                                    (moved.embedding - traffic_before.embedding) / ran, (moved.cp - traffic_before.cp) / ran};
  for (RunObserver* o : watch) o->run_ends(run);
  return finish(run, *health);
}

// After the last step: the run's figures, the layout's description, the numerical check,
// evaluation (not when stopping for preemption: no time for it) and every rank's report.
TrainResult Trainer::finish(RunState& run, HealthObserver& health) {
  RankRuntime& rt = *rt_;
  TrainResult& r = run.result;
  const double t_end = run.t_end;
  r.steps = run.total;
  r.final_train_loss = r.losses.empty() ? NAN : r.losses.back();
  r.train_seconds = t_end - run.t_train;
  const int64_t measured = run.total - run.start - r.warmup_excluded;
  r.samples_per_second = measured > 0 ? double(measured * run.global_batch) / (t_end - run.t_measure) : 0;
  describe_run(r);
  health.check_params(run.total);
  if (rt.test && !r.stop_signal) {
    if (rt.world->rank() == 0 && rt.cfg.progress != 0)
      std::fprintf(stderr, "evaluating on %s (%lld samples)\n", rt.test->name().c_str(), (long long)rt.test->size());
    r.test = evaluate();
  }
  r.peak_memory_bytes = rt.device->peak_bytes();
  StepBreakdown b = run.spent;
  const double n = double(std::max<int64_t>(1, measured));
  for (double* x : {&b.compute, &b.tp_comm, &b.grad_sync, &b.pipeline_wait, &b.data, &b.optimizer, &b.other}) *x /= n;
  b.tp_comm = std::min(b.compute, run.tp_comm_seconds);
  b.compute -= b.tp_comm;
  gather_ranks(r, b);
  r.wall_seconds = now_seconds() - run.t_start;
  return r;
}

// The layout, the reduction's timing, BatchNorm statistics, and the device's figures.
void Trainer::describe_run(TrainResult& r) const {
  RankRuntime& rt = *rt_;
  const dist::Mesh& m = *rt.mesh;
  r.world_size = m.size();
  r.dp = m.dp(), r.tp = m.tp(), r.pp = m.pp(), r.cp = m.cp(), r.ep = m.ep();
  r.pp_schedule = pipe_schedule_name(rt.cfg.pp_schedule);
  r.virtual_stages = rt.cfg.virtual_stages;
  r.pp_split.assign(rt.plan->split.cuts.begin() + 1, rt.plan->split.cuts.end() - 1);
  r.comm_backend = rt.groups.reduces ? rt.groups.dp->backend_name() : "";
  // (ZeRO-2/3 measure only the seconds the step waited for its gathers and reductions: no
  // part of them counts as hidden.)
  r.comm_seconds = rt.sync->window_seconds();
  r.comm_hidden_fraction =
      r.comm_seconds > 0 ? std::clamp(1.0 - rt.sync->exposed_seconds() / r.comm_seconds, 0.0, 1.0) : 0.0;
  rt.sync_states_from_first_replica();
  r.precision = precision_name(rt.cfg.precision);
  rt.device->synchronize();
  r.device = device_kind_name(rt.device->kind());
  r.device_name = rt.device->name();
  auto [launches, kernels] = rt.engine->take_launches();
  r.graph_replay = launches > 0;
  const int64_t replays = std::max<int64_t>(1, r.steps - 1);  // graphs replay from the second step on
  r.launches_per_step = launches / replays;
  r.kernels_per_step = r.graph_replay ? kernels / replays : 0;
  r.device_memory_used_bytes = rt.device->used_bytes();
  r.skipped_steps = rt.optimizer->skipped_steps();
  r.loss_scale = rt.optimizer->loss_scale();
  rt.device->to_host(*rt.params);
}

// Every rank's place, memory, step time and its breakdown (t: this rank's, per measured
// step; its parts add up to the step), gathered on every rank.
void Trainer::gather_ranks(TrainResult& r, const StepBreakdown& t) const {
  const dist::Mesh& m = *rt_->mesh;
  const GroupBytes& c = r.comm_bytes_per_step;
  std::vector<double> mine{double(m.rank()), double(m.pp_rank()), double(m.dp_rank()), double(m.tp_rank()),
                           double(r.predicted_memory_bytes), double(r.peak_memory_bytes), t.total(), t.pipeline_wait,
                           c.tp, c.dp, c.pp, c.embedding, t.compute, t.tp_comm, t.grad_sync, t.pipeline_wait, t.data,
                           t.optimizer, t.other, c.cp, double(m.cp_rank()), double(m.ep_rank())};
  constexpr size_t kFixed = 22;
  for (size_t b : rt_->plan->memory.by_kind) mine.push_back(double(b));
  const size_t n = mine.size();
  std::vector<double> all(n * size_t(m.size()));
  rt_->world->all_gather(mine.data(), all.data(), n, DType::f64)->wait();
  double bubble = 0;
  for (int k = 0; k < m.size(); ++k) {
    const double* a = all.data() + n * size_t(k);
    RankReport rr;
    rr.rank = int(a[0]), rr.stage = int(a[1]), rr.dp_rank = int(a[2]), rr.tp_rank = int(a[3]);
    rr.cp_rank = int(a[20]), rr.ep_rank = int(a[21]);
    rr.predicted_memory_bytes = size_t(a[4]), rr.peak_memory_bytes = size_t(a[5]);
    rr.step_seconds = a[6], rr.wait_seconds = a[7];
    rr.comm_bytes_per_step = {a[8], a[9], a[10], a[11], a[19]};
    rr.breakdown = {a[12], a[13], a[14], a[15], a[16], a[17], a[18]};
    for (size_t i = kFixed; i < n; ++i) rr.memory_by_kind.push_back(size_t(a[i]));
    r.ranks.push_back(rr);
    r.rank_step_seconds.push_back(rr.step_seconds);
    bubble += rr.step_seconds > 0 ? rr.wait_seconds / rr.step_seconds : 0;
  }
  r.bubble_fraction = m.pp() > 1 ? bubble / double(m.size()) : 0;
}

}  // namespace sat
