// The batch-size tuner: the noise-scale estimator against a closed form, budgets that
// admit only small batches (the tuner stays inside them with no refused allocation and
// the plan matches every measured peak), learning-rate scaling, and budget enforcement.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/blas.h"
#include "core/alloc.h"
#include "core/error.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "nn/models.h"
#include "train/trainer.h"
#include "tune/tune.h"

namespace {

using sat::TuneConfig;
using sat::TuneResult;

// Linear regression y = x.w* + e with x ~ N(0, I_d), e ~ N(0, s^2) and the loss
// (x.w - y)^2 / 2: the per-sample gradient at w = w* + d is g = (x.d - e) x, so
// G = d and Sigma = |d|^2 I + d d^T + s^2 I (Isserlis), hence
// B_simple = tr(Sigma) / |G|^2 = ((D + 1) |d|^2 + D s^2) / |d|^2.
struct LinearRegression {
  static constexpr int D = 20, b = 16, B = 128;
  sat::Rng rng{11};
  std::vector<double> delta = std::vector<double>(D), x = std::vector<double>(D), gs = std::vector<double>(D),
                      gb = std::vector<double>(D);
  LinearRegression() {
    double d2 = 0;
    for (auto& v : delta) v = rng.normal(), d2 += v * v;
    for (auto& v : delta) v /= std::sqrt(d2);  // |d| = 1
  }
  static double truth(double noise_var) { return (D + 1) + D * noise_var; }
  // One step: the squared norms of the first micro-batch's gradient (b) and the step's (B).
  void step(sat::NoiseScale& ns, double noise_var) {
    std::fill(gs.begin(), gs.end(), 0.0);
    std::fill(gb.begin(), gb.end(), 0.0);
    for (int i = 0; i < B; ++i) {
      double xd = 0;
      for (int k = 0; k < D; ++k) x[k] = rng.normal(), xd += x[k] * delta[k];
      const double r = xd - std::sqrt(noise_var) * rng.normal();
      for (int k = 0; k < D; ++k) {
        gb[k] += r * x[k] / B;
        if (i < b) gs[k] += r * x[k] / b;  // the first micro-batch of the step
      }
    }
    double s2 = 0, b2 = 0;
    for (int k = 0; k < D; ++k) s2 += gs[k] * gs[k], b2 += gb[k] * gb[k];
    ns.add(s2, b, b2, B);
  }
};

TEST(NoiseScale, MatchesTheClosedFormOfLinearRegression) {
  for (double noise_var : {0.0, 4.0}) {
    LinearRegression lr;
    const double truth = LinearRegression::truth(noise_var);
    sat::NoiseScale ns;
    for (int s = 0; s < 400; ++s) lr.step(ns, noise_var);
    std::printf("noise variance %.0f: B_simple estimate %.1f, closed form %.1f (|G|^2 %.3f, tr %.1f)\n", noise_var,
                ns.estimate(), truth, ns.gradient_sq(), ns.trace());
    EXPECT_NEAR(ns.estimate(), truth, 0.2 * truth);
    EXPECT_NEAR(ns.gradient_sq(), 1.0, 0.2);
    const sat::NoiseInterval iv = ns.interval();  // real per-sample gradients, not Gaussian
    std::printf("  95%% interval [%.1f, %.1f]\n", iv.low, iv.high);
    EXPECT_TRUE(iv.measurable) << iv.reason;
    EXPECT_LE(iv.low, truth);
    EXPECT_GE(iv.high, truth);
  }
}

// Training's moving averages (decay 0.95) follow a noise scale that changes: after the
// label noise grows from 0 to 4, the estimate moves from 21 to 101, while the plain mean
// over all steps stays in between.
TEST(NoiseScale, MovingAverageFollowsAChangingNoiseScale) {
  LinearRegression lr;
  sat::NoiseScale ema(0.95), mean;
  for (int s = 0; s < 300; ++s) {
    lr.step(ema, 0.0);
    lr.step(mean, 0.0);
  }
  const double before = ema.estimate();
  for (int s = 0; s < 300; ++s) {
    lr.step(ema, 4.0);
    lr.step(mean, 4.0);
  }
  std::printf("moving average: %.1f before (truth %.0f), %.1f after (truth %.0f); plain mean after: %.1f\n", before,
              LinearRegression::truth(0), ema.estimate(), LinearRegression::truth(4), mean.estimate());
  EXPECT_NEAR(before, LinearRegression::truth(0), 0.3 * LinearRegression::truth(0));
  EXPECT_NEAR(ema.estimate(), LinearRegression::truth(4), 0.3 * LinearRegression::truth(4));
  EXPECT_LT(mean.estimate(), 0.8 * LinearRegression::truth(4));
  // Bias-corrected: after a single step the average is that step's value, whatever the decay.
  sat::NoiseScale one(0.95), plain;
  one.add(3.0, 4, 2.0, 8);  // |G|^2 = (16 - 12) / 4 = 1, tr = (3 - 2) / (1/4 - 1/8) = 8
  plain.add(3.0, 4, 2.0, 8);
  EXPECT_DOUBLE_EQ(one.estimate(), 8.0);
  EXPECT_DOUBLE_EQ(plain.estimate(), 8.0);
}

// Synthetic gradients with a known noise scale: every micro-batch of b samples has the
// gradient G + N(0, Sigma / b) (independent), a step accumulates K of them, and the
// estimator sees |first micro-batch|^2 and |their mean|^2: B_simple = tr(Sigma) / |G|^2.
struct GaussianGradients {
  static constexpr int D = 64;
  sat::Rng rng;
  std::vector<double> G = std::vector<double>(D), sd = std::vector<double>(D);
  double trace = 0, g2 = 0;
  // |G|^2 = g2; Sigma diagonal with unequal variances summing to `trace`.
  GaussianGradients(uint64_t seed, double g2_, double trace_) : rng(seed), trace(trace_), g2(g2_) {
    double w = 0;
    for (int k = 0; k < D; ++k) w += 1.0 + k % 7;
    for (int k = 0; k < D; ++k) {
      G[size_t(k)] = std::sqrt(g2 / D) * (k % 2 ? 1 : -1);
      sd[size_t(k)] = std::sqrt(trace * (1.0 + k % 7) / w);
    }
  }
  double truth() const { return trace / g2; }
  void step(sat::NoiseScale& ns, int b, int K) {
    std::vector<double> first(D), mean(D, 0.0);
    for (int m = 0; m < K; ++m)
      for (int k = 0; k < D; ++k) {
        const double g = G[size_t(k)] + sd[size_t(k)] / std::sqrt(double(b)) * rng.normal();
        if (m == 0) first[size_t(k)] = g;
        mean[size_t(k)] += g / K;
      }
    double s2 = 0, b2 = 0;
    for (int k = 0; k < D; ++k) s2 += first[size_t(k)] * first[size_t(k)], b2 += mean[size_t(k)] * mean[size_t(k)];
    ns.add(s2, b, b2, int64_t(b) * K);
  }
};

// The 95% interval contains the known noise scale in about 95% of independent runs (at
// least 36 of 40 here; at 95% coverage fewer than 36 happens with probability 0.05), and
// is narrow enough to be of use: within a factor of 1.6 either way at 80 steps.
TEST(NoiseScale, IntervalContainsTheKnownNoiseScale) {
  int covered = 0, runs = 40;
  double widest = 0;
  for (int seed = 1; seed <= runs; ++seed) {
    GaussianGradients gg(uint64_t(seed), 1.0, 300.0);  // B_simple = 300; b = 16, B = 256
    sat::NoiseScale ns;
    for (int s = 0; s < 80; ++s) gg.step(ns, 16, 16);
    const sat::NoiseInterval iv = ns.interval();
    ASSERT_TRUE(iv.measurable) << iv.reason;
    EXPECT_LE(iv.low, iv.estimate);
    EXPECT_GE(iv.high, iv.estimate);
    EXPECT_DOUBLE_EQ(iv.estimate, ns.estimate());
    EXPECT_NEAR(iv.effective_steps, 80, 1e-9);
    covered += iv.low <= gg.truth() && gg.truth() <= iv.high;
    widest = std::max(widest, iv.high / iv.low);
    if (seed == 1)
      std::printf("B_simple truth %.0f: estimate %.1f, 95%% interval [%.1f, %.1f]\n", gg.truth(), iv.estimate, iv.low,
                  iv.high);
  }
  std::printf("the interval covered the truth in %d of %d runs; widest high/low %.2f\n", covered, runs, widest);
  EXPECT_GE(covered, 36);
  EXPECT_LT(widest, 1.6 * 1.6);
}

// The demo's old configuration: B = 2b, a dozen steps, a noise scale far above B. The
// per-step |G|^2 is mostly noise, so the estimate is not measurable (instead of 0 or a
// number that means nothing); with B = 16b and enough steps the same gradients give one.
TEST(NoiseScale, NotMeasurableWhenTheGradientIsBuriedInNoise) {
  GaussianGradients gg(7, 1.0, 20000.0);  // B_simple = 20000
  sat::NoiseScale two;
  for (int s = 0; s < 12; ++s) gg.step(two, 128, 2);
  const sat::NoiseInterval iv = two.interval();
  std::printf("B = 2b = 256, 12 steps: %s\n", iv.measurable ? "measurable" : iv.reason.c_str());
  EXPECT_FALSE(iv.measurable);
  EXPECT_EQ(iv.estimate, 0);
  EXPECT_FALSE(iv.reason.empty());
  sat::NoiseScale wide;
  for (int s = 0; s < 60; ++s) gg.step(wide, 128, 16);
  const sat::NoiseInterval ok = wide.interval();
  std::printf("B = 16b = 2048, 60 steps: %.0f [%.0f, %.0f]\n", ok.estimate, ok.low, ok.high);
  EXPECT_TRUE(ok.measurable) << ok.reason;
  EXPECT_LE(ok.low, gg.truth());
  EXPECT_GE(ok.high, gg.truth());
}

// Degenerate inputs say "not measurable" with a reason: no gradient at all (G = 0, pure
// noise), no noise and no gradient (every norm 0), and fewer than three steps.
TEST(NoiseScale, DegenerateInputsAreNotMeasurable) {
  GaussianGradients zero(3, 0.0, 100.0);
  for (auto& g : zero.G) g = 0;
  sat::NoiseScale ns;
  for (int s = 0; s < 200; ++s) zero.step(ns, 8, 16);
  sat::NoiseInterval iv = ns.interval();
  EXPECT_FALSE(iv.measurable);
  EXPECT_NE(iv.reason.find("|G|^2 is not distinguishable from 0"), std::string::npos) << iv.reason;
  sat::NoiseScale flat;
  for (int s = 0; s < 10; ++s) flat.add(0.0, 8, 0.0, 128);
  EXPECT_FALSE(flat.interval().measurable);
  sat::NoiseScale few;
  few.add(3.0, 4, 2.0, 8);
  few.add(3.0, 4, 2.0, 8);
  EXPECT_FALSE(few.interval().measurable);
  EXPECT_NE(few.interval().reason.find("only 2 steps"), std::string::npos) << few.interval().reason;
  // Noise without signal in tr(Sigma): |G_b|^2 = |G_B|^2 on average, the interval reaches 0.
  sat::NoiseScale no_trace;
  for (int s = 0; s < 20; ++s) no_trace.add(1.0 + (s % 2 ? 0.01 : -0.01), 8, 1.0, 128);
  iv = no_trace.interval();
  EXPECT_FALSE(iv.measurable);
  EXPECT_NE(iv.reason.find("tr(Sigma) is not distinguishable from 0"), std::string::npos) << iv.reason;
  EXPECT_NEAR(sat::t_quantile_95(1), 12.706, 1e-3);
  EXPECT_NEAR(sat::t_quantile_95(1e6), 1.96, 1e-3);
}

TEST(NoiseScale, UndefinedUntilBothTermsArePositive) {
  sat::NoiseScale ns;
  EXPECT_EQ(ns.estimate(), 0);
  ns.add(1.0, 4, 1.0, 8);  // no difference between the batch sizes: tr(Sigma) = 0
  EXPECT_EQ(ns.estimate(), 0);
  EXPECT_THROW(ns.add(1.0, 8, 1.0, 8), sat::Error);
  EXPECT_DOUBLE_EQ(sat::statistical_efficiency(0, 8, 64), 1.0);
  EXPECT_NEAR(sat::statistical_efficiency(100, 8, 64), 108.0 / 164.0, 1e-12);
}

TEST(Tune, LearningRateRules) {
  std::string rule;
  EXPECT_FLOAT_EQ(sat::scale_lr("sgd", 0.1f, 64, 256, &rule), 0.4f);
  EXPECT_EQ(rule, "linear (SGD)");
  EXPECT_FLOAT_EQ(sat::scale_lr("adamw", 1e-3f, 64, 256, &rule), 2e-3f);
  EXPECT_EQ(rule, "square root (Adam family)");
  EXPECT_FLOAT_EQ(sat::scale_lr("sgd", 0.1f, 64, 16), 0.025f);
}

struct Problem {
  sat::ModelConfig mc;
  sat::DataSplit data;
  sat::TrainConfig base;
};

Problem setup(const std::string& model) {
  sat::cpu::set_num_threads(2);
  Problem s{sat::model_config(model), {}, {}};
  s.data = sat::open_dataset("synthetic", sat::data_options_for(s.mc, 0));
  s.base.optim.lr = 0.01f;
  s.base.progress = 0;
  return s;
}

size_t plan_at(const Problem& s, int64_t b) {
  sat::TrainConfig c = s.base;
  c.batch = b;
  c.evaluate = false;
  return sat::Trainer::plan(s.mc, c, *s.data.train, nullptr, 1).total();
}

// Short probes, one round of re-measurement, a small noise-scale measurement: what the
// tests below look at, in seconds.
TuneConfig quick(size_t budget) {
  TuneConfig t;
  t.memory_budget = budget;
  t.probe_seconds = 0.05;
  t.probe_min_steps = 3;
  t.rounds = 1;
  t.noise_steps = 3;
  t.noise_ratio = 2;
  t.progress = 0;
  t.min_steps_per_epoch = 0;  // the budget alone holds the batch back (the cap has its own test)
  return t;
}

// A budget exactly at the plan of micro-batch X admits X and nothing larger.
void expect_stays_within(const std::string& model, int64_t X) {
  Problem s = setup(model);
  const size_t budget = plan_at(s, X);
  ASSERT_GT(plan_at(s, X + 1), budget) << "the plan must grow with the batch";
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, quick(budget));
  std::printf("%s, budget %zu bytes (micro-batch %lld): max %lld, chose %lld, %d probes, confirm peak %zu, %.1f s\n",
              model.c_str(), budget, (long long)X, (long long)r.max_micro_batch, (long long)r.choice.micro_batch,
              r.probes, r.confirm_peak_bytes, r.tuning_seconds);
  EXPECT_EQ(r.max_micro_batch, X) << model;
  // Larger only with a memory lever, whose plan fits the budget too.
  const bool lever = r.choice.zero || r.choice.recompute != sat::Recompute::none;
  EXPECT_LE(r.choice.micro_batch, lever ? 2 * X : X);
  EXPECT_GE(r.choice.micro_batch, 1);
  EXPECT_EQ(r.failed_allocations, 0);
  EXPECT_GT(r.confirm_peak_bytes, 0u);
  EXPECT_LE(r.confirm_peak_bytes, budget);
  EXPECT_LE(r.probes, int(std::floor(std::log2(double(X)))) + 2 + (r.levers.empty() ? 0 : 1));
  int lever_probes = 0;
  for (auto& l : r.levers) {
    if (!l.micro_batch) continue;
    ++lever_probes;
    EXPECT_LE(l.predicted_memory_bytes, budget) << l.name;
    EXPECT_LE(l.measured_peak_bytes, l.predicted_memory_bytes) << l.name;
  }
  EXPECT_EQ(sat::mem_stats().budget, 0u) << "the tuner must lift its budget when done";
  int probed = 0;
  for (auto& c : r.candidates) {
    EXPECT_LE(c.micro_batch, X);
    EXPECT_LE(c.predicted_memory_bytes, budget);
    if (!c.probed) continue;
    ++probed;
    EXPECT_GT(c.samples_per_second, 0);
    EXPECT_LE(c.measured_peak_bytes, c.predicted_memory_bytes) << model << " micro-batch " << c.micro_batch;
    EXPECT_GE(double(c.measured_peak_bytes), 0.98 * double(c.predicted_memory_bytes)) << c.micro_batch;
  }
  EXPECT_EQ(probed + lever_probes, r.probes);
}

