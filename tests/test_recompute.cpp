// Activation recomputation (--recompute). Without mpirun: full and selective give bitwise
// the losses, weights and model state (BatchNorm's running statistics) of keeping every
// activation, for gpt-mini with dropout and resnet18; the memory plan holds the measured
// peak; full < selective < none in activation memory; recompute units of the graphs.
// Under mpirun with 2 ranks (CMake runs this binary as recompute_np2): the same
// exactness under pipeline (1F1B, two micro-batches in flight) and tensor parallelism
// (with and without sequence parallelism), with the tensor-parallel bytes of the
// recomputed collectives as predicted.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/blas.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "mpi_world.h"
#include "nn/models.h"
#include "nn/params.h"
#include "train/plan.h"
#include "train/trainer.h"

namespace {

using sat::Recompute;
using sat::dist::Comm;

using sat::test::world;
using sat::test::distributed;
using sat::test::world_is;


struct Case {
  std::string model = "gpt-mini";
  float dropout = 0.1f;
  int64_t batch = 2, accum = 1;
  int steps = 20;
  int tp = 1, pp = 1;
  bool sp = false;
  bool evaluate = false;
};

struct Out {
  std::vector<double> losses;
  std::vector<float> weights, states;  // this rank's, flat
  size_t predicted = 0, peak = 0, arena = 0;
  sat::GroupBytes measured, predicted_bytes;
};

Out train(const Case& c, Recompute mode, Comm* comm) {
  sat::cpu::set_num_threads(comm ? 1 : 2);
  auto mc = sat::model_config(c.model);
  mc.dropout = c.dropout;
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 5));
  sat::TrainConfig cfg;
  cfg.batch = c.batch;
  cfg.accum = c.accum;
  cfg.steps = c.steps;
  cfg.seed = 11;
  cfg.optim.name = "sgd";
  cfg.optim.lr = 0.05f;
  cfg.optim.momentum = 0.9f;
  cfg.evaluate = c.evaluate;
  cfg.progress = 0;
  cfg.comm = comm;
  cfg.tp = c.tp;
  cfg.pp = c.pp;
  cfg.sequence_parallel = c.sp;
  cfg.recompute = mode;
  sat::Trainer t(mc, cfg, *data.train, c.evaluate ? data.test.get() : nullptr);
  sat::TrainResult r = t.run();
  Out o;
  o.losses = r.losses;
  const sat::ParamStore& ps = t.params();
  o.weights.assign(ps.flat_params(), ps.flat_params() + ps.flat_size());
  for (size_t i = 0; i < ps.num_states(); ++i) {
    const sat::Tensor s = ps.state(i);
    if (s.dtype != sat::DType::f32) continue;  // BatchNorm's step counter
    o.states.insert(o.states.end(), s.f32(), s.f32() + s.numel());
  }
  o.predicted = r.predicted_memory_bytes;
  o.peak = r.peak_memory_bytes;
  o.arena = t.memory_plan().transient;
  o.measured = r.comm_bytes_per_step;
  o.predicted_bytes = sat::predict_comm(t.rank_plan(), cfg, t.mesh().dp());
  return o;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every mode against none on the same layout: the same bits, the plan holding the peak.
void expect_exact(const Case& c, std::vector<Recompute> modes, const char* what) {
  Comm* comm = distributed() ? &world() : nullptr;
  const int rank = comm ? comm->rank() : 0;
  const Out ref = train(c, Recompute::none, comm);
  for (Recompute m : modes) {
    const Out got = train(c, m, comm);
    const char* name = sat::recompute_name(m);
    ASSERT_EQ(got.losses.size(), ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i)
      EXPECT_EQ(got.losses[i], ref.losses[i]) << what << " " << name << " step " << i << " rank " << rank;
    EXPECT_TRUE(bitwise_equal(got.weights, ref.weights)) << what << " " << name << ": weights differ, rank " << rank;
    EXPECT_TRUE(bitwise_equal(got.states, ref.states)) << what << " " << name << ": model state differs, rank " << rank;
    EXPECT_LE(got.peak, got.predicted) << what << " " << name << " rank " << rank;
    EXPECT_GE(double(got.peak), 0.98 * double(got.predicted)) << what << " " << name << " rank " << rank;
    EXPECT_DOUBLE_EQ(got.measured.tp, got.predicted_bytes.tp) << what << " " << name << " rank " << rank;
    EXPECT_DOUBLE_EQ(got.measured.pp, got.predicted_bytes.pp) << what << " " << name << " rank " << rank;
    EXPECT_LT(got.arena, ref.arena) << what << " " << name << ": no activation memory saved, rank " << rank;
    if (rank == 0)
      std::printf("[ recompute] %-28s %-9s losses and weights bitwise equal over %zu steps (%.5f -> %.5f); step "
                  "arena %zu (none %zu), memory predicted %zu peak %zu, tp bytes %.0f (none %.0f)\n",
                  what, name, ref.losses.size(), ref.losses.front(), ref.losses.back(), got.arena, ref.arena,
                  got.predicted, got.peak, got.measured.tp, ref.measured.tp);
  }
  if (c.steps >= 10) {
    EXPECT_LT(ref.losses.back(), ref.losses.front()) << what << " did not learn";
  }
}


}  // namespace

