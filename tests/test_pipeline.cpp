// Pipeline and model parallelism. Without mpirun: stage graphs, their plans and the
// errors of bad layouts. Under mpirun (CMake runs this binary as pipeline_np2 and
// pipeline_np4): every schedule follows the one-process loss trajectory, alone and with
// data parallelism, and every rank's memory plan holds its measured peak. Rank 0 trains
// the one-process reference itself while the others wait.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>

#include "backend/cpu/blas.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "error_of.h"
#include "mpi_world.h"
#include "nn/models.h"
#include "nn/safetensors.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "trajectory.h"
#ifdef SAT_MPIEXEC
#include "mpi_job.h"
#endif

namespace {

using sat::dist::Comm;
using sat::PipeSchedule;

using sat::test::world;
using sat::test::distributed;

// gpt-mini's shape with 8 layers: 8 pieces for zb-v on 4 stages.
constexpr const char* kGpt8 = "gpt:layers=8,heads=4,width=256,context=128,vocab=4096";


sat::TrainConfig layout(int pp, PipeSchedule kind, int accum, int v = 1) {
  sat::TrainConfig cfg;
  cfg.pp = pp;
  cfg.pp_schedule = kind;
  cfg.accum = accum;
  cfg.virtual_stages = v;
  return cfg;
}

// ---- stage graphs ----------------------------------------------------------------------

// Cutting a model into stages loses nothing and invents nothing: every node is in exactly
// one stage, the parameters are the whole model's (plus the copy of a weight tied across
// stages), and what one stage sends is exactly what the next receives.
TEST(StageGraphs, StagesPartitionTheModel) {
  struct Case { const char* model; int pp; PipeSchedule kind; int v; };
  for (Case c : {Case{"mlp", 2, PipeSchedule::one_f_one_b, 1}, Case{"mlp", 4, PipeSchedule::gpipe, 1},
                 Case{"mlp", 2, PipeSchedule::interleaved, 3}, Case{"convnet", 4, PipeSchedule::interleaved, 3},
                 Case{"resnet18", 3, PipeSchedule::one_f_one_b, 1}, Case{"gpt-mini", 2, PipeSchedule::one_f_one_b, 1},
                 Case{"gpt-mini", 2, PipeSchedule::interleaved, 2}, Case{"gpt-mini", 4, PipeSchedule::gpipe, 1},
                 Case{"llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256", 2,
                      PipeSchedule::one_f_one_b, 1}}) {
    const auto mc = sat::model_config(c.model);
    const sat::BuiltModel whole = sat::build_model(mc, 2);
    sat::TrainConfig cfg = layout(c.pp, c.kind, 4, c.v);
    const sat::StageSplit split = sat::split_model(*whole.graph, cfg, c.model);
    ASSERT_EQ(int(split.cuts.size()), c.pp * c.v + 1);
    std::set<std::string> nodes, params;
    int64_t count = 0, copies = 0;
    std::vector<std::vector<int>> sent(size_t(c.pp * c.v)), received(size_t(c.pp * c.v));
    for (int s = 0; s < c.pp; ++s) {
      const sat::BuiltModel st = sat::build_model(mc, 2, true, split.nodes_of(*whole.graph, s));
      const sat::Graph& g = *st.graph;
      ASSERT_EQ(int(g.chunks().size()), c.v);
      for (auto& n : g.nodes()) EXPECT_TRUE(nodes.insert(n.name).second) << n.name << " is in two stages";
      for (auto& p : g.params()) params.insert(p.name);
      count += g.param_count();
      for (auto& p : g.params())
        for (auto& name : g.tied_copies())
          if (p.name == name) copies += p.spec.shape.numel();
      for (int k = 0; k < c.v; ++k) {
        sent[size_t(k * c.pp + s)] = g.chunks()[size_t(k)].sent;
        received[size_t(k * c.pp + s)] = g.chunks()[size_t(k)].received;
      }
      EXPECT_EQ(g.loss() >= 0, s == c.pp - 1) << c.model << " stage " << s;
    }
    EXPECT_EQ(nodes.size(), whole.graph->nodes().size()) << c.model;
    EXPECT_EQ(params.size(), whole.graph->params().size()) << c.model;
    EXPECT_EQ(count - copies, whole.graph->param_count()) << c.model;
    for (int k = 0; k + 1 < c.pp * c.v; ++k) {
      EXPECT_FALSE(sent[size_t(k)].empty()) << c.model << " piece " << k;
      EXPECT_EQ(sent[size_t(k)], received[size_t(k) + 1]) << c.model << " piece " << k;
    }
    EXPECT_TRUE(received[0].empty() && sent.back().empty());
  }
}

// GPT's output head is tied to the token embedding: the last stage declares a copy of
// the embedding's weight, the first knows that its weight is used elsewhere.
TEST(StageGraphs, TiedEmbeddingIsCopiedToTheLastStage) {
  const auto mc = sat::model_config("gpt-mini");
  const sat::BuiltModel whole = sat::build_model(mc, 1);
  const sat::StageSplit split = sat::split_model(*whole.graph, layout(2, PipeSchedule::one_f_one_b, 1), "gpt-mini");
  const sat::BuiltModel first = sat::build_model(mc, 1, true, split.nodes_of(*whole.graph, 0));
  const sat::BuiltModel last = sat::build_model(mc, 1, true, split.nodes_of(*whole.graph, 1));
  EXPECT_EQ(first.graph->tied_remote(), std::vector<std::string>{"transformer.wte.weight"});
  EXPECT_TRUE(first.graph->tied_copies().empty());
  EXPECT_EQ(last.graph->tied_copies(), std::vector<std::string>{"transformer.wte.weight"});
  // Seeded by name: the copy starts equal to the original.
  sat::ParamStore a(first.graph->params(), {}, 0), b(last.graph->params(), {}, 0);
  a.init(5);
  b.init(5);
  const int ia = a.find_param("transformer.wte.weight"), ib = b.find_param("transformer.wte.weight");
  ASSERT_GE(ia, 0);
  ASSERT_GE(ib, 0);
  sat::Tensor ta = a.param(size_t(ia)), tb = b.param(size_t(ib));
  EXPECT_EQ(0, std::memcmp(ta.ptr, tb.ptr, ta.bytes()));
}

// In a V (zb-v) stage s holds pieces s and 2P-1-s: both ends of the model, the loss and the
// tied embedding (one parameter, no copy) are on stage 0, and the last stage hands its first
// chunk's output on to its second as a value of its own (made after the model's values, so the
// ids the stages exchange stay the whole model's).
TEST(StageGraphs, VShapePutsBothEndsOnTheFirstStage) {
  const auto mc = sat::model_config("gpt-mini");
  const sat::BuiltModel whole = sat::build_model(mc, 1);
  const sat::StageSplit split = sat::split_model(*whole.graph, layout(2, PipeSchedule::zb_v, 4, 2), "gpt-mini");
  ASSERT_EQ(split.cuts, (std::vector<int>{0, 1, 2, 3, 4}));
  const sat::BuiltModel first = sat::build_model(mc, 1, true, split.nodes_of(*whole.graph, 0));
  const sat::BuiltModel last = sat::build_model(mc, 1, true, split.nodes_of(*whole.graph, 1));
  const sat::Graph &f = *first.graph, &l = *last.graph;
  EXPECT_GE(f.loss(), 0);
  EXPECT_LT(l.loss(), 0);
  EXPECT_TRUE(f.tied_copies().empty() && f.tied_remote().empty() && l.tied_copies().empty());
  EXPECT_EQ(f.param_count() + l.param_count(), whole.graph->param_count());
  ASSERT_EQ(f.chunks().size(), 2u);
  ASSERT_EQ(l.chunks().size(), 2u);
  EXPECT_EQ(f.chunks()[0].sent, l.chunks()[0].received);  // piece 0 -> 1
  EXPECT_EQ(l.chunks()[1].sent, f.chunks()[1].received);  // piece 2 -> 3
  EXPECT_TRUE(f.chunks()[0].received.empty() && f.chunks()[1].sent.empty());
  // The turn, piece 1 -> 2 on the last stage.
  ASSERT_EQ(l.chunks()[0].sent.size(), 1u);
  ASSERT_EQ(l.chunks()[1].received.size(), 1u);
  const sat::Value& copy = l.value(l.chunks()[1].received[0]);
  EXPECT_EQ(copy.handed_from, l.chunks()[0].sent[0]);
  EXPECT_EQ(l.chunks()[1].received[0], int(whole.graph->values().size()));
  EXPECT_EQ(l.value(copy.handed_from).handed_from, -1);
}

// The default cut balances FLOPs and memory; a cut by hand lands where it is asked.
TEST(StageGraphs, SplitIsBalancedOrWhereAsked) {
  const auto mc = sat::model_config("gpt-mini");
  const sat::BuiltModel whole = sat::build_model(mc, 8);
  auto cuts = sat::split_model(*whole.graph, layout(4, PipeSchedule::one_f_one_b, 4), "gpt-mini").cuts;
  EXPECT_EQ(cuts, (std::vector<int>{0, 1, 2, 3, 4}));
  sat::TrainConfig cfg = layout(2, PipeSchedule::one_f_one_b, 4);
  cfg.pp_split = {1};
  EXPECT_EQ(sat::split_model(*whole.graph, cfg, "gpt-mini").cuts, (std::vector<int>{0, 1, 4}));
  // FLOPs first: gpt-mini's output head costs more than a layer, so the last stage gets one.
  EXPECT_EQ(sat::split_model(*whole.graph, layout(2, PipeSchedule::one_f_one_b, 4), "gpt-mini").cuts,
            (std::vector<int>{0, 3, 4}));
  const sat::BuiltModel mlp = sat::build_model(sat::model_config("mlp"), 8);
  auto m = sat::split_model(*mlp.graph, layout(2, PipeSchedule::one_f_one_b, 4), "mlp").cuts;
  std::printf("balanced cut of mlp in two: at block %d of 6\n", m[1]);
  EXPECT_GT(m[1], 0);
  EXPECT_LT(m[1], 6);
}

std::string error_of(const std::function<void()>& f) { return sat::test::error_of(f, "(accepted)"); }

TEST(StageGraphs, BadLayoutsAreClearErrors) {
  const auto mc = sat::model_config("gpt-mini");
  const sat::BuiltModel whole = sat::build_model(mc, 2);
  auto split = [&](sat::TrainConfig cfg) { return error_of([&] { sat::split_model(*whole.graph, cfg, "gpt-mini"); }); };
  EXPECT_NE(split(layout(8, PipeSchedule::one_f_one_b, 8)).find("--pp 8: gpt-mini has 4 blocks"), std::string::npos)
      << split(layout(8, PipeSchedule::one_f_one_b, 8));
  sat::TrainConfig cfg = layout(2, PipeSchedule::one_f_one_b, 4);
  for (std::vector<int> bad : {std::vector<int>{0}, {4}, {1, 2}}) {
    cfg.pp_split = bad;
    EXPECT_NE(split(cfg).find("--pp-split"), std::string::npos) << split(cfg);
  }
  cfg = layout(3, PipeSchedule::one_f_one_b, 4);
  cfg.pp_split = {2, 1};
  EXPECT_NE(split(cfg).find("increasing"), std::string::npos) << split(cfg);
  // 4 blocks do not make 2 stages x 3 chunks, nor divide into 2 x 2 ... (they do: 4 / 4).
  EXPECT_NE(split(layout(2, PipeSchedule::interleaved, 4, 3)).find("--pp 2 x --virtual-stages 3"), std::string::npos)
      << split(layout(2, PipeSchedule::interleaved, 4, 3));
  const sat::BuiltModel mlp = sat::build_model(sat::model_config("mlp"), 2);
  EXPECT_NE(error_of([&] { sat::split_model(*mlp.graph, layout(2, PipeSchedule::interleaved, 4, 2), "mlp"); })
                .find("--virtual-stages 2"),
            std::string::npos);
  EXPECT_NE(split(layout(4, PipeSchedule::interleaved, 2, 1)).find("--"), std::string::npos);
  EXPECT_NE(error_of([&] { sat::check_pipeline(layout(4, PipeSchedule::interleaved, 2, 2)); }).find("--accum"),
            std::string::npos)
      << error_of([&] { sat::check_pipeline(layout(4, PipeSchedule::interleaved, 2, 2)); });
  EXPECT_EQ(split(layout(2, PipeSchedule::interleaved, 4, 2)), "(accepted)");
  // zb-h1 splits every backward in two: ZeRO-2/3's per-unit staging does not follow that yet, and a
  // layer with parameters and input gradients that cannot split is refused by name.
  EXPECT_EQ(split(layout(2, PipeSchedule::zb_h1, 4)), "(accepted)");
  sat::TrainConfig zb = layout(2, PipeSchedule::zb_h1, 4);
  zb.zero = 2;
  EXPECT_NE(split(zb).find("--pp-schedule zb-h1 with --zero 2"), std::string::npos) << split(zb);
  auto convnet = sat::model_config("convnet");
  auto images = sat::open_dataset("synthetic", sat::data_options_for(convnet, 0));
  EXPECT_EQ(error_of([&] { sat::plan_rank(convnet, layout(2, PipeSchedule::zb_h1, 4), *images.train, nullptr, 0, 1); }),
            "--pp-schedule zb-h1: layer 'bn1' (BatchNorm2d) cannot split its backward into input and weight gradients");
  // zb-v likewise, and it needs two chunks per rank (the command line gives them) and 2P blocks.
  sat::TrainConfig zv = layout(2, PipeSchedule::zb_v, 4, 2);
  zv.zero = 2;
  EXPECT_NE(split(zv).find("--pp-schedule zb-v with --zero 2"), std::string::npos) << split(zv);
  EXPECT_NE(split(layout(2, PipeSchedule::zb_v, 4, 1)).find("--virtual-stages 1: --pp-schedule zb-v runs exactly two"),
            std::string::npos) << split(layout(2, PipeSchedule::zb_v, 4, 1));
  EXPECT_NE(split(layout(4, PipeSchedule::zb_v, 4, 2)).find("--pp 4 x --virtual-stages 2 = 8 model chunks: gpt-mini has 4"),
            std::string::npos) << split(layout(4, PipeSchedule::zb_v, 4, 2));
  EXPECT_EQ(split(layout(1, PipeSchedule::zb_v, 4, 2)), "--pp-schedule zb-v needs --pp 2 or more (got 1)");
}

// A split backward's weight part reads what the node's backward reads: the plan keeps it
// until W. zb-h1 holds at most 2P-1 micro-batches for their weight gradients (the first
// stage's contexts), more than 1F1B's P, and its arena is never smaller than 1F1B's.
TEST(StagePlan, ZeroBubbleHoldsTheWeightGradientsInputs) {
  const auto mc = sat::model_config("gpt-mini");
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  for (int pp : {2, 4})
    for (int m : {1, 4, 8})
      for (int s = 0; s < pp; ++s) {
        sat::TrainConfig z = layout(pp, PipeSchedule::zb_h1, m), f = layout(pp, PipeSchedule::one_f_one_b, m);
        z.batch = f.batch = 2;
        const sat::RankPlan pz = sat::plan_rank(mc, z, *data.train, nullptr, s, 1);
        const sat::RankPlan pf = sat::plan_rank(mc, f, *data.train, nullptr, s, 1);
        EXPECT_EQ(pz.memory.contexts, sat::max_held_for_weights(pz.actions, 0)) << "pp " << pp << " M " << m << " s " << s;
        EXPECT_LE(pz.memory.contexts, std::min(m, 2 * pp - 1));
        EXPECT_GE(pz.memory.transient, pf.memory.transient) << "pp " << pp << " M " << m << " stage " << s;
      }
}

// Each stage's plan holds the micro-batches its schedule keeps in flight: GPipe all of
// them, 1F1B at most stages - stage; activation memory grows with M under GPipe only.
TEST(StagePlan, ContextsFollowTheSchedule) {
  const auto mc = sat::model_config("gpt-mini");
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
  for (int pp : {2, 4})
    for (int m : {1, 4, 8}) {
      for (int s = 0; s < pp; ++s) {
        sat::TrainConfig g = layout(pp, PipeSchedule::gpipe, m), f = layout(pp, PipeSchedule::one_f_one_b, m);
        g.batch = f.batch = 2;
        const sat::RankPlan pg = sat::plan_rank(mc, g, *data.train, nullptr, s, 1);
        const sat::RankPlan pf = sat::plan_rank(mc, f, *data.train, nullptr, s, 1);
        EXPECT_EQ(pg.memory.contexts, m) << "gpipe pp " << pp << " M " << m << " stage " << s;
        EXPECT_EQ(pf.memory.contexts, std::min(m, pp - s)) << "1f1b pp " << pp << " M " << m << " stage " << s;
        EXPECT_LE(pf.memory.transient, pg.memory.transient);
      }
    }
  // Without pipelining every micro-batch reuses one context: the arena of one micro-batch.
  sat::TrainConfig one = layout(1, PipeSchedule::one_f_one_b, 1), acc = layout(1, PipeSchedule::one_f_one_b, 8);
  one.batch = acc.batch = 2;
  EXPECT_EQ(sat::plan_rank(mc, one, *data.train, nullptr, 0, 1).memory.transient,
            sat::plan_rank(mc, acc, *data.train, nullptr, 0, 1).memory.transient);
  sat::TrainConfig gp = layout(1, PipeSchedule::gpipe, 8);
  gp.batch = 2;
  EXPECT_GT(sat::plan_rank(mc, gp, *data.train, nullptr, 0, 1).memory.transient,
            4 * sat::plan_rank(mc, one, *data.train, nullptr, 0, 1).memory.transient);
}

// ---- under mpirun: exactness against one process ---------------------------------------

struct Case {
  std::string model;
  int pp = 2;
  PipeSchedule kind = PipeSchedule::one_f_one_b;
  int v = 1;
  int64_t batch = 4, accum = 4;
  int steps = 20;
  std::string optimizer = "sgd";
  float lr = 0.05f;
  bool sync_bn = false;
  int zero = 0;
  bool evaluate = false;
  sat::Precision precision = sat::Precision::fp32;
};

struct RunOut {
  std::vector<double> losses;
  sat::EvalResult test;
  size_t predicted = 0, peak = 0;
  double bubble = 0;
};

RunOut train(const Case& c, Comm& comm, int pp) {
  sat::cpu::set_num_threads(1);
  auto mc = sat::model_config(c.model);
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 7));
  sat::TrainConfig cfg = layout(pp, pp > 1 ? c.kind : PipeSchedule::one_f_one_b, int(c.accum), pp > 1 ? c.v : 1);
  cfg.batch = c.batch;
  cfg.steps = c.steps;
  cfg.seed = 3;
  cfg.optim.name = c.optimizer;
  cfg.optim.lr = c.lr;
  cfg.optim.momentum = c.optimizer == "sgd" ? 0.9f : 0.0f;
  cfg.evaluate = c.evaluate;
  cfg.progress = 0;
  cfg.comm = &comm;
  cfg.sync_bn = c.sync_bn;
  cfg.zero = c.zero;
  cfg.precision = c.precision;
  cfg.bucket_mb = 0.25;
  if (const char* o = std::getenv("SAT_TEST_OUT")) cfg.out_dir = std::string(o) + std::to_string(comm.rank());
  sat::Trainer t(mc, cfg, *data.train, c.evaluate ? data.test.get() : nullptr);
  sat::TrainResult r = t.run();
  return {r.losses, r.test.value_or(sat::EvalResult{}), r.predicted_memory_bytes, r.peak_memory_bytes,
          r.bubble_fraction};
}