// With no budget and no global batch, as `saturate tune --model mlp --data synthetic` runs:
// the budget is the host's available memory less 20% (the whole 10,000-sample training set
// would fit it), yet the choice leaves at least min_steps_per_epoch optimizer steps per
// epoch (by default 50, there micro-batch 200; 1,000 here, micro-batch 10, so that the
// probes are few) and says so; the warm-up is kept whatever the batch; and the choice
// says where it stands against the critical batch size estimate.
TEST(Tune, NoBudgetLeavesStepsPerEpochAndAWarmUp) {
  EXPECT_EQ(TuneConfig{}.min_steps_per_epoch, 50);
  Problem s = setup("mlp");
  TuneConfig t = quick(0);
  t.min_steps_per_epoch = 1000;
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, t);
  const int64_t n = s.data.train->size();
  std::printf("no budget: %s (%s), max %lld, chose %lld\n%s\n", sat::format_bytes(double(r.budget)).c_str(),
              r.budget_source.c_str(), (long long)r.max_micro_batch, (long long)r.choice.global_batch,
              r.choice.reason.c_str());
  EXPECT_EQ(r.budget_source, "available host memory less 20%");
  EXPECT_GT(r.budget, plan_at(s, n)) << "the test wants a budget the whole training set fits";
  EXPECT_EQ(r.max_micro_batch, n / 1000);
  EXPECT_GE(n / r.choice.global_batch, 1000);
  EXPECT_NE(r.choice.reason.find("fewer than 1000 optimizer steps per epoch"), std::string::npos) << r.choice.reason;
  EXPECT_NE(r.choice.reason.find("critical batch size"), std::string::npos) << r.choice.reason;
  EXPECT_EQ(r.choice.warmup_fraction, 0.05);
  // Below --lr-batch the warm-up stays too.
  t.lr_batch = 1 << 20;
  EXPECT_EQ(sat::tune(s.mc, s.base, *s.data.train, nullptr, t).choice.warmup_fraction, 0.05);
}

