// The trainer's seams: the Layout value and its rank arithmetic against the mesh's, the
// support matrix as data and the refusals it gives, the job's plan building each graph
// once, evaluation's forward-only schedule checked as data, and a run's observers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>

#include "backend/device_backend.h"
#include "backend/support.h"
#include "core/error.h"
#include "data/dataset.h"
#include "dist/mesh.h"
#include "nn/models.h"
#include "train/layout.h"
#include "train/plan.h"
#include "train/schedule.h"
#include "train/trainer.h"
#include "train/validate.h"

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const sat::Error& e) {
    return e.what();
  }
  return "";
}

// ---- Layout ----------------------------------------------------------------------------
TEST(Layout, CoordinatesRoundTripInMegatronsOrder) {
  sat::Layout l;
  l.tp = 2, l.pp = 3;
  l = l.with_world(12);
  ASSERT_EQ(l.dp, 2);
  std::set<std::tuple<int, int, int>> seen;
  for (int r = 0; r < 12; ++r) {
    const sat::dist::MeshCoords c = l.coords(r);
    EXPECT_EQ(l.rank_of(c), r);
    // tp fastest, then dp, then pp
    EXPECT_EQ(c.tp, r % 2);
    EXPECT_EQ(c.dp, r / 2 % 2);
    EXPECT_EQ(c.pp, r / 4);
    seen.insert({c.tp, c.dp, c.pp});
  }
  EXPECT_EQ(seen.size(), 12u);
}

TEST(Layout, ChecksGlobalBatchScheduleAndText) {
  sat::Layout l;
  l.batch = 8, l.accum = 4, l.tp = 2;
  EXPECT_EQ(l.global_batch(8), 8 * 4 * 4);
  EXPECT_EQ(l.schedule_spec().micro, 4);
  EXPECT_EQ(l.with_world(8).str(), "dp=4,tp=2,pp=1,micro=8,schedule=none,recompute=none,sp=off,zero=0");
  l.batch = int64_t(1) << 30;
  l.accum = int64_t(1) << 20;
  EXPECT_NE(error_of([&] { (void)l.global_batch(2); }).find("more than 2^40 samples per optimizer step"),
            std::string::npos);
  sat::Layout p;
  p.pp = 3;
  EXPECT_NE(error_of([&] { p.check(4); }).find("--tp 1 x --pp 3 = 3 does not divide the 4 processes"),
            std::string::npos);
  p.pp = 2, p.pp_schedule = sat::PipeSchedule::interleaved, p.virtual_stages = 2, p.accum = 1;
  EXPECT_NE(error_of([&] { p.check(2); }).find("the interleaved schedule needs at least --pp 2"), std::string::npos);
  sat::Layout z;
  z.zero = 3;
  EXPECT_NE(error_of([&] { z.check(1); }).find("--zero 3 shards the model over the data-parallel ranks"),
            std::string::npos);
}

// A TrainConfig is a Layout: what the planner chooses goes in whole.
TEST(Layout, TrainConfigIsALayout) {
  sat::TrainConfig cfg;
  sat::Layout l;
  l.tp = 2, l.pp = 2, l.batch = 3, l.accum = 5, l.zero = 1, l.recompute = sat::Recompute::full;
  static_cast<sat::Layout&>(cfg) = l;
  EXPECT_EQ(cfg.tp, 2);
  EXPECT_EQ(cfg.batch, 3);
  EXPECT_EQ(cfg.global_batch(8), 3 * 5 * 2);
}

// ---- the support matrix ----------------------------------------------------------------
TEST(Support, EveryFeatureHasOneRowAndTheRefusalsNameTheFlag) {
  std::set<sat::Feature> rows;
  for (const sat::SupportRow& r : sat::support_matrix()) {
    EXPECT_TRUE(rows.insert(r.feature).second) << r.name;
    EXPECT_NE(r.cpu, sat::Support::compiled) << r.name << ": the CPU path is always run here";
    if (r.cpu == sat::Support::not_built || r.cuda == sat::Support::not_built) {
      EXPECT_STRNE(r.why, "") << r.name;
    }
  }
  EXPECT_EQ(rows.size(), size_t(sat::Feature::kCount));
  EXPECT_EQ(error_of([] { sat::require(sat::Device::cuda, sat::Feature::recompute, "--recompute full"); }),
            "--recompute full needs --device cpu for now (the GPU engine does not recompute activations yet)");
  // ZeRO on GPUs: compiled, not yet run.
  EXPECT_EQ(sat::support(sat::Device::cuda, sat::Feature::zero23), sat::Support::compiled);
  EXPECT_EQ(sat::support(sat::Device::cuda, sat::Feature::zero1), sat::Support::compiled);
  EXPECT_EQ(error_of([] { sat::require(sat::Device::cuda, sat::Feature::zero23, "--zero 2"); }), "");
  EXPECT_EQ(error_of([] { sat::require(sat::Device::cpu, sat::Feature::fp16, "--precision fp16"); }),
            "--precision fp16 needs --device cuda (the CPU engine's precisions are fp32 and bf16)");
  EXPECT_EQ(error_of([] { sat::require(sat::Device::cpu, sat::Feature::zero23); }), "");
  const std::string table = sat::support_table();
  for (const sat::SupportRow& r : sat::support_matrix()) EXPECT_NE(table.find(r.name), std::string::npos) << r.name;
}