using sat::test::max_rel;

// The pipelined run on every rank (dp = world / pp data-parallel replicas), the
// one-process reference on rank 0: the same micro-batch, dp * accum micro-batches per step.
// Synchronised BatchNorm normalises over the dp replicas' micro-batches together: its
// reference is one process with dp times the micro-batch (and accum 1, where that is
// the same set of samples).
// Returns this rank's run.
RunOut expect_exact(const Case& c, int pp) {
  if (!distributed()) {
    [] { GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)"; }();
    return {};
  }
  Comm& w = world();
  if (w.size() % pp != 0) {
    [&] { GTEST_SKIP() << pp << " stages do not divide " << w.size() << " ranks"; }();
    return {};
  }
  const int dp = w.size() / pp;
  RunOut run = train(c, w, pp);
  EXPECT_LE(run.peak, run.predicted) << "rank " << w.rank();
  EXPECT_GE(double(run.peak), 0.98 * double(run.predicted)) << "rank " << w.rank();
  if (w.rank() == 0) {
    auto self = sat::dist::make_self_comm();
    Case one = c;
    one.accum = c.accum * dp;
    one.zero = 0;
    if (c.sync_bn) {
      EXPECT_EQ(c.accum, 1) << "synchronised BatchNorm has a one-process reference with accum 1 only";
      one.batch = c.batch * dp;
      one.accum = c.accum;
    }
    const std::string key = one.model + "|" + std::to_string(one.batch) + "x" + std::to_string(one.accum) + "|" +
                            std::to_string(one.steps) + "|" + one.optimizer + "|" + sat::test::key_of(one.lr) + "|" +
                            std::to_string(one.sync_bn) + std::to_string(one.evaluate) + "|" +
                            sat::precision_name(one.precision);
    const RunOut& ref = sat::test::one_process_run<RunOut>(key, [&] { return train(one, *self, 1); });
    const double d = max_rel(run.losses, ref.losses);
    std::printf("%s %s pp %d x dp %d, %s%s, micro-batch %lld x %lld: max relative loss difference %.3g over %d steps "
                "(%.5f -> %.5f), bubble %.2f\n",
                c.model.c_str(), sat::precision_name(c.precision), pp, dp, sat::pipe_schedule_name(c.kind),
                c.v > 1 ? (" V " + std::to_string(c.v)).c_str() : "", (long long)c.batch, (long long)c.accum, d,
                c.steps, ref.losses.front(), ref.losses.back(), run.bubble);
    // In bf16 with data parallelism, the replicas' gradient sum (in another order than one
    // process's) moves weights by ~1e-7, enough to flip some activations' rounding to bf16
    // (2^-9 apart): 5.6e-5 measured at pp 2 x dp 2; the stages alone give 0.
    const bool bf16_dp = c.precision == sat::Precision::bf16 && dp > 1;
    EXPECT_LT(d, bf16_dp ? 1e-3 : 1e-5) << c.model;
    EXPECT_LT(ref.losses.back(), 0.97 * ref.losses.front()) << c.model << " did not learn";
    if (c.evaluate) sat::test::expect_same_evaluation(run.test, ref.test);
  }
  w.barrier();
  return run;
}

