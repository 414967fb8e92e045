// The `saturate` command: train, tune, eval, predict, info, hardware, launch and bench. User mistakes print one clear line and
// exit with status 2; nothing is written over until a run has succeeded.
#include <strings.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "backend/cpu/blas.h"
#include "cli/eval.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/io.h"
#include "core/timer.h"
#include "data/dataset.h"
#include "nn/engine.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "plan/hardware.h"
#include "profile/run_report.h"
#include "backend/device.h"
#include "dist/bench_comm.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "dist/nccl_comm.h"
#include "dist/mesh.h"
#include "plan/curve.h"
#include "plan/plan_cli.h"
#include "train/plan.h"
#include "train/report.h"
#include "train/checkpoint.h"
#include "train/signals.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include "tune/layout_tune.h"
#include "tune/tune.h"

extern "C" char* openblas_get_corename(void);

namespace {

// The largest micro-batch --batch takes (train's, tune's and info's).
constexpr long long kMaxBatch = 1 << 24;

// OpenBLAS 0.3.21 (Debian 12) does not recognise recent AVX-512 CPUs (AMD Zen 4/5)
// and falls back to its AVX2 "Haswell" kernels, 1.4-1.9x slower in sgemm. It picks
// its kernels when the library loads, so set OPENBLAS_CORETYPE and re-execute once.
// OpenBLAS itself writes the detected core into OPENBLAS_CORETYPE at load, so a value
// that differs from the detected core is the user's own choice and is kept;
// SAT_BLAS_KERNELS=keep turns the selection off.
void select_blas_kernels(char** argv) {
  const char* keep = std::getenv("SAT_BLAS_KERNELS");
  if ((keep && std::string(keep) == "keep") || std::getenv("SAT_BLAS_REEXEC")) return;
  const char* core = openblas_get_corename();
  if (!core) return;
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  if (env && strcasecmp(env, core) != 0) return;
  bool fallback = std::string(core) == "Haswell" || std::string(core) == "Zen";
  bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (!fallback || !avx512) return;
  setenv("OPENBLAS_CORETYPE", "SKYLAKEX", 1);
  setenv("SAT_BLAS_REEXEC", "1", 1);
  execv("/proc/self/exe", argv);  // on failure, carry on with the default kernels
}

constexpr double kDefaultWarmupFraction = 0.05;  // --warmup not given: this share of the steps
constexpr int64_t kWarmupNotGiven = std::numeric_limits<int64_t>::min();

struct TrainArgs {
  // The defaults train well with nothing set (README "Defaults"): AdamW at 1e-3 with weight
  // decay 0.01, warmed up over the first 5% of the steps, then a cosine decay to 0.
  std::string model = "mlp", data = "fashion-mnist", optimizer = "adamw", schedule = "cosine", shuffle = "on";
  std::string batch = "64";  // a number or "auto"
  int64_t accum = 1, epochs = 1, steps = 0, warmup = kWarmupNotGiven, step_size = 0, vocab = 0;
  int64_t seq_len = 0;  // --seq-len: GPT models' window (0: the context)
  // NaN: not given (the optimizer's default applies)
  double lr = std::nan(""), momentum = 0, weight_decay = std::nan(""), gamma = 0.1;
  bool nesterov = false, profile = false, noise_scale = false, overwrite = false;
  std::string trace, trace_steps;  // --trace DIR, --trace-steps wait=W,warmup=U,active=A,repeat=R
  uint64_t seed = 0;
  int threads = 0;
  std::string device = "auto", precision = "fp32", cuda_graph = "on", last_batch = "drop";
  double bucket_mb = 25;
  std::string dist_backend = "auto";
  bool sync_bn = false;
  int zero = 0;
  // Layout: tensor and pipeline parallelism (the data-parallel degree is what is left).
  int tp = 1, pp = 1, virtual_stages = 1;
  bool sequence_parallel = false;
  std::string pp_schedule = "1f1b", pp_split;
  std::string recompute = "none";  // activation recomputation
  // Tuning (saturate tune, --batch auto).
  std::string memory_budget, objective = "throughput";
  int64_t global_batch = 0, lr_batch = 64;
  double knee = 0.03;
  // --layout auto|FIELDS: the planner's best layouts for these ranks, timed; and the layout
  // flags given explicitly (they fix fields of the search).
  std::string layout;
  int layout_candidates = 3;
  std::vector<std::string> given;
  std::string init_weights, save_weights, out, normalize, eval = "on";
  // Checkpoints and resuming (train/checkpoint.h).
  std::string checkpoint_dir, resume;
  int64_t checkpoint_every = 0;
  double checkpoint_every_minutes = 0;
  int keep = 0;
};

// --checkpoint-*, --keep and --resume against each other (sat::Error naming the flag).
void check_checkpoint_flags(const TrainArgs& a) {
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
    SAT_CHECK(!std::filesystem::exists(a.checkpoint_dir, ec) || std::filesystem::is_directory(a.checkpoint_dir, ec),
              "--checkpoint-dir: ", a.checkpoint_dir, " exists and is not a directory");
    std::filesystem::create_directories(a.checkpoint_dir, ec);
    SAT_CHECK(!ec && access(a.checkpoint_dir.c_str(), W_OK | X_OK) == 0, "--checkpoint-dir: cannot write to ",
              a.checkpoint_dir, ec ? ": " + ec.message() : std::string(": ") + std::strerror(errno));
  }
  if (!a.resume.empty() && a.resume != "auto") sat::resolve_checkpoint(a.resume, "--resume");
  if (!a.checkpoint_dir.empty() || !a.resume.empty())
    SAT_CHECK(a.device == "cpu" || a.device == "auto" || sat::resolve_device(a.device) == sat::Device::cpu,
              "--checkpoint-dir/--resume: checkpoints are written and read on the CPU only for now (--device cpu)");
}

// The checkpoint to resume from: --resume DIR (a checkpoint, or the newest under it), or
// with --resume auto the newest under --checkpoint-dir ("" when there is none: a fresh start).
std::string resume_from(const TrainArgs& a, bool lead) {
  if (a.resume.empty()) return "";
  if (a.resume != "auto") return sat::resolve_checkpoint(a.resume, "--resume");
  const std::string newest = sat::newest_checkpoint(a.checkpoint_dir);
  if (lead)
    std::fprintf(stderr, newest.empty() ? "--resume auto: no checkpoint in %s yet: starting from the beginning\n"
                                        : "--resume auto: resuming from %s\n",
                 newest.empty() ? a.checkpoint_dir.c_str() : newest.c_str());
  return newest;
}

sat::ModelConfig model_for(const TrainArgs& a) {
  sat::ModelConfig mc = sat::model_config(a.model);
  if (a.vocab > 0) {
    SAT_CHECK(mc.tokens, "--vocab applies to the GPT and Llama models only, not --model ", a.model);
    mc.vocab = mc.classes = a.vocab;
  }
  sat::set_seq_len(mc, a.seq_len);
  return mc;
}

// "8GiB", "512MiB", "2G" (binary), "1.5GB", "500MB" (decimal) or plain bytes.
size_t parse_bytes(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  std::string unit = end ? std::string(end) : "";
  double mult = 0;
  const std::pair<const char*, double> units[] = {
      {"", 1}, {"B", 1}, {"K", 1024.0}, {"KiB", 1024.0}, {"M", 1048576.0}, {"MiB", 1048576.0},
      {"G", 1073741824.0}, {"GiB", 1073741824.0}, {"T", 1099511627776.0}, {"TiB", 1099511627776.0},
      {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}};
  for (auto& [u, m] : units)
    if (unit == u) mult = m;
  // (at most 2^60 bytes: the conversion to size_t must be in range)
  SAT_CHECK(end != v.c_str() && mult > 0 && x > 0 && std::isfinite(x) && x * mult <= 0x1p60, flag,
            ": expected a size such as 8GiB, 512MiB, 2G or 1500000000 (bytes, at most 1 EiB), got '", v, "'");
  return size_t(x * mult);
}

// "2,5,7": --pp-split's cut points.
std::vector<int> parse_int_list(const std::string& flag, const std::string& v) {
  std::vector<int> out;
  size_t pos = 0;
  while (!v.empty() && pos <= v.size()) {
    const size_t end = std::min(v.find(',', pos), v.size());
    const std::string item = v.substr(pos, end - pos);
    char* stop = nullptr;
    const long x = std::strtol(item.c_str(), &stop, 10);
    SAT_CHECK(!item.empty() && stop && *stop == 0 && x >= 0 && x < 1000000, flag,
              ": expected block indices separated by commas (such as 2,5), got '", v, "'");
    out.push_back(int(x));
    pos = end + 1;
  }
  return out;
}

// The layout flags into cfg (checked against the model by the trainer and validate_layout).
void layout_into(const TrainArgs& a, sat::TrainConfig& cfg) {
  cfg.tp = a.tp;
  cfg.sequence_parallel = a.sequence_parallel;
  cfg.pp = a.pp;
  cfg.pp_schedule = sat::parse_pipe_schedule(a.pp_schedule);
  cfg.virtual_stages = a.virtual_stages;
  cfg.pp_split = parse_int_list("--pp-split", a.pp_split);
  cfg.recompute = sat::parse_recompute(a.recompute);
}

// Every check of the layout that needs no communication: the world size from the
// launcher's environment, the schedule, and the model's blocks. Run before MPI starts, so
// that every rank prints the same one-line error and exits with status 2 (no rank can
// hang waiting for another).
void validate_layout(const sat::ModelConfig& mc, const sat::TrainConfig& cfg, bool noise_scale) {
  // The model's own limits first: no number of processes can fix them.
  sat::check_tensor_parallel(mc, cfg.tp, cfg.sequence_parallel);
  sat::ModelConfig rc = mc;
  rc.recompute = cfg.recompute;
  sat::check_recompute(rc);
  const int world = sat::dist::detect_process().world;
  sat::dist::Mesh::check(world, cfg.tp, cfg.pp);
  sat::check_pipeline(cfg);
  sat::TrainConfig z = cfg;
  z.measure_noise = noise_scale;
  sat::check_zero(z, false, world / (cfg.tp * cfg.pp));
  SAT_CHECK(!noise_scale || !cfg.sequence_parallel, "--noise-scale with --sequence-parallel: the LayerNorm gradients "
            "are partial sums before the reduction, so the first micro-batch's norm is not measured yet; measure it "
            "without --sequence-parallel");
  if (cfg.pp == 1) return;
  const sat::BuiltModel whole = sat::build_model(mc, cfg.batch, true);
  const sat::StageSplit split = sat::split_model(*whole.graph, cfg, mc.name);
  if (!noise_scale) return;
  const sat::BuiltModel first = sat::build_model(mc, cfg.batch, true, split.nodes_of(*whole.graph, 0));
  SAT_CHECK(first.graph->tied_remote().empty(), "--noise-scale with --pp: the weights ", mc.name,
            " ties across stages (its embedding and output head) are not measured yet; measure the noise scale "
            "without --pp");
}