TEST(Tune, StaysWithinBudgetsThatAdmitOnlySmallBatches) {
  expect_stays_within("mlp", 37);
  expect_stays_within("mlp", 300);
  expect_stays_within("convnet", 12);
  expect_stays_within("gpt-mini", 3);
}

// A budget that holds micro-batch 1 of gpt-mini and not 2: the throughput curve cannot be
// seen to flatten, so the tuner weighs the memory levers (one process: recomputation,
// cheapest first), probes the one that fits a larger micro-batch within the budget, and
// says why it took it or not.
// bf16 on the CPU halves the activations: under the budget that holds float32 at
// micro-batch X, the tuner finds the larger micro-batch the bf16 plan fits, and no larger.
TEST(Tune, Bf16FitsTheLargerMicroBatchItsPlanAllows) {
  Problem s = setup("convnet");
  const int64_t X = 256;  // where activations, not the weights and AdamW's state, fill the budget
  const size_t budget = plan_at(s, X);
  s.base.precision = sat::Precision::bf16;
  int64_t want = X;
  for (int64_t step = 64; step >= 1; step /= 2)  // the plan grows with the micro-batch
    while (plan_at(s, want + step) <= budget) want += step;
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, quick(budget));
  std::printf("convnet, budget %zu bytes (fp32 micro-batch %lld): bf16 plan fits %lld, the tuner's max %lld\n",
              budget, (long long)X, (long long)want, (long long)r.max_micro_batch);
  // Larger, by what a shallow net's bf16 plan allows: 283 measured; its largest layer's
  // float32 copies are much of its activations (resnet18 under 1 GiB: 108 -> 207, README).
  EXPECT_GT(want, X);
  EXPECT_EQ(r.max_micro_batch, want);
  EXPECT_LE(r.confirm_peak_bytes, budget);
  EXPECT_EQ(r.failed_allocations, 0);
}

