#include "plan/plan_cli.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "dist/comm.h"
#include "plan/calibrate.h"
#include "plan/planner.h"
#include "train/config.h"

namespace sat {

namespace {

void write_file(const std::string& what, const std::string& path, const std::string& text) {
  write_file_atomic(what, path, text);
}

// --memory-budget (train's and tune's name too), or --memory-limit, its old name, which
// still gives the same value; both at once are refused. 0: the hardware's memory.
double memory_budget_of(const PlanArgs& a) {
  SAT_CHECK(a.memory_budget.empty() || a.memory_limit.empty(),
            "--memory-budget and --memory-limit: give one (--memory-limit is the old name of --memory-budget)");
  const bool old_name = !a.memory_limit.empty();
  const std::string& text = old_name ? a.memory_limit : a.memory_budget;
  if (text.empty()) return 0;
  return double(parse_size(old_name ? "--memory-limit" : "--memory-budget", text, kMinMemoryBytes));
}

}  // namespace

PlanRequest plan_request(const PlanArgs& a, const ModelConfig& model, dist::Comm* world) {
  PlanRequest r;
  r.model = model;
  r.model_arg = a.model;
  r.hw = hardware(a.gpu, world);
  r.gpus = a.gpus;
  r.gpus_per_node = a.gpus_per_node > 0 ? a.gpus_per_node : r.hw.gpus_per_node;
  r.global_batch = a.global_batch;
  const std::string prec = a.precision.empty() ? (r.hw.gpu ? "bf16" : "fp32") : a.precision;
  const Precision p = parse_precision(prec);
  r.precision = p == Precision::bf16 ? DType::bf16 : p == Precision::fp16 ? DType::f16 : DType::f32;
  r.hw.tf32_matmul = p == Precision::tf32;
  SAT_CHECK(r.hw.gpu || p == Precision::fp32 || p == Precision::bf16, "--precision ", prec, ": --gpu ", a.gpu,
            " plans the CPU engine, which trains in fp32 or bf16");
  SAT_CHECK(r.hw.peak(r.precision) > 0, "--precision ", prec, ": ", r.hw.name, " has no peak rate for it");
  r.optimizer = a.optimizer;
  check_choice("--optimizer", a.optimizer, {"adamw", "sgd"});
  if (!a.layout.empty()) r.filter = parse_layout(a.layout);
  r.memory_limit = memory_budget_of(a);
  r.top = a.top;
  SAT_CHECK(a.expert_imbalance >= 1 && a.expert_imbalance <= 1e6, "--expert-imbalance ", a.expert_imbalance,
            ": expected the busiest expert rank's tokens over the mean, 1 (balanced) or more");
  r.expert_imbalance = a.expert_imbalance;
  r.runnable_only = a.runnable_only;
  r.engine = engine_model(a.engine);
  return r;
}

namespace {

// --compare: every run predicted on the device it ran on, by its engine's model.
int run_compare(const PlanArgs& a) {
  const std::vector<CalibrationRun> runs = read_runs(a.compare);
  std::printf("%zu run(s) from %s:\n%s", runs.size(), a.compare.c_str(),
              comparison_table(evaluate_runs(runs, hardware(a.gpu, nullptr))).c_str());
  return 0;
}

// --calibrate: the runs predicted with the hardware as given, the efficiencies fitted to
// them, the runs again with the fit (and the planner's own best layout for each), and the
// fitted description written for --gpu.
int run_calibrate(const PlanArgs& a) {
  Hardware hw = hardware(a.gpu, nullptr);
  const std::vector<CalibrationRun> runs = read_runs(a.calibrate);
  std::printf("%zu run(s) from %s, on %s as described:\n%s\n", runs.size(), a.calibrate.c_str(), hw.name.c_str(),
              calibration_table(evaluate_runs(runs, hw)).c_str());
  hw = fit_efficiency(runs, hw, true);
  std::printf("fitted: gemm_max %.4f, memory_eff %.4f, comm_eff %.4f\n%s", hw.eff.gemm_max, hw.eff.memory_eff,
              hw.eff.comm_eff, calibration_table(evaluate_runs(runs, hw, true)).c_str());
  hw.source = "fitted to " + a.calibrate;
  if (!a.json_file.empty()) write_file("--json", a.json_file, hardware_json(hw));
  if (!a.out_dir.empty()) write_file("--out", a.out_dir + "/hardware.json", hardware_json(hw));
  if (!a.json_file.empty() || !a.out_dir.empty())
    std::printf("wrote the fitted description (use it with --gpu FILE): %s\n",
                (a.json_file.empty() ? a.out_dir + "/hardware.json" : a.json_file).c_str());
  return 0;
}

// The outputs, checked before anything is measured or searched: a file name that is a
// directory or a device, a directory that cannot be created or written.
void check_plan_outputs(const PlanArgs& a) {
  if (!a.json_file.empty()) check_output_file("--json", a.json_file);
  if (a.out_dir.empty()) return;
  check_output_dir("--out", a.out_dir);
  for (const char* f : a.calibrate.empty() ? std::vector<const char*>{"plan.json", "plan.html"}
                                           : std::vector<const char*>{"hardware.json"})
    check_output_file("--out", a.out_dir + "/" + f);
}

}  // namespace

void check_plan_args(const PlanArgs& a) {
  SAT_CHECK(a.gpus >= 1, "--gpus: expected a positive number of devices, got ", a.gpus);
  SAT_CHECK(a.global_batch >= 1, "--global-batch is required: expected a positive number of samples per step, got ", a.global_batch);
}

int run_plan(const PlanArgs& a) {
  check_plan_outputs(a);
  if (!a.calibrate.empty()) return run_calibrate(a);
  if (!a.compare.empty()) return run_compare(a);
  check_plan_args(a);
  std::unique_ptr<dist::Comm> world;
  if (a.gpu == "this" && dist::detect_process().distributed()) world = dist::make_world_comm();
  const PlanRequest r = plan_request(a, model_config(a.model), world.get());
  const PlanResult p = plan_layouts(r);
  if (!world || world->rank() == 0) {
    std::printf("%s", plan_text(p, r).c_str());
    if (!a.json_file.empty()) write_file("--json", a.json_file, plan_json(p, r));
    if (!a.out_dir.empty()) {
      write_file("--out", a.out_dir + "/plan.json", plan_json(p, r));
      write_file("--out", a.out_dir + "/plan.html", plan_html(p, r));
      std::printf("wrote %s/plan.json and %s/plan.html\n", a.out_dir.c_str(), a.out_dir.c_str());
    }
  }
  return p.best.empty() || !p.best[0].fits ? 2 : 0;  // nothing fits: said above, as bad input is
}

}  // namespace sat