int64_t parse_batch(const std::string& v) {
  char* end = nullptr;
  errno = 0;
  const long long b = std::strtoll(v.c_str(), &end, 10);
  SAT_CHECK(!v.empty() && end && *end == 0 && errno == 0 && b >= 1 && b <= kMaxBatch,
            "--batch: expected a micro-batch size from 1 to ", kMaxBatch, " or 'auto', got '", v, "'");
  return b;
}

sat::TuneConfig tune_config(const TrainArgs& a) {
  sat::TuneConfig t;
  if (!a.memory_budget.empty()) t.memory_budget = parse_bytes("--memory-budget", a.memory_budget);
  SAT_CHECK(a.global_batch >= 0, "--global-batch: expected a positive number, got ", a.global_batch);
  t.global_batch = a.global_batch;
  t.objective = a.objective;
  t.knee = a.knee;
  SAT_CHECK(a.lr_batch >= 1, "--lr-batch: expected a positive batch size, got ", a.lr_batch);
  t.lr_batch = a.lr_batch;
  return t;
}

// Writes DIR/tune.json and DIR/tune.html (atomically: a failed run keeps the old ones).
void write_tune_files(const std::string& dir, const std::string& json, const std::string& html) {
  sat::check_output_dir("--out", dir);
  for (auto [name, text] : {std::pair{"tune.json", json}, std::pair{"tune.html", html}})
    sat::write_file_atomic("--out", dir + "/" + name, text);
}

// The cache of `--batch auto`: one directory (tune.json, tune.html) per model, data,
// device, precision, ranks, budget and tuning settings, under
// $XDG_CACHE_HOME/saturate/tune (~/.cache by default).
std::string tune_cache_dir(const std::string& key) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg && *xdg ? xdg : std::string(home && *home ? home : "/tmp") + "/.cache";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return base + "/saturate/tune/" + hex;
}

// A window other than the context is another tuning problem; without --seq-len the key
// (and so every existing cache entry) stays as it was.
std::string seq_len_key(const TrainArgs& a) { return a.seq_len > 0 ? sat::str_cat("|seq_len ", a.seq_len) : ""; }

// A cached report goes with this run's output too (best effort: the cache is only a copy).
void copy_tune_files(const std::filesystem::path& from, const std::string& to) {
  try {
    std::string text[2];
    const char* names[2] = {"tune.json", "tune.html"};
    for (int i = 0; i < 2; ++i) {
      std::ifstream f(from / names[i], std::ios::binary);
      if (!f) return;
      text[i].assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
    write_tune_files(to, text[0], text[1]);
  } catch (const sat::Error& e) {
    std::fprintf(stderr, "tune: could not copy the cached report to --out (%s); carrying on\n", e.what());
  }
}

// Rank 0: the layout tuning's table, and its report in the cache and in --out.
void report_layout_tuning(const TrainArgs& a, const sat::LayoutTuneResult& r, const std::filesystem::path& cache) {
  std::printf("%s", sat::layout_tune_text(r).c_str());
  const std::string json = sat::layout_tune_json(r), html = sat::layout_tune_html(r);
  try {
    write_tune_files(cache.string(), json, html);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "layout auto: could not cache the result (%s); carrying on\n", e.what());
  }
  if (a.out.empty()) return;
  write_tune_files(a.out, json, html);
  std::printf("layout auto: report in %s/tune.html, every measurement in %s/tune.json\n", a.out.c_str(), a.out.c_str());
}

// --batch auto (and saturate tune): tune, or take the cached choice, and put it in cfg
// (micro-batch, accumulation, learning rate and its warm-up). Returns false for saturate
// tune, which ends after printing the choice.
bool apply_tuning(const TrainArgs& a, bool tune_only, const sat::ModelConfig& mc, const sat::DataSplit& data,
                  const sat::TuneConfig& tcfg, sat::dist::Comm& comm, sat::TrainConfig& cfg) {
  const bool lead = comm.rank() == 0;
  const int world = comm.size();
  SAT_CHECK(a.accum == 1, "--accum: with --batch auto the tuner chooses the accumulation (use --global-batch)");
  sat::TuneResult tr;
  bool cached = false;
  const std::string key = sat::str_cat(mc.name, "|", data.description, "|", a.device, "|", a.precision, "|", world,
                                       "|", a.memory_budget, "|", a.global_batch, "|", a.objective, "|", a.knee, "|",
                                       a.lr_batch, "|", cfg.optim.name, "|", cfg.optim.lr, "|", a.zero, "|", a.eval, "|",
                                       sat::cpu::num_threads(),
                                       a.recompute == "none" ? "" : "|recompute " + a.recompute, seq_len_key(a));
  const std::filesystem::path cache = tune_cache_dir(key);
  if (!tune_only) {
    // Rank 0 reads the cache (input like any other: sat::read_tune_choice refuses what
    // is damaged) and tells the others whether to tune.
    double hit[6] = {0, 0, 0, 0, 0, 0};
    if (lead && std::filesystem::exists(cache / "tune.json")) {
      try {
        tr.choice = sat::read_tune_choice((cache / "tune.json").string(), kMaxBatch, world);
        hit[0] = 1;
        hit[1] = double(tr.choice.micro_batch);
        hit[2] = double(tr.choice.accum);
        hit[3] = double(tr.choice.lr);
        hit[4] = double(tr.choice.zero);
        hit[5] = double(tr.choice.recompute);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tune: ignoring the cached choice (%s); tuning again\n", e.what());
      }
    }
    comm.broadcast_sync(hit, 6, sat::DType::f64, 0);
    if (hit[0] > 0) {
      cached = true;
      tr.choice.micro_batch = int64_t(hit[1]);
      tr.choice.accum = int64_t(hit[2]);
      tr.choice.lr = float(hit[3]);
      tr.choice.zero = int(hit[4]);
      tr.choice.recompute = sat::Recompute(int(hit[5]));
      tr.choice.global_batch = tr.choice.micro_batch * tr.choice.accum * world;
      if (lead) {
        std::fprintf(stderr, "tune: using the cached choice in %s (delete it to tune again)\n",
                     (cache / "tune.json").c_str());
        // The report of the cached tuning goes with this run's output too.
        if (!a.out.empty()) copy_tune_files(cache, a.out);
      }
    }
  }
  if (!cached) {
    sat::TrainConfig base = cfg;
    base.measure_noise = a.noise_scale;  // the tuner leaves out the levers that cannot measure it
    sat::TuneConfig t = tcfg;
    t.progress = lead ? 1 : 0;
    if (sat::resolve_device(a.device) == sat::Device::cpu) {
      // The cost model predicts the throughput curve; the tuner measures to confirm it.
      if (lead) std::fprintf(stderr, "tune: measuring this machine for the cost model (GEMM, memory, links)\n");
      t.predicted_samples_per_second = sat::throughput_curve(mc, base, world, sat::hardware("this", &comm),
                                                             t.global_batch);
    }
    tr = sat::tune(mc, base, *data.train, a.eval == "on" ? data.test.get() : nullptr, t);
    if (lead) {
      try {
        write_tune_files(cache.string(), sat::tune_json(tr), sat::tune_html(tr));
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tune: could not cache the result (%s); carrying on\n", e.what());
      }
      if (!a.out.empty()) write_tune_files(a.out, sat::tune_json(tr), sat::tune_html(tr));
    }
  }
  const auto& ch = tr.choice;
  if (lead) {
    const std::string lever = ch.zero ? ", with ZeRO-" + std::to_string(ch.zero)
                              : ch.recompute != sat::Recompute::none
                                  ? std::string(", with --recompute ") + sat::recompute_name(ch.recompute)
                                  : "";
    std::printf("tune: micro-batch %lld x %lld accumulation x %d rank(s) = global batch %lld%s, lr %.4g (%s from %g at "
                "batch %lld)\ntune: %s\n",
                (long long)ch.micro_batch, (long long)ch.accum, world, (long long)ch.global_batch, lever.c_str(),
                double(ch.lr), ch.lr_rule.c_str(), double(cfg.optim.lr), (long long)a.lr_batch, ch.reason.c_str());
    if (!a.out.empty() && std::filesystem::exists(a.out + "/tune.html"))
      std::printf("tune: report in %s/tune.html, every measurement in %s/tune.json\n", a.out.c_str(), a.out.c_str());
    std::fflush(stdout);
  }
  if (tune_only) return false;
  cfg.batch = ch.micro_batch;
  cfg.accum = ch.accum;
  cfg.optim.lr = ch.lr;
  if (ch.zero || ch.recompute != sat::Recompute::none) {  // a lever the tuner chose
    cfg.zero = ch.zero;
    cfg.recompute = ch.recompute;
  }
  if (ch.warmup_fraction > 0) {
    const int64_t per_epoch = data.train->size() / ch.global_batch;
    const int64_t total = a.steps > 0 ? a.steps : a.epochs * per_epoch;
    cfg.schedule.warmup = std::max<int64_t>(a.warmup, int64_t(std::ceil(ch.warmup_fraction * double(total))));
  }
  if (a.noise_scale && cfg.accum == 1 && cfg.batch % 2 == 0) {
    // The estimator needs two micro-batches per step: the same global batch as halves.
    cfg.batch /= 2;
    cfg.accum = 2;
    if (lead)
      std::fprintf(stderr, "--noise-scale: training runs micro-batch %lld x 2 accumulation (the same global batch) "
                   "to measure it\n", (long long)cfg.batch);
  }
  return true;
}

// A layout flag given beside --layout fixes that field of the search; one that --layout
// fixes too must agree with it.
template <typename T>
void fix_field(std::optional<T>& field, bool given, T value, const std::string& flag, const std::string& shown) {
  if (!given) return;
  SAT_CHECK(!field || *field == value, flag, " disagrees with --layout's ", shown, " (give the field once)");
  field = value;
}

