// Context parallelism (--cp) end to end. Without mpirun: the graphs of a context-parallel
// rank (ring attention, a rank's share of the sequence), the memory plan per rank, and bad
// input refused by every rank of a real job. Under mpirun (CMake runs this binary as
// context_parallel_np2 and _np4): gpt and llama with cp 2 and cp 4, cp 2 x tp 2 and cp 2 x
// dp 2, gpt with cp 2 x pp 2 and under full recomputation follow the one-process loss trajectory, and each rank's memory plan holds its
// measured peak. Rank 0 trains the one-process reference itself while the others wait.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/cpu/blas.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "mpi_world.h"
#include "nn/models.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "train/validate.h"
#include "trajectory.h"
#ifdef SAT_MPIEXEC
#include "mpi_job.h"
#endif

namespace {

using sat::dist::Comm;
using sat::test::distributed;
using sat::test::world;
using sat::test::world_is;

// Tiny members of the two families with a context divisible by 2 x 4.
const char* const kGpt = "gpt:layers=2,heads=4,width=64,context=32,vocab=256";
const char* const kGpt4 = "gpt:layers=4,heads=2,width=32,context=32,vocab=256";  // zb-v on 2 stages: 4 pieces
const char* const kLlama = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256";
// With dropout: each rank's mask is its chunks' part of the one-process mask.
const char* const kGptDropout = "gpt:layers=2,heads=4,width=64,context=32,vocab=256,dropout=0.1";

int count_kind(const sat::Graph& g, const std::string& kind) {
  int n = 0;
  for (auto& node : g.nodes()) n += kind == node.layer->kind();
  return n;
}

sat::ModelConfig cp_model(const std::string& name, int cp, int rank) {
  sat::ModelConfig mc = sat::model_config(name);
  mc.cp = cp;
  mc.cp_rank = rank;
  return mc;
}

// A cp rank's graph: its two chunks of each sequence in, ring attention in every layer.
TEST(ContextParallelGraph, RanksHoldTheirChunksAndAttendThroughTheRing) {
  for (const char* name : {kGpt, kLlama}) {
    const sat::BuiltModel m = sat::build_model(cp_model(name, 4, 1), 2);
    EXPECT_EQ(m.x_shape, (sat::Shape{2, 8})) << name;
    EXPECT_EQ(m.y_shape, (sat::Shape{2, 8})) << name;
    EXPECT_EQ(count_kind(*m.graph, "RingSelfAttention"), 2) << name;
    EXPECT_EQ(count_kind(*m.graph, "CausalSelfAttention"), 0) << name;
    // The parameters are the whole model's (the sequence is split, not the weights).
    const sat::BuiltModel one = sat::build_model(sat::model_config(name), 2);
    EXPECT_EQ(m.graph->params().size(), one.graph->params().size()) << name;
  }
}

std::string error_of(const std::string& model, int cp, int64_t seq_len = 0) {
  try {
    sat::ModelConfig mc = sat::model_config(model);
    if (seq_len > 0) sat::set_seq_len(mc, seq_len);
    sat::check_context_parallel(mc, cp);
    return "";
  } catch (const sat::Error& e) {
    return e.what();
  }
}

TEST(ContextParallelGraph, BadInputIsNamed) {
  EXPECT_EQ(error_of(kGpt, 4), "");
  EXPECT_NE(error_of(kGpt, 4, 28).find("--cp 4: " + std::string(kGpt) + "'s sequence length 28 (--seq-len) does not "
                                       "divide by 2 x --cp = 8"), std::string::npos);
  EXPECT_NE(error_of(kGpt, 3).find("does not divide by 2 x --cp = 6"), std::string::npos);
  EXPECT_NE(error_of("mlp", 2).find("--cp 2: mlp (mlp) has no attention to split"), std::string::npos);
  EXPECT_NE(error_of("resnet18", 2).find("(resnet) has no attention to split"), std::string::npos);
  EXPECT_NE(error_of("moe:layers=1,heads=2,width=32,experts=4,top_k=2,context=16,vocab=64", 2)
                .find("is a mixture of experts"), std::string::npos);
}

// A sequence of 512 tokens: the step's arena (activations, attention's buffers, the ring's)
// per rank falls at least as 1/cp (the ring keeps nothing T x T), and the ring's buffers
// are in it.
TEST(ContextParallelGraph, ActivationMemoryPerRankFallsAsOneOverCp) {
  const sat::ModelConfig mc = sat::model_config("gpt:layers=2,heads=4,width=64,context=512,vocab=256");
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 7));
  size_t one = 0, one_persistent = 0;
  for (int cp : {1, 2, 4}) {
    sat::TrainConfig cfg;
    cfg.batch = 2;
    cfg.cp = cp;
    const sat::RankPlan r = sat::plan_rank(sat::resolved_model(mc, cfg, 0, nullptr, cp - 1), cfg, *data.train,
                                           nullptr, 0, 1);
    const size_t act = r.memory.transient;
    if (cp == 1) one = act;
    std::printf("cp %d: step arena per rank %zu bytes (%.3f of one process's), total %zu\n", cp, act,
                double(act) / double(one), r.memory.total());
    EXPECT_LE(double(act), 1.05 * double(one) / cp) << "cp " << cp;
    if (cp == 1) one_persistent = r.memory.persistent;
    EXPECT_EQ(r.memory.persistent, one_persistent) << "cp " << cp << ": the parameters are whole on every rank";
  }
}

