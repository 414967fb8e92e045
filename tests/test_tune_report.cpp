// The tuner's reports from a hand-made TuneResult: tune.json has every documented key
// in order and turns what is not a number into null; the HTML page is self-contained
// (nothing fetched from elsewhere), escapes user text, and copes with one candidate,
// equal throughputs, NaN values and a missing noise trace.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "tune/layout_tune.h"
#include "tune/tune.h"

namespace {

constexpr size_t MiB = size_t(1) << 20;

sat::TuneResult example() {
  sat::TuneResult r;
  r.model = "res<b>&net";
  r.data = "cifar10 \"train\"";
  r.device = "NVIDIA H100 80GB HBM3";
  r.world = 2;
  r.budget = 8192 * MiB;
  r.budget_source = "--memory-budget";
  r.max_micro_batch = 200;
  r.max_predicted_bytes = 7900 * MiB;
  r.confirm_peak_bytes = 7700 * MiB;
  r.failed_allocations = 0;
  r.knee = 0.03;
  r.objective = "throughput";
  for (int64_t mb : {1, 2, 4, 8, 16, 32, 64, 128, 200, 512}) {
    sat::TuneCandidate c;
    c.micro_batch = mb;
    c.predicted_memory_bytes = 300 * MiB + size_t(mb) * 38 * MiB;
    c.fits = c.predicted_memory_bytes <= r.budget;
    c.probed = c.fits;
    c.predicted_samples_per_second = 2 * 9500.0 * double(mb) / double(mb + 5);  // a cost model's, for all
    if (c.probed) {
      c.measured_peak_bytes = c.predicted_memory_bytes * 97 / 100;
      c.samples_per_second = 2 * 9000.0 * double(mb) / double(mb + 6);
      c.statistical_efficiency = (400.0 + 2) / (400.0 + 2.0 * double(mb));
      c.goodput = c.samples_per_second * c.statistical_efficiency;
      c.timed_steps = int(40 / std::sqrt(double(mb))) + 3;
      c.samples_per_second_low = 0.96 * c.samples_per_second;
      c.samples_per_second_high = 1.05 * c.samples_per_second;
      c.step_time_iqr_fraction = 0.04;
      c.ratio_to_best = c.samples_per_second / (2 * 9000.0 * 200 / 206);
      c.ratio_to_best_low = 0.97 * c.ratio_to_best, c.ratio_to_best_high = 1.02 * c.ratio_to_best;
      c.timings = {{0, c.samples_per_second, 0.01, 0.04, c.timed_steps}};
      if (mb >= 64) c.timings.push_back({1, 1.01 * c.samples_per_second, 0.01, 0.05, c.timed_steps});
      r.probes++;
    }
    r.candidates.push_back(c);
  }
  r.choice.micro_batch = 64;
  r.choice.accum = 2;
  r.choice.global_batch = 256;
  r.choice.lr = 0.0021f;
  r.choice.lr_rule = "square root (Adam family)";
  r.choice.warmup_fraction = 0.05;
  r.choice.reason = "64 <b>& is the smallest micro-batch within 3% of the best throughput";
  r.choice.zero = 2;
  sat::TuneLever lever;
  lever.name = "ZeRO-2";
  lever.zero = 2;
  lever.max_micro_batch = 300;
  lever.micro_batch = 256;
  lever.predicted_memory_bytes = 8000 * MiB;
  lever.measured_peak_bytes = 7990 * MiB;
  lever.samples_per_second = 1234.5;
  r.levers = {lever, sat::TuneLever{"recompute full", 0, sat::Recompute::full, 400}};
  for (int s = 0; s < 12; ++s) {
    sat::NoisePoint n;
    n.step = s;
    n.b_small = 64, n.b_big = 256;
    n.small_sq = 2.0 + 0.1 * s, n.big_sq = 0.9 + 0.05 * s;
    n.estimate = s == 0 ? 0 : 410.0 + 600.0 / (s + 1) * ((s % 2) ? 1 : -0.5);
    r.noise.push_back(n);
  }
  for (auto& n : r.noise) n.low = n.estimate ? 0.8 * n.estimate : 0, n.high = n.estimate ? 1.3 * n.estimate : 0;
  r.noise_scale = 412.5;
  r.noise_interval = {true, 412.5, 350.25, 480.5, 12, ""};
  r.noise_b_small = 64, r.noise_b_big = 256;
  r.throughput_noise = {0.04, 0.012, 2, 6, false, 200, "smallest within the knee of the noise-aware best"};
  r.tuning_seconds = 14.25;
  return r;
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

// What every page must satisfy: one document, nothing external, balanced SVGs, no NaN
// or infinity written as a coordinate, and the JSON parses.
void check_valid(const sat::TuneResult& r, size_t plots) {
  std::string h = sat::tune_html(r);
  EXPECT_EQ(h.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(h.find("</html>"), std::string::npos);
  EXPECT_EQ(count(h, "<svg"), plots);
  EXPECT_EQ(count(h, "</svg>"), plots);
  EXPECT_EQ(count(h, "http://"), 0u);
  EXPECT_EQ(count(h, "https://"), 0u);
  EXPECT_EQ(count(h, "<script"), 0u);
  EXPECT_EQ(count(h, "nan"), 0u);
  EXPECT_EQ(count(h, "inf"), 0u);
  EXPECT_TRUE(nlohmann::json::parse(sat::tune_json(r)).is_object());
}

TEST(TuneReport, JsonHasEveryKeyInOrder) {
  sat::TuneResult r = example();
  auto j = nlohmann::ordered_json::parse(sat::tune_json(r));
  std::vector<std::string> keys;
  for (auto& [k, v] : j.items()) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"model", "data", "device", "world_size", "memory_budget_bytes",
                                            "budget_source", "max_micro_batch", "max_predicted_bytes",
                                            "confirm_peak_bytes", "failed_allocations", "objective", "knee",
                                            "requested_global_batch", "candidates", "choice", "levers", "noise_scale",
                                            "noise_scale_low", "noise_scale_high", "noise_scale_reason",
                                            "noise_b_small", "noise_b_big", "noise", "probes", "throughput_noise",
                                            "tuning_seconds"}));
  EXPECT_EQ(j["model"], "res<b>&net");
  EXPECT_EQ(j["data"], "cifar10 \"train\"");
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["memory_budget_bytes"], 8192 * MiB);
  EXPECT_EQ(j["budget_source"], "--memory-budget");
  EXPECT_EQ(j["max_micro_batch"], 200);
  EXPECT_EQ(j["max_predicted_bytes"], 7900 * MiB);
  EXPECT_EQ(j["confirm_peak_bytes"], 7700 * MiB);
  EXPECT_EQ(j["objective"], "throughput");
  EXPECT_DOUBLE_EQ(j["knee"].get<double>(), 0.03);
  EXPECT_TRUE(j["requested_global_batch"].is_null());
  ASSERT_EQ(j["candidates"].size(), r.candidates.size());
  std::vector<std::string> ckeys;
  for (auto& [k, v] : j["candidates"][0].items()) ckeys.push_back(k);
  EXPECT_EQ(ckeys, (std::vector<std::string>{"micro_batch", "predicted_memory_bytes", "measured_peak_bytes",
                                             "samples_per_second", "samples_per_second_low", "samples_per_second_high",
                                             "step_time_iqr_fraction", "ratio_to_best", "ratio_to_best_low",
                                             "ratio_to_best_high", "predicted_samples_per_second",
                                             "statistical_efficiency", "goodput", "timed_steps", "timings", "probed",
                                             "fits"}));
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    auto& c = j["candidates"][i];
    EXPECT_EQ(c["micro_batch"], r.candidates[i].micro_batch);
    EXPECT_EQ(c["predicted_memory_bytes"], r.candidates[i].predicted_memory_bytes);
    EXPECT_EQ(c["measured_peak_bytes"], r.candidates[i].measured_peak_bytes);
    EXPECT_DOUBLE_EQ(c["samples_per_second"].get<double>(), r.candidates[i].samples_per_second);
    EXPECT_DOUBLE_EQ(c["goodput"].get<double>(), r.candidates[i].goodput);
    EXPECT_EQ(c["timed_steps"], r.candidates[i].timed_steps);
    EXPECT_DOUBLE_EQ(c["predicted_samples_per_second"].get<double>(), r.candidates[i].predicted_samples_per_second);
    EXPECT_EQ(c["timings"].size(), r.candidates[i].timings.size());
    if (!r.candidates[i].probed) {
      EXPECT_TRUE(c["samples_per_second_low"].is_null());
      EXPECT_TRUE(c["ratio_to_best"].is_null());
      continue;
    }
    EXPECT_DOUBLE_EQ(c["samples_per_second_low"].get<double>(), r.candidates[i].samples_per_second_low);
    EXPECT_DOUBLE_EQ(c["samples_per_second_high"].get<double>(), r.candidates[i].samples_per_second_high);
    EXPECT_DOUBLE_EQ(c["step_time_iqr_fraction"].get<double>(), 0.04);
    EXPECT_DOUBLE_EQ(c["ratio_to_best_low"].get<double>(), r.candidates[i].ratio_to_best_low);
    EXPECT_DOUBLE_EQ(c["timings"][0]["step_time_iqr_fraction"].get<double>(), 0.04);
    EXPECT_EQ(c["timings"][0]["round"], 0);
    EXPECT_EQ(c["probed"], r.candidates[i].probed);
    EXPECT_EQ(c["fits"], r.candidates[i].fits);
  }
  EXPECT_EQ(j["candidates"].back()["fits"], false);
  auto& ch = j["choice"];
  std::vector<std::string> chkeys;
  for (auto& [k, v] : ch.items()) chkeys.push_back(k);
  EXPECT_EQ(chkeys, (std::vector<std::string>{"micro_batch", "accum", "global_batch", "zero", "recompute", "lr",
                                              "lr_rule", "warmup_fraction", "reason"}));
  EXPECT_EQ(ch["zero"], 2);
  EXPECT_EQ(ch["recompute"], "none");
  ASSERT_EQ(j["levers"].size(), 2u);
  std::vector<std::string> lkeys;
  for (auto& [k, v] : j["levers"][0].items()) lkeys.push_back(k);
  EXPECT_EQ(lkeys, (std::vector<std::string>{"name", "zero", "recompute", "max_micro_batch", "micro_batch",
                                             "predicted_memory_bytes", "measured_peak_bytes", "samples_per_second"}));
  EXPECT_EQ(j["levers"][0]["name"], "ZeRO-2");
  EXPECT_EQ(j["levers"][0]["micro_batch"], 256);
  EXPECT_EQ(j["levers"][0]["measured_peak_bytes"], 7990 * MiB);
  EXPECT_DOUBLE_EQ(j["levers"][0]["samples_per_second"].get<double>(), 1234.5);
  EXPECT_EQ(j["levers"][1]["recompute"], "full");
  EXPECT_EQ(j["levers"][1]["max_micro_batch"], 400);
  EXPECT_EQ(j["levers"][1]["micro_batch"], 0);
  EXPECT_EQ(ch["micro_batch"], 64);
  EXPECT_EQ(ch["accum"], 2);
  EXPECT_EQ(ch["global_batch"], 256);
  EXPECT_NEAR(ch["lr"].get<double>(), 0.0021, 1e-9);
  EXPECT_EQ(ch["lr_rule"], "square root (Adam family)");
  EXPECT_DOUBLE_EQ(ch["warmup_fraction"].get<double>(), 0.05);
  EXPECT_EQ(ch["reason"], r.choice.reason);
  EXPECT_DOUBLE_EQ(j["noise_scale"].get<double>(), 412.5);
  EXPECT_DOUBLE_EQ(j["noise_scale_low"].get<double>(), 350.25);
  EXPECT_DOUBLE_EQ(j["noise_scale_high"].get<double>(), 480.5);
  EXPECT_TRUE(j["noise_scale_reason"].is_null());
  EXPECT_EQ(j["noise_b_small"], 64);
  EXPECT_EQ(j["noise_b_big"], 256);
  std::vector<std::string> tkeys;
  for (auto& [k, v] : j["throughput_noise"].items()) tkeys.push_back(k);
  EXPECT_EQ(tkeys, (std::vector<std::string>{"step_time_iqr_fraction", "round_to_round_fraction", "rounds",
                                             "remeasured_probes", "settled", "reference_micro_batch", "rule"}));
  EXPECT_EQ(j["throughput_noise"]["reference_micro_batch"], 200);
  EXPECT_EQ(j["throughput_noise"]["settled"], false);
  EXPECT_EQ(j["throughput_noise"]["remeasured_probes"], 6);
  ASSERT_EQ(j["noise"].size(), 12u);
  std::vector<std::string> nkeys;
  for (auto& [k, v] : j["noise"][3].items()) nkeys.push_back(k);
  EXPECT_EQ(nkeys, (std::vector<std::string>{"step", "small_sq", "big_sq", "b_small", "b_big", "estimate", "low",
                                             "high"}));
  EXPECT_DOUBLE_EQ(j["noise"][3]["low"].get<double>(), r.noise[3].low);
  EXPECT_EQ(j["noise"][3]["step"], 3);
  EXPECT_EQ(j["noise"][3]["b_big"], 256);
  EXPECT_DOUBLE_EQ(j["noise"][3]["estimate"].get<double>(), r.noise[3].estimate);
  EXPECT_EQ(j["probes"], r.probes);
  EXPECT_DOUBLE_EQ(j["tuning_seconds"].get<double>(), 14.25);
}

