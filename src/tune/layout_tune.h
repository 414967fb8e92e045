// `--layout auto` (saturate tune, saturate train): the layout planner (plan/planner.h) ranks
// the layouts of the job's ranks on this machine, measured (`hardware("this", world)`);
// the top few each train a few timed steps (tune/probe.h); the measured fastest is chosen.
// The planner's prediction stands beside each measurement, so its cost model can be checked
// on the machine at hand.
//
// Every rank runs tune_layout() in lockstep (the measurement of the machine and the probes
// are collective) and all of them return the same choice. The formats only format a
// LayoutTuneResult (layout_report.cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "nn/models.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "train/config.h"

namespace sat {

namespace dist { class Comm; }

struct LayoutTuneConfig {
  int64_t global_batch = 0;  // samples per optimizer step, shared by every layout
  LayoutFilter filter;       // fields the user fixed
  int candidates = 3;        // layouts measured, the planner's best first
  size_t memory_budget = 0;  // bytes per rank; 0: the batch tuner's default (tune.h)
  // Each layout trains a warm-up step, then the steps its predicted step time says fill
  // probe_seconds, at least min_steps of them (and stops after 3 x probe_seconds, at
  // least 3 steps, when the prediction was optimistic).
  double probe_seconds = 1.0;
  int min_steps = 5;
  int progress = 1;          // 0: quiet; 1: a line per step of the tuning on stderr (rank 0)
};

// One layout the planner ranked and the tuner measured.
struct LayoutTrial {
  Prediction predicted;  // the planner's: layout, step time, samples/s, memory of the fullest rank
  double measured_samples_per_second = 0, measured_step_seconds = 0;  // median step, slowest rank
  size_t measured_peak_bytes = 0;  // the most any rank allocated
  int timed_steps = 0;
  std::string failed;  // why it could not be timed (empty: it was)
  bool chosen = false;
};

struct LayoutTuneResult {
  std::string model, data;
  Hardware hw;  // this machine, as measured
  int world = 1;
  int64_t global_batch = 0;
  size_t budget = 0;  // bytes per rank
  std::string budget_source;
  std::string filter;  // the fields fixed, as --layout writes them ("" for none)
  int64_t layouts_searched = 0;
  double plan_seconds = 0, hardware_seconds = 0, tuning_seconds = 0;
  std::vector<LayoutTrial> trials;  // the planner's order
  int chosen = -1;                  // index into trials
  std::string reason;               // one sentence a user can read
  const LayoutTrial& choice() const { return trials.at(size_t(chosen)); }
};

// Runs the whole tuning (collective over base.comm). `base` supplies everything but the
// layout, micro-batch and accumulation (optimizer, seed, threads). test (may be null): the
// evaluation split of the training that follows, whose loader the plans count (tune.h).
// sat::Error (exit 2 in the CLI) for a global batch no layout forms, a budget no layout fits,
// a GPU device.
LayoutTuneResult tune_layout(const ModelConfig& mc, const TrainConfig& base, const Dataset& train, const Dataset* test,
                             const LayoutTuneConfig& cfg);

// The fields --layout fixes, as it writes them ("tp=2,zero=1"; "" for none).
std::string filter_str(const LayoutFilter& f);

// "dp=2,tp=1,... (measured N samples/s; predicted M)": train's line about the choice.
std::string layout_choice_line(const Layout& l, double measured, double predicted);

// The cached choice in a tune.json written by layout_tune_json: false when the file is not
// there or is not one (then tune again).
bool read_layout_choice(const std::string& path, Layout& l, double& measured, double& predicted);
// The same, read by rank 0 and shared with every rank of comm (collective).
bool shared_layout_choice(dist::Comm* comm, const std::string& path, Layout& l, double& measured, double& predicted);

// Reports: the table rank 0 prints, tune.json (`layouts`, `layout_choice`) and a
// self-contained tune.html with predicted beside measured (layout_report.cpp).
std::string layout_tune_text(const LayoutTuneResult& r);
std::string layout_tune_json(const LayoutTuneResult& r);
std::string layout_tune_html(const LayoutTuneResult& r);

}  // namespace sat