// ---- under mpirun: exactness against one process ---------------------------------------

struct Case {
  std::string model;
  int cp = 2, tp = 1, pp = 1;
  sat::PipeSchedule schedule = sat::PipeSchedule::one_f_one_b;  // with pp
  bool recompute = false;  // --recompute full: the ring runs again in backward
  bool sp = false;         // --sequence-parallel (with tp)
  int64_t batch = 2, accum = 2;
  int steps = 20;
  std::string optimizer = "adamw";
  float lr = 3e-3f;
  bool evaluate = false;
};

struct RunOut {
  std::vector<double> losses;
  sat::EvalResult test;
  size_t predicted = 0, peak = 0;
  sat::GroupBytes measured, predicted_bytes;  // per step
};

RunOut train(const Case& c, Comm& comm, bool parallel) {
  sat::cpu::set_num_threads(1);
  auto mc = sat::model_config(c.model);
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 7));
  sat::TrainConfig cfg;
  cfg.cp = parallel ? c.cp : 1;
  cfg.tp = parallel ? c.tp : 1;
  cfg.pp = parallel ? c.pp : 1;
  if (parallel && c.pp > 1) cfg.pp_schedule = c.schedule;
  if (parallel && c.schedule == sat::PipeSchedule::zb_v) cfg.virtual_stages = 2;
  cfg.sequence_parallel = parallel && c.sp;
  if (parallel && c.recompute) cfg.recompute = sat::Recompute::full;
  cfg.accum = c.accum;
  cfg.batch = c.batch;
  cfg.steps = c.steps;
  cfg.seed = 3;
  cfg.optim.name = c.optimizer;
  cfg.optim.lr = c.lr;
  cfg.optim.momentum = c.optimizer == "sgd" ? 0.9f : 0.0f;
  cfg.evaluate = c.evaluate;
  cfg.progress = 0;
  cfg.comm = &comm;
  cfg.bucket_mb = 0.25;
  sat::Trainer t(mc, cfg, *data.train, c.evaluate ? data.test.get() : nullptr);
  sat::TrainResult r = t.run();
  return {r.losses, r.test.value_or(sat::EvalResult{}), r.predicted_memory_bytes, r.peak_memory_bytes,
          r.comm_bytes_per_step, sat::predict_comm(t.rank_plan(), cfg, t.mesh().dp())};
}

// The layout on every rank (dp = world / (cp * tp)), one process on rank 0 with the same
// global batch (dp * accum micro-batches).
void expect_exact(const Case& c) {
  Comm& w = world();
  const int dp = w.size() / (c.cp * c.tp * c.pp);
  RunOut run = train(c, w, true);
  EXPECT_LE(run.peak, run.predicted) << "rank " << w.rank();
  // What every group moved per step is what the plan predicts (the ring's over cp, the
  // gradients' over dp x cp).
  EXPECT_DOUBLE_EQ(run.measured.cp, run.predicted_bytes.cp) << "rank " << w.rank();
  EXPECT_GT(run.measured.cp, 0) << "rank " << w.rank();
  EXPECT_DOUBLE_EQ(run.measured.dp, run.predicted_bytes.dp) << "rank " << w.rank();
  EXPECT_DOUBLE_EQ(run.measured.tp, run.predicted_bytes.tp) << "rank " << w.rank();
  EXPECT_DOUBLE_EQ(run.measured.pp, run.predicted_bytes.pp) << "rank " << w.rank();
  if (w.rank() == 0) {
    auto self = sat::dist::make_self_comm();
    Case one = c;
    one.accum = c.accum * dp;
    const std::string key = one.model + "|" + std::to_string(one.batch) + "x" + std::to_string(one.accum) + "|" +
                            std::to_string(one.steps) + "|" + one.optimizer + "|" + sat::test::key_of(one.lr) + "|" +
                            std::to_string(one.evaluate);
    const RunOut& ref = sat::test::one_process_run<RunOut>(key, [&] { return train(one, *self, false); });
    const double d = sat::test::max_rel(run.losses, ref.losses);
    std::printf("%s cp %d x tp %d%s x dp %d x pp %d%s, micro-batch %lld x %lld: max relative loss difference %.3g over %d steps "
                "(%.5f -> %.5f); memory per rank predicted %zu, peak %zu (one process: %zu, %zu); per step cp %.0f B, "
                "dp x cp %.0f B\n",
                c.model.c_str(), c.cp, c.tp, c.sp ? " (sequence parallel)" : "", dp, c.pp, c.recompute ? " (recompute full)" : "", (long long)c.batch, (long long)c.accum, d, c.steps,
                ref.losses.front(), ref.losses.back(), run.predicted, run.peak, ref.predicted, ref.peak,
                run.measured.cp, run.measured.dp);
    EXPECT_LT(d, 1e-5) << c.model;
    EXPECT_LT(ref.losses.back(), 0.97 * ref.losses.front()) << c.model << " did not learn";
    if (c.evaluate) sat::test::expect_same_evaluation(run.test, ref.test);
  }
  w.barrier();
}

