#include "plan/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "core/alloc.h"
#include "core/error.h"
#include "core/json.h"
#include "core/text.h"

namespace sat {

namespace {

// A positive figure (sat::Error "FILE:LINE: key 'PATH': ...").
double number(const JsonRef& j, const char* key) {
  const JsonRef v = j.at(key);
  const double x = v.number();
  if (!(x > 0 && std::isfinite(x))) v.fail(str_cat("expected a positive number, got ", x));
  return x;
}

JsonRef non_empty_list(const JsonRef& j, const char* key) {
  const JsonRef v = j.at(key);
  if (v.items().empty()) v.fail("expected a non-empty array");
  return v;
}

std::vector<CalibrationRun> megatron_rows(const JsonRef& j) {
  const JsonRef setup = j.at("setup");
  const double s = number(setup, "seq_len"), V = number(setup, "vocab");
  std::vector<CalibrationRun> out;
  for (const JsonRef& r : non_empty_list(j, "rows").items()) {
    const double l = number(r, "layers"), h = number(r, "hidden"), B = number(r, "batch");
    CalibrationRun run;
    run.model = model_config(str_cat("gpt:layers=", int64_t(l), ",heads=", int64_t(number(r, "heads")), ",width=",
                                     int64_t(h), ",context=", int64_t(s), ",vocab=", int64_t(V)));
    run.gpus = int(number(r, "gpus"));
    run.global_batch = int64_t(B);
    const int tp = int(number(r, "tp")), pp = int(number(r, "pp"));
    if (run.gpus % (tp * pp) != 0) r.fail(str_cat("gpus ", run.gpus, " do not divide by tp x pp = ", tp * pp));
    run.layout.tp = tp, run.layout.pp = pp, run.layout.dp = run.gpus / (tp * pp);
    if (pp > 1) run.layout.schedule = PipeSchedule::interleaved;
    run.layout.recompute = Recompute::full, run.layout.sp = false, run.layout.zero = 0;
    run.flops_per_step = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    run.measured_step_seconds = run.flops_per_step / (number(r, "tflops_per_gpu") * 1e12 * run.gpus);
    run.overlap_dp = false;
    run.engine = "megatron";
    run.source = "Narayanan et al. 2021 (SC21), Table 1";
    run.label = str_cat(r.contains("params_b") ? str_cat(r.at("params_b").number(), "B") : std::string("GPT"), " t", tp,
                        " p", pp, " d", run.layout.dp.value());
    out.push_back(run);
  }
  return out;
}

// A run whose TFLOP/s per GPU counts the FLOPs as Narayanan et al. do (full recomputation
// included): 96 B s l h^2 (1 + s / 6h + V / 16 l h); sets the step's seconds, returns the FLOPs.
double megatron_flops(CalibrationRun& run, const JsonRef& r) {
  const ModelConfig& m = run.model;
  const double B = double(run.global_batch), s = double(m.seq_len > 0 ? m.seq_len : m.context);
  const double l = double(m.n_layer), h = double(m.n_embd), V = double(m.vocab);
  const double flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
  run.measured_step_seconds = flops / (number(r, "tflops_per_gpu") * 1e12 * run.gpus);
  return flops;
}

CalibrationRun saturate_run(const JsonRef& r) {
  static constexpr Named<DType> kPrecisions[] = {{"bf16", DType::bf16}, {"fp16", DType::f16}, {"fp32", DType::f32}};
  CalibrationRun run;
  run.model = model_config(r.at("model").string());
  run.label = r.contains("label") ? r.at("label").string() : run.model.name;
  run.gpus = int(number(r, "gpus"));
  run.gpus_per_node = r.contains("gpus_per_node") ? int(number(r, "gpus_per_node")) : 8;
  run.global_batch = int64_t(number(r, "global_batch"));
  if (r.contains("layout")) run.layout = parse_layout(r.at("layout").string());
  if (r.contains("overlap_dp")) run.overlap_dp = r.at("overlap_dp").boolean();
  if (r.contains("engine")) {
    run.engine = r.at("engine").string();
    try {
      engine_model(run.engine);
    } catch (const Error& e) {
      r.at("engine").fail(e.what());
    }
  }
  if (r.contains("gpu")) run.gpu = r.at("gpu").string();
  if (r.contains("source")) run.source = r.at("source").string();
  if (r.contains("memory_gib")) run.measured_memory_bytes = number(r, "memory_gib") * 1073741824.0;
  run.precision = r.contains("precision") ? parse_named(r.at("precision").where(), r.at("precision").string(), kPrecisions)
                                          : DType::bf16;
  if (r.contains("step_seconds")) {
    run.measured_step_seconds = number(r, "step_seconds");
  } else if (r.contains("samples_per_second")) {
    run.measured_step_seconds = double(run.global_batch) / number(r, "samples_per_second");
  } else if (r.contains("tokens_per_second_per_gpu")) {
    const double tokens = double(run.global_batch) * double(run.model.seq_len > 0 ? run.model.seq_len : run.model.context);
    run.measured_step_seconds = tokens / (number(r, "tokens_per_second_per_gpu") * run.gpus);
  } else if (r.contains("tflops_per_gpu")) {
    run.flops_per_step = -number(r, "tflops_per_gpu");  // resolved once the model's FLOPs are known
    if (r.contains("flops") && r.at("flops").string() == "megatron") run.flops_per_step = megatron_flops(run, r);
  } else {
    if (!r.contains("memory_gib"))
      r.fail("needs one of 'step_seconds', 'samples_per_second', 'tokens_per_second_per_gpu', 'tflops_per_gpu' or "
             "'memory_gib'");
    run.timed = false;
  }
  return run;
}

}  // namespace

std::vector<CalibrationRun> read_runs(const std::string& path) {
  const JsonRef j = JsonRef::parse_file(path, "--calibrate");
  if (j.is_object() && j.contains("rows")) return megatron_rows(j);
  std::vector<CalibrationRun> out;
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (const JsonRef& r : non_empty_list(j, "runs").items()) {
    out.push_back(saturate_run(r));
    std::string& g = out.back().gpu;  // a hardware file named relative to the runs' file
    if (g.size() > 5 && g.substr(g.size() - 5) == ".json" && std::filesystem::path(g).is_relative())
      g = (dir / g).string();
    if (!g.empty()) {
      try {
        hardware(g);
      } catch (const Error& e) {
        r.at("gpu").fail(e.what());
      }
    }
  }
  return out;
}

namespace {

PlanRequest request_for(const CalibrationRun& run, const Hardware& hw, bool exact) {
  PlanRequest r;
  r.model = run.model;
  r.hw = hw;
  r.gpus = run.gpus;
  r.gpus_per_node = run.gpus_per_node;
  r.global_batch = run.global_batch;
  r.precision = run.precision;
  r.filter = run.layout;
  r.top = 1;
  r.exact_memory = exact;
  r.overlap_dp = run.overlap_dp;
  r.engine = engine_model(run.engine);
  return r;
}

}  // namespace

std::vector<CalibrationRow> evaluate_runs(const std::vector<CalibrationRun>& runs, const Hardware& hw, bool own_best,
                                          bool exact) {
  std::vector<CalibrationRow> rows;
  for (const CalibrationRun& run : runs) {
    CalibrationRow row;
    row.run = run;
    const Hardware own = run.gpu.empty() ? hw : hardware(run.gpu);
    // The run's free fields among those that fit the device; if none does, the fastest anyway.
    PlanResult p = plan_layouts(request_for(run, own, exact));
    if (p.best.empty()) {
      PlanRequest any = request_for(run, own, exact);
      any.memory_limit = 1e30;
      p = plan_layouts(any);
    }
    SAT_CHECK(!p.best.empty(), run.label, ": no layout forms this run");
    row.predicted = p.best[0];
    row.memory_limit = own.memory_bytes;
    row.fits = row.predicted.memory_bytes <= own.memory_bytes;
    row.predicted_memory = row.predicted.memory_formula ? row.predicted.allocator_bytes : row.predicted.memory_bytes;
    if (run.measured_memory_bytes > 0) row.memory_error = row.predicted_memory / run.measured_memory_bytes - 1;
    if (!run.timed) {
      rows.push_back(row);
      continue;
    }
    double flops = run.flops_per_step;
    if (flops < 0) {  // given as TFLOP/s per GPU by saturate's count
      row.run.measured_step_seconds = p.model_flops_per_sample * double(run.global_batch) / (-flops * 1e12 * run.gpus);
      flops = 0;
    }
    if (flops == 0) flops = p.model_flops_per_sample * double(run.global_batch);
    row.measured_tflops = flops / row.run.measured_step_seconds / run.gpus / 1e12;
    row.predicted_tflops = flops / row.predicted.step_seconds / run.gpus / 1e12;
    row.error = row.predicted_tflops / row.measured_tflops - 1;
    if (own_best) {
      PlanRequest free = request_for(run, own, exact);
      free.filter = {};
      free.overlap_dp = true;
      const PlanResult b = plan_layouts(free);
      if (!b.best.empty()) row.own_best = b.best[0];
    }
    rows.push_back(row);
  }
  return rows;
}

namespace {

double loss(const std::vector<CalibrationRun>& runs, const Hardware& hw) {
  double sum = 0;
  for (const CalibrationRow& r : evaluate_runs(runs, hw, false, false))
    if (r.run.timed) sum += std::pow(std::log1p(r.error), 2);
  return sum / double(runs.size());
}

}  // namespace

Hardware fit_efficiency(const std::vector<CalibrationRun>& runs, Hardware hw, bool progress) {
  // Coordinate search in log space, halving the step when no move helps; efficiencies stay in (0, 1].
  double* params[] = {&hw.eff.gemm_max, &hw.eff.memory_eff, &hw.eff.comm_eff};
  const char* names[] = {"gemm_max", "memory_eff", "comm_eff"};
  double best = loss(runs, hw);
  for (double step = 0.25; step > 0.01; step /= 2) {
    bool moved = true;
    while (moved) {
      moved = false;
      for (int k = 0; k < 3; ++k)
        for (double dir : {1.0, -1.0}) {
          const double old = *params[k];
          *params[k] = std::min(1.0, old * std::exp(dir * step));
          const double l = loss(runs, hw);
          if (l < best - 1e-9) {
            best = l, moved = true;
            if (progress) std::fprintf(stderr, "calibrate: %s %.4f, rms log error %.4f\n", names[k], *params[k], std::sqrt(l));
          } else {
            *params[k] = old;
          }
        }
    }
  }
  return hw;
}

std::string calibration_table(const std::vector<CalibrationRow>& rows) {
  std::string s;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-22s %-58s %10s %10s %7s %11s %s\n", "run", "predicted layout", "measured", "predicted",
                "error", "memory/GPU", "own best (TFLOP/s, memory)");
  s += buf;
  std::vector<double> errs;
  for (const CalibrationRow& r : rows) {
    std::string own = "-";
    if (r.own_best.step_seconds > 0)
      own = str_cat(r.own_best.layout.str(), " (", int(std::lround(r.measured_tflops * r.run.measured_step_seconds /
                                                                   r.own_best.step_seconds)),
                    ", ", format_bytes(r.own_best.memory_bytes), ")");
    std::snprintf(buf, sizeof buf, "%-22s %-58s %10.1f %10.1f %+6.1f%% %11s %s\n", r.run.label.c_str(),
                  r.predicted.layout.str().c_str(), r.measured_tflops, r.predicted_tflops, 100 * r.error,
                  format_bytes(r.predicted.memory_bytes).c_str(), own.c_str());
    s += buf;
    errs.push_back(std::fabs(r.error));
  }
  std::sort(errs.begin(), errs.end());
  if (!errs.empty()) {
    const double median = errs.size() % 2 ? errs[errs.size() / 2] : (errs[errs.size() / 2 - 1] + errs[errs.size() / 2]) / 2;
    std::snprintf(buf, sizeof buf, "absolute error: median %.1f%%, worst %.1f%% (TFLOP/s per GPU)\n", 100 * median,
                  100 * errs.back());
    s += buf;
  }
  return s;
}

}  // namespace sat

