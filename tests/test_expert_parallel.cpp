// Expert parallelism is exact: under mpirun (CMake runs this binary as expert_parallel_np2
// and expert_parallel_np4), a moe: model trained with --ep E over groups of E data-parallel
// ranks follows the loss trajectory of one process, and routes and drops the same tokens.
//
// Which one process: every rank routes its own micro-batch and applies the capacity to it
// (moe.h), as one process does to each of its micro-batches. So the reference trains on one
// process with the same micro-batch and dp times the accumulation: the same tokens grouped
// the same way, the same capacity per group, the same drops. (With capacity 0, no drops, the
// routing is per token, but the load-balancing loss is still per micro-batch, hence the same
// reference.) Rank 0 trains the reference with a communicator of its own while the others
// wait at a barrier.
//
// Outside mpirun: the bad input of --ep (the model, the ranks) in one process.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/blas.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "error_of.h"
#include "mpi_world.h"
#include "nn/layers/moe.h"
#include "nn/models.h"
#include "train/trainer.h"
#include "trajectory.h"
#ifdef SAT_MPIEXEC
#include "mpi_job.h"
#include "run_command.h"
#endif

namespace {

using sat::dist::Comm;
using sat::test::distributed;
using sat::test::world;

// 8 experts, top-2, two moe layers; capacity factor 1.0 drops tokens from the first step.
const std::string kModel = "moe:layers=2,heads=2,width=32,experts=8,top_k=2,context=16,vocab=64,ffn=32,capacity=1.0";

struct Case {
  std::string model = kModel;
  int ep = 1;
  int tp = 1, pp = 1;
  bool recompute = false;  // full
  int64_t batch = 4;  // micro-batch of every rank
  int64_t accum = 1;
  int steps = 20;
};

struct Run {
  std::vector<double> losses;
  std::map<std::string, sat::MoeLoad> load;  // this rank's routing over the run
  size_t predicted = 0, peak = 0;
};

Run train(const Case& c, Comm* comm, int ep, int tp, int pp, int64_t accum) {
  sat::cpu::set_num_threads(1);
  const sat::ModelConfig mc = sat::model_config(c.model);
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 7));
  sat::TrainConfig cfg;
  cfg.batch = c.batch;
  cfg.accum = accum;
  cfg.ep = ep;
  cfg.tp = tp;
  cfg.pp = pp;
  if (c.recompute) cfg.recompute = sat::Recompute::full;
  cfg.steps = c.steps;
  cfg.seed = 3;
  cfg.optim.name = "adamw";
  cfg.optim.lr = 3e-3f;
  cfg.progress = 0;
  cfg.comm = comm;
  (void)sat::take_moe_load();
  sat::Trainer t(mc, cfg, *data.train, nullptr);
  sat::TrainResult r = t.run();
  Run out;
  out.losses = r.losses;
  out.load = sat::take_moe_load();
  out.predicted = r.predicted_memory_bytes;
  out.peak = r.peak_memory_bytes;
  return out;
}

// Per moe layer of the model (2 layers of 8 experts), the kept tokens per expert, the dropped
// and the routed ones, summed over the ranks of comm (a pipeline stage has only its layers).
std::vector<int64_t> load_over(Comm& comm, const std::map<std::string, sat::MoeLoad>& load) {
  const size_t per = 8 + 2;
  std::vector<int64_t> v(2 * per, 0);
  for (const auto& [layer, L] : load) {
    const size_t at = layer == "model.layers.0.mlp" ? 0 : per;
    EXPECT_TRUE(layer == "model.layers.0.mlp" || layer == "model.layers.1.mlp") << layer;
    EXPECT_EQ(L.tokens.size(), 8u);
    for (size_t e = 0; e < L.tokens.size() && e < 8; ++e) v[at + e] = L.tokens[e];
    v[at + 8] = L.dropped;
    v[at + 9] = L.routed;
  }
  comm.all_reduce_sync(v.data(), v.size(), sat::DType::i64, sat::dist::ReduceOp::sum);
  return v;
}

void expect_matches_one_process(const Case& c, int ranks) {
  if (!sat::test::world_is(ranks)) GTEST_SKIP() << "runs under mpirun with " << ranks << " ranks";
  Comm& w = world();
  const Run ep = train(c, &w, c.ep, c.tp, c.pp, c.accum);
  // Each rank holds its ep group's sum, and the tp ranks of a group route the same tokens;
  // a pipeline stage counts its own layers.
  std::vector<int64_t> ep_load = load_over(w, ep.load);
  for (int64_t& v : ep_load) v /= c.ep * c.tp;
  const int dp = w.size() / (c.tp * c.pp);
  EXPECT_GE(ep.peak, 1u);
  EXPECT_EQ(ep.peak, ep.predicted) << "rank " << w.rank() << ": the plan is not the measured peak";
  if (w.rank() == 0) {
    auto self = sat::dist::make_self_comm();
    const Run ref = train(c, self.get(), 1, 1, 1, c.accum * dp);
    const std::vector<int64_t> ref_load = load_over(*self, ref.load);
    const double d = sat::test::max_rel(ep.losses, ref.losses);
    std::printf("%s: --ep %d --tp %d --pp %d%s, %d ranks x batch %lld x accum %lld vs 1 x batch %lld x accum %lld, %d steps: max "
                "relative loss difference %.3g (first %.6f, last %.6f); dropped %lld of %lld\n",
                c.model.c_str(), c.ep, c.tp, c.pp, c.recompute ? " --recompute full" : "", w.size(), (long long)c.batch, (long long)c.accum, (long long)c.batch,
                (long long)(c.accum * dp), c.steps, d, ref.losses.front(), ref.losses.back(),
                (long long)ref_load[8], (long long)ref_load[9]);
    std::printf("  memory per rank: plan %zu bytes, measured peak %zu (one process at the same micro-batch: plan %zu)\n",
                ep.predicted, ep.peak, ref.predicted);
    EXPECT_LT(d, 1e-5);
    EXPECT_LT(ref.losses.back(), 0.95 * ref.losses.front()) << "did not learn";
    EXPECT_EQ(ep_load, ref_load) << "tokens per expert, dropped and routed of each layer";
    if (c.model == kModel) {
      EXPECT_GT(ref_load[8], 0) << "capacity 1.0 should drop tokens";
    }
  }
  w.barrier();
}

}  // namespace