// ---- one process -------------------------------------------------------------------------

TEST(Recompute, UnitsOfTheGraphs) {
  for (const char* name : {"gpt-mini", "resnet18"}) {
    auto mc = sat::model_config(name);
    mc.recompute = Recompute::full;
    const auto m = sat::build_model(mc, 2, true);
    const auto& nodes = m.graph->nodes();
    int units = 0, inside = 0;
    for (int i = 0; i < int(nodes.size()); ++i) {
      const sat::Node& n = nodes[size_t(i)];
      if (n.rc_first < 0) continue;
      ++inside;
      EXPECT_LE(n.rc_first, i);
      EXPECT_GE(n.rc_last, i);
      units += n.rc_last == i;
    }
    // gpt-mini: its 4 transformer layers (ln_1 .. add2); resnet18: its 8 BasicBlocks.
    EXPECT_EQ(units, std::string(name) == "gpt-mini" ? 4 : 8) << name;
    EXPECT_LT(inside, int(nodes.size())) << name << ": the embedding/stem and the head stay outside";
    // Without the mode (or for evaluation) no node is in a unit.
    // (The models are held: a range-for over a temporary's graph would read it freed.)
    mc.recompute = Recompute::none;
    const auto plain = sat::build_model(mc, 2, true);
    for (const auto& n : plain.graph->nodes()) EXPECT_EQ(n.rc_first, -1);
    mc.recompute = Recompute::full;
    const auto eval = sat::build_model(mc, 2, false);
    for (const auto& n : eval.graph->nodes()) EXPECT_EQ(n.rc_first, -1);
  }
}