// The README's table is the matrix (the code's, as support_markdown prints it).
TEST(Support, TheReadmeShowsTheMatrix) {
  std::ifstream f(std::string(SAT_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(f) << "README.md";
  const std::string readme((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(readme.find(sat::support_markdown()), std::string::npos)
      << "README.md's table under <!-- support matrix --> should read:\n" << sat::support_markdown();
}

// docs/promises.md holds each promise to a test: every `Suite.Name` it names is a TEST or a
// TEST_F of the suite (a renamed or deleted test would leave a promise held by nothing).
TEST(Docs, EveryPromiseNamesATestThatExists) {
  const std::string root = SAT_SOURCE_DIR;
  auto read = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  std::string tests;
  for (auto& e : std::filesystem::directory_iterator(root + "/tests"))
    if (e.path().extension() == ".cpp") tests += read(e.path());
  const std::string doc = read(root + "/docs/promises.md");
  ASSERT_FALSE(doc.empty()) << "docs/promises.md";
  const std::regex name("`([A-Z][A-Za-z]*)\\.([A-Z][A-Za-z0-9]*)`");
  int named = 0;
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), name); it != std::sregex_iterator(); ++it, ++named) {
    const std::string suite = (*it)[1], test = (*it)[2];
    const bool found = tests.find("TEST(" + suite + ", " + test + ")") != std::string::npos ||
                       tests.find("TEST_F(" + suite + ", " + test + ")") != std::string::npos;
    EXPECT_TRUE(found) << "docs/promises.md names " << suite << "." << test << ", which no test defines";
  }
  EXPECT_GE(named, 15);
}

// validate_run refuses from the matrix: what the CPU lacks, named by its flag.
TEST(Support, ValidationRefusesFromTheMatrix) {
  sat::ModelConfig mc = sat::model_config("mlp");
  sat::TrainConfig cfg;
  cfg.device = "cpu";
  cfg.precision = sat::Precision::tf32;
  EXPECT_NE(error_of([&] { sat::validate_run(mc, cfg, 1); }).find("--precision tf32 needs --device cuda"),
            std::string::npos);
  cfg.precision = sat::Precision::fp32;
  cfg.dist_backend = sat::DistBackend::nccl;
  EXPECT_NE(error_of([&] { sat::validate_run(mc, cfg, 1); }).find("--dist-backend nccl needs --device cuda"),
            std::string::npos);
  cfg.dist_backend = sat::DistBackend::automatic;
  EXPECT_EQ(error_of([&] { sat::validate_run(mc, cfg, 1); }), "");
  // Mixture-of-experts layers: float32 on the CPU only.
  const sat::ModelConfig moe = sat::model_config("moe:layers=1,heads=2,width=32,experts=4,top_k=2,context=16,vocab=64");
  EXPECT_EQ(error_of([&] { sat::validate_run(moe, cfg, 1); }), "");
  cfg.precision = sat::Precision::bf16;
  EXPECT_NE(error_of([&] { sat::validate_run(moe, cfg, 1); }).find("--precision bf16: " + moe.name +
                                                                   "'s mixture-of-experts layers run in float32 only"),
            std::string::npos);
}

// What the engine runs on the CPU only is marked for a GPU plan, each naming its flag.
TEST(Support, GpuPlansMarkWhatRunsOnTheCpuOnly) {
  const sat::ModelConfig moe = sat::model_config("moe:layers=1,heads=2,width=32,experts=4,top_k=2,context=16,vocab=64");
  sat::Layout l;
  l.dp = 2, l.ep = 2, l.pp = 2, l.pp_schedule = sat::PipeSchedule::zb_h1, l.cp = 2;
  const std::vector<std::string> why = sat::refusals(l, sat::Device::cuda, &moe);
  std::string all;
  for (const std::string& w : why) all += w + "\n";
  for (const char* flag : {"--pp-schedule zb-h1 needs --device cpu", "--cp 2 needs --device cpu",
                           "--model moe:... needs --device cpu", "--ep 2 needs --device cpu"})
    EXPECT_NE(all.find(flag), std::string::npos) << flag << " in\n" << all;
  EXPECT_TRUE(sat::refusals(l, sat::Device::cpu, &moe).empty());
}

// ZeRO on GPUs is compiled: validation accepts --zero 1/2/3 --device cuda where a GPU exists,
// and without one refuses it for want of a GPU (the error of any --device cuda run).
TEST(Support, ZeroOnCudaIsAcceptedWhereAGpuExists) {
  sat::ModelConfig mc = sat::model_config("mlp");
  sat::TrainConfig cfg;
  cfg.device = "cuda";
  for (int zero : {1, 2, 3}) {
    cfg.zero = zero;
    const std::string err = error_of([&] { sat::validate_run(mc, cfg, 2); });
    if (sat::cuda_device_count() > 0) {
      EXPECT_EQ(err, "") << "--zero " << zero;
    } else {
      EXPECT_EQ(err.rfind("--device cuda: no usable GPU (", 0), 0u) << err;
      EXPECT_EQ(err.find("--zero"), std::string::npos) << err;
    }
  }
}

// ---- the job's plan: each graph once -----------------------------------------------------
std::map<std::string, int> builds_since(const std::map<std::string, int>& before) {
  std::map<std::string, int> d;
  for (const auto& [k, n] : sat::graph_builds()) {
    const auto it = before.find(k);
    const int was = it == before.end() ? 0 : it->second;
    if (n > was) d[k] = n - was;
  }
  return d;
}

TEST(JobPlan, BuildsEveryGraphOnce) {
  sat::ModelConfig mc = sat::model_config("gpt-mini");
  sat::TrainConfig cfg;
  cfg.batch = 2, cfg.accum = 2, cfg.pp = 2, cfg.tp = 2, cfg.recompute = sat::Recompute::full, cfg.device = "cpu";
  sat::DataSplit data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  const auto before = sat::graph_builds();
  sat::JobPlan job(sat::resolved_model(mc, cfg, 1), cfg, *data.train, data.test.get(), 1);
  for (int round = 0; round < 2; ++round)  // asked twice: planned once
    for (int s = 0; s < cfg.pp; ++s) EXPECT_GT(job.stage(s).memory.total(), 0u);
  sat::TrainConfig plain = cfg;
  plain.zero = 0, plain.optim.name = "sgd";
  EXPECT_GT(job.memory_with(0, plain).total(), 0u);
  const auto built = builds_since(before);
  for (const auto& [key, n] : built) EXPECT_EQ(n, 1) << key;
  // the whole model (this tp rank's), the unsplit one, and the two stages
  EXPECT_EQ(built.size(), 4u);
  EXPECT_GT(job.model_parameters(), job.whole().graph->param_count());
}

// ---- evaluation's schedule ----------------------------------------------------------------
TEST(ForwardSchedule, EveryStageRunsEachForwardOnceWithoutDeadlock) {
  for (int P = 1; P <= 6; ++P)
    for (int V = 1; V <= 3; ++V)
      for (int M = 1; M <= 3; ++M) {
        if (V > 1 && P == 1) continue;  // (interleaving needs two stages or more)
        const sat::ScheduleSpec s{V > 1 ? sat::PipeSchedule::interleaved : sat::PipeSchedule::one_f_one_b, P, M, V};
        std::vector<std::vector<sat::Action>> lists;
        for (int stage = 0; stage < P; ++stage) {
          lists.push_back(sat::make_forward_schedule(s, stage));
          int forwards = 0;
          for (const sat::Action& a : lists.back()) {
            EXPECT_NE(a.kind, sat::ActionKind::backward);
            EXPECT_NE(a.kind, sat::ActionKind::optimizer);
            forwards += a.kind == sat::ActionKind::forward;
          }
          EXPECT_EQ(forwards, M * V) << "P=" << P << " V=" << V << " M=" << M;
        }
        const sat::ScheduleSim sim = sat::simulate_actions(lists, V);
        EXPECT_FALSE(sim.deadlock) << "P=" << P << " V=" << V << " M=" << M << ": " << sim.problem;
        EXPECT_EQ(sim.problem, "") << "P=" << P << " V=" << V << " M=" << M;
      }
}

// ---- the loop's observers ----------------------------------------------------------------
class Counting final : public sat::RunObserver {
 public:
  void step_begins(sat::RunState&) override { ++begun; }
  void step_ends(sat::StepDone& d, sat::RunState&) override { steps.push_back(d.metrics.step); }
  void run_ends(sat::RunState& run) override { ended = run.total; }
  int begun = 0;
  std::vector<int64_t> steps;
  int64_t ended = 0;
};

TEST(Trainer, AttachedObserversSeeEveryStepAndTheEnd) {
  sat::ModelConfig mc = sat::model_config("mlp");
  sat::DataSplit data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  sat::fit_to_data(mc, *data.train);
  sat::TrainConfig cfg;
  cfg.device = "cpu", cfg.steps = 5, cfg.batch = 8, cfg.progress = 0;
  sat::Trainer t(mc, cfg, *data.train, data.test.get());
  Counting c;
  t.attach(&c);
  const sat::TrainResult r = t.run();
  EXPECT_EQ(c.begun, 5);
  EXPECT_EQ(c.steps, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(c.ended, 5);
  EXPECT_EQ(r.losses.size(), 5u);
  ASSERT_TRUE(r.test.has_value());
  // Evaluating again through the forward-only schedule gives the same figures.
  const sat::EvalResult again = t.evaluate();
  EXPECT_EQ(again.loss, r.test->loss);
  EXPECT_EQ(again.accuracy, r.test->accuracy);
  EXPECT_EQ(again.samples, r.test->samples);
}

}  // namespace