TEST(PipelineRanks, MlpEverySchedule) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  for (int pp : {2, 4})
    for (auto kind : {PipeSchedule::none, PipeSchedule::gpipe, PipeSchedule::one_f_one_b, PipeSchedule::zb_h1})
      expect_exact({.model = "mlp", .pp = pp, .kind = kind, .batch = 8}, pp);
  expect_exact({.model = "mlp", .pp = 2, .kind = PipeSchedule::interleaved, .v = 3, .batch = 8, .evaluate = true}, 2);
}

TEST(PipelineRanks, GptMiniWithTiedEmbeddingsEverySchedule) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  for (auto kind : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    for (int pp : {2, 4}) expect_exact({.model = "gpt-mini", .pp = pp, .kind = kind, .batch = 1, .steps = 20}, pp);
  expect_exact({.model = "gpt-mini", .pp = 2, .kind = PipeSchedule::interleaved, .v = 2, .batch = 1, .evaluate = true},
               2);
}

// bf16 on the CPU (nn/bf16_cpu.h): stages send and receive bf16 activations and their
// gradients; the losses follow one process's in bf16 (identical with the stages alone).
// Zero-bubble ZB-H1 (each backward split into I and W): the losses of one process, 20 steps,
// on as many stages as ranks (2 and 4). With data parallelism W launches the gradient buckets:
// MlpEverySchedule covers pp 2 x dp 2 on 4 ranks.
TEST(PipelineRanks, GptMiniZeroBubbleH1) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  const int pp = world().size();
  expect_exact({.model = "gpt-mini", .pp = pp, .kind = PipeSchedule::zb_h1, .batch = 1, .accum = 4, .steps = 20}, pp);
}