TEST(Tune, ConsidersTheMemoryLeversWhenTheBudgetHoldsTheBatchBack) {
  Problem s = setup("gpt-mini");
  s.base.optim.name = "adamw";
  s.base.optim.lr = 3e-4f;
  const size_t budget = plan_at(s, 1) + (plan_at(s, 2) - plan_at(s, 1)) / 2;
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, quick(budget));
  ASSERT_EQ(r.max_micro_batch, 1);
  ASSERT_EQ(r.levers.size(), 2u);
  EXPECT_EQ(r.levers[0].name, "recompute selective");
  EXPECT_EQ(r.levers[1].name, "recompute full");
  EXPECT_GE(r.levers[1].max_micro_batch, 2) << "full recomputation fits a larger micro-batch";
  EXPECT_GE(r.levers[1].max_micro_batch, r.levers[0].max_micro_batch);
  const sat::TuneLever* probed = nullptr;
  for (auto& l : r.levers)
    if (l.micro_batch) probed = &l;
  ASSERT_TRUE(probed);
  EXPECT_EQ(probed->micro_batch, 2);
  EXPECT_LE(probed->predicted_memory_bytes, budget);
  EXPECT_LE(probed->measured_peak_bytes, probed->predicted_memory_bytes);
  EXPECT_GT(probed->samples_per_second, 0);
  EXPECT_NE(r.choice.reason.find(probed->name + " (the cheapest lever that fits it)"), std::string::npos)
      << r.choice.reason;
  const bool took = r.choice.recompute != sat::Recompute::none;
  EXPECT_NE(r.choice.reason.find(took ? ": chosen" : "so no lever"), std::string::npos) << r.choice.reason;
  EXPECT_EQ(r.choice.micro_batch, took ? 2 : 1);
  EXPECT_EQ(r.failed_allocations, 0);
  std::printf("gpt-mini, budget %zu: %s\n", budget, r.choice.reason.c_str());
  const std::string json = sat::tune_json(r);
  EXPECT_NE(json.find("\"levers\""), std::string::npos);
  EXPECT_NE(json.find(probed->name), std::string::npos);
}

