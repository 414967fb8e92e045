#include "plan/calibrate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

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
    run.label = str_cat(r.contains("params_b") ? str_cat(r.at("params_b").number(), "B") : std::string("GPT"), " t", tp,
                        " p", pp, " d", run.layout.dp.value());
    out.push_back(run);
  }
  return out;
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
  run.precision = r.contains("precision") ? parse_named(r.at("precision").where(), r.at("precision").string(), kPrecisions)
                                          : DType::bf16;
  if (r.contains("step_seconds")) {
    run.measured_step_seconds = number(r, "step_seconds");
  } else if (r.contains("samples_per_second")) {
    run.measured_step_seconds = double(run.global_batch) / number(r, "samples_per_second");
  } else {
    if (!r.contains("tflops_per_gpu")) r.fail("needs one of 'step_seconds', 'samples_per_second', 'tflops_per_gpu'");
    run.flops_per_step = -number(r, "tflops_per_gpu");  // resolved once the model's FLOPs are known
  }
  return run;
}

}  // namespace

std::vector<CalibrationRun> read_runs(const std::string& path) {
  const JsonRef j = JsonRef::parse_file(path, "--calibrate");
  if (j.is_object() && j.contains("rows")) return megatron_rows(j);
  std::vector<CalibrationRun> out;
  for (const JsonRef& r : non_empty_list(j, "runs").items()) out.push_back(saturate_run(r));
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
