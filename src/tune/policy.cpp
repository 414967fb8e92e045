#include "tune/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "backend/cpu/blas.h"
#include "backend/device.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "dist/comm.h"
#include "plan/curve.h"
#include "plan/hardware.h"
#include "plan/planner.h"

namespace sat {

namespace fs = std::filesystem;

std::string tune_cache_dir(const std::string& key) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base = xdg && *xdg ? xdg : std::string(home && *home ? home : "/tmp") + "/.cache";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", (unsigned long long)h);
  return base + "/saturate/tune/" + hex;
}

void write_tune_files(const std::string& dir, const std::string& json, const std::string& html) {
  check_output_dir("--out", dir);
  for (auto [name, text] : {std::pair{"tune.json", json}, std::pair{"tune.html", html}})
    write_file_atomic("--out", dir + "/" + name, text);
}

namespace {

// A window other than the context is another tuning problem; without one the key (and so
// every existing cache entry) stays as it was.
std::string seq_len_key(const TunePolicy& p) { return p.seq_len > 0 ? str_cat("|seq_len ", p.seq_len) : ""; }

// Everything the batch tuner's choice depends on.
std::string batch_key(const TunePolicy& p, const ModelConfig& mc, const TrainConfig& cfg, int world) {
  const TuneConfig& t = p.tune;
  return str_cat(mc.name, "|", p.data, "|", cfg.device, "|", precision_name(cfg.precision), "|", world, "|",
                 p.budget_text, "|", t.global_batch, "|", t.objective, "|", t.knee, "|", t.lr_batch, "|",
                 cfg.optim.name, "|", cfg.optim.lr, "|", cfg.zero, "|", cfg.evaluate ? "on" : "off", "|",
                 cpu::num_threads(), "|steps/epoch ", t.min_steps_per_epoch,
                 cfg.recompute == Recompute::none ? "" : "|recompute ",
                 cfg.recompute == Recompute::none ? "" : recompute_name(cfg.recompute), seq_len_key(p));
}

// Everything the layout tuner's choice depends on.
std::string layout_key(const TunePolicy& p, const ModelConfig& mc, const LayoutTuneConfig& t, const TrainConfig& cfg,
                       int world) {
  return str_cat("layout|", mc.name, "|", p.data, "|", world, "|", p.budget_text, "|", t.global_batch, "|",
                 filter_str(t.filter), "|", t.candidates, "|", cfg.optim.name, "|", cfg.optim.momentum, "|",
                 cpu::num_threads(), seq_len_key(p));
}

// A cached report goes with this run's output too (best effort: the cache is only a copy).
void copy_tune_files(const fs::path& from, const std::string& to) {
  try {
    std::string text[2];
    const char* names[2] = {"tune.json", "tune.html"};
    for (int i = 0; i < 2; ++i) {
      std::error_code ec;
      if (!fs::exists(from / names[i], ec)) return;
      text[i] = read_input_file("tune cache", (from / names[i]).string());
    }
    write_tune_files(to, text[0], text[1]);
  } catch (const Error& e) {
    std::fprintf(stderr, "tune: could not copy the cached report to --out (%s); carrying on\n", e.what());
  }
}

// Rank 0: a new tuning's report into the cache (best effort) and beside the run's output.
void keep_report(const TunePolicy& p, const fs::path& cache, const std::string& json, const std::string& html,
                 const char* what) {
  if (p.cache) {
    try {
      write_tune_files(cache.string(), json, html);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: could not cache the result (%s); carrying on\n", what, e.what());
    }
  }
  if (!p.out_dir.empty()) write_tune_files(p.out_dir, json, html);
}

// The cached batch choice, read by rank 0 and shared with every rank (false: tune).
bool shared_tune_choice(dist::Comm& comm, const fs::path& file, TuneChoice& ch) {
  const int world = comm.size();
  double hit[7] = {0, 0, 0, 0, 0, 0, 0};
  if (comm.rank() == 0 && fs::exists(file)) {
    try {
      ch = read_tune_choice(file.string(), kMaxMicroBatch, world);
      hit[0] = 1;
      hit[1] = double(ch.micro_batch);
      hit[2] = double(ch.accum);
      hit[3] = double(ch.lr);
      hit[4] = double(ch.zero);
      hit[5] = double(ch.recompute);
      hit[6] = ch.warmup_fraction;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tune: ignoring the cached choice (%s); tuning again\n", e.what());
    }
  }
  comm.broadcast_sync(hit, 7, DType::f64, 0);
  if (hit[0] == 0) return false;
  ch.micro_batch = int64_t(hit[1]);
  ch.accum = int64_t(hit[2]);
  ch.lr = float(hit[3]);
  ch.zero = int(hit[4]);
  ch.recompute = Recompute(int(hit[5]));
  ch.warmup_fraction = hit[6];
  ch.global_batch = ch.micro_batch * ch.accum * world;
  return true;
}

// A new batch tuning (collective), its report kept by rank 0.
TuneChoice tune_batch(const TunePolicy& p, const ModelConfig& mc, const Dataset& train, const Dataset* test,
                      dist::Comm& comm, const TrainConfig& cfg, const fs::path& cache) {
  const bool lead = comm.rank() == 0;
  TrainConfig base = cfg;
  base.measure_noise = p.noise_scale;  // the tuner leaves out the levers that cannot measure it
  TuneConfig t = p.tune;
  t.progress = lead ? p.tune.progress : 0;
  if (p.cost_model && resolve_device(cfg.device) == Device::cpu) {
    // The cost model predicts the throughput curve; the tuner measures to confirm it.
    if (lead) std::fprintf(stderr, "tune: measuring this machine for the cost model (GEMM, memory, links)\n");
    t.predicted_samples_per_second = throughput_curve(mc, base, comm.size(), hardware("this", &comm), t.global_batch);
  }
  const TuneResult tr = tune(mc, base, train, test, t);
  if (lead) keep_report(p, cache, tune_json(tr), tune_html(tr), "tune");
  return tr.choice;
}

void print_choice(const TunePolicy& p, const TuneChoice& ch, int world, const TrainConfig& cfg) {
  const std::string lever = ch.zero ? ", with ZeRO-" + std::to_string(ch.zero)
                            : ch.recompute != Recompute::none
                                ? std::string(", with --recompute ") + recompute_name(ch.recompute)
                                : "";
  const std::string warmup =
      ch.warmup_fraction > 0
          ? strf(", warm-up %g%% of the steps%s", 100 * ch.warmup_fraction,
                 ch.global_batch > p.tune.lr_batch ? " (the rate is scaled up)" : " (kept below --lr-batch too)")
          : ", no warm-up";
  std::printf("tune: micro-batch %lld x %lld accumulation x %d rank(s) = global batch %lld%s, lr %.4g (%s from %g at "
              "batch %lld)%s\ntune: %s\n",
              (long long)ch.micro_batch, (long long)ch.accum, world, (long long)ch.global_batch, lever.c_str(),
              double(ch.lr), ch.lr_rule.c_str(), double(cfg.optim.lr), (long long)p.tune.lr_batch, warmup.c_str(),
              ch.reason.c_str());
  const std::string& out = p.out_dir;
  if (!out.empty() && fs::exists(out + "/tune.html"))
    std::printf("tune: report in %s/tune.html, every measurement in %s/tune.json\n", out.c_str(), out.c_str());
  std::fflush(stdout);
}

// The choice into cfg: micro-batch, accumulation, learning rate, the memory lever, the
// warm-up (a share of the run's steps), and two micro-batches for the noise scale.
void adopt_choice(const TunePolicy& p, const TuneChoice& ch, int64_t train_size, bool lead, TrainConfig& cfg) {
  cfg.batch = ch.micro_batch;
  cfg.accum = ch.accum;
  cfg.schedule.min_lr *= ch.lr / cfg.optim.lr;  // --min-lr keeps its share of --lr
  cfg.optim.lr = ch.lr;
  if (ch.zero || ch.recompute != Recompute::none) {  // a lever the tuner chose
    cfg.zero = ch.zero;
    cfg.recompute = ch.recompute;
  }
  if (ch.warmup_fraction > 0) {
    const int64_t total = cfg.steps > 0 ? cfg.steps : cfg.epochs * (train_size / ch.global_batch);
    cfg.schedule.warmup =
        std::max<int64_t>(cfg.schedule.warmup, int64_t(std::ceil(ch.warmup_fraction * double(total))));
  }
  if (p.noise_scale && cfg.accum == 1 && cfg.batch % 2 == 0) {
    // The estimator needs two micro-batches per step: the same global batch as halves.
    cfg.batch /= 2;
    cfg.accum = 2;
    if (lead)
      std::fprintf(stderr, "--noise-scale: training runs micro-batch %lld x 2 accumulation (the same global batch) "
                   "to measure it\n", (long long)cfg.batch);
  }
}

}  // namespace