TEST(TuneReport, JsonWritesNullForZeroNoiseScaleAndNonFiniteNumbers) {
  sat::TuneResult r = example();
  r.noise_scale = 0;
  r.noise_interval = {false, 0, 0, 0, 3, "|G|^2 is not distinguishable from 0"};
  r.requested_global_batch = 512;
  r.candidates[0].samples_per_second = NAN;
  r.candidates[1].goodput = INFINITY;
  r.candidates[2].statistical_efficiency = -INFINITY;
  r.noise[4].estimate = NAN;
  r.choice.lr = NAN;
  r.tuning_seconds = NAN;
  std::string s = sat::tune_json(r);
  auto j = nlohmann::json::parse(s);
  EXPECT_TRUE(j["noise_scale"].is_null());
  EXPECT_TRUE(j["noise_scale_low"].is_null());
  EXPECT_TRUE(j["noise_scale_high"].is_null());
  EXPECT_EQ(j["noise_scale_reason"], "not measurable yet: |G|^2 is not distinguishable from 0");
  EXPECT_EQ(j["requested_global_batch"], 512);
  EXPECT_TRUE(j["candidates"][0]["samples_per_second"].is_null());
  EXPECT_TRUE(j["candidates"][1]["goodput"].is_null());
  EXPECT_TRUE(j["candidates"][2]["statistical_efficiency"].is_null());
  EXPECT_TRUE(j["noise"][4]["estimate"].is_null());
  EXPECT_TRUE(j["choice"]["lr"].is_null());
  EXPECT_TRUE(j["tuning_seconds"].is_null());
  EXPECT_EQ(s.find("NaN"), std::string::npos);
  EXPECT_EQ(s.find("nan"), std::string::npos);
}