// Zero-bubble ZB-V (two chunks per rank in a V, the loss on stage 0, the last stage handing on
// to itself): the losses of one process on as many stages as ranks, 4 steps (20 measured once:
// identical, relative difference 0, on 2 and 4 stages). gpt-mini's 4 blocks make the 4 pieces of
// 2 stages; 4 stages need 8 pieces: gpt-mini's shape with 8 layers.
TEST(PipelineRanks, GptZeroBubbleV) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  const int pp = world().size();
  const std::string model = pp == 2 ? "gpt-mini" : kGpt8;
  expect_exact({.model = model, .pp = pp, .kind = PipeSchedule::zb_v, .v = 2, .batch = 1, .accum = 4, .steps = 4}, pp);
}

TEST(PipelineRanks, GptMiniInBf16) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  expect_exact({.model = "gpt-mini", .pp = 2, .kind = PipeSchedule::one_f_one_b, .batch = 1, .steps = 12,
                .lr = 0.02f, .precision = sat::Precision::bf16},
               2);
}

// Llama's untied embedding and head on the first and last stages.
TEST(PipelineRanks, LlamaOneFOneB) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  expect_exact({.model = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256", .pp = 2,
                .kind = PipeSchedule::one_f_one_b, .batch = 2, .steps = 20}, 2);
}

