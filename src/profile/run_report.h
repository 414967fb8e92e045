// saturate report RUN_DIR: one self-contained report.html (inline SVG, no scripts or files
// from elsewhere, like tune.html) from what a run left in its --out directory:
//   summary.json    the run, and where each rank's step time went (ranks[].step_breakdown)
//   metrics.jsonl   loss and throughput per step
//   the traces      (when it ran with --trace: summary.json's trace_dir) one traced step as a
//                   timeline per rank (the schedule's actions, the collectives of each group),
//                   and the memory in use over that step against the plan and the budget.
#pragma once
#include <string>

namespace sat {

// The page. sat::Error naming the file when summary.json or metrics.jsonl is missing or
// not what a run writes; traces that cannot be read are named on the page, not fatal.
std::string run_report_html(const std::string& run_dir);
// Writes RUN_DIR/report.html (atomically); returns its path.
std::string write_run_report(const std::string& run_dir);

}  // namespace sat