// --layout auto|FIELDS with the fields the layout flags fix.
sat::LayoutFilter layout_filter(const TrainArgs& a) {
  auto given = [&](const char* flag) { return std::count(a.given.begin(), a.given.end(), flag) > 0; };
  sat::LayoutFilter f = a.layout == "auto" ? sat::LayoutFilter{} : sat::parse_layout(a.layout);
  for (const char* flag : {"--accum", "--pp-split", "--noise-scale"})
    SAT_CHECK(!given(flag), flag, ": not with --layout, which chooses the accumulation (--global-batch / (micro-batch x "
              "dp)) and the pipeline's cut; fix the micro-batch with --batch N or --layout micro=N");
  fix_field(f.tp, given("--tp"), a.tp, "--tp " + std::to_string(a.tp), "tp=" + std::to_string(f.tp.value_or(0)));
  fix_field(f.pp, given("--pp"), a.pp, "--pp " + std::to_string(a.pp), "pp=" + std::to_string(f.pp.value_or(0)));
  fix_field(f.zero, given("--zero"), a.zero, "--zero " + std::to_string(a.zero), "zero=" + std::to_string(f.zero.value_or(0)));
  fix_field(f.v, given("--virtual-stages"), a.virtual_stages, "--virtual-stages " + std::to_string(a.virtual_stages),
            "v=" + std::to_string(f.v.value_or(0)));
  fix_field(f.sp, given("--sequence-parallel"), true, "--sequence-parallel", "sp=off");
  fix_field(f.recompute, given("--recompute"), sat::parse_recompute(a.recompute), "--recompute " + a.recompute,
            std::string("recompute=") + sat::recompute_name(f.recompute.value_or(sat::Recompute::none)));
  fix_field(f.schedule, given("--pp-schedule"), sat::parse_pipe_schedule(a.pp_schedule), "--pp-schedule " + a.pp_schedule,
            std::string("schedule=") + sat::pipe_schedule_name(f.schedule.value_or(sat::PipeSchedule::one_f_one_b)));
  if (given("--batch") && a.batch != "auto")
    fix_field(f.micro, true, parse_batch(a.batch), "--batch " + a.batch, "micro=" + std::to_string(f.micro.value_or(0)));
  return f;
}

// --layout and its options, checked before MPI starts (every rank exits with status 2 alike).
sat::LayoutTuneConfig layout_tune_config(const TrainArgs& a) {
  sat::LayoutTuneConfig t;
  t.filter = layout_filter(a);
  SAT_CHECK(a.global_batch >= 1, "--layout auto needs --global-batch (the samples per optimizer step the layouts share)");
  SAT_CHECK(a.layout_candidates >= 1, "--layout-candidates: expected a positive number of layouts, got ",
            a.layout_candidates);
  t.candidates = a.layout_candidates;
  t.global_batch = a.global_batch;
  if (!a.memory_budget.empty()) t.memory_budget = parse_bytes("--memory-budget", a.memory_budget);
  return t;
}

// The cache of `train --layout`: the layout tuning's tune.json and tune.html, keyed by
// everything it depends on (as --batch auto's).
std::filesystem::path layout_cache(const TrainArgs& a, const sat::ModelConfig& mc, const sat::DataSplit& data,
                                   const sat::LayoutTuneConfig& t, const sat::TrainConfig& cfg, int world) {
  return tune_cache_dir(sat::str_cat("layout|", mc.name, "|", data.description, "|", world, "|", a.memory_budget, "|",
                                     t.global_batch, "|", sat::filter_str(t.filter), "|", t.candidates, "|",
                                     cfg.optim.name, "|", cfg.optim.momentum, "|", sat::cpu::num_threads(), seq_len_key(a)));
}

// --layout (train and tune): the planner's best layouts for these ranks, timed, or train's
// cached choice; the chosen one goes into cfg. Returns false for saturate tune, which ends
// after printing it.
bool apply_layout_tuning(const TrainArgs& a, bool tune_only, const sat::ModelConfig& mc, const sat::DataSplit& data,
                         sat::LayoutTuneConfig t, sat::dist::Comm& comm, sat::TrainConfig& cfg) {
  const bool lead = comm.rank() == 0;
  const std::filesystem::path cache = layout_cache(a, mc, data, t, cfg, comm.size());
  sat::Layout l;
  double measured = 0, predicted = 0;
  const bool cached = !tune_only && sat::shared_layout_choice(&comm, (cache / "tune.json").string(), l, measured, predicted);
  if (cached && lead) {
    std::fprintf(stderr, "layout auto: using the cached choice in %s (delete it to tune again)\n",
                 (cache / "tune.json").c_str());
    if (!a.out.empty()) copy_tune_files(cache, a.out);
  }
  if (!cached) {
    t.progress = lead ? 1 : 0;
    const sat::LayoutTuneResult r =
        sat::tune_layout(mc, cfg, *data.train, a.eval == "on" ? data.test.get() : nullptr, t);
    l = r.choice().predicted.layout;
    measured = r.choice().measured_samples_per_second;
    predicted = r.choice().predicted.samples_per_second;
    if (lead) report_layout_tuning(a, r, cache);
  }
  if (lead) std::printf("layout auto: %s\n", sat::layout_choice_line(l, measured, predicted).c_str());
  std::fflush(stdout);
  if (tune_only) return false;
  sat::apply_layout(l, cfg);
  return true;
}

// micro-batch x accumulation x data-parallel ranks: the samples of a step, computed without
// overflow and at most 2^40 (each factor is range-checked already; their product is not).
void check_global_batch(const sat::TrainConfig& cfg, int world) {
  const int64_t dp = std::max(1, world / std::max(1, cfg.tp * cfg.pp));
  int64_t g = 0;
  const bool overflow = __builtin_mul_overflow(cfg.batch, cfg.accum, &g) || __builtin_mul_overflow(g, dp, &g);
  SAT_CHECK(!overflow && g <= (int64_t(1) << 40), "--batch ", cfg.batch, " x --accum ", cfg.accum, " x ", dp,
            " data-parallel rank(s): more than 2^40 samples per optimizer step");
}

// Every output of train and tune, before anything is read or trained (on every rank alike):
// a target that exists and is not a regular file, or a directory that cannot be created or
// written, is refused; and a directory holding another run's results is not written over
// without --overwrite (metrics.jsonl would be truncated at the first step).
void check_train_outputs(const TrainArgs& a, bool tune_only) {
  if (!a.save_weights.empty()) sat::check_output_file("--save-weights", a.save_weights);
  if (!a.trace.empty()) sat::check_output_dir("--trace", a.trace);
  if (a.out.empty()) return;
  sat::check_output_dir("--out", a.out);
  const std::vector<std::string> files = tune_only ? std::vector<std::string>{"tune.json", "tune.html"}
                                                   : std::vector<std::string>{"metrics.jsonl", "summary.json",
                                                                              "tune.json", "tune.html"};
  for (const std::string& f : files) sat::check_output_file("--out", a.out + "/" + f);
  if (!a.trace.empty() && !tune_only) sat::check_output_file("--out", a.out + "/report.html");
  // --resume goes on with the same run: its metrics.jsonl is kept up to the checkpoint's step.
  if (tune_only || a.overwrite || !a.resume.empty()) return;
  for (const char* f : {"metrics.jsonl", "summary.json"})
    SAT_CHECK(!std::filesystem::exists(std::filesystem::path(a.out) / f), "--out: ", a.out,
              " already holds the results of another run (", f, "): give a new directory, or --overwrite to replace them");
}

// --profile (rank 0): its layers, slowest first, against this machine's GEMM rate, and
// where every rank's step time goes.
void print_profile(const sat::Trainer& trainer, const sat::TrainResult& r) {
  std::fprintf(stderr, "%s", trainer.profile_table(sat::gemm_peak_flops()).c_str());
  std::fprintf(stderr, "\nwhere the step time goes (ms per measured step; tp comm: the tensor-parallel layers' "
               "collectives):\n%4s %5s %9s %8s %9s %14s %7s %10s %7s %9s\n", "rank", "stage", "compute", "tp comm",
               "grad sync", "pipeline wait", "data", "optimizer", "other", "step");
  for (const sat::RankReport& k : r.ranks) {
    const sat::StepBreakdown& b = k.breakdown;
    std::fprintf(stderr, "%4d %5d %9.3f %8.3f %9.3f %14.3f %7.3f %10.3f %7.3f %9.3f\n", k.rank, k.stage, 1e3 * b.compute,
                 1e3 * b.tp_comm, 1e3 * b.grad_sync, 1e3 * b.pipeline_wait, 1e3 * b.data, 1e3 * b.optimizer,
                 1e3 * b.other, 1e3 * k.step_seconds);
  }
}

void print_traces(const TrainArgs& a, const sat::Trainer& trainer) {
  const auto files = trainer.trace_files();
  std::fprintf(stderr, "trace: rank 0 wrote %zu file(s) in %s (every rank writes its own); open them in Perfetto "
               "(https://ui.perfetto.dev) or TensorBoard (tensorboard --logdir %s)\n", files.size(), a.trace.c_str(),
               a.trace.c_str());
}

