// The noise-aware choice of the tuner (tune/contest.h) on a simulated shared machine:
// a known throughput curve, step times with scatter, occasional slow steps and a load
// that drifts over seconds. The choice must reach 97% of the true best in nearly every
// run where a single pass with the old rule (the smallest within 3% of one noisy maximum)
// often does not; a clear knee is found without running out the rounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "core/rng.h"
#include "tune/contest.h"

namespace {

using sat::Contender;
using sat::ProbeTiming;

TEST(TuneContest, ProbeTimingFromStepTimes) {
  ProbeTiming t = sat::time_probe({0.5, 0.1, 0.1, 0.1, 0.1, 0.1}, 32, 2);
  EXPECT_EQ(t.round, 2);
  EXPECT_EQ(t.steps, 6);
  EXPECT_DOUBLE_EQ(t.samples_per_second, 320);  // the median: one slow step does not count
  EXPECT_DOUBLE_EQ(t.iqr_fraction, 0);
  t = sat::time_probe({0.9, 1.0, 1.1, 1.2, 0.8, 1.6, 2.0, 3.0, 0.9}, 10, 0);
  EXPECT_DOUBLE_EQ(t.samples_per_second, 10 / 1.1);
  EXPECT_NEAR(t.iqr_fraction, (1.6 - 0.9) / 1.1, 1e-12);
  EXPECT_NEAR(t.log_se, 1.2533 * (1.6 - 0.9) / 1.349 / 1.1 / 3, 1e-9);
  t = sat::time_probe({1.0, 1.2, 1.1}, 10, 0);  // three steps: sigma from the range
  EXPECT_NEAR(t.log_se, 1.2533 * (0.2 / 1.693) / 1.1 / std::sqrt(3.0), 1e-9);
  EXPECT_EQ(sat::time_probe({}, 10, 0).samples_per_second, 0);
}

// Paired rounds: a machine twice as slow in round 1 changes no ratio.
TEST(TuneContest, RatiosPairRoundsSoThatDriftCancels) {
  std::vector<ProbeTiming> a = {{0, 100, 0.01}, {1, 50, 0.01}}, b = {{0, 80, 0.01}, {1, 40, 0.01}, {2, 1, 0.01}};
  sat::Ratio r = sat::compare(a, b);
  EXPECT_EQ(r.rounds, 2);
  EXPECT_NEAR(r.value(), 1.25, 1e-12);
  EXPECT_NEAR(r.se, std::sqrt(4 * 0.01 * 0.01) / 2, 1e-12);  // no scatter between rounds: the within part
  EXPECT_LT(r.low(1.96), 1.25);
  EXPECT_EQ(sat::compare(a, {{5, 1, 0}}).rounds, 0);
}

// A shared machine, as two cores shared with other people's builds look: every step takes
// micro-batch / (true throughput x speed now) times a lognormal scatter of 5%, one step in
// 20 is 1.5x slower, and other jobs come and go: quiet spells of 4 s and busy ones of 2 s
// on average (exponentially distributed) at 65% of the speed, each spell's speed off by
// another 5% or so.
struct Machine {
  sat::Rng rng;
  std::map<int64_t, double> curve;
  double now = 0, until = 0, level = 1, drift = 1;
  bool shared = true;  // false: a quiet machine: only the steps' scatter (2%) and the slow steps
  double scatter = 0.05;  // the steps' lognormal scatter on the shared machine
  Machine(uint64_t seed, std::map<int64_t, double> c, bool others = true, double spread = 0.05)
      : rng(seed), curve(std::move(c)), shared(others), scatter(spread) {}
  double speed() {
    while (shared && now >= until) {
      const bool busy = level == 1;
      until -= (busy ? 2.0 : 4.0) * std::log(1 - 0.999 * rng.uniform());
      level = busy ? 0.65 : 1;
      drift = std::exp(0.05 * rng.normal());
    }
    return level * drift;
  }
  ProbeTiming probe(int64_t b, int round, double seconds = 0.3) {
    std::vector<double> steps;
    for (double spent = 0; spent < seconds || steps.size() < 3;) {
      double dt = double(b) / (curve.at(b) * speed()) * std::exp((shared ? scatter : 0.02) * rng.normal());
      if (rng.uniform() < 0.05) dt *= 1.5;
      now += dt, spent += dt;
      steps.push_back(dt);
    }
    now += 0.1;  // the probe's set-up and warm-up step
    return sat::time_probe(steps, double(b), round);
  }
  double best() const {
    double m = 0;
    for (auto& [b, v] : curve) m = std::max(m, v);
    return m;
  }
};

struct Outcome {
  int64_t chosen = 0, old_rule = 0;
  int rounds = 0, remeasured = 0, entrants = 0;
  bool settled = false, unsure = false;
};

Outcome choose(Machine& m, const sat::ContestRules& rules) {
  std::vector<Contender> c;
  for (auto& [b, v] : m.curve) c.push_back({b, {m.probe(b, 0)}});
  Outcome o;
  double top = 0;
  for (auto& x : c) top = std::max(top, x.timings[0].samples_per_second);
  for (auto& x : c)
    if (x.timings[0].samples_per_second >= 0.97 * top) { o.old_rule = x.micro_batch; break; }
  o.entrants = int(sat::entrants(c, rules).size());
  sat::ContestOutcome r = sat::run_contest(c, rules, [&](int i, int round) {
    return m.probe(c[size_t(i)].micro_batch, round);
  });
  o.chosen = c[size_t(r.verdict.choice)].micro_batch;
  o.rounds = r.rounds, o.remeasured = r.remeasured, o.settled = r.verdict.settled;
  o.unsure = r.verdict.unsure;
  return o;
}

// mlp's curve on two cores: flat from 512 up, 512 itself 8% short of the best.
const std::map<int64_t, double> kFlat = {{64, 10000}, {128, 10400}, {256, 11600}, {512, 15900},
                                         {1024, 17150}, {1042, 17300}};

TEST(TuneContest, ReachesTheKneeOfTheTrueBestOnANoisyMachine) {
  const int runs = 500;
  int ok = 0, old_ok = 0, rounds = 0, most = 0;
  for (int seed = 1; seed <= runs; ++seed) {
    Machine m(uint64_t(seed), kFlat);
    Outcome o = choose(m, {});
    ok += m.curve.at(o.chosen) >= 0.97 * m.best();
    old_ok += m.curve.at(o.old_rule) >= 0.97 * m.best();
    rounds += o.rounds;
    most = std::max(most, o.remeasured);
    EXPECT_LE(o.remeasured, 4 * o.entrants) << "the rounds' bound";
  }
  std::printf("within 97%% of the true best: %d of %d runs (one pass, old rule: %d); %.1f rounds on average, at most "
              "%d probes again\n", ok, runs, old_ok, double(rounds) / runs, most);
  EXPECT_GE(ok, runs * 97 / 100);
  EXPECT_LE(old_ok, runs * 95 / 100) << "the simulated machine must be noisy enough to fool one pass";
}

// A clear knee (256 as fast as the best, 128 20% short): on a quiet machine it is chosen
// and settled; on the shared one the choice still reaches 97% of the best, and is the
// knee in most runs that settle. When none is told within the knee, the larger 512, as
// fast, is the choice (UnsureChoosesTheLargestNotOut): on the shared machine that costs
// the knee in about 20 of 50 runs (memory, not speed), where the reference used to land on
// 256 or 512 as the noise fell.
TEST(TuneContest, AClearKneeIsFound) {
  const std::map<int64_t, double> knee = {{32, 3000}, {64, 5000}, {128, 8000}, {256, 10000}, {512, 10000}};
  for (bool shared : {false, true}) {
    int at_knee = 0, settled = 0, ok = 0, settled_at_knee = 0;
    for (int seed = 1; seed <= 50; ++seed) {
      Machine m(uint64_t(seed), knee, shared);
      Outcome o = choose(m, {});
      at_knee += o.chosen == 256;
      settled += o.settled;
      ok += m.curve.at(o.chosen) >= 0.97 * m.best();
      settled_at_knee += o.settled && o.chosen == 256;
    }
    std::printf("%s machine: chose the knee in %d of 50 runs (%d of the %d settled), within 97%% of the best in %d\n",
                shared ? "shared" : "quiet", at_knee, settled_at_knee, settled, ok);
    EXPECT_GE(ok, 49);
    EXPECT_GE(settled, shared ? 10 : 45);
    EXPECT_GE(settled_at_knee, shared ? settled * 7 / 10 : settled);
    EXPECT_GE(at_knee, shared ? 10 : 45);
  }
}

// A kept global batch (fastest): the choice is the reference, and reaches 97% of the best
// as the knee rule's does.
TEST(TuneContest, FastestIsTheNoiseAwareBest) {
  sat::ContestRules fastest;
  fastest.fastest = true;
  int ok = 0;
  for (int seed = 1; seed <= 100; ++seed) {
    Machine m(uint64_t(seed), kFlat);
    Outcome o = choose(m, fastest);
    ok += m.curve.at(o.chosen) >= 0.97 * m.best();
  }
  std::printf("fastest: within 97%% of the best in %d of 100 runs\n", ok);
  EXPECT_GE(ok, 97);
}

// Three contenders measured in two rounds, every ratio's interval wide enough to hold both
// the knee and parity: none is within the knee and none is out. By throughput alone the
// choice is then the largest; with offsets (goodput) the reference; a larger one that the
// rounds show clearly slower is out and not chosen.
TEST(TuneContest, UnsureChoosesTheLargestNotOut) {
  auto timing = [](int round, double sps) { return ProbeTiming{round, sps, 0.04, 0.1, 6}; };
  std::vector<Contender> c = {{8, {timing(0, 31), timing(1, 30)}},
                              {16, {timing(0, 30), timing(1, 30.5)}},
                              {23, {timing(0, 30.2), timing(1, 29.8)}}};
  const std::vector<int> all = {0, 1, 2};
  sat::ContestRules rules;
  sat::Verdict v = sat::judge(c, all, rules);
  EXPECT_EQ(v.reference, 0);
  EXPECT_TRUE(v.unsure);
  EXPECT_FALSE(v.settled);
  EXPECT_EQ(v.choice, 2);
  rules.larger_when_unsure = false;
  EXPECT_EQ(sat::judge(c, all, rules).choice, 0) << "goodput keeps the reference";
  rules.larger_when_unsure = true;
  c[2].timings = {{0, 20, 0.01, 0.02, 6}, {1, 20.2, 0.01, 0.02, 6}};  // memory pressure: a third slower
  v = sat::judge(c, all, rules);
  EXPECT_TRUE(v.unsure);
  EXPECT_EQ(v.choice, 1) << "the largest not out";
  c[1].timings = {timing(0, 33), timing(1, 33)};  // 16 clearly ahead of 8, 8 still not out
  c[1].timings[0].log_se = c[1].timings[1].log_se = 0.001;
  c[0].timings = {{0, 32.5, 0.001, 0.01, 6}, {1, 32.6, 0.001, 0.01, 6}};
  v = sat::judge(c, all, rules);
  EXPECT_FALSE(v.unsure) << "8 is within the knee of 16";
  EXPECT_EQ(v.choice, 0);
}

// gpt-mini's curve on two cores (8 is 7% short of the best, 16 and 23 level) on a machine
// twice as noisy as the shared one (10% step scatter, as this project's VM shows at times):
// the rounds often run out with nothing told apart, and then the largest not out reaches
// the knee of the best where the reference (a noisy maximum) often does not.
TEST(TuneContest, WhenUnsureTheLargerSideOfAFlatTopIsSafer) {
  const std::map<int64_t, double> top = {{4, 23}, {8, 29.5}, {16, 31.6}, {23, 31.8}};
  int ok[2] = {0, 0}, unsure = 0;
  for (bool larger : {false, true}) {
    sat::ContestRules rules;
    rules.larger_when_unsure = larger;
    for (int seed = 1; seed <= 200; ++seed) {
      Machine m(uint64_t(seed), top, true, 0.10);
      Outcome o = choose(m, rules);
      ok[larger] += m.curve.at(o.chosen) >= 0.97 * m.best();
      unsure += larger && o.unsure;
    }
  }
  std::printf("noisier machine: within 97%% of the best in %d of 200 runs (the reference when unsure: %d); "
              "unsure in %d\n", ok[1], ok[0], unsure);
  EXPECT_GE(unsure, 20) << "the machine must be noisy enough to leave the rounds unsure";
  EXPECT_GT(ok[1], ok[0]);
  EXPECT_GE(ok[1], 196);
}

// One candidate, or one far ahead of the others: nothing to re-measure beyond the rounds'
// minimum.
TEST(TuneContest, NoRoundsWithoutContenders) {
  std::vector<Contender> one = {{8, {{0, 100, 0.01, 0, 5}}}};
  int calls = 0;
  auto count = [&](int, int) { return ++calls, ProbeTiming{0, 100, 0.01, 0, 5}; };
  sat::ContestOutcome o = sat::run_contest(one, {}, count);
  EXPECT_EQ(o.verdict.choice, 0);
  EXPECT_TRUE(o.verdict.settled);
  EXPECT_EQ(calls, 0);
  std::vector<Contender> apart = {{8, {{0, 50, 0.01, 0, 5}}}, {16, {{0, 100, 0.01, 0, 5}}}};
  o = sat::run_contest(apart, {}, count);
  EXPECT_EQ(o.verdict.choice, 1);
  EXPECT_EQ(calls, 0);
}

}  // namespace