TEST(ContextParallelRanks, TwoRanks) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R context_parallel_np2)";
  expect_exact({.model = kGpt, .evaluate = true});
  expect_exact({.model = kLlama, .evaluate = true});
  expect_exact({.model = kGpt, .recompute = true});
  expect_exact({.model = kGptDropout});
}

TEST(ContextParallelRanks, FourRanks) {
  if (!world_is(4)) GTEST_SKIP() << "runs under mpirun with 4 ranks (ctest -R context_parallel_np4)";
  expect_exact({.model = kGpt, .cp = 4});
  expect_exact({.model = kLlama, .cp = 4});
  expect_exact({.model = kGpt, .cp = 2, .tp = 2});                    // cp 2 x tp 2
  expect_exact({.model = kLlama, .cp = 2, .tp = 2});                  // cp 2 x tp 2
  expect_exact({.model = kGpt, .cp = 2, .tp = 2, .sp = true});        // + sequence parallel
  expect_exact({.model = kGptDropout, .cp = 2, .tp = 2, .sp = true});  // + dropout over the rows
  expect_exact({.model = kGptDropout, .cp = 4});
  expect_exact({.model = kGpt, .cp = 2, .batch = 1, .evaluate = true});  // cp 2 x dp 2
  expect_exact({.model = kLlama, .cp = 2, .batch = 1});               // cp 2 x dp 2
  expect_exact({.model = kGpt, .cp = 2, .pp = 2});                    // cp 2 x pp 2
  // zb-v: the first stage's two chunks cut the tokens and the labels of each micro-batch
  // into buffers of their own (the tokens stay until the embedding's weight part).
  expect_exact({.model = kGpt4, .cp = 2, .pp = 2, .schedule = sat::PipeSchedule::zb_v});
}

#ifdef SAT_MPIEXEC
TEST(ContextParallelFailure, BadInputIsRefusedByEveryRank) {
  if (distributed()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  const std::string gpt = std::string("--model ") + kGpt + " --batch 1 ";
  sat::test::expect_every_rank_refuses({
      {2, gpt + "--cp 2 --seq-len 30",
       "--cp 2: " + std::string(kGpt) + "'s sequence length 30 (--seq-len) does not divide by 2 x --cp = 4"},
      {2, "--model mlp --batch 8 --cp 2", "--cp 2: mlp (mlp) has no attention to split"},
      {2, "--model moe:layers=1,heads=2,width=32,experts=4,top_k=2,context=16,vocab=64 --batch 1 --cp 2",
       "--cp 2: moe:layers=1"},
      {2, gpt + "--cp 4", "--tp 1 x --cp 4"},
  });
}

// A sequence whose step does not fit one rank's --memory-budget trains with --cp 4, each
// rank's measured peak within its plan.
TEST(ContextParallelJob, SequenceBeyondOneRanksBudgetTrainsWithCp4) {
  if (distributed()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  const std::string args = "train --model gpt:layers=2,heads=4,width=64,context=512,vocab=256 --data synthetic "
                           "--batch 2 --steps 2 --threads 1 --eval off --memory-budget 16MiB";
  const sat::test::JobEnd one = sat::test::run_job(1, args, 60);
  EXPECT_EQ(one.status, 2) << one.out;
  EXPECT_NE(one.out.find("--memory-budget: micro-batch 2 needs"), std::string::npos) << one.out;
  const auto out = std::filesystem::temp_directory_path() / ("sat_cp4_" + std::to_string(getpid()));
  const sat::test::JobEnd four = sat::test::run_job(4, args + " --cp 4 --out " + out.string(), 60);
  EXPECT_EQ(four.status, 0) << four.out;
  EXPECT_NE(four.out.find("final train loss"), std::string::npos) << four.out;
  // summary.json names the layout and each rank's part of the sequence.
  std::ifstream f(out / "summary.json");
  const auto s = nlohmann::json::parse(f, nullptr, false);
  ASSERT_FALSE(s.is_discarded()) << "no summary.json in " << out;
  EXPECT_EQ(s["layout"]["cp"], 4);
  EXPECT_EQ(s["layout"]["dp"], 1);
  ASSERT_EQ(s["ranks"].size(), 4u);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(s["ranks"][size_t(r)]["cp_rank"], r) << "rank " << r;
  std::filesystem::remove_all(out);
}
#endif

}  // namespace