TEST(Tune, KeepsTheGlobalBatch) {
  Problem s = setup("mlp");
  TuneConfig t = quick(plan_at(s, 40));
  t.global_batch = 96;  // micro-batches that divide 96 and fit: 1, 2, 3, 4, 6, 8, ..., 32
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, t);
  EXPECT_EQ(r.choice.global_batch, 96);
  EXPECT_EQ(r.choice.micro_batch * r.choice.accum, 96);
  EXPECT_LE(r.choice.micro_batch, 40);
  EXPECT_EQ(96 % r.choice.micro_batch, 0);
  EXPECT_FLOAT_EQ(r.choice.lr, 0.01f * 96 / 64);
  EXPECT_NE(r.choice.reason.find("global batch 96 kept"), std::string::npos) << r.choice.reason;
  // The fastest probed divisor was chosen: the noise-aware best, which no other probed
  // divisor beats with confidence.
  EXPECT_EQ(r.choice.micro_batch, r.throughput_noise.reference);
  for (auto& c : r.candidates) {
    if (!c.probed) continue;
    EXPECT_LE(c.ratio_to_best_low, 1.0) << c.micro_batch;
    if (c.micro_batch == r.choice.micro_batch) {
      EXPECT_EQ(c.ratio_to_best, 1.0);
    }
  }
}