int run_train(const TrainArgs& a, bool tune_only = false) {
  const double t0 = sat::now_seconds();
  SAT_CHECK(a.threads >= 0, "--threads: expected 0 (all cores) or a positive number, got ", a.threads);
  sat::cpu::set_num_threads(a.threads);
  sat::ModelConfig mc = model_for(a);
  SAT_CHECK(a.shuffle == "on" || a.shuffle == "off", "--shuffle: expected on or off, got '", a.shuffle, "'");
  SAT_CHECK(a.eval == "on" || a.eval == "off", "--eval: expected on or off, got '", a.eval, "'");
  if (!a.init_weights.empty())
    SAT_CHECK(std::filesystem::exists(a.init_weights), "--init-weights: ", a.init_weights, " does not exist");
  check_checkpoint_flags(a);
  check_train_outputs(a, tune_only);

  sat::DataOptions dopt = sat::data_options_for(mc, a.seed);
  if (!a.normalize.empty()) sat::parse_normalize(a.normalize, dopt);
  sat::DataSplit data = sat::open_dataset(a.data, dopt);
  // Image data of another shape (synthetic:CxHxW, CIFAR...) sets the model's input (an
  // mlp's input width must match it).
  sat::fit_to_data(mc, *data.train);

  sat::TrainConfig cfg;
  const bool auto_layout = !a.layout.empty();
  const sat::LayoutTuneConfig lcfg = auto_layout ? layout_tune_config(a) : sat::LayoutTuneConfig{};
  const bool auto_batch = !auto_layout && (tune_only || a.batch == "auto");
  cfg.batch = auto_batch || auto_layout ? 1 : parse_batch(a.batch);
  SAT_CHECK(auto_batch || auto_layout || a.global_batch == 0,
            "--global-batch needs --batch auto or --layout (or saturate tune)");
  cfg.accum = a.accum;
  cfg.epochs = a.epochs;
  cfg.steps = a.steps;
  cfg.optim.name = a.optimizer;
  cfg.optim.lr = float(std::isnan(a.lr) ? (a.optimizer == "adamw" ? 1e-3 : 0.01) : a.lr);
  cfg.optim.momentum = float(a.momentum);
  cfg.optim.nesterov = a.nesterov;
  SAT_CHECK(std::isnan(a.weight_decay) || a.weight_decay >= 0, "--weight-decay: expected a number >= 0, got ", a.weight_decay);
  cfg.optim.weight_decay = std::isnan(a.weight_decay) ? -1.0f : float(a.weight_decay);  // < 0: PyTorch's default
  cfg.schedule.name = a.schedule;
  const bool auto_warmup = a.warmup == kWarmupNotGiven;
  SAT_CHECK(auto_warmup || a.warmup >= 0, "--warmup: expected a number of steps >= 0, got ", a.warmup);
  cfg.schedule.warmup = auto_warmup ? 0 : a.warmup;
  cfg.schedule.warmup_fraction = auto_warmup ? kDefaultWarmupFraction : 0;
  cfg.schedule.step_size = a.step_size;
  cfg.schedule.gamma = float(a.gamma);
  cfg.seed = a.seed;
  cfg.shuffle = a.shuffle == "on";
  cfg.evaluate = a.eval == "on";
  cfg.out_dir = a.out;
  cfg.profile = a.profile;
  cfg.trace_dir = a.trace;
  if (!a.trace_steps.empty()) {
    SAT_CHECK(!a.trace.empty(), "--trace-steps needs --trace DIR (where the traces go)");
    cfg.trace_steps = sat::parse_trace_schedule(a.trace_steps);
  }
  cfg.device = a.device;
  cfg.precision = sat::parse_precision(a.precision);
  SAT_CHECK(a.cuda_graph == "on" || a.cuda_graph == "off", "--cuda-graph: expected on or off, got '", a.cuda_graph, "'");
  cfg.cuda_graph = a.cuda_graph == "on";
  SAT_CHECK(a.last_batch == "drop" || a.last_batch == "pad", "--last-batch: expected drop or pad, got '", a.last_batch, "'");
  cfg.last_batch = a.last_batch == "pad" ? sat::LastBatch::pad : sat::LastBatch::drop;
  cfg.bucket_mb = a.bucket_mb;
  cfg.dist_backend = sat::parse_dist_backend(a.dist_backend);
  cfg.sync_bn = a.sync_bn;
  cfg.zero = a.zero;
  cfg.checkpoint_dir = a.checkpoint_dir;
  cfg.checkpoint_every = a.checkpoint_every;
  cfg.checkpoint_every_minutes = a.checkpoint_every_minutes;
  cfg.checkpoint_keep = a.keep;
  if (!a.checkpoint_dir.empty()) sat::install_stop_signals();
  layout_into(a, cfg);
  SAT_CHECK(!auto_batch || (cfg.pp == 1 && cfg.tp == 1), "--batch auto and saturate tune choose the batch of a "
            "data-parallel layout: with --pp or --tp give --batch (and --accum) yourself, or use --layout auto");
  if (!auto_layout) validate_layout(mc, cfg, a.noise_scale);  // --layout: the planner forms valid layouts only
  // Each rank's communication thread spins inside OpenMPI while a reduction waits for a
  // peer; when the ranks' compute threads fill every core of the node, that steals a core
  // from backward. Ask OpenMPI to yield instead (as saturate launch does), unless the user
  // chose; it is read when MPI starts, just below.
  const sat::dist::ProcessInfo pi = sat::dist::detect_process();
  if (pi.distributed() && int64_t(pi.local_world) * sat::cpu::num_threads() >= int64_t(std::thread::hardware_concurrency()))
    setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
  // Under mpirun/srun: one communicator for the job; only rank 0 prints and writes.
  std::unique_ptr<sat::dist::Comm> comm = sat::dist::make_world_comm();
  cfg.comm = comm.get();
  const bool lead = comm->rank() == 0;
  const int world = comm->size();
  if (!lead) {
    cfg.progress = 0;
    cfg.out_dir.clear();
  }

  SAT_CHECK(a.init_weights.empty() || a.device == "cpu" || sat::resolve_device(a.device) == sat::Device::cpu,
            "--init-weights with --device cuda is not supported yet: load on the CPU (--device cpu)");
  if (lead) std::fprintf(stderr, "saturate %s: %s on %s\n", tune_only ? "tune" : "train", mc.name.c_str(), data.description.c_str());
  if (lead && sat::resolve_device(a.device) == sat::Device::cuda)
    std::fprintf(stderr, "note: saturate's CUDA path (engine, executor, NCCL) compiles but has not yet been verified on "
                 "a GPU; compare with --device cpu and report what differs\n");
  const sat::TuneConfig tcfg = tune_config(a);
  if (auto_batch && !apply_tuning(a, tune_only, mc, data, tcfg, *comm, cfg)) return 0;
  if (auto_layout && !apply_layout_tuning(a, tune_only, mc, data, lcfg, *comm, cfg)) return 0;
  SAT_CHECK(!a.noise_scale || cfg.accum >= 2, "--noise-scale needs --accum 2 or more: the estimator compares one "
            "micro-batch's gradient with the whole step's (e.g. --batch ", std::max<int64_t>(1, cfg.batch / 2),
            " --accum 2 instead of --batch ", cfg.batch, ")");
  cfg.measure_noise = a.noise_scale;
  check_global_batch(cfg, world);
  if (tcfg.memory_budget) {
    // This rank's stage of the pipeline (global rank = tp rank + tp * (dp rank + dp * stage)).
    const int stage = comm->rank() / std::max(1, world / cfg.pp);
    const sat::MemoryPlan pl =
        sat::Trainer::plan(mc, cfg, *data.train, cfg.evaluate ? data.test.get() : nullptr, world, stage);
    const size_t need = pl.device ? pl.device : pl.total();
    SAT_CHECK(need <= tcfg.memory_budget, "--memory-budget: micro-batch ", cfg.batch, " needs ",
              sat::format_bytes(double(need)), " per rank, more than the budget of ",
              sat::format_bytes(double(tcfg.memory_budget)), ": use a smaller --batch, or --batch auto");
    // Host buffers that exist before training (none of the plan's) do not count.
    const sat::Device dev = sat::resolve_device(a.device);
    sat::device_mem_set_budget(dev, tcfg.memory_budget + (dev == sat::Device::cpu ? sat::mem_stats().current : 0));
  }
  sat::Trainer trainer(mc, cfg, *data.train, data.test.get());
  if (!a.init_weights.empty()) trainer.load_weights(a.init_weights);
  if (const std::string from = resume_from(a, lead); !from.empty()) trainer.resume(from);
  const auto& plan = trainer.memory_plan();
  const sat::RankPlan& rp = trainer.rank_plan();
  if (lead) {
    std::fprintf(stderr, "%lld parameters, micro-batch %lld x %lld accumulation x %d rank(s), %d threads, predicted memory %s%s\n",
                 (long long)rp.model_parameters, (long long)cfg.batch, (long long)cfg.accum, world,
                 sat::cpu::num_threads(), sat::format_bytes(double(plan.device ? plan.device : plan.total())).c_str(),
                 cfg.pp > 1 ? " (stage 0)" : "");
    if (cfg.pp > 1)
      std::fprintf(stderr, "layout: %s; %s schedule, stages %s\n", trainer.mesh().describe().c_str(),
                   sat::pipe_schedule_name(cfg.pp_schedule), rp.split.describe(*sat::build_model(mc, 1).graph).c_str());
    else if (cfg.tp > 1)
      std::fprintf(stderr, "layout: %s; tensor parallel%s\n", trainer.mesh().describe().c_str(),
                   cfg.sequence_parallel ? " with sequence parallelism" : "");
  }
  sat::TrainResult r = trainer.run();
  if (r.stop_signal) {  // preempted: the checkpoint is what counts; nothing else is overwritten
    if (lead)
      std::fprintf(stderr, "stopped by signal %d after step %lld: checkpoint %s; the same command with --resume auto "
                   "goes on from there\n", r.stop_signal, (long long)r.steps, r.last_checkpoint.c_str());
    return sat::stop_exit_status(r.stop_signal);
  }
  if (!a.save_weights.empty()) {
    trainer.save_weights(a.save_weights);  // gathers the stages on rank 0
    if (lead) std::fprintf(stderr, "saved weights to %s\n", a.save_weights.c_str());
  }
  if (!lead) return 0;
  if (a.profile) print_profile(trainer, r);
  if (!a.trace.empty()) print_traces(a, trainer);

  const int64_t gb = r.global_batch;
  std::printf("final train loss %.4f", r.final_train_loss);
  if (r.test) {
    std::printf(", test loss %.4f", r.test->loss);
    if (r.test->accuracy >= 0) std::printf(", test accuracy %.2f%% (%lld samples)", 100 * r.test->accuracy, (long long)r.test->samples);
  }
  std::printf("\n%.1f samples/s (%lld warm-up steps excluded), memory predicted %s, peak %s%s\n", r.samples_per_second,
              (long long)r.warmup_excluded, sat::format_bytes(double(r.predicted_memory_bytes)).c_str(),
              sat::format_bytes(double(r.peak_memory_bytes)).c_str(), cfg.pp > 1 ? " (rank 0)" : "");
  if (cfg.pp > 1 && cfg.accum == 1)
    std::printf("model parallelism: %d stages, one micro-batch at a time: measured bubble %.1f%% (theory (P-1)/P = "
                "%.1f%%; --accum M pipelines M micro-batches)\n", cfg.pp, 100 * r.bubble_fraction,
                100 * sat::theoretical_bubble(rp.schedule));
  else if (cfg.pp > 1)
    std::printf("pipeline: %d stages, %s, %lld micro-batches per step: measured bubble %.1f%% (theory %.1f%%)\n", cfg.pp,
                sat::pipe_schedule_name(cfg.pp_schedule), (long long)cfg.accum, 100 * r.bubble_fraction,
                100 * sat::theoretical_bubble(rp.schedule));
  if (cfg.measure_noise) {
    const sat::NoiseInterval& iv = r.noise_interval;
    char interval[64];
    std::snprintf(interval, sizeof interval, "95%% interval %.4g to %.4g", iv.low, iv.high);
    const std::string how = iv.measurable ? std::string(interval) : "no interval yet: " + iv.reason;
    if (r.noise_scale > 0 && iv.measurable)
      std::printf("gradient noise scale %.4g at the end (smoothed over %zu steps; %s): this run's global batch %lld is "
                  "%.3gx it\n", r.noise_scale, r.grad_norms.size(), how.c_str(), (long long)gb,
                  double(gb) / r.noise_scale);
    else if (r.noise_scale > 0)
      std::printf("gradient noise scale: not measurable yet: %s (the smoothed estimate is %.4g over %zu steps, "
                  "but its interval says nothing)\n", iv.reason.c_str(), r.noise_scale, r.grad_norms.size());
    else
      std::printf("gradient noise scale: not measurable yet: %s\n",
                  iv.reason.empty() ? "the estimates of |G|^2 and tr(Sigma) are not both positive" : iv.reason.c_str());
  }
  if (!a.out.empty()) {
    sat::RunInfo info;
    info.model = mc.name;
    info.data = data.description;
    info.schedule_name = a.schedule;
    info.parameters = rp.model_parameters;
    info.threads = sat::cpu::num_threads();
    info.tokens = mc.tokens;
    info.seq_len = mc.seq_len;
    info.flops_per_sample = rp.model_flops_per_sample;
    info.seed = a.seed;
    info.wall_seconds = sat::now_seconds() - t0;
    info.memory_budget = double(tcfg.memory_budget);
    sat::write_json_atomic(a.out + "/summary.json", sat::run_summary(info, cfg, r, plan));
    std::fprintf(stderr, "wrote %s/summary.json and %s/metrics.jsonl\n", a.out.c_str(), a.out.c_str());
    if (!a.trace.empty()) std::fprintf(stderr, "wrote %s (saturate report)\n", sat::write_run_report(a.out).c_str());
  }
  return 0;
}

