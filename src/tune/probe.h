// A timed probe: a short training run of one configuration on the engine that trains
// afterwards (tune/layout_tune.h times whole layouts with it). One warm-up step, then timed
// steps until `seconds` have passed (at least 3), and the throughput from the median step
// time: one step delayed by other work on the machine does not move it.
//
// Collective: every rank of c.comm runs it together, and every rank gets the job's figures
// (the slowest rank's median step, the largest peak of any rank), so all of them can
// compare probes alike.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "nn/models.h"
#include "train/config.h"

namespace sat {

struct TimedRun {
  double samples_per_second = 0;     // global batch / median step time (0: not measured)
  double median_step_seconds = 0;    // the slowest rank's median
  std::vector<double> step_seconds;  // this rank's timed steps
  size_t peak_bytes = 0;             // the most any rank allocated
  size_t planned_bytes = 0;          // the most any rank's plan holds
  int timed_steps = 0;
  std::string refused;               // an allocation the budget refused (empty: none)
};

// The configuration a probe trains: `base` (layout, micro-batch, accumulation, optimizer)
// for at most max_steps steps, stopping once `seconds` of timed steps have run, with one
// warm-up step and no evaluation, output, profile, trace, learning-rate schedule or noise scale
// (seconds 0: no time limit).
TrainConfig timed_config(const TrainConfig& base, int64_t max_steps, double seconds);

// The median of a list of seconds (0 for none).
double median_seconds(std::vector<double> s);

// Trains c (from timed_config) on `train` and times it. test (may be null): the evaluation
// split of the training that follows, whose loader's buffers count in its memory; the probe
// holds them too, so that its peak is the training's, and evaluates its first batch once at
// the end (not timed).
TimedRun timed_run(const ModelConfig& mc, const TrainConfig& c, const Dataset& train, const Dataset* test = nullptr);

}  // namespace sat