TEST(TuneReport, HtmlIsSelfContainedEscapedAndMarksBudgetAndChoice) {
  sat::TuneResult r = example();
  std::string h = sat::tune_html(r);
  std::ofstream("/tmp/tune_example.html") << h;
  check_valid(r, 3);
  EXPECT_NE(h.find(">budget 8.0 GiB<"), std::string::npos);
  EXPECT_NE(h.find(">chosen 64<"), std::string::npos);
  EXPECT_NE(h.find(">max fits 200<"), std::string::npos);
  EXPECT_NE(h.find("knee: 97% of the noise-aware best"), std::string::npos);
  EXPECT_NE(h.find("final: B_simple = 412 (350 to 480)"), std::string::npos);
  EXPECT_NE(h.find("95% interval 350 to 480"), std::string::npos);
  EXPECT_EQ(count(h, "(95%)</title><path"), 9u) << "an error bar per probed candidate";
  EXPECT_NE(h.find("predicted (cost model)"), std::string::npos);
  EXPECT_NE(h.find("<th>predicted samples/s</th>"), std::string::npos);
  EXPECT_NE(h.find("2 rounds of re-measurement (6 probes), rounds disagreeing by 1.2%"), std::string::npos);
  EXPECT_NE(h.find("noise-aware best: micro-batch 200"), std::string::npos);
  EXPECT_NE(h.find("<td>1.000 (0.970&ndash;1.020)</td>"), std::string::npos);  // micro-batch 200 against itself
  EXPECT_NE(h.find("Gradient noise scale"), std::string::npos);
  EXPECT_NE(h.find("res&lt;b&gt;&amp;net"), std::string::npos);
  EXPECT_NE(h.find("64 &lt;b&gt;&amp; is the smallest"), std::string::npos);
  EXPECT_NE(h.find("cifar10 &quot;train&quot;"), std::string::npos);
  EXPECT_EQ(h.find("<b>&"), std::string::npos);
  EXPECT_EQ(h.find("res<b>"), std::string::npos);
  EXPECT_NE(h.find("NVIDIA H100 80GB HBM3"), std::string::npos);
  EXPECT_NE(h.find("8.0 GiB per rank (--memory-budget)"), std::string::npos);
  EXPECT_NE(h.find("14.2 s"), std::string::npos);
  EXPECT_NE(h.find("square root (Adam family)"), std::string::npos);
  EXPECT_NE(h.find("<tr class=\"chosen\"><td>64</td>"), std::string::npos);
  EXPECT_EQ(count(h, "<tr class=\"chosen\">"), 1u);
  EXPECT_EQ(count(h.substr(h.find("<h2>Candidates")), "<tr"), r.candidates.size() + 1 /* header */);
  EXPECT_EQ(h.find("goodput (throughput"), std::string::npos);  // only for the goodput objective

  r.objective = "goodput";
  h = sat::tune_html(r);
  EXPECT_NE(h.find("goodput (throughput"), std::string::npos);
  EXPECT_NE(h.find("of the noise-aware best goodput"), std::string::npos);
  check_valid(r, 3);
}

