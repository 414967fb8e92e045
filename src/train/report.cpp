#include "train/report.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include <cstdio>
#include <filesystem>
#include <sstream>

#include "backend/cpu/cpu_features.h"
#include "core/error.h"
#include "core/io.h"
#include "nn/layers/moe.h"

namespace sat {

namespace {

std::string format_duration(double s) {
  char b[32];
  if (!(s >= 0) || s > 1e8) return "?";
  if (s < 60) std::snprintf(b, sizeof b, "%.0fs", s);
  else if (s < 3600) std::snprintf(b, sizeof b, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(b, sizeof b, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return b;
}

// "  grad norm 3.2 (clipped)" with --clip-grad-norm, else nothing.
std::string grad_norm_text(const StepMetrics& m) {
  if (std::isnan(m.grad_norm)) return "";
  char b[64];
  std::snprintf(b, sizeof b, "  grad norm %.3g%s", m.grad_norm, m.clipped ? " (clipped)" : "");
  return b;
}

// A rank's step breakdown (seconds per measured step), as summary.json and the run report read it.
nlohmann::ordered_json breakdown_json(const StepBreakdown& b) {
  return {{"compute", b.compute},     {"tp_comm", b.tp_comm}, {"grad_sync", b.grad_sync},
          {"pipeline_wait", b.pipeline_wait}, {"data", b.data}, {"optimizer", b.optimizer},
          {"other", b.other}};
}

}  // namespace

namespace {
// metrics.jsonl's lines of steps up to `last` (each line starts {"step": N, ...), and of the
// resumes before it ({"event": "resume", "from_step": N, ...}).
std::string metrics_until(const std::string& path, int64_t last) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return "";
  std::istringstream f(read_input_file("--out", path));
  std::string out, line;
  while (std::getline(f, line)) {
    long long step = 0;
    if (std::sscanf(line.c_str(), "{\"step\": %lld", &step) == 1 && step <= last) out += line + "\n";
    if (std::sscanf(line.c_str(), "{\"event\": \"resume\", \"from_step\": %lld", &step) == 1 && step < last)
      out += line + "\n";
  }
  return out;
}

// A number for a JSON line: null when not finite (a perplexity beyond double's range).
std::string json_number(double v, const char* format = "%.9g") {
  if (!std::isfinite(v)) return "null";
  char b[40];
  std::snprintf(b, sizeof b, format, v);
  return b;
}

// "resume" events' changes: {"key": [from, to], ...}.
nlohmann::ordered_json changes_json(const std::vector<SettingChange>& changes) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const SettingChange& c : changes) j[c.key] = {c.from, c.to};
  return j;
}
}  // namespace

std::string validation_fields(const EvalResult& e) {
  std::string s = ", \"val_loss\": " + json_number(e.loss);
  if (e.accuracy >= 0) s += ", \"val_accuracy\": " + json_number(e.accuracy);
  else s += ", \"val_perplexity\": " + json_number(std::exp(e.loss));  // a language model's: e^(nats per token)
  return s + ", \"val_samples\": " + std::to_string(e.samples);
}

std::string describe_validation(const EvalResult& e) {
  char b[160];
  if (e.accuracy >= 0)
    std::snprintf(b, sizeof b, "loss %.4f, accuracy %.2f%% (%lld samples)", e.loss, 100 * e.accuracy,
                  (long long)e.samples);
  else
    std::snprintf(b, sizeof b, "loss %.4f, perplexity %.4g (%lld samples)", e.loss, std::exp(e.loss),
                  (long long)e.samples);
  return b;
}

StepReporter::StepReporter(int progress, const std::string& out_dir, bool noise, int64_t resumed_at)
    : progress_(progress >= 0 ? progress : (isatty(STDERR_FILENO) ? 2 : 1)), noise_(noise) {
  if (out_dir.empty()) return;
  check_output_dir("--out", out_dir);
  path_ = out_dir + "/metrics.jsonl";
  check_output_file("--out", path_);
  if (resumed_at > 0) write_file_atomic("--out", path_, metrics_until(path_, resumed_at));
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (resumed_at > 0 ? O_APPEND : O_TRUNC), 0644);
  SAT_CHECK(fd_ >= 0, "--out: cannot write ", path_, ": ", std::strerror(errno));
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  written_ = end > 0 ? (long long)end : 0;
}

StepReporter::~StepReporter() {
  if (fd_ >= 0) ::close(fd_);
}

