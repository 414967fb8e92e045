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
// Each rank holds only its experts' weights, gradients and optimizer state (counted below),
// and a checkpoint or weights file of --ep holds the one-process model: the checkpoint test
// resumes one under dp 2 without --ep and in one process, on the one-process trajectory.
//
// Outside mpirun: the bad input of --ep (the model, the ranks) in one process.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
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
#include "nn/safetensors.h"
#include "train/checkpoint.h"
#include "train/trainer.h"
#include "train/weights.h"
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
  int layers = 2;          // the model's moe layers
  bool recompute = false;  // full
  int64_t batch = 4;  // micro-batch of every rank
  int64_t accum = 1;
  int steps = 20;
  float clip = 0;                  // --clip-grad-norm (0: off)
  std::string checkpoint_dir = "";  // a checkpoint at the end
  int64_t checkpoint_every = 0;    // and every so many steps
  std::string resume = "";          // a checkpoint to go on from
  std::string save_weights = "";    // the weights at the end
};

// The parameters of kModel's experts: 2 layers x 8 experts x 3 matrices of width x ffn.
constexpr int64_t kExpertParams = 2 * 8 * 3 * 32 * 32;

struct Run {
  std::vector<double> losses;
  std::map<std::string, sat::MoeLoad> load;  // this rank's routing over the run
  size_t predicted = 0, peak = 0;
  int64_t params = 0;  // this rank's store
  int64_t clipped = 0;
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
  cfg.optim.clip_grad_norm = c.clip;
  cfg.checkpoint_dir = c.checkpoint_dir;
  cfg.checkpoint_every = c.checkpoint_every;
  cfg.progress = 0;
  cfg.comm = comm;
  (void)sat::take_moe_load();
  sat::Trainer t(mc, cfg, *data.train, nullptr);
  if (!c.resume.empty()) t.resume(c.resume);
  sat::TrainResult r = t.run();
  if (!c.save_weights.empty()) t.save_weights(c.save_weights);
  Run out;
  out.losses = r.losses;
  out.load = sat::take_moe_load();
  out.predicted = r.predicted_memory_bytes;
  out.peak = r.peak_memory_bytes;
  out.params = t.params().param_count();
  out.clipped = r.clipped_steps;
  // Every rank's place in its expert group, as summary.json reports it.
  EXPECT_EQ(r.ep, ep);
  for (const sat::RankReport& k : r.ranks) EXPECT_EQ(k.ep_rank, k.dp_rank % ep) << "rank " << k.rank;
  return out;
}