TEST(TuneReport, EdgeCasesGiveValidPages) {
  sat::TuneResult one = example();  // one candidate, nothing measured about the noise
  one.candidates.resize(1);
  one.choice.micro_batch = one.max_micro_batch = 1;
  one.noise.clear();
  one.noise_scale = 0;
  one.noise_interval = {};
  check_valid(one, 2);
  EXPECT_EQ(sat::tune_html(one).find("Gradient noise scale"), std::string::npos);
  one.noise_interval.reason = "the training set (10 samples) is too small";  // said, but no plot
  check_valid(one, 2);
  EXPECT_NE(sat::tune_html(one).find("not measurable yet</b>: the training set (10 samples)"), std::string::npos);
  EXPECT_NE(sat::tune_html(one).find(">chosen 1<"), std::string::npos);

  sat::TuneResult flat = example();  // all throughputs equal
  for (auto& c : flat.candidates) c.samples_per_second = c.goodput = 1234;
  check_valid(flat, 3);
  flat.objective = "goodput";
  check_valid(flat, 3);

  sat::TuneResult bad = example();  // NaN, infinite, zero and negative values are left out
  bad.candidates[0].samples_per_second = NAN;
  bad.candidates[1].samples_per_second = -5;
  bad.candidates[2].samples_per_second = INFINITY;
  bad.candidates[3].goodput = NAN;
  bad.candidates[4].statistical_efficiency = NAN;
  bad.candidates[5].predicted_memory_bytes = 0;
  bad.knee = NAN;
  bad.noise[2].estimate = NAN;
  bad.noise[3].estimate = -1;
  bad.noise_scale = NAN;
  bad.tuning_seconds = NAN;
  check_valid(bad, 3);

  sat::TuneResult none;  // nothing at all: a default result
  check_valid(none, 2);
  sat::TuneResult unmeasured = example();  // probes that measured nothing, an undefined estimate
  for (auto& c : unmeasured.candidates)
    c.samples_per_second = c.goodput = c.predicted_samples_per_second = 0, c.measured_peak_bytes = 0;
  for (auto& n : unmeasured.noise) n.estimate = 0;
  unmeasured.budget = 0;
  check_valid(unmeasured, 3);
  EXPECT_NE(sat::tune_html(unmeasured).find("no throughput measured"), std::string::npos);
}

}  // namespace