// Every probe reports its noise, contenders are re-measured within the rounds' bound, and
// the choice is within the knee of the noise-aware best by its own interval, or is it, or
// (none told within the knee) is not out against it.
TEST(Tune, ReportsTheNoiseOfEveryProbe) {
  Problem s = setup("mlp");
  TuneConfig t = quick(plan_at(s, 300));
  t.rounds = 2;
  t.noise_steps = 0;
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, t);
  const sat::ThroughputNoise& tn = r.throughput_noise;
  std::printf("mlp: chose %lld, reference %lld, %d rounds (%d probes), step-time IQR %.3f, between rounds %.3f\n",
              (long long)r.choice.micro_batch, (long long)tn.reference, tn.rounds, tn.remeasured,
              tn.step_time_iqr_fraction, tn.round_to_round);
  int near = 0;  // candidates that entered the contest by their ratio to the best
  for (auto& c : r.candidates) near += c.probed && c.ratio_to_best_high >= 1 - 3 * t.knee;
  if (near >= 2) {
    EXPECT_GE(tn.rounds, 1) << "one pass alone decides nothing when several contend";
  }
  EXPECT_LE(tn.rounds, 2);
  EXPECT_GT(tn.step_time_iqr_fraction, 0);
  EXPECT_FALSE(tn.rule.empty());
  int remeasured = 0;
  for (auto& c : r.candidates) {
    if (!c.probed) continue;
    ASSERT_FALSE(c.timings.empty()) << c.micro_batch;
    EXPECT_EQ(c.timings[0].round, 0);
    remeasured += int(c.timings.size()) - 1;
    EXPECT_LT(c.samples_per_second_low, c.samples_per_second) << c.micro_batch;
    EXPECT_GT(c.samples_per_second_high, c.samples_per_second) << c.micro_batch;
    EXPECT_LE(c.ratio_to_best_low, c.ratio_to_best);
    EXPECT_GE(c.ratio_to_best_high, c.ratio_to_best);
    EXPECT_GE(c.step_time_iqr_fraction, 0);
    EXPECT_EQ(c.predicted_samples_per_second, 0) << "no cost model";
    if (c.micro_batch == r.choice.micro_batch && c.micro_batch != tn.reference && !tn.unsure) {
      EXPECT_GE(c.ratio_to_best_low, 1 - t.knee) << "the choice is within the knee by its own interval";
    }
    if (c.micro_batch == r.choice.micro_batch && tn.unsure) {  // the largest not out
      EXPECT_GE(c.ratio_to_best_high, 1 - t.knee) << "not out against the reference";
    }
  }
  EXPECT_EQ(remeasured, tn.remeasured);
}