// ... and split into I and W (RMSNorm, SwiGLU, rotary attention, the untied head).
TEST(PipelineRanks, LlamaZeroBubbleH1) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  expect_exact({.model = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256", .pp = 2,
                .kind = PipeSchedule::zb_h1, .batch = 2, .steps = 20}, 2);
}

// (A smaller learning rate: at 0.05 the convnet fits the synthetic data to a loss of 0.003
// within 20 steps, where a relative bound on the loss means nothing.)
TEST(PipelineRanks, ConvnetEverySchedule) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  for (auto kind : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    for (int pp : {2, 4}) expect_exact({.model = "convnet", .pp = pp, .kind = kind, .batch = 8, .lr = 0.004f}, pp);
  expect_exact({.model = "convnet", .pp = 2, .kind = PipeSchedule::interleaved, .v = 2, .batch = 8, .lr = 0.004f}, 2);
  expect_exact({.model = "convnet", .pp = 4, .kind = PipeSchedule::interleaved, .v = 3, .batch = 8, .lr = 0.004f,
                .evaluate = true},
               4);
}

// dp 2 x pp 2 on 4 ranks: buckets over the dp group of each stage, ZeRO-1 and
// synchronised BatchNorm over it too.
TEST(PipelineRanks, DataTimesPipelineParallel) {
  if (!distributed() || world().size() != 4) GTEST_SKIP() << "runs under mpirun with 4 ranks (ctest -R pipeline_np4)";
  expect_exact({.model = "gpt-mini", .pp = 2, .batch = 1, .accum = 4, .evaluate = true}, 2);
  expect_exact({.model = "mlp", .pp = 2, .kind = PipeSchedule::gpipe, .batch = 8, .optimizer = "adamw", .lr = 1e-3f,
                .zero = 1},
               2);
  expect_exact({.model = "convnet", .pp = 2, .batch = 8, .accum = 1, .lr = 0.004f, .sync_bn = true, .evaluate = true}, 2);
}

