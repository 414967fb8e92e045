// `--layout auto` (tune/layout_tune.h): under mpirun with 2 ranks (CMake runs this binary
// as layout_tune_np2) the planner's best layouts of gpt-mini for the 2 ranks are timed for
// real: each layout uses both ranks and forms the global batch, its measured peak is its
// plan to the byte, the choice is the measured fastest, every rank agrees on it, and
// tune.json reads back as the choice.
// Alone, the formats and the flags' fields.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/blas.h"
#include "core/error.h"
#include "data/dataset.h"
#include "mpi_world.h"
#include "train/trainer.h"
#include "tune/layout_tune.h"

namespace fs = std::filesystem;
using namespace sat;
using sat::test::world;

namespace {

// The tuning of gpt-mini at global batch 4 over the job's ranks, each layout timed briefly.
LayoutTuneResult tune_gpt_mini(int candidates) {
  cpu::set_num_threads(1);
  ModelConfig mc = model_config("gpt-mini");
  static DataSplit data = open_dataset("synthetic", data_options_for(mc, 0));
  fit_to_data(mc, *data.train);
  TrainConfig base;
  base.comm = &world();
  base.optim.name = "sgd";
  base.optim.lr = 0.01f;
  base.progress = 0;
  LayoutTuneConfig t;
  t.global_batch = 4;
  t.candidates = candidates;
  t.memory_budget = size_t(1) << 30;
  t.probe_seconds = 0.05;
  t.min_steps = 3;
  t.progress = 0;
  return tune_layout(mc, base, *data.train, data.test.get(), t);
}

// Every rank's value of x is rank 0's.
bool ranks_agree(double x) {
  double lo = x, hi = x;
  world().all_reduce_sync(&lo, 1, DType::f64, dist::ReduceOp::min);
  world().all_reduce_sync(&hi, 1, DType::f64, dist::ReduceOp::max);
  return lo == hi;
}

}  // namespace

TEST(LayoutTuneRanks, TimesThePlannersBestAndChoosesTheMeasuredFastest) {
  if (!sat::test::world_is(2)) GTEST_SKIP() << "runs under mpirun -np 2 (ctest layout_tune_np2)";
  const LayoutTuneResult r = tune_gpt_mini(3);
  ASSERT_GE(r.trials.size(), 2u);
  ASSERT_LE(r.trials.size(), 3u);
  int fastest = 0;
  for (size_t i = 0; i < r.trials.size(); ++i) {
    const LayoutTrial& t = r.trials[i];
    const Layout& l = t.predicted.layout;
    EXPECT_EQ(l.dp * l.tp * l.pp, 2) << l.str();
    EXPECT_EQ(l.batch * l.accum * l.dp, 4) << l.str();
    EXPECT_TRUE(t.failed.empty()) << l.str() << ": " << t.failed;
    EXPECT_GT(t.measured_samples_per_second, 0) << l.str();
    EXPECT_GE(t.timed_steps, 3) << l.str();
    EXPECT_TRUE(t.predicted.memory_exact) << l.str();
    // The plan is exact on the CPU: the fullest rank's peak is its plan to the byte (the
    // probe holds the evaluation loader that the plan counts).
    EXPECT_EQ(double(t.measured_peak_bytes), t.predicted.memory_bytes) << l.str();
    if (t.measured_samples_per_second > r.trials[size_t(fastest)].measured_samples_per_second) fastest = int(i);
    EXPECT_TRUE(ranks_agree(t.measured_samples_per_second)) << l.str();
    EXPECT_TRUE(ranks_agree(double(t.measured_peak_bytes))) << l.str();
    if (world().rank() == 0)
      std::printf("[ layout   ] %-62s predicted %8.1f measured %8.1f samples/s; memory plan %zu peak %zu\n",
                  l.str().c_str(), t.predicted.samples_per_second, t.measured_samples_per_second,
                  size_t(t.predicted.memory_bytes), t.measured_peak_bytes);
  }
  for (size_t i = 1; i < r.trials.size(); ++i)
    EXPECT_LE(r.trials[i - 1].predicted.step_seconds, r.trials[i].predicted.step_seconds) << "the planner's order";
  EXPECT_EQ(r.chosen, fastest);
  int chosen_flags = 0;
  for (const LayoutTrial& t : r.trials) chosen_flags += t.chosen;
  EXPECT_EQ(chosen_flags, 1);
  EXPECT_TRUE(ranks_agree(r.chosen));
  EXPECT_FALSE(r.reason.empty());
  EXPECT_NE(r.reason.find(r.chosen == 0 ? "first choice, confirmed" : "faster than the planner's first choice"),
            std::string::npos) << r.reason;

  // tune.json: the layouts with predicted beside measured, and the choice that train reads back.
  const nlohmann::json j = nlohmann::json::parse(layout_tune_json(r));
  ASSERT_EQ(j.at("layouts").size(), r.trials.size());
  for (auto& l : j.at("layouts"))
    for (const char* k : {"dp", "tp", "pp", "micro_batch", "accum", "schedule", "virtual_stages", "recompute",
                          "sequence_parallel", "zero", "predicted_step_seconds", "predicted_samples_per_second",
                          "measured_samples_per_second", "predicted_memory_bytes", "measured_peak_bytes", "chosen"})
      EXPECT_TRUE(l.contains(k)) << k;
  EXPECT_TRUE(j.at("layouts").at(size_t(r.chosen)).at("chosen").get<bool>());
  const fs::path file = fs::temp_directory_path() / ("sat_layout_tune_" + std::to_string(getpid()) + ".json");
  std::ofstream(file) << j.dump();
  Layout back;
  double measured = 0, predicted = 0;
  ASSERT_TRUE(shared_layout_choice(&world(), file.string(), back, measured, predicted));
  EXPECT_EQ(back.str(), r.choice().predicted.layout.str());
  EXPECT_DOUBLE_EQ(measured, r.choice().measured_samples_per_second);
  fs::remove(file);
  const std::string text = layout_tune_text(r), html = layout_tune_html(r);
  EXPECT_NE(text.find("<- chosen"), std::string::npos) << text;
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  if (world().rank() == 0) std::printf("%s", text.c_str());
}