TEST(Recompute, RefusedWhereThereIsNothingToRecompute) {
  auto error_of = [](const std::string& model, Recompute r) -> std::string {
    auto mc = sat::model_config(model);
    mc.recompute = r;
    try {
      sat::check_recompute(mc);
    } catch (const sat::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of("gpt-mini", Recompute::selective), "");
  EXPECT_EQ(error_of("gpt2-124m", Recompute::full), "");
  EXPECT_EQ(error_of("resnet18", Recompute::full), "");
  EXPECT_EQ(error_of("mlp", Recompute::none), "");
  EXPECT_NE(error_of("resnet18", Recompute::selective).find("--recompute selective: resnet18 has no attention"),
            std::string::npos);
  EXPECT_NE(error_of("mlp", Recompute::full).find("--recompute full: mlp has no recomputable blocks"), std::string::npos);
  EXPECT_NE(error_of("convnet", Recompute::selective).find("--recompute selective: convnet"), std::string::npos);
  EXPECT_THROW(sat::parse_recompute("some"), sat::Error);
}

// Bitwise: the recomputed forward is the same code on the same inputs with the same
// seeds (dropout masks) into the same buffers' shapes, and BatchNorm does not update its
// running statistics a second time.
TEST(Recompute, BitwiseEqualToKeepingEverything) {
  if (distributed()) GTEST_SKIP() << "one process";
  expect_exact(Case{}, {Recompute::selective, Recompute::full}, "gpt-mini dropout 0.1");
  Case acc;
  acc.accum = 2;
  acc.steps = 5;
  acc.evaluate = true;
  expect_exact(acc, {Recompute::full}, "gpt-mini accum 2");
  Case res;
  res.model = "resnet18";
  res.dropout = 0;
  res.steps = 3;
  expect_exact(res, {Recompute::full}, "resnet18");
  Case llama;
  llama.model = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256";
  llama.dropout = 0;
  llama.steps = 5;
  expect_exact(llama, {Recompute::selective, Recompute::full}, "llama (grouped-query)");
}

// The plan is exact at two batch sizes, and each mode keeps less than the one before it.
TEST(Recompute, MemoryPlanExactAndOrdered) {
  if (distributed()) GTEST_SKIP() << "one process";
  for (int64_t batch : {2, 8}) {
    Case c;
    c.batch = batch;
    c.steps = 1;
    size_t arena[3];
    for (Recompute m : {Recompute::none, Recompute::selective, Recompute::full}) {
      const Out o = train(c, m, nullptr);
      EXPECT_LE(o.peak, o.predicted) << sat::recompute_name(m) << " batch " << batch;
      EXPECT_GE(double(o.peak), 0.98 * double(o.predicted)) << sat::recompute_name(m) << " batch " << batch;
      arena[int(m)] = o.arena;
      std::printf("[ memory   ] gpt-mini batch %lld recompute %-9s: step arena %10zu, predicted %10zu peak %10zu\n",
                  (long long)batch, sat::recompute_name(m), o.arena, o.predicted, o.peak);
    }
    EXPECT_LT(arena[int(Recompute::full)], arena[int(Recompute::selective)]) << "batch " << batch;
    EXPECT_LT(arena[int(Recompute::selective)], arena[int(Recompute::none)]) << "batch " << batch;
  }
}

// ---- under mpirun with 2 ranks -----------------------------------------------------------

// What one more GPT layer adds to the step arena, against Korthikanti et al.'s count of
// the activations a layer keeps (float32, no dropout; s sequence, b batch, h width, a heads):
//   none       72 s b h + 4 a s^2 b + 16 s b bytes: every output of the layer (ln_1 4, qkv 12,
//              attention 4, c_proj 4, add 4, ln_2 4, c_fc 16, gelu 16, c_proj 4, add 4: 72 sbh),
//              attention's probabilities, and the two LayerNorms' mean and 1/std per token;
//   selective  the same without the probabilities;
//   full       only the layer's input: 4 s b h.
TEST(Recompute, ActivationsPerLayerAreTheFormulas) {
  const double s = 128, b = 8, h = 256, a = 4;
  const double want[3] = {72 * s * b * h + 4 * a * s * s * b + 16 * s * b, 72 * s * b * h + 16 * s * b, 4 * s * b * h};
  int k = 0;
  for (auto rc : {sat::Recompute::none, sat::Recompute::selective, sat::Recompute::full}) {
    size_t arena[2];
    for (int L : {5, 6}) {
      sat::ModelConfig mc = sat::model_config("gpt-mini");
      mc.n_layer = L;
      mc.recompute = rc;
      auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
      sat::TrainConfig cfg;
      cfg.batch = int64_t(b);
      cfg.recompute = rc;
      cfg.evaluate = false;
      arena[L - 5] = sat::plan_rank(mc, cfg, *data.train, nullptr, 0, 1).step.arena;
    }
    EXPECT_EQ(double(arena[1] - arena[0]), want[k]) << sat::recompute_name(rc);
    ++k;
  }
}

TEST(RecomputeRanks, BitwiseUnderPipelineParallelism) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R recompute_np2)";
  Case c;
  c.pp = 2;
  c.accum = 2;  // 1F1B: two micro-batches in flight on the first stage
  expect_exact(c, {Recompute::selective, Recompute::full}, "gpt-mini pp 2 (1f1b, M 2)");
  world().barrier();
}

TEST(RecomputeRanks, BitwiseUnderTensorParallelism) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R recompute_np2)";
  Case c;
  c.tp = 2;
  expect_exact(c, {Recompute::selective, Recompute::full}, "gpt-mini tp 2");
  Case sp = c;
  sp.sp = true;
  sp.steps = 5;
  expect_exact(sp, {Recompute::full}, "gpt-mini tp 2 sequence parallel");
  world().barrier();
}