// A cost model (here a made-up saturating curve) decides where the probes go: next to its
// knee and its best, not every power of two; every candidate reports its figure.
TEST(Tune, ACostModelPicksTheProbes) {
  Problem s = setup("mlp");
  TuneConfig t = quick(plan_at(s, 300));  // sizes 1, 2, 4, ..., 256, 300
  auto model = [](int64_t b) { return 20000.0 * double(b) / double(b + 16); };
  t.predicted_samples_per_second = model;  // best at 300; knee (97% of it) at 256
  t.noise_steps = 0;
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, t);
  std::vector<int64_t> probed;
  for (auto& c : r.candidates) {
    EXPECT_DOUBLE_EQ(c.predicted_samples_per_second, model(c.micro_batch)) << c.micro_batch;
    if (c.probed) probed.push_back(c.micro_batch);
  }
  std::printf("probed:");
  for (auto b : probed) std::printf(" %lld", (long long)b);
  std::printf(" (chose %lld)\n", (long long)r.choice.micro_batch);
  ASSERT_GE(probed.size(), 3u);
  EXPECT_EQ(probed.back(), 300);
  EXPECT_NE(std::find(probed.begin(), probed.end(), 256), probed.end());
  EXPECT_NE(std::find(probed.begin(), probed.end(), 128), probed.end());
  EXPECT_EQ(std::find(probed.begin(), probed.end(), 1), probed.end()) << "far from the knee: not probed";
  EXPECT_LT(r.probes, int(r.candidates.size()));
  const std::string json = sat::tune_json(r);
  EXPECT_NE(json.find("\"predicted_samples_per_second\": 18987"), std::string::npos);  // at 300
}