TEST(ExpertParallelRanks, Ep2MatchesOneProcess) { expect_matches_one_process({.ep = 2}, 2); }
TEST(ExpertParallelRanks, Ep2NoDropsMatchesOneProcess) {
  expect_matches_one_process({.model = kModel.substr(0, kModel.rfind(',')), .ep = 2}, 2);
}
TEST(ExpertParallelRanks, Ep4MatchesOneProcess) { expect_matches_one_process({.ep = 4}, 4); }
TEST(ExpertParallelRanks, Ep2TimesDp2MatchesOneProcess) { expect_matches_one_process({.ep = 2, .accum = 2}, 4); }
// The attention split over 2 tensor-parallel ranks, the moe layers whole on each.
TEST(ExpertParallelRanks, Ep2TimesTp2MatchesOneProcess) { expect_matches_one_process({.ep = 2, .tp = 2}, 4); }
// The exchanges run again when backward recomputes a block, and within each pipeline stage.
TEST(ExpertParallelRanks, Ep2WithFullRecomputationMatchesOneProcess) {
  expect_matches_one_process({.ep = 2, .recompute = true}, 2);
}
TEST(ExpertParallelRanks, Ep2TimesPp2MatchesOneProcess) { expect_matches_one_process({.ep = 2, .pp = 2, .accum = 2}, 4); }

// ---- bad input, in one process ----

TEST(ExpertParallel, BadInputNamesTheFlag) {
  using sat::test::error_of;
  const sat::ModelConfig moe = sat::model_config(kModel);
  EXPECT_NE(error_of([&] { sat::check_expert_parallel(sat::model_config("gpt-mini"), 2); }).find("--ep 2: gpt-mini has no experts"),
            std::string::npos);
  EXPECT_NE(error_of([&] { sat::check_expert_parallel(moe, 3); }).find("--ep 3: the 8 experts"), std::string::npos);
  EXPECT_NO_THROW(sat::check_expert_parallel(moe, 4));
  sat::ModelConfig file;
  file.family = sat::ModelFamily::file;
  file.name = "file:net.json";
  EXPECT_NE(error_of([&] { sat::check_expert_parallel(file, 2); }).find("--ep 2: file:net.json is a model file"),
            std::string::npos);
  EXPECT_NE(error_of([] { sat::dist::Mesh::check(4, 1, 1, 1, 3); }).find("--ep 3 does not divide the 4 data-parallel"),
            std::string::npos);
  EXPECT_NE(error_of([] { sat::dist::Mesh::check(4, 2, 1, 1, 4); }).find("--ep 4 does not divide the 2 data-parallel"),
            std::string::npos);
  EXPECT_NE(error_of([] { (void)sat::model_config("moe:layers=1,heads=2,width=16,experts=2,top_k=3,context=8,vocab=32"); })
                .find("top_k 3 is more than experts 2"),
            std::string::npos);
}

#ifdef SAT_MPIEXEC
// Every rank of a job refuses bad --ep at once, naming the flag, exit 2.
TEST(ExpertParallel, EveryRankRefusesBadEp) {
  if (distributed()) GTEST_SKIP() << "starts mpirun jobs of its own";
  const std::string moe = "--model " + kModel + " --batch 2 ";
  sat::test::expect_every_rank_refuses(2, moe + "--ep 4", "--ep 4 does not divide the 2 data-parallel ranks");
  sat::test::expect_every_rank_refuses(2, moe + "--ep 3", "--ep 3: the 8 experts");
  sat::test::expect_every_rank_refuses(2, "--model gpt-mini --batch 2 --ep 2", "--ep 2: gpt-mini has no experts");
  sat::test::expect_every_rank_refuses(2, "--model " + kModel + " --batch 1 --accum 2 --ep 2 --noise-scale", "--noise-scale with --ep 2");
  // What chooses the layout does not place experts yet (refused before MPI starts).
  for (const char* auto_flag : {"--batch auto", "--layout auto --global-batch 16"}) {
    const sat::test::CmdResult r = sat::test::run_command(std::string(SAT_BINARY) + " train --data synthetic --steps 2 "
                                                          "--eval off --model " + kModel + " --ep 2 " + auto_flag);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("--ep 2: --batch auto, --layout and saturate tune do not place experts"), std::string::npos)
        << r.out;
  }
  sat::test::expect_every_rank_refuses(
      2, "--model moe:layers=1,heads=2,width=16,experts=3,top_k=1,context=8,vocab=32 --batch 2 --ep 2",
      "--ep 2: the 3 experts");
  sat::test::expect_every_rank_refuses(
      2, "--model moe:layers=1,heads=2,width=16,experts=2,top_k=3,context=8,vocab=32 --batch 2 --ep 2",
      "--model moe:layers=1,heads=2,width=16,experts=2,top_k=3,context=8,vocab=32: top_k 3 is more than experts 2");
}
#endif