struct InfoArgs {
  std::string model = "mlp", optimizer = "adamw", pp_schedule = "1f1b", pp_split, precision = "fp32";
  int64_t batch = 64, vocab = 0, accum = 1, seq_len = 0;
  double momentum = 0;
  int ranks = 1, zero = 0, pp = 1, virtual_stages = 1, tp = 1;
  bool sequence_parallel = false;
  std::string recompute = "none";
};

void print_plan(const sat::MemoryPlan& p) {
  for (int k = 0; k < int(sat::MemKind::kCount); ++k)
    if (p.by_kind[size_t(k)])
      std::printf("  %-30s %12zu  %s\n", sat::mem_kind_name(sat::MemKind(k)), p.by_kind[size_t(k)],
                  sat::format_bytes(double(p.by_kind[size_t(k)])).c_str());
  std::printf("  %-30s %12zu  %s  (transient kinds above share it by lifetime)\n", "step arena", p.transient,
              sat::format_bytes(double(p.transient)).c_str());
  if (p.staging)
    std::printf("  %-30s %12zu  %s  (ZeRO: gathered parameters and gradient buckets, by lifetime)\n", "staging arena",
                p.staging, sat::format_bytes(double(p.staging)).c_str());
  std::printf("  %-30s %12zu  %s\n", "total", p.total(), sat::format_bytes(double(p.total())).c_str());
}

// The bytes a rank moves over each group per optimizer step (predict_comm).
void print_comm(const sat::RankPlan& rp, const sat::TrainConfig& cfg, int dp) {
  const sat::GroupBytes b = sat::predict_comm(rp, cfg, dp);
  if (b.tp + b.dp + b.pp + b.embedding == 0) return;
  std::printf("  %-30s tp %s, dp %s, pp %s, embedding %s\n", "communicated per step", sat::format_bytes(b.tp).c_str(),
              sat::format_bytes(b.dp).c_str(), sat::format_bytes(b.pp).c_str(), sat::format_bytes(b.embedding).c_str());
}

// With --pp: every stage's part of the model and its plan (the plan its ranks train with).
void print_stages(const sat::ModelConfig& mc, const sat::TrainConfig& cfg, const sat::DataSplit& data, int dp) {
  std::printf("pipeline    %d stages, %s schedule%s, %lld micro-batches per step: bubble (P-1)/(%sM+P-1) = %.1f%%\n",
              cfg.pp, sat::pipe_schedule_name(cfg.pp_schedule),
              cfg.virtual_stages > 1 ? (", " + std::to_string(cfg.virtual_stages) + " model chunks per stage").c_str() : "",
              (long long)cfg.accum, cfg.virtual_stages > 1 ? "V" : "",
              100 * sat::theoretical_bubble({cfg.pp_schedule, cfg.pp, int(cfg.accum), cfg.virtual_stages}));
  for (int s = 0; s < cfg.pp; ++s) {
    const sat::RankPlan rp = sat::plan_rank(mc, cfg, *data.train, data.test.get(), s, dp);
    const sat::Graph& g = *rp.model.graph;
    std::string blocks;
    for (int c = 0; c < cfg.virtual_stages; ++c) {
      const int k = c * cfg.pp + s;
      blocks += sat::str_cat(c ? ", " : "", rp.split.cuts[size_t(k)], "-", rp.split.cuts[size_t(k) + 1] - 1);
    }
    std::printf("stage %d     blocks %s of %d: %zu layers, %lld parameters%s, %.4g FLOPs per sample; %d micro-batch(es) "
                "in flight\n", s, blocks.c_str(), rp.split.blocks, g.nodes().size(), (long long)g.param_count(),
                g.tied_copies().empty() ? "" : " (with a copy of the tied embedding)", rp.flops_per_sample,
                rp.memory.contexts);
    print_plan(rp.memory);
    print_comm(rp, cfg, dp);
  }
}

// What the ZeRO stage saves against plain data parallelism, per rank (stage 0 of a pipeline).
void print_zero_saving(const sat::ModelConfig& mc, const sat::TrainConfig& cfg, const sat::DataSplit& data, int world,
                       const sat::MemoryPlan& p) {
  sat::TrainConfig plain = cfg;
  plain.zero = 0;
  const sat::MemoryPlan w = sat::Trainer::plan(mc, plain, *data.train, data.test.get(), world);
  auto kind = [](const sat::MemoryPlan& m, sat::MemKind k) { return sat::format_bytes(double(m.by_kind[size_t(k)])); };
  const double saved = double(w.total()) - double(p.total());
  std::printf("ZeRO-%d saves %s per rank (%.1f%% of %s): parameters %s (was %s), gradients %s (was %s), optimizer "
              "state %s (was %s)",
              cfg.zero, sat::format_bytes(saved).c_str(), 100.0 * saved / double(w.total()),
              sat::format_bytes(double(w.total())).c_str(), kind(p, sat::MemKind::parameters).c_str(),
              kind(w, sat::MemKind::parameters).c_str(), kind(p, sat::MemKind::gradients).c_str(),
              kind(w, sat::MemKind::gradients).c_str(), kind(p, sat::MemKind::optimizer_state).c_str(),
              kind(w, sat::MemKind::optimizer_state).c_str());
  if (cfg.zero >= 2)
    std::printf(", plus a staging arena of %s for gathered parameters and gradient buckets",
                sat::format_bytes(double(p.staging)).c_str());
  std::printf("\n");
}

int run_info(const InfoArgs& ia) {
  SAT_CHECK(ia.ranks >= 1, "--ranks: expected a positive number of data-parallel ranks, got ", ia.ranks);
  SAT_CHECK(ia.zero >= 0 && ia.zero <= 3, "--zero: expected a ZeRO stage 0, 1, 2 or 3, got ", ia.zero);
  SAT_CHECK(ia.batch >= 1, "--batch: expected a positive micro-batch size, got ", ia.batch);
  TrainArgs a;
  a.model = ia.model;
  a.vocab = ia.vocab;
  a.seq_len = ia.seq_len;
  a.pp = ia.pp;
  a.tp = ia.tp;
  a.sequence_parallel = ia.sequence_parallel;
  a.pp_schedule = ia.pp_schedule;
  a.virtual_stages = ia.virtual_stages;
  a.pp_split = ia.pp_split;
  a.recompute = ia.recompute;
  sat::ModelConfig mc = model_for(a);
  sat::BuiltModel m = sat::build_model(mc, ia.batch, true);
  sat::TrainConfig cfg;
  cfg.batch = ia.batch;
  cfg.accum = ia.accum;
  cfg.optim.name = ia.optimizer;
  cfg.optim.momentum = float(ia.momentum);
  cfg.zero = ia.zero;
  cfg.precision = sat::parse_precision(ia.precision);
  SAT_CHECK(cfg.precision == sat::Precision::fp32 || cfg.precision == sat::Precision::bf16, "--precision ",
            ia.precision, ": saturate info plans the CPU engine, which trains in fp32 or bf16");
  layout_into(a, cfg);
  SAT_CHECK(ia.accum >= 1, "--accum: expected a positive number of micro-batches, got ", ia.accum);
  int slots = sat::optimizer_slots(sat::resolve_optim(cfg.optim));
  // The plan of `saturate train` on data of the model's default shape (synthetic data
  // is generated on demand, so opening it costs nothing): loader rings included.
  sat::DataSplit data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  sat::check_tensor_parallel(mc, cfg.tp, cfg.sequence_parallel);
  sat::check_zero(cfg, false, ia.ranks);
  mc.tp = cfg.tp;
  mc.sequence_parallel = cfg.sequence_parallel;
  mc.recompute = cfg.recompute;
  sat::check_recompute(mc);
  const int world = ia.ranks * cfg.pp * cfg.tp;
  sat::MemoryPlan p = sat::Trainer::plan(mc, cfg, *data.train, data.test.get(), world);
  const auto& g = *m.graph;
  std::printf("model       %s\n", mc.name.c_str());
  std::printf("config      %s (%s)\n", sat::model_spec(mc).c_str(), sat::describe_model(mc).c_str());
  std::printf("input       %s %s per micro-batch of %lld\n", m.x_shape.str().c_str(), sat::dtype_name(m.x_dtype), (long long)ia.batch);
  std::printf("parameters  %lld (%zu tensors)\n", (long long)g.param_count(), g.params().size());
  std::printf("layers      %zu in %zu blocks\n", g.nodes().size(), g.block_starts().size());
  std::printf("FLOPs       %.4g per sample forward, %.4g per sample training step (forward + backward)\n",
              g.flops_forward() / double(ia.batch), sat::train_flops_per_sample(m, ia.batch));
  const std::string zero_note =
      ia.zero ? ", ZeRO-" + std::to_string(ia.zero) + " over " + std::to_string(ia.ranks) + " rank(s)" : "";
  const std::string slot_note = slots ? " with " + std::to_string(slots) + " state slot(s)" : "";
  std::printf("memory plan per rank (micro-batch %lld%s, optimizer %s%s%s%s):\n", (long long)ia.batch,
              ia.accum > 1 ? (" x " + std::to_string(ia.accum) + " accumulation").c_str() : "", ia.optimizer.c_str(),
              slot_note.c_str(), zero_note.c_str(), ia.precision == "bf16" ? ", bf16 activations" : "");
  const sat::RankPlan first = sat::plan_rank(mc, cfg, *data.train, data.test.get(), 0, ia.ranks);
  if (cfg.tp > 1)
    std::printf("tensor      %d-way%s: each rank%s holds %lld of the parameters (split ones 1/%d, the rest whole)\n",
                cfg.tp, cfg.sequence_parallel ? ", sequence parallel" : "", cfg.pp > 1 ? " of stage 0" : "",
                (long long)first.model.graph->param_count(), cfg.tp);
  if (cfg.pp > 1) {
    print_stages(mc, cfg, data, ia.ranks);
  } else {
    print_plan(p);
    print_comm(first, cfg, ia.ranks);
  }
  if (cfg.recompute != sat::Recompute::none) {
    // The same plan keeping every activation; the FLOPs recomputation adds (whole model).
    sat::TrainConfig keep = cfg;
    keep.recompute = sat::Recompute::none;
    const sat::MemoryPlan w = sat::Trainer::plan(mc, keep, *data.train, data.test.get(), world);
    sat::ModelConfig one = mc;
    one.tp = 1, one.tp_rank = 0, one.sequence_parallel = false;
    const sat::BuiltModel rm = sat::build_model(one, ia.batch, true);
    const double extra = sat::recompute_flops(*rm.graph) / double(ia.batch);
    const double step = sat::train_flops_per_sample(rm, ia.batch);
    std::printf("recompute %s: activations (step arena) %s (none: %s), total %s (none: %s)%s; recomputing adds %.4g "
                "FLOPs per sample, %.1f%% of the step's %.4g\n",
                sat::recompute_name(cfg.recompute), sat::format_bytes(double(p.transient)).c_str(),
                sat::format_bytes(double(w.transient)).c_str(), sat::format_bytes(double(p.total())).c_str(),
                sat::format_bytes(double(w.total())).c_str(), cfg.pp > 1 ? " (stage 0)" : "", extra,
                100.0 * extra / step, step);
  }
  if (ia.zero) print_zero_saving(mc, cfg, data, world, p);
  return 0;
}