// The gradient noise scale of a pipeline (each stage's squared norms summed over the
// stages) is the one-process estimate.
TEST(PipelineRanks, NoiseScaleMatchesOneProcess) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  Comm& w = world();
  auto run = [&](Comm& comm, int pp) {
    sat::cpu::set_num_threads(1);
    auto mc = sat::model_config("mlp");
    auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 7));
    sat::TrainConfig cfg = layout(pp, PipeSchedule::one_f_one_b, 2);
    cfg.batch = 16;
    cfg.steps = 10;
    cfg.evaluate = false;
    cfg.progress = 0;
    cfg.comm = &comm;
    cfg.measure_noise = true;
    sat::Trainer t(mc, cfg, *data.train, nullptr);
    return t.run().noise_scale;
  };
  const double piped = run(w, w.size());
  if (w.rank() == 0) {
    auto self = sat::dist::make_self_comm();
    const double one = run(*self, 1);
    std::printf("noise scale: %d stages %.6g, one process %.6g\n", w.size(), piped, one);
    EXPECT_GT(one, 0);
    EXPECT_NEAR(piped, one, 1e-6 * one);
  }
  w.barrier();
}

// Every rank's plan holds its measured peak, within 2%, for gpt-mini under GPipe, 1F1B and
// ZB-H1 at M = 1, 4, 8 (and GPipe's activation memory grows with M while 1F1B's stays).
TEST(PipelineRanks, MemoryPlanHoldsEveryRanksPeak) {
  if (!distributed()) GTEST_SKIP() << "runs under mpirun (ctest -R pipeline)";
  Comm& w = world();
  for (auto kind : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b, PipeSchedule::zb_h1, PipeSchedule::zb_v})
    for (int64_t m : {1, 4, 8}) {
      const bool v = kind == PipeSchedule::zb_v;  // (2P pieces: gpt-mini's 4 blocks on 2 ranks, 8 layers on 4)
      Case c{.model = v && w.size() > 2 ? kGpt8 : "gpt-mini", .pp = w.size(), .kind = kind, .v = v ? 2 : 1, .batch = 2,
             .accum = m, .steps = 2};
      RunOut r = train(c, w, w.size());
      EXPECT_LE(r.peak, r.predicted) << sat::pipe_schedule_name(kind) << " M " << m << " rank " << w.rank();
      EXPECT_GE(double(r.peak), 0.98 * double(r.predicted)) << sat::pipe_schedule_name(kind) << " M " << m;
      double mine[2] = {double(r.predicted), double(r.peak)};
      std::vector<double> all(size_t(2 * w.size()));
      w.all_gather(mine, all.data(), 2, sat::DType::f64)->wait();
      if (w.rank() == 0)
        for (int k = 0; k < w.size(); ++k)
          std::printf("[ memory   ] %s pp %d %-5s M %2lld stage %d: predicted %10.0f peak %10.0f (%.4f)\n", c.model.c_str(),
                      w.size(), sat::pipe_schedule_name(kind), (long long)m, k, all[size_t(2 * k)],
                      all[size_t(2 * k + 1)], all[size_t(2 * k + 1)] / all[size_t(2 * k)]);
    }
  w.barrier();
}

}  // namespace

