#include "cli/train.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>

#include "backend/cpu/blas.h"
#include "backend/cpu/cpu_features.h"
#include "backend/device.h"
#include "backend/support.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/text.h"
#include "core/io.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "dist/verdict.h"
#include "plan/hardware.h"
#include "profile/run_report.h"
#include "train/checkpoint.h"
#include "train/plan.h"
#include "train/report.h"
#include "train/run_dir.h"
#include "train/signals.h"
#include "train/trainer.h"
#include "train/validate.h"
#include "train/validation.h"
#include "tune/policy.h"

namespace sat::cli {

namespace {

namespace fs = std::filesystem;

// --checkpoint-*, --keep and --resume against each other (sat::Error naming the flag).
void check_checkpoint_flags(const RunArgs& a) {
  SAT_CHECK(a.checkpoint_every >= 0, "--checkpoint-every: expected a number of steps >= 0, got ", a.checkpoint_every);
  SAT_CHECK(std::isfinite(a.checkpoint_every_minutes) && a.checkpoint_every_minutes >= 0,
            "--checkpoint-every-minutes: expected a number of minutes >= 0, got ", a.checkpoint_every_minutes);
  SAT_CHECK(a.keep >= 0, "--keep: expected the number of checkpoints to keep (0: all), got ", a.keep);
  const bool any = a.checkpoint_every > 0 || a.checkpoint_every_minutes > 0 || a.keep > 0;
  SAT_CHECK(!any || !a.checkpoint_dir.empty(), "--checkpoint-every, --checkpoint-every-minutes and --keep need "
            "--checkpoint-dir DIR");
  SAT_CHECK(a.resume != "auto" || !a.checkpoint_dir.empty(), "--resume auto needs --checkpoint-dir DIR (where it "
            "looks for the newest checkpoint)");
  std::error_code ec;
  if (!a.checkpoint_dir.empty()) {  // refused now, not at the first checkpoint hours later
    SAT_CHECK(!fs::exists(a.checkpoint_dir, ec) || fs::is_directory(a.checkpoint_dir, ec), "--checkpoint-dir: ",
              a.checkpoint_dir, " exists and is not a directory");
    fs::create_directories(a.checkpoint_dir, ec);
    SAT_CHECK(!ec && access(a.checkpoint_dir.c_str(), W_OK | X_OK) == 0, "--checkpoint-dir: cannot write to ",
              a.checkpoint_dir, ec ? ": " + ec.message() : std::string(": ") + std::strerror(errno));
  }
  if (!a.resume.empty() && a.resume != "auto") resolve_checkpoint(a.resume, "--resume");
  // A new run beside another run's checkpoints would prune its own (theirs have higher
  // steps) and --resume auto would go on from theirs: the directory is that run's.
  if (a.resume.empty() && !a.checkpoint_dir.empty()) {
    const std::string other = newest_checkpoint(a.checkpoint_dir);
    SAT_CHECK(other.empty(), "--checkpoint-dir: ", a.checkpoint_dir, " holds another run's checkpoints (",
              fs::path(other).filename().string(), "): go on with it with --resume auto, or give another directory");
  }
  if (!a.checkpoint_dir.empty() || !a.resume.empty()) require(resolve_device(a.device), Feature::checkpoints);
}

// The checkpoint to resume from: --resume DIR (a checkpoint, or the newest under it), or
// with --resume auto the newest under --checkpoint-dir ("" when there is none: a fresh start).
// Each rank looks on its own disk; all must find the same one.
std::string resume_from(const RunArgs& a, dist::Comm& world) {
  if (a.resume.empty()) return "";
  const std::string from = dist::on_every_rank(world, [&] {
    return a.resume != "auto" ? resolve_checkpoint(a.resume, "--resume") : newest_checkpoint(a.checkpoint_dir);
  });
  dist::agree_on_text(world, from, a.resume == "auto" ? "--resume auto: the newest checkpoint" : "--resume",
                      "every rank must see the same checkpoints: is --checkpoint-dir on a file system the nodes share?");
  if (a.resume == "auto" && world.rank() == 0)
    std::fprintf(stderr, from.empty() ? "--resume auto: no checkpoint in %s yet: starting from the beginning\n"
                                      : "--resume auto: resuming from %s\n",
                 from.empty() ? a.checkpoint_dir.c_str() : from.c_str());
  return from;
}

// --keep-best replaces DIR/best whole: it may hold a checkpoint, or nothing yet.
void check_best_dir(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  SAT_CHECK(fs::is_directory(dir, ec) && (fs::exists(fs::path(dir) / "manifest.json", ec) || fs::is_empty(dir, ec)),
            "--keep-best: ", dir, " exists and is not a checkpoint (--keep-best replaces it whole): move it away, or "
            "give another --out");
}

// Every output of train and tune, before anything is read or trained (on every rank alike):
// a target that exists and is not a regular file, or a directory that cannot be created or
// written, is refused; and a directory holding another run's results is not written over
// without --overwrite (metrics.jsonl would be truncated at the first step).
void check_train_outputs(const RunArgs& a, bool tune_only) {
  if (!a.save_weights.empty()) check_output_file("--save-weights", a.save_weights);
  if (!a.trace.empty()) check_output_dir("--trace", a.trace);
  if (a.out.empty()) return;
  check_output_dir("--out", a.out);
  const std::vector<std::string> files = tune_only ? std::vector<std::string>{"tune.json", "tune.html", "config.toml"}
                                                   : std::vector<std::string>{"metrics.jsonl", "summary.json",
                                                                              "config.toml", "tune.json", "tune.html"};
  for (const std::string& f : files) check_output_file("--out", a.out + "/" + f);
  if (!a.trace.empty() && !tune_only) check_output_file("--out", a.out + "/report.html");
  if (!a.keep_best.empty() && !tune_only) check_best_dir(a.out + "/best");
  // --resume goes on with the same run: its metrics.jsonl is kept up to the checkpoint's step.
  if (a.overwrite || (!tune_only && !a.resume.empty())) return;
  const std::vector<const char*> earlier = tune_only ? std::vector<const char*>{"tune.json", "tune.html"}
                                                     : std::vector<const char*>{"metrics.jsonl", "summary.json"};
  for (const char* f : earlier)
    SAT_CHECK(!fs::exists(fs::path(a.out) / f), "--out: ", a.out, " already holds the results of another ",
              tune_only ? "tuning" : "run", " (", f, "): give a new directory, or --overwrite to replace them");
}

// The flags that need no data and no model, in the order a user meets them.
void check_run_flags(const RunArgs& a, bool tune_only) {
  (void)parse_on_off("--shuffle", a.shuffle);
  (void)parse_on_off("--eval", a.eval);
  if (!a.init_weights.empty()) check_input_path("--init-weights", a.init_weights, true);
  check_checkpoint_flags(a);
  check_train_outputs(a, tune_only);
  const auto given = [&](const char* f) { return std::count(a.given.begin(), a.given.end(), f) > 0; };
  SAT_CHECK(!tune_only || !a.layout.empty() || (!given("--batch") && !given("--accum")),
            "--batch/--accum: saturate tune chooses them (give --global-batch to keep a global batch)");
}

// What the run is asked to do, typed: its settings and layout, and what decides the layout
// when the flags leave it open (--batch auto, saturate tune, --layout).
struct Run {
  TrainConfig cfg;
  bool auto_batch = false, auto_layout = false;
  LayoutTuneConfig layout;
  TunePolicy policy;
};

Run run_of(const RunArgs& a, bool tune_only, const DataSplit& data) {
  Run r;
  r.auto_layout = !a.layout.empty();
  if (r.auto_layout) r.layout = layout_tune_config(a);
  r.auto_batch = !r.auto_layout && (tune_only || a.batch == "auto");
  const int64_t batch = r.auto_batch || r.auto_layout ? 1 : parse_batch(a.batch);
  SAT_CHECK(r.auto_batch || r.auto_layout || a.global_batch == 0,
            "--global-batch needs --batch auto or --layout (or saturate tune)");
  r.cfg = train_config(a);
  if (!a.checkpoint_dir.empty()) install_stop_signals();
  static_cast<Layout&>(r.cfg) = layout_of(a, batch);
  r.cfg.measure_noise = a.noise_scale;
  SAT_CHECK(!r.auto_batch || (r.cfg.pp == 1 && r.cfg.tp == 1 && r.cfg.cp == 1), "--batch auto and saturate tune "
            "choose the batch of a data-parallel layout: with --pp, --tp or --cp give --batch (and --accum) yourself, or use --layout auto");
  SAT_CHECK((!r.auto_batch && !r.auto_layout) || a.ep == 1, "--ep ", a.ep, ": --batch auto, --layout and saturate tune "
            "do not place experts yet; give --batch (and --accum) yourself with --ep");
  r.policy = tune_policy(a, data.description, tune_only);
  if (r.auto_batch)
    SAT_CHECK(r.cfg.accum == 1, "--accum: with --batch auto the tuner chooses the accumulation (use --global-batch)");
  if (!a.init_weights.empty()) require(resolve_device(a.device), Feature::init_weights);
  return r;
}

// --eval-every against the data and the run's length, before anything is written. The steps
// are known unless --batch auto or --layout still has to choose the batch of an --epochs run
// (the trainer checks those when it starts).
void check_validation_run(const Run& r, const DataSplit& data, int world) {
  const TrainConfig& c = r.cfg;
  int64_t total = c.steps;
  if (total == 0 && !r.auto_batch && !r.auto_layout)
    total = c.epochs * BatchLoader::train_steps(data.train->size(), c.batch, c.accum, c.dp_of(world), c.last_batch);
  check_validation(c, data.test.get(), total);
}

// The one validation before MPI starts, of what is known then: the whole run with a layout
// given; with --batch auto its settings and ranks (the tuner gives the noise scale its two
// micro-batches); with --layout the settings alone (the planner forms valid layouts only).
void validate_before_mpi(const ModelConfig& mc, const Run& r, int world) {
  TrainConfig c = r.cfg;
  if (r.auto_batch && c.measure_noise) c.accum = 2;
  if (r.auto_layout) {
    static_cast<Layout&>(c) = Layout{};
    c.measure_noise = false;
  }
  validate_run(mc, c, world);
}

// The job's plan as this rank runs it: validated, resolved for its tensor-parallel rank.
std::unique_ptr<JobPlan> plan_job(const ModelConfig& mc, const TrainConfig& cfg, const DataSplit& data, int world,
                                  int rank) {
  validate_run(mc, cfg, world);
  const Layout l = cfg.with_world(world);
  const dist::MeshCoords at = l.coords(rank);
  return std::make_unique<JobPlan>(resolved_model(mc, cfg, at.tp, nullptr, at.cp, at.dp % std::max(1, cfg.ep)), cfg,
                                   *data.train, data.test.get(), l.dp);
}

// Under mpirun/srun: one communicator for the job; only rank 0 prints and writes.
std::unique_ptr<dist::Comm> start_job(const dist::ProcessInfo& pi, TrainConfig& cfg) {
  // Each rank's communication thread spins inside OpenMPI while a reduction waits for a
  // peer; when the ranks' compute threads fill every core of the node, that steals a core
  // from backward. Ask OpenMPI to yield instead (as saturate launch does), unless the user
  // chose; it is read when MPI starts, just below.
  if (pi.distributed() && int64_t(pi.local_world) * cpu::num_threads() >= int64_t(std::thread::hardware_concurrency()))
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  std::unique_ptr<dist::Comm> comm = dist::make_world_comm();
  SAT_CHECK(comm->rank() == pi.rank && comm->size() == pi.world, "internal error: MPI made rank ", comm->rank(), " of ",
            comm->size(), " where the launcher said ", pi.rank, " of ", pi.world);
  cfg.comm = comm.get();
  if (comm->rank() != 0) {
    cfg.progress = 0;
    cfg.out_dir.clear();
  }
  return comm;
}

void print_start(const ModelConfig& mc, const DataSplit& data, const RunArgs& a, bool tune_only) {
  std::fprintf(stderr, "saturate %s: %s on %s\n", tune_only ? "tune" : "train", mc.name.c_str(),
               data.description.c_str());
  if (resolve_device(a.device) == Device::cuda)
    std::fprintf(stderr, "note: saturate's CUDA path (engine, executor, NCCL) compiles but has not yet been verified on "
                 "a GPU; compare with --device cpu and report what differs\n");
}

// The share of a step spent waiting for the next batch, in percent.
double data_share(const StepBreakdown& b, double step_seconds) {
  return step_seconds > 0 ? 100.0 * b.data / step_seconds : 0.0;
}

void print_layout(const Trainer& trainer, const TrainConfig& cfg, int world) {
  const MemoryPlan& plan = trainer.memory_plan();
  const RankPlan& rp = trainer.rank_plan();
  std::fprintf(stderr, "%lld parameters, micro-batch %lld x %lld accumulation x %d rank(s), %d threads, predicted memory "
               "%s%s\n", (long long)rp.model_parameters, (long long)cfg.batch, (long long)cfg.accum, world,
               cpu::num_threads(), format_bytes(double(plan.device ? plan.device : plan.total())).c_str(),
               cfg.pp > 1 ? " (stage 0)" : "");
  std::fprintf(stderr, "cpu: %s\n", cpu::cpu_features().describe().c_str());
  if (rp.reads_data) std::fprintf(stderr, "loader: %s\n", rp.loader.describe().c_str());
  if (resolve_device(cfg.device) == Device::cpu && cfg.precision == Precision::bf16)
    std::fprintf(stderr, "%s\n", cpu::bf16_path_line().c_str());
  if (cfg.pp > 1)
    std::fprintf(stderr, "layout: %s; %s schedule, stages %s\n", trainer.mesh().describe().c_str(),
                 pipe_schedule_name(cfg.pp_schedule), rp.split.describe(*trainer.job_plan().whole().graph).c_str());
  else if (cfg.tp > 1)
    std::fprintf(stderr, "layout: %s; tensor parallel%s\n", trainer.mesh().describe().c_str(),
                 cfg.sequence_parallel ? " with sequence parallelism" : "");
}

// --profile (rank 0): its layers, slowest first, against this machine's GEMM rate, and
// where every rank's step time goes; "data": the step waiting for its next batch (the
// loader's hand-off), its share of the step after warm-up.
void print_profile(const Trainer& trainer, const TrainResult& r) {
  std::fprintf(stderr, "%s", trainer.profile_table(gemm_peak_flops()).c_str());
  std::fprintf(stderr, "\nwhere the step time goes (ms per measured step; tp comm: the tensor-parallel layers' "
               "collectives; data: waiting for the next batch):\n%4s %5s %9s %8s %9s %14s %7s %10s %7s %9s %7s\n",
               "rank", "stage", "compute", "tp comm", "grad sync", "pipeline wait", "data", "optimizer", "other", "step",
               "data %");
  for (const RankReport& k : r.ranks) {
    const StepBreakdown& b = k.breakdown;
    std::fprintf(stderr, "%4d %5d %9.3f %8.3f %9.3f %14.3f %7.3f %10.3f %7.3f %9.3f %6.2f%%\n", k.rank, k.stage,
                 1e3 * b.compute, 1e3 * b.tp_comm, 1e3 * b.grad_sync, 1e3 * b.pipeline_wait, 1e3 * b.data,
                 1e3 * b.optimizer, 1e3 * b.other, 1e3 * k.step_seconds, data_share(b, k.step_seconds));
  }
  const double share = r.ranks.empty() ? 0 : data_share(r.ranks[0].breakdown, r.ranks[0].step_seconds);
  std::fprintf(stderr, "data share %.2f%% of the step (rank 0, over %lld measured steps; warm-up steps excluded: %lld): "
               "%s\n", share, (long long)(r.steps - r.resumed_from - r.warmup_excluded),
               (long long)r.warmup_excluded, share < 1 ? "the loader keeps up" : "the step waits for data (see "
               "--loader-workers, --prefetch)");
}

void print_traces(const RunArgs& a, const Trainer& trainer) {
  const auto files = trainer.trace_files();
  std::fprintf(stderr, "trace: rank 0 wrote %zu file(s) in %s (every rank writes its own); open them in Perfetto "
               "(https://ui.perfetto.dev) or TensorBoard (tensorboard --logdir %s)\n", files.size(), a.trace.c_str(),
               a.trace.c_str());
}

void print_noise(const TrainResult& r) {
  const NoiseInterval& iv = r.noise_interval;
  char interval[64];
  std::snprintf(interval, sizeof interval, "95%% interval %.4g to %.4g", iv.low, iv.high);
  const std::string how = iv.measurable ? std::string(interval) : "no interval yet: " + iv.reason;
  const int64_t gb = r.global_batch;
  if (r.noise_scale > 0 && iv.measurable)
    std::printf("gradient noise scale %.4g at the end (smoothed over %zu steps; %s): this run's global batch %lld is "
                "%.3gx it\n", r.noise_scale, r.grad_norms.size(), how.c_str(), (long long)gb, double(gb) / r.noise_scale);
  else if (r.noise_scale > 0)
    std::printf("gradient noise scale: not measurable yet: %s (the smoothed estimate is %.4g over %zu steps, "
                "but its interval says nothing)\n", iv.reason.c_str(), r.noise_scale, r.grad_norms.size());
  else
    std::printf("gradient noise scale: not measurable yet: %s\n",
                iv.reason.empty() ? "the estimates of |G|^2 and tr(Sigma) are not both positive" : iv.reason.c_str());
}

// Rank 0's lines about a finished run.
void print_result(const TrainConfig& cfg, const TrainResult& r, const RankPlan& rp) {
  std::printf("final train loss %.4f", r.final_train_loss);
  if (r.test) {
    std::printf(", test loss %.4f", r.test->loss);
    if (r.test->accuracy >= 0)
      std::printf(", test accuracy %.2f%% (%lld samples)", 100 * r.test->accuracy, (long long)r.test->samples);
  }
  std::printf("\n%.1f samples/s (%lld warm-up steps excluded), memory predicted %s, peak %s%s; process peak resident "
              "%s\n", r.samples_per_second, (long long)r.warmup_excluded, format_bytes(double(r.predicted_memory_bytes)).c_str(),
              format_bytes(double(r.peak_memory_bytes)).c_str(), cfg.pp > 1 ? " (rank 0)" : "",
              format_bytes(double(peak_resident_bytes())).c_str());
  if (cfg.pp > 1 && cfg.accum == 1)
    std::printf("model parallelism: %d stages, one micro-batch at a time: measured bubble %.1f%% (theory (P-1)/P = "
                "%.1f%%; --accum M pipelines M micro-batches)\n", cfg.pp, 100 * r.bubble_fraction,
                100 * theoretical_bubble(rp.schedule));
  else if (cfg.pp > 1)
    std::printf("pipeline: %d stages, %s, %lld micro-batches per step: measured bubble %.1f%% (theory %.1f%%)\n", cfg.pp,
                pipe_schedule_name(cfg.pp_schedule), (long long)cfg.accum, 100 * r.bubble_fraction,
                100 * theoretical_bubble(rp.schedule));
  if (cfg.measure_noise) print_noise(r);
}

void write_summary(RunDirectory& out, const RunArgs& a, const ModelConfig& mc, const DataSplit& data, const Run& run,
                   const TrainResult& r, const Trainer& trainer, double t0) {
  const RankPlan& rp = trainer.rank_plan();
  RunInfo info;
  info.model = mc.name;
  info.data = data.description;
  info.schedule_name = a.schedule;
  info.parameters = rp.model_parameters;
  info.threads = cpu::num_threads();
  info.tokens = mc.tokens;
  info.seq_len = mc.seq_len;
  info.flops_per_sample = rp.model_flops_per_sample;
  info.seed = a.seed;
  info.wall_seconds = now_seconds() - t0;
  info.memory_budget = double(run.policy.tune.memory_budget);
  out.complete(run_summary(info, run.cfg, r, trainer.memory_plan()));
  std::fprintf(stderr, "wrote %s/summary.json, %s/metrics.jsonl and %s/config.toml\n", a.out.c_str(), a.out.c_str(),
               a.out.c_str());
  if (!a.trace.empty()) std::fprintf(stderr, "wrote %s (saturate report)\n", write_run_report(a.out).c_str());
}

// --out's config.toml: every flag as this run resolved it (cli/config_file.h), before it
// trains, so that a run stopped on the way can be repeated too.
void write_run_config(const RunArgs& a, const Run& run) {
  const std::string text =
      config_toml("train", a.flags, resolved_flags(run.cfg, a.flags, run.auto_batch, run.auto_layout));
  write_file_atomic("--out", a.out + "/config.toml", text);
}

// Trains with the job's plan; rank 0 reports.
int train_and_report(const RunArgs& a, const ModelConfig& mc, const DataSplit& data, Run& run, JobPlan& job,
                     RunDirectory* out, double t0) {
  const TrainConfig& cfg = run.cfg;
  const bool lead = cfg.comm->rank() == 0;
  Trainer trainer(job, cfg);
  if (!a.init_weights.empty()) trainer.load_weights(a.init_weights);
  if (const std::string from = resume_from(a, *cfg.comm); !from.empty()) trainer.resume(from);
  if (lead) print_layout(trainer, cfg, cfg.comm->size());
  const TrainResult r = trainer.run();
  if (r.stop_signal) {  // preempted: the checkpoint is what counts; nothing else is overwritten
    if (lead)
      std::fprintf(stderr, "stopped by signal %d after step %lld: checkpoint %s; the same command with --resume auto "
                   "goes on from there\n", r.stop_signal, (long long)r.steps, r.last_checkpoint.c_str());
    if (out) out->stopped(r.stop_signal, (long long)r.steps, r.last_checkpoint);
    return stop_exit_status(r.stop_signal);
  }
  if (!a.save_weights.empty()) {
    trainer.save_weights(a.save_weights);  // gathers the stages on rank 0
    if (lead) std::fprintf(stderr, "saved weights to %s\n", a.save_weights.c_str());
  }
  if (!lead) return 0;
  if (a.profile) print_profile(trainer, r);
  if (!a.trace.empty()) print_traces(a, trainer);
  print_result(cfg, r, trainer.rank_plan());
  if (out) write_summary(*out, a, mc, data, run, r, trainer, t0);
  return 0;
}

}  // namespace

int run_train(const RunArgs& a, bool tune_only) {
  const double t0 = now_seconds();
  SAT_CHECK(a.threads >= 0, "--threads: expected 0 (the cores this rank may use) or a positive number, got ", a.threads);
  cpu::set_num_threads(a.threads, dist::detect_process().local_world);
  ModelConfig mc = model_for(a);
  check_run_flags(a, tune_only);
  DataOptions dopt = data_options_for(mc, a.seed);
  if (!a.normalize.empty()) parse_normalize(a.normalize, dopt);
  dopt.label = a.label;
  dopt.val_fraction = a.val_fraction;
  dopt.augment = a.augment;
  dopt.skip_bad_images = a.skip_bad_images;
  const DataSplit data = open_dataset(a.data, dopt);
  // Image data of another shape (synthetic:CxHxW, CIFAR...) sets the model's input (an
  // mlp's input width must match it).
  fit_to_data(mc, *data.train);
  Run run = run_of(a, tune_only, data);
  TrainConfig& cfg = run.cfg;
  const dist::ProcessInfo pi = dist::detect_process();
  validate_before_mpi(mc, run, pi.world);
  check_validation_run(run, data, pi.world);
  std::unique_ptr<JobPlan> job;
  if (!run.auto_batch && !run.auto_layout) job = plan_job(mc, cfg, data, pi.world, pi.rank);
  const std::unique_ptr<dist::Comm> comm = start_job(pi, cfg);
  const bool lead = comm->rank() == 0;
  // Rank 0 claims --out before anything is written there (a tuned batch's tune.json first).
  auto out = dist::on_every_rank(*comm, [&] {
    auto dir = lead && !tune_only && !a.out.empty() ? std::make_unique<RunDirectory>(a.out, !a.resume.empty()) : nullptr;
    if (dir && !data.train->is_tokens() && !data.train->schema().empty())  // a table's or image folder's, for predict
      write_file_atomic("--out", a.out + "/" + data.train->schema_file(), data.train->schema() + "\n");
    return dir;
  });
  if (lead) print_start(mc, data, a, tune_only);
  const Dataset* test = cfg.evaluate ? data.test.get() : nullptr;
  if (run.auto_batch && !apply_tuning(run.policy, mc, *data.train, test, *comm, cfg)) {
    // saturate tune --out: the choice as train's config (saturate train --config DIR/config.toml).
    if (lead && !a.out.empty()) write_run_config(a, run);
    return 0;
  }
  if (run.auto_layout && !apply_layout_tuning(run.policy, mc, *data.train, test, run.layout, *comm, cfg)) {
    if (lead && !a.out.empty()) write_run_config(a, run);  // saturate tune --layout auto --out: its choice
    return 0;
  }
  if (!job) job = plan_job(mc, cfg, data, comm->size(), comm->rank());
  const int stage = cfg.with_world(comm->size()).coords(comm->rank()).pp;
  if (run.policy.tune.memory_budget) hold_to_budget(run.policy.tune.memory_budget, job->stage(stage).memory, cfg);
  if (out) write_run_config(a, run);
  return train_and_report(a, mc, data, run, *job, out.get(), t0);
}

}  // namespace sat::cli