// Per moe layer of the model (`layers` layers of 8 experts), the kept tokens per expert, the
// dropped and the routed ones, summed over the ranks of comm (a pipeline stage has only its layers).
std::vector<int64_t> load_over(Comm& comm, const std::map<std::string, sat::MoeLoad>& load, int layers = 2) {
  const size_t per = 8 + 2;
  std::vector<int64_t> v(size_t(layers) * per, 0);
  for (const auto& [layer, L] : load) {
    size_t at = v.size();
    for (int k = 0; k < layers; ++k)
      if (layer == "model.layers." + std::to_string(k) + ".mlp") at = size_t(k) * per;
    EXPECT_LT(at, v.size()) << layer;
    if (at >= v.size()) continue;
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
  std::vector<int64_t> ep_load = load_over(w, ep.load, c.layers);
  for (int64_t& v : ep_load) v /= c.ep * c.tp;
  const int dp = w.size() / (c.tp * c.pp);
  EXPECT_GE(ep.peak, 1u);
  EXPECT_EQ(ep.peak, ep.predicted) << "rank " << w.rank() << ": the plan is not the measured peak";
  if (w.rank() == 0) {
    auto self = sat::dist::make_self_comm();
    const Run ref = train(c, self.get(), 1, 1, 1, c.accum * dp);
    // Each rank holds 1/ep of the experts (the tensor-parallel and pipeline cases split the rest too).
    if (c.tp == 1 && c.pp == 1) {
      EXPECT_EQ(ep.params, ref.params - kExpertParams + kExpertParams / c.ep);
    }
    if (c.clip > 0) {
      EXPECT_GT(ref.clipped, 0) << "--clip-grad-norm " << c.clip << " should clip";
    }
    EXPECT_EQ(ep.clipped, ref.clipped);
    const std::vector<int64_t> ref_load = load_over(*self, ref.load, c.layers);
    const double d = sat::test::max_rel(ep.losses, ref.losses);
    std::printf("%s: --ep %d --tp %d --pp %d%s, %d ranks x batch %lld x accum %lld vs 1 x batch %lld x accum %lld, %d steps: max "
                "relative loss difference %.3g (first %.6f, last %.6f); dropped %lld of %lld\n",
                c.model.c_str(), c.ep, c.tp, c.pp, c.recompute ? " --recompute full" : "", w.size(), (long long)c.batch, (long long)c.accum, (long long)c.batch,
                (long long)(c.accum * dp), c.steps, d, ref.losses.front(), ref.losses.back(),
                (long long)ref_load[8], (long long)ref_load[9]);
    std::printf("  memory per rank: plan %zu bytes, measured peak %zu, %lld parameters (one process at the same "
                "micro-batch: plan %zu, %lld parameters)\n",
                ep.predicted, ep.peak, (long long)ep.params, ref.predicted, (long long)ref.params);
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
// dp 4: each expert's gradient is averaged over the 2 ranks that hold it; the gradient norm
// clipped counts each expert once.
TEST(ExpertParallelRanks, Ep2TimesDp2MatchesOneProcess) {
  expect_matches_one_process({.ep = 2, .accum = 2, .clip = 0.05f}, 4);
}
// The attention split over 2 tensor-parallel ranks, the moe layers whole on each.
TEST(ExpertParallelRanks, Ep2TimesTp2MatchesOneProcess) { expect_matches_one_process({.ep = 2, .tp = 2}, 4); }
// The exchanges run again when backward recomputes a block, and within each pipeline stage.
TEST(ExpertParallelRanks, Ep2WithFullRecomputationMatchesOneProcess) {
  expect_matches_one_process({.ep = 2, .recompute = true}, 2);
}
TEST(ExpertParallelRanks, Ep2TimesPp2MatchesOneProcess) { expect_matches_one_process({.ep = 2, .pp = 2, .accum = 2}, 4); }
// Four stages, a moe layer on each: the load-balancing losses travel as one running sum
// through every cut (each layer's own loss, read at the end, crossed several cuts at once and
// the messages between stages did not match: MPI stopped the job).
TEST(ExpertParallelRanks, Pp4CarriesTheLoadBalancingLossesThroughEveryCut) {
  expect_matches_one_process(
      {.model = "moe:layers=4,heads=2,width=32,experts=8,top_k=2,context=16,vocab=64,ffn=32,capacity=1.0", .pp = 4,
       .layers = 4, .accum = 2},
      4);
}

// The weights of a one-process store of kModel read from `path` (a checkpoint or a
// safetensors file): every tensor of the one-process model, under its name and shape.
sat::ParamStore one_process_weights(const std::string& path) {
  const sat::BuiltModel m = sat::build_model(sat::model_config(kModel), 1);
  sat::ParamStore ps(m.graph->params(), m.graph->states(), 0);
  if (std::filesystem::is_directory(path))
    sat::load_weights_into(ps, path, kModel);
  else
    sat::load_safetensors(path, ps);
  return ps;
}

double max_rel_params(const sat::ParamStore& a, const sat::ParamStore& b) {
  double worst = 0;
  for (size_t i = 0; i < a.num_params(); ++i) {
    const sat::Tensor x = a.host_param(i), y = b.host_param(i);
    for (int64_t k = 0; k < x.numel(); ++k)
      worst = std::max(worst, double(std::fabs(x.f32()[k] - y.f32()[k])) / (1e-3 + std::fabs(y.f32()[k])));
  }
  return worst;
}

// A checkpoint of --ep 2 at step 10: each expert rank writes its own experts, the manifest
// holds the one-process model's tensors, and the run goes on from it without --ep (dp 2), or
// in one process, on the one-process trajectory; the weights file --ep 2 saves is the
// checkpoint's model.
TEST(ExpertParallelRanks, Ep2CheckpointHoldsTheOneProcessModel) {
  namespace fs = std::filesystem;
  if (!sat::test::world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks";
  Comm& w = world();
  int64_t id = getpid();
  w.broadcast_sync(&id, 1, sat::DType::i64, 0);
  const fs::path d = fs::temp_directory_path() / ("sat_ep_ckpt_" + std::to_string(id));
  if (w.rank() == 0) fs::remove_all(d), fs::create_directories(d);
  w.barrier();
  const std::string ck = (d / "ep2").string(), at10 = (d / "ep2" / sat::checkpoint_name(10)).string();
  const ::Run a = train({.ep = 2, .steps = 10, .checkpoint_dir = ck, .save_weights = (d / "ep2.st").string()}, &w, 2, 1, 1, 1);
  const ::Run b = train({.steps = 20, .resume = at10}, &w, 1, 1, 1, 1);  // dp 2, experts whole on each rank
  if (w.rank() == 0) {
    auto self = sat::dist::make_self_comm();
    const ::Run ref = train({.steps = 20, .checkpoint_dir = (d / "one").string(), .checkpoint_every = 10}, self.get(), 1, 1, 1, 2);
    const ::Run c = train({.steps = 20, .resume = at10}, self.get(), 1, 1, 1, 2);
    ASSERT_EQ(ref.losses.size(), 20u);
    ASSERT_EQ(b.losses.size(), 20u);
    ASSERT_EQ(c.losses.size(), 20u);
    const std::vector<double> first(ref.losses.begin(), ref.losses.begin() + 10), last(ref.losses.begin() + 10, ref.losses.end());
    const double da = sat::test::max_rel(a.losses, first);
    const double db = sat::test::max_rel(std::vector<double>(b.losses.begin() + 10, b.losses.end()), last);
    const double dc = sat::test::max_rel(std::vector<double>(c.losses.begin() + 10, c.losses.end()), last);
    const sat::Manifest man = sat::read_manifest(at10);
    EXPECT_EQ(man.layout.ep, 2);
    EXPECT_EQ(man.files.size(), 2u) << "each expert rank writes its experts";
    const sat::ParamStore saved = one_process_weights(ck), file = one_process_weights((d / "ep2.st").string());
    EXPECT_EQ(sat::manifest_parameters(man), saved.param_count());
    EXPECT_EQ(max_rel_params(file, saved), 0.0) << "the weights file is the checkpoint's model";
    const double dw = max_rel_params(saved, one_process_weights((d / "one" / sat::checkpoint_name(10)).string()));
    std::printf("--ep 2 checkpoint at step 10: losses to it %.3g, resumed with dp 2 %.3g, in one process %.3g "
                "(max relative difference from one process); weights %.3g\n", da, db, dc, dw);
    EXPECT_LT(da, 1e-5);
    EXPECT_LT(db, 1e-5);
    EXPECT_LT(dc, 1e-5);
    EXPECT_LT(dw, 2e-4);  // (AdamW divides by the root of the second moment: small sums differ more)
    fs::remove_all(d);
  }
  w.barrier();
}

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
  sat::test::expect_every_rank_refuses({
      {2, moe + "--ep 4", "--ep 4 does not divide the 2 data-parallel ranks"},
      {2, moe + "--ep 3", "--ep 3: the 8 experts"},
      {2, "--model gpt-mini --batch 2 --ep 2", "--ep 2: gpt-mini has no experts"},
      {2, "--model " + kModel + " --batch 1 --accum 2 --ep 2 --noise-scale", "--noise-scale with --ep 2"},
      {2, "--model " + kModel + " --batch 2 --ep 2 --zero 1", "--zero 1 with --ep 2"},
      {2, "--model moe:layers=1,heads=2,width=16,experts=3,top_k=1,context=8,vocab=32 --batch 2 --ep 2",
       "--ep 2: the 3 experts"},
      {2, "--model moe:layers=1,heads=2,width=16,experts=2,top_k=3,context=8,vocab=32 --batch 2 --ep 2",
       "--model moe:layers=1,heads=2,width=16,experts=2,top_k=3,context=8,vocab=32: top_k 3 is more than experts 2"},
  });
  // What chooses the layout does not place experts yet (refused before MPI starts).
  for (const char* auto_flag : {"--batch auto", "--layout auto --global-batch 16"}) {
    const sat::test::CmdResult r = sat::test::run_command(std::string(SAT_BINARY) + " train --data synthetic --steps 2 "
                                                          "--eval off --model " + kModel + " --ep 2 " + auto_flag);
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_NE(r.out.find("--ep 2: --batch auto, --layout and saturate tune do not place experts"), std::string::npos)
        << r.out;
  }
}
#endif