// ---- whole jobs: bad layouts on every rank, a dead or stuck stage --------------------

#ifdef SAT_MPIEXEC
TEST(PipelineFailure, BadLayoutsAreRefusedByEveryRank) {
  if (distributed()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  // A skip connection over two blocks: cut between them, its value would cross two cuts.
  const std::string skipnet =
      (std::filesystem::temp_directory_path() / ("sat_skipnet_" + std::to_string(getpid()) + ".json")).string();
  std::ofstream(skipnet) << R"({"name": "skipnet", "inputs": {"x": {"shape": [1, 28, 28]}, "y": {"shape": [], "dtype": "int32"}},
    "layers": [{"name": "flatten", "type": "flatten"}, {"name": "fc1", "type": "linear", "out": 32},
      {"name": "relu1", "type": "relu"}, {"name": "fc2", "type": "linear", "out": 32},
      {"name": "skip", "type": "add", "inputs": ["fc2", "fc1"]}, {"name": "head", "type": "linear", "out": 10},
      {"name": "loss", "type": "cross_entropy", "inputs": ["head", "y"]}]})";
  sat::test::expect_every_rank_refuses({
      {3, "--model file:" + skipnet + " --pp 3 --pp-split 2,4",
       "--pp 3: file:" + skipnet + "'s value fc1 (made by fc1) is read by skip 2 model chunks later"},
      {3, "--model mlp --batch 8 --pp 2", "--tp 1 x --pp 2 = 2 does not divide the 3 processes"},
      {2, "--model gpt-mini --batch 1 --pp 2 --tp 3", "--tp 3: gpt-mini has 4"},
      {2, "--model gpt-mini --batch 1 --pp 2 --tp 2", "--tp 2 x --pp 2"},
      {2, "--model mlp --batch 8 --pp 2 --pp-split 6", "--pp-split 6"},
      {2, "--model convnet --batch 8 --pp 2 --pp-split 4,2", "--pp-split 4,2"},
      {2, "--model gpt-mini --batch 1 --pp 2 --pp-schedule interleaved --virtual-stages 3 --accum 2",
       "--pp 2 x --virtual-stages 3"},
      {2, "--model mlp --batch 8 --pp 2 --pp-schedule interleaved --virtual-stages 3 --accum 1", "--accum 1"},
      {2, "--model mlp --batch 8 --pp 2 --pp-schedule zigzag", "--pp-schedule"},
      {2, "--model gpt-mini --batch 1 --accum 2 --pp 2 --noise-scale", "--noise-scale with --pp"},
      {2, "--model convnet --batch 8 --accum 2 --pp 2 --pp-schedule zb-h1",
       "--pp-schedule zb-h1: layer 'bn1' (BatchNorm2d) cannot split its backward"},
      {2, "--model resnet18 --data synthetic --batch 2 --accum 2 --pp 2 --pp-schedule zb-v",
       "--pp-schedule zb-v: layer 'bn1' (BatchNorm2d) cannot split its backward"},
      {2, "--model gpt-mini --data synthetic --batch 1 --accum 2 --pp-schedule zb-v",
       "--pp-schedule zb-v needs --pp 2 or more (got 1)"},
  });
  std::filesystem::remove(skipnet);
}