void StepReporter::write_line(const std::string& line) {
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = n < 0 ? errno : ENOSPC;
      if (::ftruncate(fd_, off_t(written_)) != 0) {  // the cut line taken back where it can be
      }
      ::close(fd_);
      fd_ = -1;
      fail("--out: cannot write ", path_, ": ", std::strerror(e), " (the run stops here: the file keeps the steps "
           "before, and checkpoints already written are kept)");
    }
    done += size_t(n);
  }
  written_ += (long long)line.size();
}

void StepReporter::step(const StepMetrics& m, int64_t total, double elapsed) {
  if (fd_ >= 0) {
    char line[320];
    int n = std::snprintf(line, sizeof line,
                          "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"samples_per_second\": %.6g, \"seconds\": %.6g",
                          (long long)m.step, m.loss, m.lr, m.samples_per_second, m.seconds);
    if (noise_) n += std::snprintf(line + n, sizeof line - size_t(n), ", \"noise_scale\": %.6g", m.noise_scale);
    if (!std::isnan(m.grad_norm)) {  // --clip-grad-norm (a norm that is not finite: null)
      char norm[32] = "null";
      if (std::isfinite(m.grad_norm)) std::snprintf(norm, sizeof norm, "%.9g", m.grad_norm);
      std::snprintf(line + n, sizeof line - size_t(n), ", \"grad_norm\": %s, \"clipped\": %s", norm,
                    m.clipped ? "true" : "false");
    }
    write_line(std::string(line) + (m.val ? validation_fields(*m.val) : "") + "}\n");
  }
  if (progress_ == 2) {
    const double frac = double(m.step) / double(total);
    const int filled = int(frac * 30);
    std::fprintf(stderr, "\r[%.*s%*s] step %lld/%lld  loss %.4f%s  %.0f samples/s  ETA %s   ", filled,
                 "##############################", 30 - filled, "", (long long)m.step, (long long)total, m.loss,
                 grad_norm_text(m).c_str(), m.samples_per_second, format_duration(elapsed / frac - elapsed).c_str());
    if (m.step == total) std::fprintf(stderr, "\n");
  } else if (progress_ == 1) {
    const int64_t every = std::max<int64_t>(1, total / 20);
    if (m.step % every == 0 || m.step == total)
      std::fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.3g%s  %.0f samples/s\n", (long long)m.step,
                   (long long)total, m.loss, m.lr, grad_norm_text(m).c_str(), m.samples_per_second);
  }
  if (m.val && progress_ != 0) {
    if (progress_ == 2 && m.step != total) std::fprintf(stderr, "\n");  // below the bar, which goes on under it
    std::fprintf(stderr, "validation at step %lld/%lld: %s%s\n", (long long)m.step, (long long)total,
                 describe_validation(*m.val).c_str(),
                 m.val_kept.empty() ? "" : ("; the best so far: saved to " + m.val_kept).c_str());
  }
}