// The layout cache is input like any other: a sound choice is read, a hostile or damaged
// one (huge or fractional numbers, wrong types, not JSON) is ignored with a warning, never
// converted out of range, and a choice for another number of ranks is not used.
TEST(TuneReport, LayoutCacheIsValidatedLikeInput) {
  const std::string path = (std::filesystem::temp_directory_path() / "sat_layout_cache.json").string();
  auto write = [&](const std::string& choice) { std::ofstream(path) << "{\"layout_choice\": {" << choice << "}}"; };
  const std::string rest = "\"schedule\": \"1f1b\", \"virtual_stages\": 1, \"recompute\": \"none\", "
                           "\"sequence_parallel\": false, \"zero\": 0, \"measured_samples_per_second\": 100, "
                           "\"predicted_samples_per_second\": 120";
  sat::Layout l;
  double measured = 0, predicted = 0;
  write("\"dp\": 1, \"tp\": 1, \"pp\": 1, \"micro_batch\": 8, \"accum\": 2, " + rest);
  ASSERT_TRUE(sat::read_layout_choice(path, l, measured, predicted));
  EXPECT_EQ(l.batch, 8);
  EXPECT_EQ(l.accum, 2);
  EXPECT_TRUE(sat::shared_layout_choice(nullptr, path, l, measured, predicted));
  for (const std::string bad : {"\"dp\": 1, \"tp\": 1, \"pp\": 1, \"micro_batch\": 1e300, \"accum\": 2, ",
                                "\"dp\": 1, \"tp\": 1, \"pp\": 1, \"micro_batch\": 8, \"accum\": -3, ",
                                "\"dp\": 1, \"tp\": 1e9, \"pp\": 1, \"micro_batch\": 8, \"accum\": 1, ",
                                "\"dp\": 1, \"tp\": 1, \"pp\": 1, \"micro_batch\": 2.5, \"accum\": 1, ",
                                "\"dp\": \"one\", \"tp\": 1, \"pp\": 1, \"micro_batch\": 8, \"accum\": 1, "}) {
    write(bad + rest);
    EXPECT_FALSE(sat::read_layout_choice(path, l, measured, predicted)) << bad;
  }
  write("\"dp\": 2, \"tp\": 1, \"pp\": 1, \"micro_batch\": 8, \"accum\": 1, " + rest);  // a 2-rank job's
  EXPECT_FALSE(sat::shared_layout_choice(nullptr, path, l, measured, predicted));
  std::ofstream(path) << "{\"layout_choice\": [1, 2";
  EXPECT_FALSE(sat::read_layout_choice(path, l, measured, predicted));
  std::filesystem::remove(path);
}