const char* const kModelHelp =
    "mlp | convnet | resnet18 | gpt-mini | gpt2-124m, or a family: gpt:layers=L,heads=H,width=C,context=T,vocab=V"
    "[,dropout=P] | llama:layers=L,heads=H,kv_heads=K,width=C,ffn=F,context=T,vocab=V | mlp:IN-HIDDEN...-CLASSES | "
    "resnet:18|34, or a model file: file:NET.json (README 'Your own model')";

// saturate hardware: a kind, a cluster's file or this machine (measured by every rank of the
// job at once), as a table or in the file format; rank 0 prints.
int run_hardware(const std::string& gpu, bool json, int threads) {
  SAT_CHECK(threads >= 0, "--threads: expected 0 (all cores) or a positive number, got ", threads);
  sat::cpu::set_num_threads(threads);
  std::unique_ptr<sat::dist::Comm> comm;
  if (gpu == "this") {
    comm = sat::dist::make_world_comm();
    if (comm->rank() == 0)
      std::fprintf(stderr, "saturate hardware: measuring this machine (GEMM, memory%s), a few seconds\n",
                   comm->size() > 1 ? ", the links between the ranks" : "");
  }
  const sat::Hardware h = sat::hardware(gpu, comm.get());
  if ((comm ? comm->rank() : sat::dist::detect_process().rank) != 0) return 0;
  std::printf("%s", json ? sat::hardware_json(h).c_str() : sat::hardware_table(h).c_str());
  return 0;
}

// The options of `train`, shared by `tune` (which trains short probes the same way).
void add_train_options(CLI::App* t, TrainArgs& a) {
  t->add_option("--model", a.model, kModelHelp)->capture_default_str();
  t->add_option("--data", a.data, "fashion-mnist | mnist:DIR | cifar10:DIR | tokens:FILE[:VAL] | synthetic[:CxHxW]")->capture_default_str();
  t->add_option("--batch", a.batch, "micro-batch size, or auto: tune it first (cached)")->capture_default_str();
  t->add_option("--accum", a.accum, "micro-batches per optimizer step (gradient accumulation)")->capture_default_str();
  auto* epochs = t->add_option("--epochs", a.epochs, "epochs to train")->capture_default_str();
  auto* steps = t->add_option("--steps", a.steps, "optimizer steps to train (instead of --epochs)");
  epochs->excludes(steps);
  t->add_option("--lr", a.lr, "learning rate (default 0.01 for sgd, 0.001 for adamw)");
  t->add_option("--optimizer", a.optimizer, "adamw | sgd")->capture_default_str();
  t->add_option("--momentum", a.momentum, "SGD momentum")->capture_default_str();
  t->add_flag("--nesterov", a.nesterov, "Nesterov momentum (SGD)");
  t->add_option("--weight-decay", a.weight_decay, "weight decay (default: PyTorch's, 0 for sgd, 0.01 for adamw)");
  t->add_option("--schedule", a.schedule, "constant | step | cosine")->capture_default_str();
  t->add_option("--warmup", a.warmup, "linear learning-rate warm-up steps (default: 5% of the run's steps)");
  t->add_option("--step-size", a.step_size, "step schedule: decay every N steps (default: a third of the run)");
  t->add_option("--gamma", a.gamma, "step schedule: decay factor")->capture_default_str();
  t->add_option("--seed", a.seed, "seed for initialisation, shuffling, dropout and synthetic data")->capture_default_str();
  t->add_option("--threads", a.threads, "CPU threads (0: all cores)")->capture_default_str();
  t->add_option("--shuffle", a.shuffle, "on | off (off: batches in file order)")->capture_default_str();
  t->add_option("--normalize", a.normalize, "MEAN,STD (or per-channel means then stds) applied after pixel/255");
  t->add_option("--eval", a.eval, "on | off: evaluate on the test split at the end")->capture_default_str();
  t->add_option("--vocab", a.vocab, "GPT models: vocabulary size (default: the model's)");
  t->add_option("--seq-len", a.seq_len, "GPT models: train on windows of T tokens, T <= the model's context "
                "(default: the context; the weights keep the context's shapes)");
  t->add_option("--init-weights", a.init_weights, "start from these weights (safetensors)");
  t->add_option("--save-weights", a.save_weights, "save the trained weights (safetensors)");
  t->add_option("--checkpoint-dir", a.checkpoint_dir, "write checkpoints (parameters, optimizer, data position) here");
  t->add_option("--checkpoint-every", a.checkpoint_every, "a checkpoint every N steps (and at the end)");
  t->add_option("--checkpoint-every-minutes", a.checkpoint_every_minutes, "a checkpoint every X minutes");
  t->add_option("--keep", a.keep, "keep the newest K checkpoints (0: all)");
  t->add_option("--resume", a.resume, "DIR (a checkpoint, or the newest under it) or auto (the newest in "
                "--checkpoint-dir, or a fresh start)");
  t->add_flag("--profile", a.profile, "time every layer (after warm-up): a table per layer, and where each rank's "
              "step time goes");
  t->add_option("--trace", a.trace, "write Chrome/TensorBoard trace files of the steps --trace-steps records here "
                "(one per rank and window; with --out, report.html too)");
  t->add_option("--trace-steps", a.trace_steps, "which steps --trace records, as torch.profiler.schedule: "
                "wait=W,warmup=U,active=A,repeat=R (default 1,1,3,1)");
  t->add_option("--out", a.out, "directory for summary.json and metrics.jsonl");
  t->add_flag("--overwrite", a.overwrite, "with --out: replace the results of an earlier run in that directory");
  t->add_option("--device", a.device, "auto | cpu | cuda | cuda:N (auto: cuda when a GPU is present)")->capture_default_str();
  t->add_option("--precision", a.precision, "fp32 | tf32 | bf16 | fp16 (mixed precision with fp32 master weights; the CPU: fp32 or bf16)")->capture_default_str();
  t->add_option("--cuda-graph", a.cuda_graph, "on | off: replay each step as one CUDA graph after warm-up")->capture_default_str();
  t->add_option("--last-batch", a.last_batch, "drop | pad: the last partial global batch of an epoch")->capture_default_str();
  t->add_option("--bucket-mb", a.bucket_mb, "data parallel: gradient bucket size in MiB")->capture_default_str();
  t->add_option("--dist-backend", a.dist_backend,
                "data parallel: auto | mpi | nccl (auto: mpi on the CPU, nccl on GPUs; nccl with one rank runs the NCCL path alone)")
      ->capture_default_str();
  t->add_flag("--sync-bn", a.sync_bn, "data parallel: BatchNorm statistics over the global batch (default: per rank)");
  t->add_option("--zero", a.zero, "data parallel: shard over the ranks 1 = optimizer state (ZeRO-1), 2 = + gradients, "
                "3 = + parameters (fully sharded), 0 = off")->capture_default_str();
  t->add_option("--tp", a.tp, "tensor-parallel ranks per layer (Megatron-LM's splits; mlp and gpt)")->capture_default_str();
  t->add_flag("--sequence-parallel", a.sequence_parallel, "with --tp: LayerNorm and dropout on 1/tp of the sequence (all-gather / reduce-scatter instead of all-reduce)");
  t->add_option("--pp", a.pp, "pipeline stages: the model is cut between blocks into this many stages")->capture_default_str();
  t->add_option("--pp-schedule", a.pp_schedule, "none | gpipe | 1f1b | interleaved (see saturate schedule)")->capture_default_str();
  t->add_option("--virtual-stages", a.virtual_stages, "interleaved: model chunks per stage")->capture_default_str();
  t->add_option("--pp-split", a.pp_split, "cut points between stages, by block (e.g. 2 or 1,3); default: balanced by FLOPs and memory");
  t->add_option("--recompute", a.recompute, "none | selective | full: recompute activations in backward instead of keeping them (selective: attention's probabilities; full: each transformer layer / residual block)")->capture_default_str();
  t->add_option("--memory-budget", a.memory_budget, "bytes per rank (8GiB, 512MiB, ...): an allocation beyond it is an error; the tuner fits in it");
  t->add_option("--global-batch", a.global_batch, "with --batch auto: keep this global batch (micro-batch x accum x ranks); "
                "with --layout: the samples per optimizer step every layout shares");
  t->add_option("--layout", a.layout, "auto, or fields to fix as in saturate plan --layout (tp=2,zero=1,...): the planner "
                "ranks the layouts of these ranks on this machine, the best few are timed and the fastest is used; "
                "--tp, --pp, --zero, --recompute, --sequence-parallel, --pp-schedule, --virtual-stages and --batch N "
                "fix their fields too (needs --global-batch)");
  t->add_option("--layout-candidates", a.layout_candidates, "with --layout: the layouts timed, the planner's best first")
      ->capture_default_str();
  t->add_option("--objective", a.objective, "with --batch auto: throughput | goodput (throughput x statistical efficiency)")->capture_default_str();
  t->add_option("--knee", a.knee, "with --batch auto: the smallest micro-batch within this fraction of the best throughput")->capture_default_str();
  t->add_option("--lr-batch", a.lr_batch, "the global batch --lr is meant for; --batch auto scales it (linear SGD, sqrt AdamW)")->capture_default_str();
}