void StepReporter::resumed(int64_t step, const std::string& from, const std::vector<SettingChange>& changes) {
  if (fd_ < 0) return;
  nlohmann::ordered_json j;
  j["event"] = "resume";
  j["from_step"] = step;
  j["from"] = from;
  j["changes"] = changes_json(changes);
  write_line(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

nlohmann::ordered_json memory_plan_json(const MemoryPlan& p) {
  nlohmann::ordered_json j;
  for (int k = 0; k < int(MemKind::kCount); ++k) j[mem_kind_name(MemKind(k))] = p.by_kind[size_t(k)];
  j["persistent"] = p.persistent;
  j["transient_arena"] = p.transient;
  j["transient_peak"] = p.transient_peak;  // the most of the arena live at once
  j["staging_arena"] = p.staging;  // ZeRO-2/3: gathered parameters and gradient buckets
  j["inputs"] = p.inputs;
  j["contexts"] = p.contexts;
  j["total"] = p.total();
  return j;
}

// --eval-every's evaluations: how often, on how much, the last one, and with --keep-best the
// best so far (its checkpoint's directory, step and value).
static nlohmann::ordered_json validation_summary(const TrainConfig& cfg, const TrainResult& r) {
  using nlohmann::ordered_json;
  ordered_json v{{"every", cfg.eval_every},
                 {"batches", cfg.eval_batches > 0 ? ordered_json(cfg.eval_batches) : ordered_json(nullptr)},
                 {"evaluations", r.validations.size()},
                 {"seconds", r.validation_seconds}};
  if (!r.validations.empty()) {
    const auto& [step, e] = r.validations.back();
    v["last"] = ordered_json::parse("{\"step\": " + std::to_string(step) + validation_fields(e) + "}");
  }
  if (!cfg.keep_best.empty()) {
    const bool any = r.best_step > 0;
    v["best"] = {{"metric", cfg.keep_best},
                 {"direction", cfg.keep_best == "val_loss" ? "lower is better" : "higher is better"},
                 {"value", any ? ordered_json(r.best_value) : ordered_json(nullptr)},
                 {"step", any ? ordered_json(r.best_step) : ordered_json(nullptr)},
                 {"dir", std::filesystem::absolute(cfg.best_dir).lexically_normal().string()}};
  }
  return v;
}

// The host CPU: its model and the vector extensions the kernels may take; under bf16 on
// the CPU, which path bf16 took (native bf16 kernels or the conversions).
static nlohmann::ordered_json cpu_summary(const TrainResult& r) {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  nlohmann::ordered_json j{{"model", f.model}, {"avx2", f.avx2}, {"avx512f", f.avx512f},
                           {"avx512_bf16", f.avx512_bf16}, {"amx_bf16", f.amx_bf16}};
  if (r.device == "cpu" && r.precision == "bf16") j["bf16_kernels"] = cpu::bf16_native() ? "native" : "fallback";
  return j;
}

// Mixture-of-experts layers: this rank's routing over the run (tokens each expert kept,
// dropped at capacity, routed), under summary.json's moe_load.
static void add_moe_load(nlohmann::ordered_json& s) {
  for (const auto& [layer, L] : moe_load())
    s["moe_load"][layer] = {{"tokens_per_expert", L.tokens}, {"dropped", L.dropped}, {"routed", L.routed}};
}

// Every rank's place, memory, traffic and step time: summary.json's ranks.
static nlohmann::ordered_json ranks_json(const TrainResult& r) {
  using nlohmann::ordered_json;
  ordered_json ranks = ordered_json::array();
  for (const RankReport& k : r.ranks) {
    ordered_json mem = ordered_json::object();
    for (size_t i = 0; i < k.memory_by_kind.size(); ++i)
      if (k.memory_by_kind[i]) mem[mem_kind_name(MemKind(i))] = k.memory_by_kind[i];
    const GroupBytes& c = k.comm_bytes_per_step;
    ranks.push_back({{"rank", k.rank}, {"stage", k.stage}, {"dp_rank", k.dp_rank}, {"tp_rank", k.tp_rank},
                     {"cp_rank", k.cp_rank}, {"ep_rank", k.ep_rank},
                     {"predicted_memory_bytes", k.predicted_memory_bytes}, {"peak_memory_bytes", k.peak_memory_bytes},
                     {"memory_by_kind", mem},
                     {"comm_bytes_per_step", {{"tp", c.tp}, {"dp", c.dp}, {"pp", c.pp}, {"embedding", c.embedding}}},
                     {"step_seconds", k.step_seconds}, {"wait_seconds", k.wait_seconds},
                     {"step_breakdown", breakdown_json(k.breakdown)}});
    if (c.cp > 0) ranks.back()["comm_bytes_per_step"]["cp"] = c.cp;  // --cp: the ring's
  }
  return ranks;
}

nlohmann::ordered_json run_summary(const RunInfo& info, const TrainConfig& cfg, const TrainResult& r,
                                   const MemoryPlan& plan) {
  using nlohmann::ordered_json;
  ordered_json s;
  s["model"] = info.model;
  s["parameters"] = info.parameters;
  s["data"] = info.data;
  s["device"] = r.device;
  if (!r.device_name.empty()) s["device_name"] = r.device_name;
  s["precision"] = r.precision;
  s["cpu"] = cpu_summary(r);
  s["threads"] = info.threads;
  s["batch"] = cfg.batch;
  s["accum"] = cfg.accum;
  s["global_batch"] = r.global_batch;
  s["world_size"] = r.world_size;
  s["layout"] = {{"dp", r.dp}, {"tp", r.tp}, {"pp", r.pp}, {"cp", r.cp}, {"ep", r.ep}};
  s["pp_schedule"] = r.pp_schedule;
  s["virtual_stages"] = r.virtual_stages;
  s["pp_split"] = r.pp_split;
  s["bubble_fraction"] = r.bubble_fraction;
  s["comm_backend"] = r.comm_backend;
  s["comm_seconds"] = r.comm_seconds;
  s["comm_hidden_fraction"] = r.comm_hidden_fraction;
  s["rank_step_seconds"] = r.rank_step_seconds;
  if (info.memory_budget > 0) s["memory_budget_bytes"] = info.memory_budget;
  if (!cfg.trace_dir.empty()) s["trace_dir"] = std::filesystem::absolute(cfg.trace_dir).string();
  if (r.checkpoints > 0 || r.resumed_from > 0) {
    s["checkpoints"] = {{"written", r.checkpoints}, {"paused_seconds", r.checkpoint_seconds},
                        {"write_seconds", r.checkpoint_write_seconds}, {"last_bytes", r.checkpoint_bytes},
                        {"last", r.last_checkpoint}, {"resumed_from_step", r.resumed_from}};
  }
  if (r.resumed_from > 0)
    s["resume"] = {{"from", r.resumed_dir}, {"from_step", r.resumed_from}, {"changes", changes_json(r.resume_changes)}};
  s["ranks"] = ranks_json(r);
  s["sequence_parallel"] = cfg.sequence_parallel;
  s["recompute"] = recompute_name(cfg.recompute);
  s["sync_bn"] = cfg.sync_bn;
  s["zero"] = cfg.zero;
  s["optimizer_state_bytes"] = plan.by_kind[size_t(MemKind::optimizer_state)];
  s["steps"] = r.steps;
  s["optimizer"] = {{"name", cfg.optim.name}, {"lr", cfg.optim.lr}, {"momentum", cfg.optim.momentum},
                    {"nesterov", cfg.optim.nesterov}, {"weight_decay", resolve_optim(cfg.optim).weight_decay}};
  if (cfg.optim.name == "adamw") {
    s["optimizer"]["betas"] = {cfg.optim.beta1, cfg.optim.beta2};
    s["optimizer"]["eps"] = cfg.optim.eps;
  }
  if (cfg.optim.clip_grad_norm > 0) {
    s["optimizer"]["clip_grad_norm"] = cfg.optim.clip_grad_norm;
    s["optimizer"]["clipped_steps"] = r.clipped_steps;
  }
  s["schedule"] = {{"name", info.schedule_name}, {"warmup", cfg.schedule.warmup},
                   {"warmup_fraction", cfg.schedule.warmup_fraction}, {"min_lr", cfg.schedule.min_lr}};
  s["seed"] = info.seed;
  s["final_train_loss"] = r.final_train_loss;
  if (r.test) {
    s["test_loss"] = r.test->loss;
    if (r.test->accuracy >= 0) s["test_accuracy"] = r.test->accuracy;
    s["test_samples"] = r.test->samples;
  }
  if (cfg.eval_every > 0) s["validation"] = validation_summary(cfg, r);
  if (cfg.measure_noise) s["noise_scale"] = r.noise_scale > 0 ? ordered_json(r.noise_scale) : ordered_json(nullptr);
  s["samples_per_second"] = r.samples_per_second;
  s["samples_per_second_note"] = "excludes the first " + std::to_string(r.warmup_excluded) + " steps (warm-up)";
  s["warmup_steps_excluded"] = r.warmup_excluded;
  if (info.tokens) s["tokens_per_second"] = r.samples_per_second * double(info.seq_len);
  s["flops_per_sample"] = info.flops_per_sample;
  s["predicted_memory_bytes"] = r.predicted_memory_bytes;
  s["peak_memory_bytes"] = r.peak_memory_bytes;
  s["memory_plan"] = memory_plan_json(plan);
  add_moe_load(s);
  if (!r.device_name.empty()) {  // a GPU (the host reports no device name)
    s["device_memory_used_bytes"] = r.device_memory_used_bytes;
    s["graph_replay"] = r.graph_replay;
    s["kernels_per_step"] = r.kernels_per_step;
    s["launches_per_step"] = r.launches_per_step;
    s["gpu_utilization_mean"] = r.gpu_utilization_mean;
    if (r.precision == "fp16") {
      s["skipped_steps"] = r.skipped_steps;
      s["loss_scale"] = r.loss_scale;
    }
  }
  s["train_seconds"] = r.train_seconds;
  s["wall_seconds"] = info.wall_seconds;
  return s;
}

void write_json_atomic(const std::string& path, const nlohmann::ordered_json& j) {
  write_file_atomic("--out", path, j.dump(2) + "\n");
}

}  // namespace sat
