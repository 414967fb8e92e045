// Calibrating the cost model: runs whose speed was measured (by the user, or published), the
// planner's prediction of each, and a fit of the hardware's efficiency parameters to them
// (`saturate plan --calibrate RUNS.json`).
//
// RUNS.json is either saturate's format
//   {"runs": [{"model": "gpt:layers=24,...", "gpus": 32, "gpus_per_node": 8, "global_batch": 512,
//              "layout": "tp=1,pp=1,schedule=interleaved,recompute=full", "precision": "bf16",
//              "step_seconds": 2.1  |  "samples_per_second": 243  |  "tflops_per_gpu": 137}]}
// (tflops_per_gpu: saturate's count of the model's FLOPs, forward and backward, no
// recomputation), or a published table in the form of Narayanan et al.'s Table 1
// ({"setup": {...}, "rows": [...]}, as in bench/plan/published/sc21-table1.json): GPT models
// with tensor size t, pipeline size p, d = gpus / (t p), the interleaved schedule, full
// recomputation, bf16 and the gradient all-reduce after the pipeline's flush (not overlapped
// with backward, as Megatron-LM did then), the micro-batch and virtual stages chosen by the
// search among those that fit the device, their TFLOP/s per GPU counted by the paper's formula
// 96 B s l h^2 (1 + s / 6h + V / 16 l h).
#pragma once
#include <string>
#include <vector>

#include "plan/planner.h"

namespace sat {

struct CalibrationRun {
  std::string label;
  ModelConfig model;
  int gpus = 1, gpus_per_node = 8;
  int64_t global_batch = 1;
  DType precision = DType::bf16;
  LayoutFilter layout;
  double measured_step_seconds = 0;
  double flops_per_step = 0;  // the FLOPs its TFLOP/s figure counts (0: saturate's model FLOPs)
  bool overlap_dp = true;     // its engine overlaps the gradient reduction with backward
  std::string engine = "saturate";  // the engine that ran it (--engine's names: its memory model)
  std::string gpu;            // the device it ran on (a kind or a file), when not the one given
  std::string source;         // where the figures come from (a paper's table, a repository's file)
  bool timed = true;          // it gives a speed (a run may give its peak memory only)
  double measured_memory_bytes = 0;  // the peak memory per GPU it reports (0: none)
};

// sat::Error naming the file and the key that is missing or wrong.
std::vector<CalibrationRun> read_runs(const std::string& path);

struct CalibrationRow {
  CalibrationRun run;
  Prediction predicted;        // the fastest layout within the run's fixed fields
  double measured_tflops = 0;  // per GPU, by the run's count of FLOPs
  double predicted_tflops = 0;
  double error = 0;            // predicted / measured - 1
  bool fits = false;           // the predicted layout fits the device's memory
  Prediction own_best;         // the planner's own best layout for the same job (when asked)
  double memory_limit = 0;     // the device's memory it ran in
  double predicted_memory = 0; // as the run's engine reports it (formula engines: the allocator's peak)
  double memory_error = 0;     // predicted_memory / measured_memory_bytes - 1 (when measured)
};

// Each run predicted on hw (the layout's free fields chosen by the search); with `own_best`,
// also the planner's unconstrained best for the same devices and batch; exact: the memory of
// the layouts from their exact plans (false: the search's estimate, while fitting).
std::vector<CalibrationRow> evaluate_runs(const std::vector<CalibrationRun>& runs, const Hardware& hw,
                                          bool own_best = false, bool exact = true);

// Fits hw.eff.gemm_max, memory_eff and comm_eff to the runs (least squares of the log ratio
// of predicted to measured speed); returns the hardware with them.
Hardware fit_efficiency(const std::vector<CalibrationRun>& runs, Hardware hw, bool progress = false);

// The table `saturate plan --calibrate` prints.
std::string calibration_table(const std::vector<CalibrationRow>& rows);
// The table `saturate plan --compare RUNS.json` prints: each run's published speed and peak
// memory against the prediction, whether it fits the device it ran on, and the errors'
// median and worst.
std::string comparison_table(const std::vector<CalibrationRow>& rows);

}  // namespace sat
