// Finding the batch size: the largest micro-batch that fits a memory budget, computed
// from the exact memory plan (nothing that could fail is tried); a few timed probes at
// geometrically spaced micro-batches up to it; the throughput knee; the gradient noise
// scale measured while training; and the learning rate scaled to the chosen batch.
//
// Data flow: tune() reads the model, the data and a TuneConfig, runs short Trainer runs
// (the same engine that trains afterwards) and returns a TuneResult; tune_json() and
// tune_html() only format a TuneResult. Under mpirun every rank runs tune() in lockstep
// (probes are data-parallel runs) and rank 0's choice is broadcast, so all ranks agree.
//
// Noise: on a shared machine one probe's throughput is off by several percent, as much as
// the knee. Every probe reports the spread of its step times, candidates within the noise
// of each other are re-measured in interleaved rounds (tune/contest.h), and the choice
// compares against the noise-aware best. The gradient noise scale comes with a 95%
// interval, or is "not measurable yet" (train/noise.h).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "nn/models.h"
#include "train/noise.h"
#include "train/trainer.h"
#include "tune/contest.h"

namespace sat {

struct TuneConfig {
  // Bytes each rank may use. 0: the GPU's free memory less a reserve, or on the CPU the
  // available system memory less a reserve.
  size_t memory_budget = 0;
  int64_t global_batch = 0;            // 0: free; otherwise kept (micro-batch x accum x ranks)
  std::string objective = "throughput";  // throughput | goodput
  double knee = 0.03;                  // smallest micro-batch within this of the best throughput
  int64_t max_micro_batch = 0;         // 0: no cap beyond memory and the training set
  // Without a global batch: the largest global batch considered leaves at least this many
  // optimizer steps per epoch (0: none). A batch as large as the training set fits memory
  // on the CPU and is often the fastest per sample, but it takes one step per epoch:
  // progress comes from steps, so the tuner never trades them all away for throughput.
  int64_t min_steps_per_epoch = 50;
  double probe_seconds = 0.3;          // timed seconds per probe (after one warm-up step; at least 3
                                       // timed steps; throughput from the median step time)
  int probe_min_steps = 6;             // timed steps per probe at least (quartiles of the step times)
  int rounds = 4;                      // re-measurement rounds of the contenders at most (tune/contest.h)
  // The gradient noise scale: the small batch is the chosen micro-batch, at most
  // noise_max_small (less when the training set is small or a step would be slow), the big
  // one noise_ratio times it (accumulation x ranks); steps run until the 95% interval is at
  // most noise_tolerance x the estimate wide, or a cap. (tr(Sigma) comes from the
  // difference |G_b|^2 - |G_B|^2 ~ tr(Sigma) / b, lost in the step-to-step change of |G|^2
  // once b is well above the noise scale, which at initialisation is tens to hundreds.)
  int64_t noise_max_small = 32;
  int noise_ratio = 16;
  int noise_steps = 100;               // cap on the steps (0: no measurement)
  double noise_seconds = 20;           // cap on their time
  double noise_tolerance = 0.5;
  // A cost model's throughput (global samples/s) at a micro-batch, when one is given: the
  // probes go around its best and its knee instead of every power of two, and every
  // candidate reports it beside the measured figure.
  std::function<double(int64_t micro_batch)> predicted_samples_per_second;
  // Learning-rate scaling: base.optim.lr is the user's rate at this global batch.
  int64_t lr_batch = 64;
  int progress = 1;                    // 0: quiet; 1: a line per probe on stderr
};

// One micro-batch size considered.
struct TuneCandidate {
  int64_t micro_batch = 0;
  size_t predicted_memory_bytes = 0;  // the plan (per rank)
  size_t measured_peak_bytes = 0;     // 0 when not probed
  double samples_per_second = 0;      // global, over its rounds (tune/contest.h); 0 when not probed
  double samples_per_second_low = 0, samples_per_second_high = 0;  // its 95% interval
  double step_time_iqr_fraction = 0;  // the spread of its step times: IQR / median (median over its probes)
  // Its throughput over the reference's (the noise-aware best), round by round, with the
  // 95% interval; 0 when not probed.
  double ratio_to_best = 0, ratio_to_best_low = 0, ratio_to_best_high = 0;
  double predicted_samples_per_second = 0;  // the cost model's; 0 without one
  double statistical_efficiency = 1;  // Pollux: (noise + B0) / (noise + B), B0 = smallest global batch
  double goodput = 0;                 // samples_per_second * statistical_efficiency
  int timed_steps = 0;                // over all its probes
  std::vector<ProbeTiming> timings;   // one per probe: the first pass (round 0), then re-measurements
  bool probed = false;
  bool fits = true;                   // predicted_memory_bytes <= budget
};

// How noisy the throughputs were, and what the rounds made of it.
struct ThroughputNoise {
  double step_time_iqr_fraction = 0;  // median over every probe
  double round_to_round = 0;          // rms scatter of the contenders' log ratios between rounds (0: one round)
  int rounds = 0;                     // re-measurement rounds run
  int remeasured = 0;                 // probes they took
  bool settled = false;               // the knee rule decided before the rounds ran out
  int64_t reference = 0;              // the noise-aware best micro-batch
  std::string rule;                   // what decided, in words
  bool unsure = false;                // the rounds confirmed none within the knee (tune/contest.h)
};

// A memory lever the tuner considered: ZeRO stages and activation recomputation let a
// larger micro-batch fit the same budget, at a cost in communication or compute.
struct TuneLever {
  std::string name;               // "ZeRO-2", "recompute selective", ...
  int zero = 0;
  Recompute recompute = Recompute::none;
  int64_t max_micro_batch = 0;    // the largest micro-batch its plan fits in the budget
  int64_t micro_batch = 0;        // the one probed with it (0: not probed)
  size_t predicted_memory_bytes = 0;  // its plan at micro_batch
  size_t measured_peak_bytes = 0;
  double samples_per_second = 0;  // global
};

struct TuneChoice {
  int64_t micro_batch = 0, accum = 1, global_batch = 0;
  int zero = 0;                    // the lever chosen (ZeRO stage; recompute mode)
  Recompute recompute = Recompute::none;
  float lr = 0;                // scaled from the user's lr at lr_batch
  std::string lr_rule;         // "linear (SGD)" | "square root (Adam family)"
  double warmup_fraction = 0;  // of the training steps, linear warm-up (0: none)
  std::string reason;          // one sentence a user can read
};

// One step of the noise-scale measurement (two-batch estimator).
struct NoisePoint {
  int64_t step = 0;
  double small_sq = 0, big_sq = 0;  // |G_small|^2, |G_big|^2
  int64_t b_small = 0, b_big = 0;
  double estimate = 0;              // B_simple from the sums so far (0 until measurable)
  double low = 0, high = 0;         // its 95% interval so far (0 until measurable)
};

struct TuneResult {
  std::string model, data, device;
  int world = 1;
  size_t budget = 0;                  // bytes per rank
  std::string budget_source;          // "--memory-budget", "free GPU memory less 5%", ...
  int64_t max_micro_batch = 0;        // largest that the plan fits in the budget
  size_t max_predicted_bytes = 0;
  size_t confirm_peak_bytes = 0;      // the confirming step at max_micro_batch
  int failed_allocations = 0;         // allocations refused by the budget during tuning
  std::vector<TuneCandidate> candidates;  // every probed size, ascending (plus max)
  // When the budget cannot hold a micro-batch that could be faster than the largest that
  // fits: the levers considered, cheapest first (empty when not needed, or when the user
  // chose --zero or --recompute).
  std::vector<TuneLever> levers;
  int probes = 0;                     // timed probes of the first pass (and a lever's)
  ThroughputNoise throughput_noise;
  double knee = 0.03;
  std::string objective;
  int64_t requested_global_batch = 0;
  double noise_scale = 0;             // B_simple; 0 when not measurable (yet)
  NoiseInterval noise_interval;       // its 95% interval, or why it is not measurable
  int64_t noise_b_small = 0, noise_b_big = 0;
  std::vector<NoisePoint> noise;
  TuneChoice choice;
  double tuning_seconds = 0;
};

// NoiseScale, the two-batch estimator of the gradient noise scale: train/noise.h.


// Pollux's statistical efficiency of global batch `batch` relative to `ref`:
// (noise + ref) / (noise + batch); 1 when the noise scale is unknown (0).
double statistical_efficiency(double noise_scale, int64_t ref, int64_t batch);

// The tuners' default memory budget on the CPU without --memory-budget: the available host
// memory less 20%, shared by the `world` ranks of the host; `source` says so.
size_t default_host_budget(int world, std::string& source);

// Runs the whole tuning. `base` supplies everything but batch/accum/steps (optimizer,
// seed, device, precision, comm). Throws sat::Error on bad settings (exit 2 in the CLI),
// e.g. when not even a micro-batch of 1 fits the budget.
// `test` (may be null): the evaluation split of the training that follows, whose loader
// buffers count in the memory that must fit.
TuneResult tune(const ModelConfig& model, const TrainConfig& base, const Dataset& train, const Dataset* test,
                const TuneConfig& cfg);

// The learning rate for global batch `batch`, given `lr` at `ref_batch`: linear for SGD,
// square root for AdamW. Sets rule to a short description.
float scale_lr(const std::string& optimizer, float lr, int64_t ref_batch, int64_t batch, std::string* rule = nullptr);

// Formats: tune.json (the fields listed in the README) and a self-contained HTML report
// with inline SVG plots (tune_report.cpp).
std::string tune_json(const TuneResult& r);
std::string tune_html(const TuneResult& r);

// The choice in a tune.json that tune_json wrote (the `--batch auto` cache), read like any
// input: a damaged or hostile file is a sat::Error naming the key and what is wrong, never
// a micro-batch above max_batch, an integer out of range or a learning rate that is not a
// positive number. The choice's global batch is micro-batch x accumulation x world.
TuneChoice read_tune_choice(const std::string& path, int64_t max_batch, int world);

}  // namespace sat