// eval and predict: the model, weights and data as train was given them.
void add_eval_options(CLI::App* c, sat::EvalArgs& a, bool predict) {
  c->add_option("--model", a.model, kModelHelp)->capture_default_str();
  c->add_option("--init-weights", a.init_weights, "the trained weights: a safetensors file (train --save-weights) or a "
                "checkpoint directory")->required();
  c->add_option("--data", a.data, predict ? "the data whose test split is predicted (classifiers)"
                                          : "the data whose test split is evaluated (as given to train)");
  c->add_option("--batch", a.batch, "micro-batch size (train's gives train's figures exactly)")->capture_default_str();
  c->add_option("--seed", a.seed, "train's --seed (synthetic data is generated from it)")->capture_default_str();
  c->add_option("--normalize", a.normalize, "train's --normalize");
  c->add_option("--vocab", a.vocab, "GPT models: train's --vocab");
  c->add_option("--threads", a.threads, "CPU threads (0: all cores)")->capture_default_str();
  if (!predict) {
    c->add_option("--seq-len", a.seq_len, "GPT models: evaluate on windows of T <= context tokens");
    c->add_option("--json", a.json, "write the test loss and accuracy to this JSON file");
    return;
  }
  c->add_option("--out", a.out, "the CSV written: index,class,probability,label (classifiers) or "
                "rank,token,probability,logit (GPT models with --prompt)")->required();
  c->add_option("--prompt", a.prompt, "GPT models: a text file of token ids separated by whitespace");
  c->add_option("--top-k", a.top_k, "GPT models: how many of the most likely next tokens to write")->capture_default_str();
}

// Every number from a flag of every command is checked where CLI11 parses it, by the
// option's type (so an option added later is covered too): a floating-point value must be
// finite and within float's range (NaN, inf and 1e999 would otherwise pass every `x > 0`
// check and train on silently), an integer must lie in its flag's range below (before any arithmetic: no
// product of flags can overflow, no size is allocated from a typo). A flag that is not
// listed gets [0, 2^31 - 1]; "COMMAND FLAG" overrides FLAG for one command.
struct IntRange {
  long long lo, hi;
};
const std::map<std::string, IntRange>& int_ranges() {
  static const std::map<std::string, IntRange> r = {
      {"--accum", {1, 1 << 20}},         {"--epochs", {1, 1000000}},
      {"--steps", {1, 1LL << 40}},       {"--warmup", {0, 1LL << 40}},
      {"--step-size", {0, 1LL << 40}},   {"--vocab", {0, 1 << 30}},
      {"--seq-len", {1, 1 << 30}},       {"--top-k", {1, 1 << 30}},
      {"--threads", {0, 1024}},          {"--zero", {0, 3}},
      {"--tp", {1, 4096}},               {"--pp", {1, 4096}},
      {"--virtual-stages", {1, 1024}},   {"--global-batch", {0, 1LL << 40}},
      {"--layout-candidates", {1, 64}},  {"--lr-batch", {1, 1LL << 40}},
      {"--batch", {1, 1 << 24}},         {"--ranks", {1, 1 << 20}},
      {"--gpus", {1, 1 << 20}},          {"--gpus-per-node", {0, 4096}},
      {"--top", {1, 100000}},            {"--min-bytes", {4, 1LL << 34}},
      {"--max-bytes", {4, 1LL << 34}},   {"--iters", {1, 1000000}},
      {"bench comm --warmup", {0, 1000000}},
      // saturate schedule prints a grid of every rank and micro-batch
      {"schedule --pp", {1, 256}},       {"schedule --accum", {1, 4096}},
      {"schedule --virtual-stages", {1, 64}},
  };
  return r;
}

void check_numbers(CLI::App* app, const std::string& command) {
  for (CLI::Option* o : app->get_options()) {
    const std::string type = o->get_type_name(), flag = o->get_name();
    if (type == "FLOAT") {
      o->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const double x = std::strtod(v.c_str(), &end);
            if (end == v.c_str() || *end != 0) return "expected a number, got '" + v + "'";
            // (the engine computes in float: a larger magnitude would not convert)
            if (!std::isfinite(x) || std::fabs(x) > double(FLT_MAX))
              return "expected a finite number (at most 3.4e38 in magnitude), got '" + v + "'";
            return "";
          },
          "", "finite"));
    } else if (type == "INT" || type == "UINT") {
      auto it = int_ranges().find(command + " " + flag);
      if (it == int_ranges().end()) it = int_ranges().find(flag);
      const bool unsigned_any = type == "UINT" && it == int_ranges().end();  // --seed: any 64-bit value
      const IntRange range = it != int_ranges().end() ? it->second : IntRange{0, (1LL << 31) - 1};
      o->check(CLI::Validator(
          [range, unsigned_any](std::string& v) -> std::string {
            errno = 0;
            char* end = nullptr;
            const bool neg = v.find('-') != std::string::npos;
            if (unsigned_any) {
              if (!neg) (void)std::strtoull(v.c_str(), &end, 0);
              if (!neg && end != v.c_str() && *end == 0 && errno == 0) return "";
              return "expected an integer from 0 to 18446744073709551615, got '" + v + "'";
            }
            const long long x = std::strtoll(v.c_str(), &end, 0);
            if (end == v.c_str() || *end != 0 || errno != 0 || x < range.lo || x > range.hi)
              return sat::str_cat("expected an integer from ", range.lo, " to ", range.hi, ", got '", v, "'");
            return "";
          },
          "", "range"));
    }
  }
  for (CLI::App* sub : app->get_subcommands([](CLI::App*) { return true; }))
    check_numbers(sub, command.empty() ? sub->get_name() : command + " " + sub->get_name());
}

// The layout flags given on the command line (with --layout they fix fields of the search).
void note_layout_flags(const CLI::App* app, TrainArgs& a) {
  for (const char* f : {"--tp", "--pp", "--zero", "--recompute", "--sequence-parallel", "--pp-schedule",
                        "--virtual-stages", "--pp-split", "--batch", "--accum", "--noise-scale"})
    if (app->get_option_no_throw(f) && app->count(f)) a.given.push_back(f);
}

}  // namespace