bool apply_tuning(const TunePolicy& p, const ModelConfig& mc, const Dataset& train, const Dataset* test,
                  dist::Comm& comm, TrainConfig& cfg) {
  const bool lead = comm.rank() == 0;
  SAT_CHECK(cfg.accum == 1, "--accum: with --batch auto the tuner chooses the accumulation (use --global-batch)");
  const fs::path cache = tune_cache_dir(batch_key(p, mc, cfg, comm.size()));
  TuneChoice ch;
  const bool cached = p.cache && !p.tune_only && shared_tune_choice(comm, cache / "tune.json", ch);
  if (cached && lead) {
    if (p.print)
      std::fprintf(stderr, "tune: using the cached choice in %s (delete it to tune again)\n",
                   (cache / "tune.json").c_str());
    if (!p.out_dir.empty()) copy_tune_files(cache, p.out_dir);  // the cached tuning's report goes with this run's
  }
  if (!cached) ch = tune_batch(p, mc, train, test, comm, cfg, cache);
  if (lead && p.print) print_choice(p, ch, comm.size(), cfg);
  adopt_choice(p, ch, train.size(), lead && !p.tune_only, cfg);  // tune: for the config.toml it writes
  return !p.tune_only;
}

bool apply_layout_tuning(const TunePolicy& p, const ModelConfig& mc, const Dataset& train, const Dataset* test,
                         LayoutTuneConfig t, dist::Comm& comm, TrainConfig& cfg) {
  const bool lead = comm.rank() == 0;
  const fs::path cache = tune_cache_dir(layout_key(p, mc, t, cfg, comm.size()));
  Layout l;
  double measured = 0, predicted = 0;
  const bool cached =
      p.cache && !p.tune_only && shared_layout_choice(&comm, (cache / "tune.json").string(), l, measured, predicted);
  if (cached && lead) {
    if (p.print)
      std::fprintf(stderr, "layout auto: using the cached choice in %s (delete it to tune again)\n",
                   (cache / "tune.json").c_str());
    if (!p.out_dir.empty()) copy_tune_files(cache, p.out_dir);
  }
  if (!cached) {
    t.progress = lead ? 1 : 0;
    const LayoutTuneResult r = tune_layout(mc, cfg, train, test, t);
    l = r.choice().predicted.layout;
    measured = r.choice().measured_samples_per_second;
    predicted = r.choice().predicted.samples_per_second;
    if (lead && p.print) std::printf("%s", layout_tune_text(r).c_str());
    if (lead) keep_report(p, cache, layout_tune_json(r), layout_tune_html(r), "layout auto");
    if (lead && p.print && !p.out_dir.empty())
      std::printf("layout auto: report in %s/tune.html, every measurement in %s/tune.json\n", p.out_dir.c_str(),
                  p.out_dir.c_str());
  }
  if (lead && p.print) std::printf("layout auto: %s\n", layout_choice_line(l, measured, predicted).c_str());
  std::fflush(stdout);
  apply_layout(l, cfg);  // (saturate tune writes it into its config.toml)
  return !p.tune_only;
}

void hold_to_budget(size_t budget, const MemoryPlan& plan, const TrainConfig& cfg) {
  const size_t need = plan.device ? plan.device : plan.total();
  SAT_CHECK(need <= budget, "--memory-budget: micro-batch ", cfg.batch, " needs ", format_bytes(double(need)),
            " per rank, more than the budget of ", format_bytes(double(budget)),
            ": use a smaller --batch, or --batch auto");
  // Host buffers that exist before training (none of the plan's) do not count.
  const Device dev = resolve_device(cfg.device);
  device_mem_set_budget(dev, budget + (dev == Device::cpu ? mem_stats().current : 0));
}

}  // namespace sat