TEST(PipelineFailure, MoreStagesThanBlocksIsRefused) {
  if (distributed()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  sat::test::expect_every_rank_refuses(4, "--model gpt-mini --batch 1 --pp 4 --pp-schedule interleaved --virtual-stages 2 --accum 4",
                            "--pp 4 x --virtual-stages 2 = 8 model chunks: gpt-mini has 4 blocks");
}

// A stage that dies, or stops without dying, ends the whole job within 30 s, and the
// output names the rank (and, for the stopped one, the operation that waited on it).
TEST(PipelineFailure, DeadOrStuckStageEndsTheJob) {
  if (distributed()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  for (int sig : {SIGKILL, SIGSTOP}) {
    sat::test::Job job = sat::test::start_job(
        2, "train --model gpt-mini --data synthetic --batch 2 --accum 4 --pp 2 --steps 100000 --threads 1 --eval off", 90,
        "SAT_COMM_TIMEOUT=10");
    const pid_t victim = sat::test::wait_for_rank(job, 1);
    ASSERT_GT(victim, 0) << "rank 1 of the job never appeared";
    std::this_thread::sleep_for(std::chrono::seconds(4));  // stages built, steps running
    ASSERT_EQ(kill(victim, sig), 0);
    const auto t0 = std::chrono::steady_clock::now();
    sat::test::JobEnd end = sat::test::wait_job(job);
    const double after = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%s to rank 1 (pid %d): the job ended %.1f s later with status %d; its output:\n%s\n",
                sig == SIGKILL ? "SIGKILL" : "SIGSTOP", int(victim), after, end.status, end.out.c_str());
    EXPECT_NE(end.status, 0);
    EXPECT_NE(end.status, 124) << "the job did not end by itself";
    EXPECT_LT(after, 30.0);
    EXPECT_NE(end.out.find("rank 1"), std::string::npos) << "the output does not name the failed rank";
    if (sig == SIGSTOP) {  // rank 0's watchdog names what it waited for
      EXPECT_NE(end.out.find("did not complete within 10 s"), std::string::npos) << end.out;
    }
    kill(victim, SIGKILL);  // a stopped process the launcher could not end
  }
}

// Weights saved by a pipeline are the whole model's (gathered from the stages) and equal to
// one process's after the same training; weights loaded into a pipeline give the same
// next loss as in one process. summary.json describes the layout and every rank.
TEST(PipelineJob, WeightsRoundTripAndSummary) {
  if (distributed()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("sat_pp_weights_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  // SGD: AdamW's first steps move every weight by about lr whatever its gradient's size, so
  // a gradient near 0 that rounds to the other sign moves it 2 lr the other way: a weight
  // comparison measures that, not the layout (the loss trajectories check AdamW layouts).
  const std::string common = "train --model gpt-mini --data synthetic --batch 1 --accum 4 --steps 3 --threads 1 --eval off "
                             "--optimizer sgd ";
  sat::test::JobEnd pp = sat::test::run_job(
      2, common + "--pp 2 --save-weights " + (d / "pp.safetensors").string() + " --out " + (d / "pp").string());
  ASSERT_EQ(pp.status, 0) << pp.out;
  sat::test::JobEnd one = sat::test::run_job(1, common + "--save-weights " + (d / "one.safetensors").string());
  ASSERT_EQ(one.status, 0) << one.out;
  // Every tensor of the whole model is in the pipeline's file.
  const double worst = sat::test::max_rel_weights("gpt-mini", (d / "pp.safetensors").string(),
                                                  (d / "one.safetensors").string());
  sat::BuiltModel m = sat::build_model(sat::model_config("gpt-mini"), 1);
  std::printf("gpt-mini after 3 steps: the pipeline's saved weights differ from one process's by %.3g (relative)\n",
              worst);
  EXPECT_LT(worst, 1e-4);
  std::ifstream sf(d / "pp" / "summary.json");
  auto s = nlohmann::json::parse(sf);
  EXPECT_EQ(s["layout"]["pp"], 2);
  EXPECT_EQ(s["layout"]["dp"], 1);
  EXPECT_EQ(s["pp_schedule"], "1f1b");
  EXPECT_EQ(s["pp_split"], std::vector<int>{3});
  EXPECT_EQ(s["parameters"], m.graph->param_count());
  ASSERT_EQ(s["ranks"].size(), 2u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(s["ranks"][size_t(r)]["stage"], r);
    EXPECT_LE(s["ranks"][size_t(r)]["peak_memory_bytes"].get<double>(),
              s["ranks"][size_t(r)]["predicted_memory_bytes"].get<double>());
  }
  EXPECT_GT(s["bubble_fraction"].get<double>(), 0);
  EXPECT_LT(s["bubble_fraction"].get<double>(), 1);
  // Loading: the same first loss in a pipeline as in one process.
  const std::string from = "--init-weights " + (d / "one.safetensors").string() + " --steps 1 ";
  sat::test::JobEnd p2 = sat::test::run_job(2, common + from + "--pp 2 --out " + (d / "p2").string());
  sat::test::JobEnd o2 = sat::test::run_job(1, common + from + "--out " + (d / "o2").string());
  ASSERT_EQ(p2.status, 0) << p2.out;
  ASSERT_EQ(o2.status, 0) << o2.out;
  auto loss = [&](const char* dir) {
    std::ifstream f(d / dir / "summary.json");
    return nlohmann::json::parse(f)["final_train_loss"].get<double>();
  };
  EXPECT_NEAR(loss("p2"), loss("o2"), 1e-5 * loss("o2"));
  fs::remove_all(d);
}
#endif