namespace sat {

namespace {

std::string median_worst(std::vector<double> errs) {
  if (errs.empty()) return "none";
  std::sort(errs.begin(), errs.end());
  const size_t n = errs.size();
  const double median = n % 2 ? errs[n / 2] : (errs[n / 2 - 1] + errs[n / 2]) / 2;
  return strf("median %.1f%%, worst %.1f%% over %zu run(s)", 100 * median, 100 * errs.back(), n);
}

}  // namespace

std::string comparison_table(const std::vector<CalibrationRow>& rows) {
  std::string s = strf("%-30s %-9s %-88s %9s %9s %7s %9s %9s %7s %9s %s\n", "run", "engine", "predicted layout",
                       "TFLOP/s", "predicted", "error", "memory", "predicted", "error", "peak/GPU", "fits");
  std::vector<double> time_errs, mem_errs;
  int fit = 0;
  for (const CalibrationRow& r : rows) {
    const bool mem = r.run.measured_memory_bytes > 0;
    s += strf("%-30s %-9s %-88s %9s %9s %7s %9s %9s %7s %9s %s\n", r.run.label.c_str(), r.run.engine.c_str(),
              r.predicted.layout.str().c_str(), r.run.timed ? strf("%.1f", r.measured_tflops).c_str() : "-",
              r.run.timed ? strf("%.1f", r.predicted_tflops).c_str() : "-",
              r.run.timed ? strf("%+.1f%%", 100 * r.error).c_str() : "-",
              mem ? format_bytes(r.run.measured_memory_bytes).c_str() : "-",
              mem ? format_bytes(r.predicted_memory).c_str() : "-", mem ? strf("%+.1f%%", 100 * r.memory_error).c_str() : "-",
              format_bytes(r.predicted.memory_bytes).c_str(),
              r.fits ? "yes" : strf("NO (%s)", format_bytes(r.memory_limit).c_str()).c_str());
    if (r.run.timed) time_errs.push_back(std::fabs(r.error));
    if (mem) mem_errs.push_back(std::fabs(r.memory_error));
    fit += r.fits;
  }
  s += strf("speed (TFLOP/s per GPU, the source's count of FLOPs): absolute error %s\n", median_worst(time_errs).c_str());
  s += strf("peak memory against the figure the source reports: absolute error %s\n", median_worst(mem_errs).c_str());
  s += strf("%d of %zu run(s) fit the memory of the device they ran on\n", fit, rows.size());
  return s;
}

}  // namespace sat