// The fields --layout fixes are kept by every layout timed.
TEST(LayoutTuneRanks, FixedFieldsAreKept) {
  if (!sat::test::world_is(2)) GTEST_SKIP() << "runs under mpirun -np 2 (ctest layout_tune_np2)";
  cpu::set_num_threads(1);
  ModelConfig mc = model_config("mlp");
  DataSplit data = open_dataset("synthetic", data_options_for(mc, 0));
  fit_to_data(mc, *data.train);
  TrainConfig base;
  base.comm = &world();
  base.progress = 0;
  LayoutTuneConfig t;
  t.global_batch = 32;
  t.filter = parse_layout("dp=2,zero=1");
  t.candidates = 2;
  t.memory_budget = size_t(256) << 20;
  t.probe_seconds = 0.05;
  t.min_steps = 3;
  t.progress = 0;
  const LayoutTuneResult r = tune_layout(mc, base, *data.train, data.test.get(), t);
  ASSERT_FALSE(r.trials.empty());
  for (const LayoutTrial& x : r.trials) {
    EXPECT_EQ(x.predicted.layout.dp, 2);
    EXPECT_EQ(x.predicted.layout.zero, 1);
    EXPECT_TRUE(x.failed.empty()) << x.failed;
  }
  EXPECT_EQ(r.filter, "dp=2,zero=1");
}

TEST(LayoutTune, FilterTextAndApply) {
  LayoutFilter f = parse_layout("tp=2,micro=4,schedule=interleaved,v=2,recompute=full,sp=on,zero=1");
  EXPECT_EQ(filter_str(f), "tp=2,micro=4,schedule=interleaved,v=2,recompute=full,sp=on,zero=1");
  EXPECT_EQ(filter_str(LayoutFilter{}), "");
  Layout l;
  l.dp = 1, l.tp = 2, l.pp = 2, l.batch = 3, l.accum = 4, l.pp_schedule = PipeSchedule::interleaved;
  l.virtual_stages = 2, l.recompute = Recompute::selective, l.sequence_parallel = true, l.zero = 0;
  TrainConfig c;
  c.pp_split = {1};
  apply_layout(l, c);
  EXPECT_EQ(c.batch, 3);
  EXPECT_EQ(c.accum, 4);
  EXPECT_EQ(c.tp, 2);
  EXPECT_EQ(c.pp, 2);
  EXPECT_EQ(c.pp_schedule, PipeSchedule::interleaved);
  EXPECT_EQ(c.virtual_stages, 2);
  EXPECT_EQ(c.recompute, Recompute::selective);
  EXPECT_TRUE(c.sequence_parallel);
  EXPECT_TRUE(c.pp_split.empty());
  Layout none;
  double m = 0, p = 0;
  EXPECT_FALSE(read_layout_choice("/nonexistent/tune.json", none, m, p));
  const fs::path bad = fs::temp_directory_path() / ("sat_layout_bad_" + std::to_string(getpid()) + ".json");
  std::ofstream(bad) << "{\"choice\": {\"micro_batch\": 4}}";  // a batch tuning's file: not a layout choice
  EXPECT_FALSE(read_layout_choice(bad.string(), none, m, p));
  fs::remove(bad);
}

// Regression (fuzz_tune_cache): a damaged cache's layout of 0 or -3 ranks, a zero level of
// 7 or a count beyond int was taken as it stood and handed to the trainer; now the file is
// not a valid choice (tune again), as a missing key is.
TEST(LayoutTune, CachedChoiceWithImpossibleCountsIsNotTaken) {
  const fs::path f = fs::temp_directory_path() / ("sat_layout_counts_" + std::to_string(getpid()) + ".json");
  // The cache a layout tuning writes, with one field's value replaced.
  auto read_with = [&](const std::string& key, const std::string& value) {
    std::vector<std::pair<std::string, std::string>> fields{
        {"dp", "2"}, {"tp", "1"}, {"pp", "1"}, {"micro_batch", "16"}, {"accum", "2"}, {"schedule", "\"1f1b\""},
        {"virtual_stages", "1"}, {"recompute", "\"none\""}, {"sequence_parallel", "false"}, {"zero", "0"},
        {"measured_samples_per_second", "100"}, {"predicted_samples_per_second", "90"}};
    std::string c;
    for (auto& [k, v] : fields) c += (c.empty() ? "" : ", ") + ("\"" + k + "\": ") + (k == key ? value : v);
    std::ofstream(f) << "{\"layout_choice\": {" << c << "}}";
    Layout l;
    double m = 0, p = 0;
    return read_layout_choice(f.string(), l, m, p);
  };
  EXPECT_TRUE(read_with("", ""));
  for (auto [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"dp", "0"}, {"tp", "-3"}, {"pp", "4294967297"}, {"micro_batch", "0"}, {"accum", "-1"},
           {"virtual_stages", "0"}, {"zero", "7"}, {"zero", "-1"}, {"dp", "1.5"}})
    EXPECT_FALSE(read_with(key, value)) << key << " = " << value;
  fs::remove(f);
}
