#include "plan/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/alloc.h"
#include "core/error.h"

namespace sat {

namespace {

using json = nlohmann::json;

// A key of an object, with the file and the key's path in the error.
const json& at(const json& j, const std::string& key, const std::string& where) {
  SAT_CHECK(j.is_object() && j.contains(key), where, ": missing key '", key, "'");
  return j[key];
}

double number(const json& j, const std::string& key, const std::string& where) {
  const json& v = at(j, key, where);
  SAT_CHECK(v.is_number(), where, ": key '", key, "': expected a number");
  const double x = v.get<double>();
  SAT_CHECK(x > 0 && std::isfinite(x), where, ": key '", key, "': expected a positive number, got ", x);
  return x;
}

std::string text(const json& j, const std::string& key, const std::string& where) {
  const json& v = at(j, key, where);
  SAT_CHECK(v.is_string(), where, ": key '", key, "': expected a string");
  return v.get<std::string>();
}

std::vector<CalibrationRun> megatron_rows(const json& j, const std::string& path) {
  const json& setup = at(j, "setup", path);
  const double s = number(setup, "seq_len", path + ": setup"), V = number(setup, "vocab", path + ": setup");
  const json& rows = at(j, "rows", path);
  SAT_CHECK(rows.is_array() && !rows.empty(), path, ": key 'rows': expected a non-empty array");
  std::vector<CalibrationRun> out;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string w = str_cat(path, ": rows[", i, "]");
    const json& r = rows[i];
    const double l = number(r, "layers", w), h = number(r, "hidden", w), B = number(r, "batch", w);
    CalibrationRun run;
    run.model = model_config(str_cat("gpt:layers=", int64_t(l), ",heads=", int64_t(number(r, "heads", w)), ",width=",
                                     int64_t(h), ",context=", int64_t(s), ",vocab=", int64_t(V)));
    run.gpus = int(number(r, "gpus", w));
    run.global_batch = int64_t(B);
    const int tp = int(number(r, "tp", w)), pp = int(number(r, "pp", w));
    SAT_CHECK(run.gpus % (tp * pp) == 0, w, ": gpus ", run.gpus, " do not divide by tp x pp = ", tp * pp);
    run.layout.tp = tp, run.layout.pp = pp, run.layout.dp = run.gpus / (tp * pp);
    if (pp > 1) run.layout.schedule = PipeSchedule::interleaved;
    run.layout.recompute = Recompute::full, run.layout.sp = false, run.layout.zero = 0;
    run.flops_per_step = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    run.measured_step_seconds = run.flops_per_step / (number(r, "tflops_per_gpu", w) * 1e12 * run.gpus);
    run.overlap_dp = false;
    run.label = str_cat(r.contains("params_b") ? str_cat(r["params_b"].get<double>(), "B") : std::string("GPT"),
                        " t", tp, " p", pp, " d", run.layout.dp.value());
    out.push_back(run);
  }
  return out;
}

CalibrationRun saturate_run(const json& r, const std::string& w) {
  CalibrationRun run;
  run.model = model_config(text(r, "model", w));
  run.label = r.contains("label") ? text(r, "label", w) : run.model.name;
  run.gpus = int(number(r, "gpus", w));
  run.gpus_per_node = r.contains("gpus_per_node") ? int(number(r, "gpus_per_node", w)) : 8;
  run.global_batch = int64_t(number(r, "global_batch", w));
  if (r.contains("layout")) run.layout = parse_layout(text(r, "layout", w));
  if (r.contains("overlap_dp")) {
    SAT_CHECK(r["overlap_dp"].is_boolean(), w, ": key 'overlap_dp': expected true or false");
    run.overlap_dp = r["overlap_dp"].get<bool>();
  }
  const std::string prec = r.contains("precision") ? text(r, "precision", w) : "bf16";
  SAT_CHECK(prec == "bf16" || prec == "fp16" || prec == "fp32", w, ": key 'precision': expected bf16, fp16 or fp32");
  run.precision = prec == "bf16" ? DType::bf16 : prec == "fp16" ? DType::f16 : DType::f32;
  if (r.contains("step_seconds")) {
    run.measured_step_seconds = number(r, "step_seconds", w);
  } else if (r.contains("samples_per_second")) {
    run.measured_step_seconds = double(run.global_batch) / number(r, "samples_per_second", w);
  } else {
    SAT_CHECK(r.contains("tflops_per_gpu"), w, ": needs one of 'step_seconds', 'samples_per_second', 'tflops_per_gpu'");
    run.flops_per_step = -number(r, "tflops_per_gpu", w);  // resolved once the model's FLOPs are known
  }
  return run;
}

}  // namespace

std::vector<CalibrationRun> read_runs(const std::string& path) {
  std::ifstream f(path);
  SAT_CHECK(f.good(), "--calibrate ", path, ": cannot open the file");
  json j;
  try {
    j = json::parse(f);
  } catch (const json::parse_error& e) {
    fail("--calibrate ", path, ": not valid JSON (", e.what(), ")");
  }
  if (j.is_object() && j.contains("rows")) return megatron_rows(j, path);
  const json& runs = at(j, "runs", path);
  SAT_CHECK(runs.is_array() && !runs.empty(), path, ": key 'runs': expected a non-empty array");
  std::vector<CalibrationRun> out;
  for (size_t i = 0; i < runs.size(); ++i) out.push_back(saturate_run(runs[i], str_cat(path, ": runs[", i, "]")));
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
  return r;
}

}  // namespace

std::vector<CalibrationRow> evaluate_runs(const std::vector<CalibrationRun>& runs, const Hardware& hw, bool own_best,
                                          bool exact) {
  std::vector<CalibrationRow> rows;
  for (const CalibrationRun& run : runs) {
    CalibrationRow row;
    row.run = run;
    // The run's free fields among those that fit the device; if none does, the fastest anyway.
    PlanResult p = plan_layouts(request_for(run, hw, exact));
    if (p.best.empty()) {
      PlanRequest any = request_for(run, hw, exact);
      any.memory_limit = 1e30;
      p = plan_layouts(any);
    }
    SAT_CHECK(!p.best.empty(), run.label, ": no layout forms this run");
    row.predicted = p.best[0];
    row.fits = row.predicted.memory_bytes <= hw.memory_bytes;
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
      PlanRequest free = request_for(run, hw, exact);
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
  for (const CalibrationRow& r : evaluate_runs(runs, hw, false, false)) sum += std::pow(std::log1p(r.error), 2);
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