int main(int argc, char** argv) {
  select_blas_kernels(argv);
  CLI::App app{"saturate: a training engine that keeps every accelerator busy"};
  app.set_version_flag("--version", "saturate 0.1");
  app.require_subcommand(1);
  // A repeated flag takes its last value, as argparse does.
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  TrainArgs a, ta;
  auto* train = app.add_subcommand("train", "train a model");
  add_train_options(train, a);
  train->add_flag("--noise-scale", a.noise_scale,
                  "measure the gradient noise scale every step (needs --accum 2 or more; with --batch auto it halves the "
                  "micro-batch): metrics.jsonl and summary.json");
  auto* tune = app.add_subcommand("tune", "find the micro-batch, accumulation and learning rate for a memory budget (--layout auto: the whole layout of the ranks)");
  add_train_options(tune, ta);

  InfoArgs ia;
  auto* info = app.add_subcommand("info", "parameters, FLOPs and the memory plan of a model (every pipeline stage's)");
  info->add_option("--model", ia.model, kModelHelp)->capture_default_str();
  info->add_option("--batch", ia.batch, "micro-batch size")->capture_default_str();
  info->add_option("--precision", ia.precision, "fp32 | bf16 (activations in bf16, fp32 master weights)")->capture_default_str();
  info->add_option("--optimizer", ia.optimizer, "sgd | adamw (optimizer state in the plan)")->capture_default_str();
  info->add_option("--momentum", ia.momentum, "SGD momentum (0: no momentum buffer)")->capture_default_str();
  info->add_option("--vocab", ia.vocab, "GPT models: vocabulary size");
  info->add_option("--seq-len", ia.seq_len, "GPT models: the plan for windows of T <= context tokens");
  info->add_option("--ranks", ia.ranks, "data-parallel ranks (the plan is per rank)")->capture_default_str();
  info->add_option("--zero", ia.zero, "ZeRO stage over the ranks: 1 optimizer state, 2 + gradients, 3 + parameters")->capture_default_str();
  info->add_option("--pp", ia.pp, "pipeline stages: print every stage's plan")->capture_default_str();
  info->add_option("--tp", ia.tp, "tensor-parallel ranks per layer: the plan of one of them")->capture_default_str();
  info->add_flag("--sequence-parallel", ia.sequence_parallel, "with --tp: sequence parallelism");
  info->add_option("--accum", ia.accum, "micro-batches per optimizer step (in flight in a pipeline)")->capture_default_str();
  info->add_option("--pp-schedule", ia.pp_schedule, "none | gpipe | 1f1b | interleaved")->capture_default_str();
  info->add_option("--virtual-stages", ia.virtual_stages, "interleaved: model chunks per stage")->capture_default_str();
  info->add_option("--pp-split", ia.pp_split, "cut points between stages, by block (e.g. 2 or 1,3); default: balanced");
  info->add_option("--recompute", ia.recompute, "none | selective | full: the plan with activation recomputation (and its saving)")->capture_default_str();

  std::string hw_gpu = "this";
  bool hw_json = false;
  int hw_threads = 0;
  auto* hw = app.add_subcommand("hardware", "what a GPU kind, a cluster (JSON file) or this machine (measured) can do, "
                                "as the layout planner sees it");
  hw->add_option("--gpu", hw_gpu, "a100-40gb | a100-80gb | h100-sxm | h200 | FILE.json | this (measure this machine; "
                 "under mpirun, with the links between the ranks)")->capture_default_str();
  hw->add_flag("--json", hw_json, "print the description in the JSON file format (edit it and pass it back as --gpu FILE)");
  hw->add_option("--threads", hw_threads, "with --gpu this: CPU threads per process, as saturate train's (0: all cores)")
      ->capture_default_str();

  sat::EvalArgs ea, pa_;
  auto* eval = app.add_subcommand("eval", "test loss and accuracy of trained weights (train's final evaluation)");
  add_eval_options(eval, ea, false);
  auto* predict = app.add_subcommand("predict", "the model's outputs: each test sample's class and probability "
                                     "(CSV), or a GPT model's top-k next tokens after --prompt");
  add_eval_options(predict, pa_, true);

  sat::ScheduleSpec sspec;
  std::string sched_kind = "1f1b";
  auto* schedule = app.add_subcommand("schedule", "print a pipeline schedule as a per-rank grid (time runs left to right)");
  schedule->add_option("--pp", sspec.stages, "pipeline stages")->capture_default_str();
  schedule->add_option("--accum", sspec.micro, "micro-batches per optimizer step")->capture_default_str();
  schedule->add_option("--pp-schedule", sched_kind, "none | gpipe | 1f1b | interleaved")->capture_default_str();
  schedule->add_option("--virtual-stages", sspec.virtual_stages, "interleaved: model chunks per stage")->capture_default_str();

  // `saturate launch -n N -- ARGS...` is parsed by hand: everything after -- belongs to
  // the launched command, which CLI11 would otherwise try to parse.
  if (argc >= 2 && std::string(argv[1]) == "launch") {
    try {
      int n = 0;
      int i = 2;
      std::vector<std::string> rest;
      for (; i < argc; ++i) {
        std::string arg = argv[i];
        if (arg == "--") { ++i; break; }
        if ((arg == "-n" || arg == "--np") && i + 1 < argc) {
          char* end = nullptr;
          errno = 0;
          const long v = std::strtol(argv[++i], &end, 10);
          SAT_CHECK(end != argv[i] && *end == 0 && errno == 0 && v >= 1 && v <= 4096,
                    "-n: expected a number of processes from 1 to 4096, got '", argv[i], "'");
          n = int(v);
        } else if (arg == "-h" || arg == "--help") {
          std::printf("usage: saturate launch -n N -- train [options]\n"
                      "runs N processes of saturate under mpirun, with the flags users forget\n"
                      "(running as root, oversubscription on small machines), and prints the command\n");
          return 0;
        } else {
          sat::fail("saturate launch: unexpected argument '", arg, "'; usage: saturate launch -n N -- train ...");
        }
      }
      for (; i < argc; ++i) rest.push_back(argv[i]);
      SAT_CHECK(n >= 1, "saturate launch: -n N is required; usage: saturate launch -n N -- train ...");
      SAT_CHECK(!rest.empty(), "saturate launch: nothing to run; usage: saturate launch -n N -- train ...");
      sat::dist::exec_command(sat::dist::mpirun_command(n, rest, sat::dist::self_executable()));
    } catch (const sat::Error& e) {
      std::fprintf(stderr, "saturate: error: %s\n", e.what());
      return 2;
    }
  }

  sat::PlanArgs pa;
  auto* plan = app.add_subcommand("plan", "the fastest layout that fits: data/tensor/pipeline split, micro-batch, schedule, "
                                  "recomputation and ZeRO stage, from a cost model");
  plan->add_option("--model", pa.model, kModelHelp)->capture_default_str();
  plan->add_option("--gpus", pa.gpus, "devices")->capture_default_str();
  plan->add_option("--gpu", pa.gpu, "a100-40gb | a100-80gb | h100-sxm | h200 | FILE.json | this (measured here)")->capture_default_str();
  plan->add_option("--gpus-per-node", pa.gpus_per_node, "devices per node (default: the hardware's)");
  plan->add_option("--global-batch", pa.global_batch, "samples per optimizer step");
  plan->add_option("--calibrate", pa.calibrate, "RUNS.json: fit the hardware's efficiency to measured runs (see the README)");
  plan->add_option("--precision", pa.precision, "bf16 | fp16 | tf32 | fp32 (default bf16 on GPUs: mixed precision with fp32 master weights; fp32 for --gpu this)");
  plan->add_option("--optimizer", pa.optimizer, "adamw | sgd (its state in the memory plan)")->capture_default_str();
  plan->add_option("--layout", pa.layout, "fix fields: dp=D,tp=T,pp=P,micro=B,schedule=1f1b|interleaved,v=V,"
                   "recompute=none|selective|full,sp=on|off,zero=0..3 (the rest are searched)");
  plan->add_option("--memory-limit", pa.memory_limit, "bytes per device (default: the hardware's memory)");
  plan->add_option("--top", pa.top, "layouts to print")->capture_default_str();
  plan->add_option("--out", pa.out_dir, "directory for plan.json and plan.html");
  plan->add_option("--json", pa.json_file, "write the layouts as JSON to this file");

  sat::dist::BenchCommOptions bco;
  std::string bc_backend = "mpi";
  auto* bench = app.add_subcommand("bench", "benchmarks");
  auto* bcomm = bench->add_subcommand("comm", "all-reduce and point-to-point sweeps over message sizes: bandwidth, and "
                                     "the latency and bandwidth fitted to them");
  bench->require_subcommand(1);
  bcomm->add_option("--min-bytes", bco.min_bytes, "smallest message")->capture_default_str();
  bcomm->add_option("--max-bytes", bco.max_bytes, "largest message")->capture_default_str();
  bcomm->add_option("--iters", bco.iters, "timed all-reduces per size")->capture_default_str();
  bcomm->add_option("--warmup", bco.warmup, "untimed all-reduces per size")->capture_default_str();
  bcomm->add_option("--backend", bc_backend, "mpi (host memory) | nccl (GPU memory, one GPU per rank)")->capture_default_str();

  std::string report_dir;
  auto* report = app.add_subcommand("report", "report.html of a finished run: loss and throughput, where each rank's "
                                    "step time goes, and (with --trace) one step's timeline and memory");
  report->add_option("RUN_DIR", report_dir, "the run's --out directory")->required();

  check_numbers(&app, "");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Under mpirun every rank has the same command line and says so itself (before MPI starts).
    const sat::dist::ProcessInfo pi = sat::dist::detect_process();
    const std::string who = pi.distributed() ? "error on rank " + std::to_string(pi.rank) : "error";
    std::fprintf(stderr, "saturate: %s: %s\nrun 'saturate %s--help' for the options\n", who.c_str(), e.what(),
                 train->parsed() ? "train " : tune->parsed() ? "tune " : eval->parsed() ? "eval " : predict->parsed() ? "predict "
                 : info->parsed() ? "info " : hw->parsed() ? "hardware "
                 : plan->parsed() ? "plan " : schedule->parsed() ? "schedule " : bcomm->parsed() ? "bench comm "
                 : report->parsed() ? "report " : "");
    return 2;
  }
  note_layout_flags(train, a);
  note_layout_flags(tune, ta);
  try {
    if (train->parsed()) {
      const int status = run_train(a);  // its communicators are gone here
      // Stopped by a signal: every rank exits 128 + signal at the same step, as one job.
      if (status > 128) sat::dist::finish_job_together();
      return status;
    }
    if (tune->parsed()) {
      SAT_CHECK(!ta.layout.empty() || (tune->count("--batch") == 0 && tune->count("--accum") == 0),
                "--batch/--accum: saturate tune chooses them (give --global-batch to keep a global batch)");
      return run_train(ta, true);
    }
    if (eval->parsed()) return sat::run_eval(ea);
    if (predict->parsed()) return sat::run_predict(pa_);
    if (info->parsed()) return run_info(ia);
    if (hw->parsed()) return run_hardware(hw_gpu, hw_json, hw_threads);
    if (plan->parsed()) return sat::run_plan(pa);
    if (report->parsed()) {
      std::printf("wrote %s\n", sat::write_run_report(report_dir).c_str());
      return 0;
    }
    if (schedule->parsed()) {
      sspec.kind = sat::parse_pipe_schedule(sched_kind);
      std::printf("%s", sat::format_schedule(sspec).c_str());
      return 0;
    }
    if (bcomm->parsed()) {
      SAT_CHECK(bc_backend == "mpi" || bc_backend == "nccl", "--backend: expected mpi or nccl, got '", bc_backend, "'");
      SAT_CHECK(bco.min_bytes >= 4 && bco.min_bytes <= bco.max_bytes, "--min-bytes/--max-bytes: expected 4 <= min <= max");
      SAT_CHECK(bco.iters >= 1, "--iters: expected at least 1");
      auto comm = sat::dist::make_world_comm();
      std::unique_ptr<sat::dist::Comm> nccl;
      if (bc_backend == "nccl") {
        SAT_CHECK(sat::dist::have_nccl(), "--backend nccl: this saturate was built without NCCL");
        nccl = sat::dist::make_nccl_comm(*comm, sat::dist::local_rank_gpu("--backend nccl"));
      }
      sat::dist::Comm& c = nccl ? *nccl : *comm;
      bool ok = true;
      for (auto& r : sat::dist::bench_comm(c, bco, std::cout)) ok = ok && r.ok;
      if (c.size() >= 2) {
        if (c.rank() == 0) std::cout << "\n";
        for (auto& r : sat::dist::bench_p2p(c, bco, std::cout)) ok = ok && r.ok;
      }
      return ok ? 0 : 1;
    }
  } catch (const sat::ReportedError&) {
    return 2;  // every rank met it together and has printed its line
  } catch (const sat::Error& e) {
    const sat::dist::ProcessInfo pi = sat::dist::detect_process();
    if (pi.distributed()) {
      // The other ranks would wait for this one in their next collective: end the job
      // (after every rank has said so, when all of them met the error before training).
      std::fprintf(stderr, "saturate: error on rank %d: %s\n", pi.rank, e.what());
      sat::dist::end_job_after_input_error(2);
    }
    std::fprintf(stderr, "saturate: error: %s\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "saturate: error: out of host memory\n");
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "saturate: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