// The `--batch auto` cache: what tune_json wrote reads back, and a damaged or hostile file is
// an error naming the key, never a value no flag would allow.
TEST(TuneReport, BatchCacheIsValidatedLikeInput) {
  const std::string path = (std::filesystem::temp_directory_path() / "sat_batch_cache.json").string();
  sat::TuneResult r = example();
  r.choice.micro_batch = 48, r.choice.accum = 2, r.choice.lr = 0.02f, r.choice.zero = 1;
  r.choice.recompute = sat::Recompute::selective, r.choice.warmup_fraction = 0.05, r.choice.reason = "knee";
  std::ofstream(path) << sat::tune_json(r);
  const sat::TuneChoice c = sat::read_tune_choice(path, 1 << 24, 2);
  EXPECT_EQ(c.micro_batch, 48);
  EXPECT_EQ(c.accum, 2);
  EXPECT_FLOAT_EQ(c.lr, 0.02f);
  EXPECT_EQ(c.zero, 1);
  EXPECT_EQ(c.recompute, sat::Recompute::selective);
  EXPECT_DOUBLE_EQ(c.warmup_fraction, 0.05);
  EXPECT_EQ(c.global_batch, 48 * 2 * 2);
  const std::string ok = "\"lr\": 0.01, \"warmup_fraction\": 0";
  for (const auto& [choice, words] : std::vector<std::pair<std::string, std::string>>{
           {"\"micro_batch\": 1e300, \"accum\": 1, " + ok, "choice.micro_batch"},
           {"\"micro_batch\": 99999999, \"accum\": 1, " + ok, "choice.micro_batch"},
           {"\"micro_batch\": 2.5, \"accum\": 1, " + ok, "choice.micro_batch"},
           {"\"micro_batch\": \"8\", \"accum\": 1, " + ok, "choice.micro_batch is not a number"},
           {"\"micro_batch\": 8, \"accum\": 0, " + ok, "choice.accum"},
           {"\"micro_batch\": 8, \"accum\": 1, \"lr\": -1, \"warmup_fraction\": 0", "choice.lr"},
           {"\"micro_batch\": 8, \"accum\": 1, \"lr\": 0.1, \"warmup_fraction\": 2", "choice.warmup_fraction"},
           {"\"micro_batch\": 8, \"accum\": 1, \"zero\": 7, " + ok, "choice.zero"},
           {"\"micro_batch\": 8, \"accum\": 1, \"recompute\": \"most\", " + ok, "choice.recompute 'most'"},
           {"\"accum\": 1, " + ok, "choice.micro_batch is missing"}}) {
    std::ofstream(path) << "{\"choice\": {" << choice << "}}";
    std::string error;
    try {
      sat::read_tune_choice(path, 1 << 24, 1);
    } catch (const sat::Error& e) {
      error = e.what();
    }
    EXPECT_NE(error.find(words), std::string::npos) << choice << " -> " << error;
    EXPECT_NE(error.find(path), std::string::npos) << error;
  }
  std::ofstream(path) << "{\"choice\": [1, 2";
  EXPECT_THROW(sat::read_tune_choice(path, 1 << 24, 1), sat::Error);
  std::ofstream(path) << "[]";
  EXPECT_THROW(sat::read_tune_choice(path, 1 << 24, 1), sat::Error);
  std::filesystem::remove(path);
}

