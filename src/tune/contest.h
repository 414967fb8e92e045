// Telling throughputs apart on a noisy machine. A probe's throughput is the micro-batch
// over the median of its step times (what training at that size will see, slow steps
// included: a size whose steps run into memory pressure is slower, not unlucky), and its
// noise the standard error of that median, from the interquartile range of the step
// times. Candidates whose throughputs are within that noise of each other are probed
// again in interleaved rounds (each round every contender once, the order reversed from
// one round to the next), and compared round by round:
// the log ratio of two candidates' throughputs in the same round, averaged over the rounds
// they share (the median from three rounds on: a round that other work hit halfway is an
// outlier), so that a machine that slows down for a while slows both alike and the
// slowdown cancels. The uncertainty of a ratio is the larger of what the step times say
// (within rounds) and what the rounds' scatter says (between rounds).
//
// Knee rule, noise-aware: a candidate is *within the knee* when, against every other
// contender, the lower end of its ratio's interval is at least 1 - knee; it is *out* when
// the upper end of its ratio's interval against some contender is below 1 - knee. The
// choice is the smallest candidate within the knee once every smaller one is out
// (settled); when the rounds run out first, it is the smallest within the knee. When none
// is, the noise could not tell the contenders apart: by throughput alone the choice is then
// the largest that is not out (a larger micro-batch spreads each step's fixed cost over
// more samples, so on a curve flat within the noise it is the safer side of the knee; one
// that memory pressure slows is out), and otherwise (goodput weighs smaller batches up)
// the *reference* (the noise-aware best): the contender whose log ratios to the others,
// round by round, add up to the most. With `fastest` (a kept global batch) the choice is
// the reference, settled once it is within the knee of every other.
//
// Nothing here runs anything: measure() is the caller's (the tuner's probes; a simulated
// machine in the tests).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sat {

struct ProbeTiming {
  int round = 0;                  // 0: the first pass over the sizes; 1, 2, ...: re-measurement rounds
  double samples_per_second = 0;  // samples per step / median step time
  double log_se = 0;              // standard error of log(samples_per_second)
  double iqr_fraction = 0;        // interquartile range of the step times / their median
  int steps = 0;
};

// One probe's timing from its step times (after warm-up). The median's standard error is
// 1.2533 sigma / sqrt(n) with sigma = IQR / 1.349 (from the range for fewer than 4 steps).
ProbeTiming time_probe(std::vector<double> step_seconds, double samples_per_step, int round);

// log(a / b) of two throughputs with its standard error, over the rounds both were
// measured in.
struct Ratio {
  double log = 0, se = 0;
  int rounds = 0;  // 0: no round in common (nothing known)
  double low(double z) const;   // exp(log - z se)
  double high(double z) const;  // exp(log + z se)
  double value() const;
};
Ratio compare(const std::vector<ProbeTiming>& a, const std::vector<ProbeTiming>& b);

struct Contender {
  int64_t micro_batch = 0;
  std::vector<ProbeTiming> timings;  // by round
  double log_offset = 0;             // added to log throughput (goodput: log statistical efficiency)
};

// A contender's log throughput over its rounds (plus its offset; mean or median as for
// ratios) and its standard error.
struct Estimate {
  double log = 0, se = 0;
};
Estimate estimate(const Contender& c);

struct ContestRules {
  double knee = 0.03;
  int max_rounds = 4;   // re-measurement rounds at most
  // Rounds run even when the first pass looks settled: probes taken one after another at
  // different moments share no drift, so one pass alone decides nothing.
  int min_rounds = 1;
  double z = 1.96;      // two-sided 95%
  bool fastest = false; // a kept global batch: the fastest, not the smallest within the knee
  // Entrants: the interval of the ratio to the leader after the first pass reaches within
  // this many knees (a pass of probes one after another is exposed to drift).
  double entry = 3;
  // Unsettled with none within the knee: the largest not out (throughput alone), or the
  // reference (false: offsets such as goodput's favour smaller batches).
  bool larger_when_unsure = true;
};

struct Verdict {
  int choice = -1;           // index into the contenders
  int reference = -1;        // the noise-aware best
  bool settled = false;
  bool unsure = false;       // none within the knee: chosen by larger_when_unsure or as the reference
  std::vector<int> members;  // still contending (what the next round measures), ascending micro-batch
};

// The contenders after the first pass: the leader (the fastest), every larger micro-batch
// (one measured slower may have met a busy moment, and on a rising curve the best is at
// the top), and every smaller one whose ratio's interval reaches within `entry` knees of
// the leader. Indices, ascending micro-batch.
std::vector<int> entrants(const std::vector<Contender>& c, const ContestRules& rules);
Verdict judge(const std::vector<Contender>& c, const std::vector<int>& members, const ContestRules& rules);

struct ContestOutcome {
  Verdict verdict;
  int rounds = 0;      // re-measurement rounds run
  int remeasured = 0;  // probes they took
};
// Re-measures the entrants (measure(index, round) times contender `index` again; rounds
// are numbered on from the highest in the timings) for at
// least min_rounds and until the verdict is settled or max_rounds have run; a timing with no
// throughput is dropped. Nothing runs when only one candidate contends.
ContestOutcome run_contest(std::vector<Contender>& c, const ContestRules& rules,
                           const std::function<ProbeTiming(int index, int round)>& measure);

}  // namespace sat