TEST(Tune, MeasuresTheNoiseScaleAndGoodput) {
  Problem s = setup("mlp");
  TuneConfig t = quick(plan_at(s, 64));
  t.objective = "goodput";
  t.noise_steps = 20;
  t.noise_ratio = 16;
  t.noise_tolerance = 0.6;
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, t);
  const sat::NoiseInterval& iv = r.noise_interval;
  std::printf("mlp noise scale %.1f [%.1f, %.1f] after %zu steps, batches %lld and %lld\n", r.noise_scale, iv.low,
              iv.high, r.noise.size(), (long long)r.noise_b_small, (long long)r.noise_b_big);
  ASSERT_TRUE(iv.measurable) << iv.reason;
  EXPECT_GE(r.noise_b_big, 16 * r.noise_b_small);
  EXPECT_GE(r.noise.size(), 5u);
  EXPECT_LE(r.noise.size(), 20u);
  EXPECT_LE(iv.high - iv.low, 0.6 * iv.estimate + 1e-9) << "or it ran out of steps";
  EXPECT_GT(r.noise_scale, 0);
  EXPECT_LE(iv.low, r.noise_scale);
  EXPECT_GE(iv.high, r.noise_scale);
  char low[32];
  std::snprintf(low, sizeof low, "95%% interval %.3g to", iv.low);
  EXPECT_NE(r.choice.reason.find(low), std::string::npos) << r.choice.reason;
  for (auto& c : r.candidates) {
    EXPECT_LE(c.statistical_efficiency, 1.0);
    EXPECT_GT(c.statistical_efficiency, 0.0);
    if (c.probed) {
      EXPECT_NEAR(c.goodput, c.samples_per_second * c.statistical_efficiency, 1e-9 * c.goodput);
    }
  }
  EXPECT_NE(r.choice.reason.find("goodput"), std::string::npos) << r.choice.reason;
}

// Too few steps for an interval: "not measurable yet" with the reason, no noise scale, and
// the goodput objective says it fell back to throughput.
TEST(Tune, GoodputFallsBackWhenTheNoiseScaleIsNotMeasurable) {
  Problem s = setup("mlp");
  TuneConfig t = quick(plan_at(s, 64));
  t.objective = "goodput";
  t.noise_steps = 2;
  TuneResult r = sat::tune(s.mc, s.base, *s.data.train, nullptr, t);
  EXPECT_FALSE(r.noise_interval.measurable);
  EXPECT_EQ(r.noise_scale, 0);
  EXPECT_NE(r.noise_interval.reason.find("only 2 steps"), std::string::npos) << r.noise_interval.reason;
  EXPECT_NE(r.choice.reason.find("not measurable yet"), std::string::npos) << r.choice.reason;
  EXPECT_NE(r.choice.reason.find("chosen by throughput"), std::string::npos) << r.choice.reason;
  auto j = nlohmann::json::parse(sat::tune_json(r));
  EXPECT_TRUE(j["noise_scale"].is_null());
  EXPECT_TRUE(j["noise_scale_low"].is_null());
  EXPECT_EQ(j["noise_scale_reason"].get<std::string>().rfind("not measurable yet: only 2 steps", 0), 0u);
  EXPECT_NE(sat::tune_html(r).find("gradient noise scale: not measurable yet</b>: only 2 steps"), std::string::npos);
  for (auto& c : r.candidates) EXPECT_EQ(c.statistical_efficiency, 1.0);
}

TEST(Tune, BudgetBelowOneSampleIsAClearError) {
  Problem s = setup("mlp");
  try {
    sat::tune(s.mc, s.base, *s.data.train, nullptr, quick(1 << 20));
    FAIL() << "tune accepted a 1 MiB budget";
  } catch (const sat::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--memory-budget"), std::string::npos) << e.what();
  }
}

TEST(MemoryBudget, AnAllocationBeyondItIsRefusedAndCounted) {
  const size_t before = sat::mem_stats().failed;
  sat::mem_set_budget(sat::mem_stats().current + 1000);
  EXPECT_THROW(sat::Buffer(2000, "test buffer"), sat::OutOfMemory);
  { sat::Buffer ok(500, "small"); }
  sat::mem_set_budget(0);
  EXPECT_EQ(sat::mem_stats().failed, before + 1);
}

}  // namespace
