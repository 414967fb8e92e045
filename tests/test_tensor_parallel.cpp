// Tensor and sequence parallelism. Without mpirun: how parameters are split, the graphs
// of a tensor-parallel rank, the collectives they hold, and the errors of bad layouts.
// Under mpirun (CMake runs this binary as tensor_parallel_np2, _np4 and _np8): every
// layout (tp, tp with sequence parallelism, dp x tp, tp x pp, dp x tp x pp) follows the
// one-process loss trajectory, each rank's memory plan holds its measured peak, and the
// bytes the tensor-parallel group moves per step are the textbook's. Rank 0 trains the
// one-process reference itself while the others wait.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "backend/cpu/blas.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "mpi_world.h"
#include "nn/models.h"
#include "nn/params.h"
#include "nn/safetensors.h"
#include "nn/shard.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "nn/layers/cross_entropy.h"
#include "op_harness.h"
#include "trajectory.h"
#ifdef SAT_MPIEXEC
#include "mpi_job.h"
#endif

namespace {

using sat::dist::Comm;

using sat::test::world;
using sat::test::distributed;
using sat::test::world_is;


// A small Llama (2 kv heads: tp 2 at most) that learns on synthetic tokens in 20 steps.
const char* const kLlama = "llama:layers=2,heads=4,kv_heads=2,width=64,ffn=96,context=32,vocab=256";

sat::ModelConfig tp_model(const std::string& name, int tp, int rank, bool sp = false) {
  sat::ModelConfig mc = sat::model_config(name);
  mc.tp = tp;
  mc.tp_rank = rank;
  mc.sequence_parallel = sp;
  return mc;
}

int count_kind(const sat::Graph& g, const std::string& kind) {
  int n = 0;
  for (auto& node : g.nodes()) n += kind == node.layer->kind();
  return n;
}

// ---- how a parameter is split ------------------------------------------------------------

// qkv's weight [3C, C] over 2 ranks with stride 3: rank r holds rows of q, k and v of its
// heads, in that order; putting both parts back gives the full tensor.
TEST(Shard, StridedRowsRoundTrip) {
  const int64_t C = 4;
  std::vector<float> full(size_t(3 * C * C));
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(i);
  std::vector<float> back(full.size(), -1.0f);
  for (int r = 0; r < 2; ++r) {
    sat::ParamDecl d{"w", {sat::Shape{3 * C / 2, C}}, sat::ParamInit::zeros(), false, {0, 2, r, 3}};
    EXPECT_EQ(d.full_shape(), (sat::Shape{3 * C, C}));
    std::vector<float> part(size_t(3 * C / 2 * C));
    sat::shard_extract(d, full.data(), part.data());
    // Local row j = block b (q, k, v) piece k: full row b * C + r * C/2 + k.
    for (int64_t j = 0; j < 3 * C / 2; ++j) {
      const int64_t b = j / (C / 2), k = j % (C / 2), row = b * C + r * (C / 2) + k;
      for (int64_t c = 0; c < C; ++c) EXPECT_EQ(part[size_t(j * C + c)], float(row * C + c)) << r << " " << j;
    }
    sat::shard_insert(d, part.data(), back.data());
  }
  EXPECT_EQ(back, full);
}

// Columns (a row-parallel weight [out, in] split along in).
TEST(Shard, ColumnsRoundTrip) {
  std::vector<float> full(6 * 8);
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(i);
  std::vector<float> back(full.size(), -1.0f);
  for (int r = 0; r < 4; ++r) {
    sat::ParamDecl d{"w", {sat::Shape{6, 2}}, sat::ParamInit::zeros(), false, {1, 4, r, 1}};
    std::vector<float> part(12);
    sat::shard_extract(d, full.data(), part.data());
    for (int64_t o = 0; o < 6; ++o)
      for (int64_t c = 0; c < 2; ++c) EXPECT_EQ(part[size_t(o * 2 + c)], float(o * 8 + r * 2 + c));
    sat::shard_insert(d, part.data(), back.data());
  }
  EXPECT_EQ(back, full);
}

// ---- tensor-parallel graphs ----------------------------------------------------------------

// Every rank of a tp group starts from its part of the one-process weights (both inits),
// and the parts of the split parameters, put together, are the whole model.
TEST(TensorParallelGraph, InitIsTheSliceOfOneProcess) {
  for (const char* name : {"mlp", "mlp:784-64-32-48-16-10", "gpt-mini", kLlama})
    for (int tp : {2, 4}) {
      if (name == kLlama && tp == 4) continue;  // 2 key/value heads
      for (bool parity : {false, true}) {
        sat::BuiltModel one = sat::build_model(sat::model_config(name), 2);
        sat::ParamStore whole(one.graph->params(), one.graph->states(), 0);
        parity ? whole.init_parity() : whole.init(11);
        int64_t split_elems = 0, whole_elems = 0;
        for (int r = 0; r < tp; ++r) {
          sat::BuiltModel m = sat::build_model(tp_model(name, tp, r), 2);
          sat::ParamStore ps(m.graph->params(), m.graph->states(), 0);
          parity ? ps.init_parity() : ps.init(11);
          ASSERT_EQ(ps.num_params(), whole.num_params()) << name;
          for (size_t i = 0; i < ps.num_params(); ++i) {
            const sat::ParamDecl& d = ps.decl(i);
            const int k = whole.find_param(d.name);
            ASSERT_GE(k, 0) << d.name;
            EXPECT_EQ(d.full_shape(), whole.decl(size_t(k)).spec.shape) << d.name;
            std::vector<float> want(size_t(d.spec.shape.numel()));
            sat::shard_extract(d, whole.param(size_t(k)).ptr, want.data());
            const sat::Tensor got = ps.param(i);
            for (int64_t e = 0; e < got.numel(); ++e)
              ASSERT_EQ(got.f32()[e], want[size_t(e)]) << name << " tp " << tp << " rank " << r << " " << d.name;
            if (d.shard.split()) split_elems += d.spec.shape.numel();
            else if (r == 0) whole_elems += d.spec.shape.numel();
          }
        }
        EXPECT_EQ(split_elems + whole_elems, one.graph->param_count()) << name << " tp " << tp;
      }
    }
}

// Megatron's layout of GPT: per block one entry and one exit of a tensor-parallel region
// around attention and around the MLP, plus the embedding's exit and the head's entry;
// the weights of each rank are 1/tp of the split ones.
TEST(TensorParallelGraph, GptHasMegatronsCollectives) {
  const int L = 4;
  for (bool sp : {false, true}) {
    sat::BuiltModel m = sat::build_model(tp_model("gpt-mini", 2, 1, sp), 2);
    const sat::Graph& g = *m.graph;
    EXPECT_EQ(count_kind(g, sp ? "TPAllGather" : "TPCopy"), 2 * L + 1);
    EXPECT_EQ(count_kind(g, sp ? "TPReduceScatter" : "TPAllReduce"), 2 * L + 1);
    EXPECT_EQ(count_kind(g, sp ? "TPCopy" : "TPAllGather"), 0);
    for (auto& n : g.nodes()) {
      if (n.name == "transformer.h.0.attn.attn") {
        EXPECT_EQ(n.setup.in_shape(0)[2], 3 * 256 / 2);
      } else if (n.name == "lm_head") {
        EXPECT_EQ(n.setup.output.shape[2], 4096 / 2);
      } else if (n.name == "transformer.h.0.ln_1") {
        EXPECT_EQ(n.setup.in_shape(0).numel(), sp ? 2 * 128 * 256 / 2 : 2 * 128 * 256);
      }
    }
    int partial = 0;
    for (auto& p : g.params()) partial += p.shard.partial_grad;
    EXPECT_EQ(partial, sp ? 2 * (2 * L + 1) : 0) << "LayerNorm weights and biases sum their gradients under sp";
  }
}

// Llama under tp 2 has GPT's regions: each rank holds half of the query heads (q 4/2 x 16
// channels), half of the key/value heads (2/2 x 16), half of SwiGLU's features and of the
// vocabulary; RMSNorm weights sum their gradients under sequence parallelism.
TEST(TensorParallelGraph, LlamaHasMegatronsCollectives) {
  const int L = 2;
  for (bool sp : {false, true}) {
    sat::BuiltModel m = sat::build_model(tp_model(kLlama, 2, 1, sp), 2);
    const sat::Graph& g = *m.graph;
    EXPECT_EQ(count_kind(g, sp ? "TPAllGather" : "TPCopy"), 2 * L + 1);
    EXPECT_EQ(count_kind(g, sp ? "TPReduceScatter" : "TPAllReduce"), 2 * L + 1);
    std::map<std::string, sat::Shape> out;
    for (auto& n : g.nodes()) out[n.name] = n.setup.output.shape;
    EXPECT_EQ(out.at("model.layers.0.self_attn.q_proj"), (sat::Shape{2, 32, 2 * 16}));
    EXPECT_EQ(out.at("model.layers.0.self_attn.k_proj"), (sat::Shape{2, 32, 1 * 16}));
    EXPECT_EQ(out.at("model.layers.1.self_attn.attn"), (sat::Shape{2, 32, 2 * 16}));
    EXPECT_EQ(out.at("model.layers.1.mlp.act_fn"), (sat::Shape{2, 32, 96 / 2}));
    EXPECT_EQ(out.at("lm_head"), (sat::Shape{2, 32, 256 / 2}));
    EXPECT_EQ(out.at("model.norm").numel(), sp ? 2 * 32 * 64 / 2 : 2 * 32 * 64);  // sp: this rank's tokens
    int partial = 0;
    for (auto& p : g.params()) partial += p.shard.partial_grad;
    EXPECT_EQ(partial, sp ? 2 * L + 1 : 0) << "RMSNorm weights sum their gradients under sp";
  }
}

// The bytes the graph's collectives move per micro-batch (LayerSetup::comm_*) are the
// textbook's: without sequence parallelism two all-reduces of b*s*h in forward and two in
// backward per layer; with it the same as all-gathers and reduce-scatters (each counted
// by its full b*s*h payload); plus the embedding's and the head's, and the
// cross-entropy's three floats per token.
TEST(TensorParallelGraph, CollectiveBytesAreTheTextbooks) {
  const double b = 2, s = 128, h = 256, L = 4, f = 4;  // f: bytes per float
  for (bool sp : {false, true}) {
    sat::BuiltModel m = sat::build_model(tp_model("gpt-mini", 2, 0, sp), 2);
    double fwd = 0, bwd = 0;
    for (auto& n : m.graph->nodes()) fwd += n.setup.comm_fwd, bwd += n.setup.comm_bwd;
    const double act = b * s * h * f, ce = 3 * b * s * f;
    if (!sp) {
      EXPECT_DOUBLE_EQ(fwd, L * 2 * act + act + ce);  // + the embedding's all-reduce
      EXPECT_DOUBLE_EQ(bwd, L * 2 * act + act);       // + the head's input gradient
    } else {
      EXPECT_DOUBLE_EQ(fwd, L * 4 * act + 2 * act + ce);  // gather and scatter per region
      EXPECT_DOUBLE_EQ(bwd, L * 4 * act + 2 * act);
    }
  }
}

TEST(TensorParallelGraph, BadLayoutsAreClearErrors) {
  auto error_of = [](const std::string& name, int tp, bool sp, int64_t vocab = 0) {
    sat::ModelConfig mc = sat::model_config(name);
    if (vocab) mc.vocab = mc.classes = vocab;
    try {
      sat::check_tensor_parallel(mc, tp, sp);
    } catch (const sat::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of("gpt-mini", 3, false).find("--tp 3: gpt-mini has 4 attention heads"), std::string::npos);
  EXPECT_NE(error_of("gpt-mini", 2, false, 4097).find("vocabulary of 4097"), std::string::npos);
  EXPECT_NE(error_of("convnet", 2, false).find("convnet has no tensor-parallel form (models with one: mlp"),
            std::string::npos);
  EXPECT_NE(error_of("resnet18", 2, false).find("has no tensor-parallel form"), std::string::npos);
  EXPECT_NE(error_of("gpt-mini", 1, true).find("--sequence-parallel needs --tp 2"), std::string::npos);
  EXPECT_NE(error_of("mlp", 2, true).find("--sequence-parallel: mlp has no sequence"), std::string::npos);
  EXPECT_NE(error_of("mlp", 3, false).find("hidden width 1024"), std::string::npos);
  EXPECT_NE(error_of("mlp:784-64-64-10", 3, false).find("hidden width 64"), std::string::npos);
  EXPECT_EQ(error_of("mlp:784-64-65-10", 2, false), "");  // fc2's output is not split
  EXPECT_NE(error_of("mlp:784-64-10", 2, false).find("has no tensor-parallel form"), std::string::npos);
  EXPECT_EQ(error_of("gpt2-124m", 4, true, 50304), "");
  EXPECT_EQ(error_of(kLlama, 2, true), "");
  EXPECT_NE(error_of(kLlama, 4, false).find("--tp 4: " + std::string(kLlama) + " has 2 key/value heads, which do not "
                                            "divide by 4"), std::string::npos);
  EXPECT_NE(error_of("llama:layers=1,heads=4,kv_heads=4,width=64,ffn=90,context=8,vocab=256", 4, false)
                .find("MLP width ffn=90"), std::string::npos);
  EXPECT_NE(error_of("gpt2-124m", 2, false).find("vocabulary of 50257 tokens does not divide by 2 (the embedding and "
                                                 "output head are split by vocabulary): pad it, as Megatron-LM does, "
                                                 "with --vocab 50432"),
            std::string::npos);
}

// ---- under mpirun: exactness against one process ---------------------------------------

struct Case {
  std::string model;
  int tp = 2, pp = 1;
  bool sp = false;
  int64_t batch = 2, accum = 2;
  int steps = 20;
  std::string optimizer = "sgd";
  float lr = 0.05f;
  int zero = 0;
  bool evaluate = false;
  float dropout = 0;
  bool noise = false;
};

struct RunOut {
  std::vector<double> losses;
  sat::EvalResult test;
  size_t predicted = 0, peak = 0;
  sat::dist::Traffic tp_traffic;
  sat::GroupBytes measured, predicted_bytes;  // per step
  double noise_scale = 0;
};

RunOut train(const Case& c, Comm& comm, bool parallel) {
  sat::cpu::set_num_threads(1);
  auto mc = sat::model_config(c.model);
  mc.dropout = c.dropout;
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 7));
  sat::TrainConfig cfg;
  cfg.tp = parallel ? c.tp : 1;
  cfg.pp = parallel ? c.pp : 1;
  cfg.sequence_parallel = parallel && c.sp;
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
  cfg.zero = parallel ? c.zero : 0;
  cfg.bucket_mb = 0.25;
  cfg.measure_noise = c.noise;
  sat::Trainer t(mc, cfg, *data.train, c.evaluate ? data.test.get() : nullptr);
  sat::TrainResult r = t.run();
  return {r.losses, r.test.value_or(sat::EvalResult{}), r.predicted_memory_bytes, r.peak_memory_bytes,
          t.mesh().traffic_of("tp"), r.comm_bytes_per_step,
          sat::predict_comm(t.rank_plan(), cfg, t.mesh().dp()), r.noise_scale};
}

// The layout on every rank (dp = world / (tp * pp)), one process on rank 0 with the same
// global batch (dp * accum micro-batches).
void expect_exact(const Case& c) {
  Comm& w = world();
  const int dp = w.size() / (c.tp * c.pp);
  RunOut run = train(c, w, true);
  // What every group moved per step is what the plan predicts.
  EXPECT_DOUBLE_EQ(run.measured.tp, run.predicted_bytes.tp) << "rank " << w.rank();
  EXPECT_DOUBLE_EQ(run.measured.dp, run.predicted_bytes.dp) << "rank " << w.rank();
  EXPECT_DOUBLE_EQ(run.measured.pp, run.predicted_bytes.pp) << "rank " << w.rank();
  EXPECT_DOUBLE_EQ(run.measured.embedding, run.predicted_bytes.embedding) << "rank " << w.rank();
  EXPECT_LE(run.peak, run.predicted) << "rank " << w.rank();
  EXPECT_GE(double(run.peak), 0.98 * double(run.predicted)) << "rank " << w.rank();
  if (w.rank() == 0) {
    auto self = sat::dist::make_self_comm();
    Case one = c;
    one.accum = c.accum * dp;
    const std::string key = one.model + "|" + std::to_string(one.batch) + "x" + std::to_string(one.accum) + "|" +
                            std::to_string(one.steps) + "|" + one.optimizer + "|" + sat::test::key_of(one.lr) + "|" +
                            std::to_string(one.evaluate) + std::to_string(one.noise) + "|" +
                            sat::test::key_of(one.dropout);
    const RunOut& ref = sat::test::one_process_run<RunOut>(key, [&] { return train(one, *self, false); });
    const double d = sat::test::max_rel(run.losses, ref.losses);
    std::printf("%s dp %d x tp %d%s x pp %d%s, micro-batch %lld x %lld, %s: max relative loss difference %.3g over %d "
                "steps (%.5f -> %.5f); memory predicted %zu, peak %zu\n",
                c.model.c_str(), dp, c.tp, c.sp ? " (sequence parallel)" : "", c.pp, c.zero ? ", ZeRO-1" : "",
                (long long)c.batch, (long long)c.accum, c.optimizer.c_str(), d, c.steps, ref.losses.front(),
                ref.losses.back(), run.predicted, run.peak);
    EXPECT_LT(d, 1e-5) << c.model;
    EXPECT_LT(ref.losses.back(), 0.97 * ref.losses.front()) << c.model << " did not learn";
    if (c.evaluate) sat::test::expect_same_evaluation(run.test, ref.test);
  }
  w.barrier();
}


// The gradient noise scale counts each element once: a split parameter's parts on their
// ranks, a whole one on the group's first rank.
TEST(TensorParallelRanks, NoiseScaleMatchesOneProcess) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R tensor_parallel_np2)";
  for (const char* model : {"mlp", "gpt-mini"}) {
    const Case c{.model = model, .batch = 4, .steps = 8, .noise = true};
    const RunOut run = train(c, world(), true);
    if (world().rank() == 0) {
      auto self = sat::dist::make_self_comm();
      const RunOut ref = train(c, *self, false);
      std::printf("%s tp 2: noise scale %.9g, one process %.9g\n", model, run.noise_scale, ref.noise_scale);
      EXPECT_GT(ref.noise_scale, 0);
      EXPECT_NEAR(run.noise_scale, ref.noise_scale, 1e-5 * ref.noise_scale) << model;
    }
    world().barrier();
  }
}

// The vocabulary-parallel cross-entropy against central differences: each rank holds 5 of
// 10 classes; the loss is one number on every rank, and the gradient of a rank's logits
// is checked by perturbing them on that rank alone (every rank recomputes the loss).
TEST(TensorParallelRanks, VocabParallelCrossEntropyGradient) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R tensor_parallel_np2)";
  Comm& w = world();
  sat::CrossEntropy ce(sat::TPRank{2, w.rank()});
  sat::test::OpCheck opt;
  opt.seed = uint64_t(5 + w.rank());  // each rank its own logits (and its own weight of the loss)
  opt.inputs = {{sat::Shape{6, 5}}, {sat::Shape{6}, sat::DType::i32}};
  opt.fill_inputs = [](std::vector<sat::Tensor>& in) {  // the same labels on every rank, one ignored
    const int32_t labels[6] = {0, 9, 4, 5, -1, 7};
    for (int k = 0; k < 6; ++k) in[1].i32()[k] = labels[k];
  };
  sat::test::LayerRig rig(ce, opt);
  rig.ctx().group = &w;
  rig.forward();
  rig.backward();
  const sat::Tensor x = rig.ctx().in[0], dx = rig.ctx().din[0];
  std::vector<float> analytic(dx.f32(), dx.f32() + dx.numel());
  const float eps = 1e-2f;
  double err = 0, norm = 0;
  for (int owner = 0; owner < 2; ++owner)
    for (int64_t k = 0; k < x.numel(); ++k) {
      const float keep = x.f32()[k];
      if (w.rank() == owner) x.f32()[k] = keep + eps;
      const double up = rig.forward();
      if (w.rank() == owner) x.f32()[k] = keep - eps;
      const double down = rig.forward();
      x.f32()[k] = keep;
      if (w.rank() != owner) continue;
      const double numeric = (up - down) / (2 * eps);
      err += (numeric - analytic[size_t(k)]) * (numeric - analytic[size_t(k)]);
      norm += numeric * numeric;
    }
  EXPECT_LT(std::sqrt(err / std::max(norm, 1e-30)), 1e-2) << "rank " << w.rank();
  EXPECT_GT(norm, 0) << "rank " << w.rank();
}

TEST(TensorParallelRanks, TwoRanks) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R tensor_parallel_np2)";
  expect_exact({.model = "mlp", .batch = 8, .evaluate = true});
  expect_exact({.model = "gpt-mini", .evaluate = true});
  expect_exact({.model = "gpt-mini", .sp = true, .evaluate = true});
  expect_exact({.model = "gpt-mini", .sp = true, .optimizer = "adamw", .lr = 3e-4f, .dropout = 0.1f});
}

// Llama (RMSNorm, rotary, grouped-query attention, SwiGLU, untied vocabulary-parallel
// embedding and head) follows one process, with and without sequence parallelism.
TEST(TensorParallelRanks, LlamaTwoRanks) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R tensor_parallel_np2)";
  expect_exact({.model = kLlama, .batch = 4, .optimizer = "adamw", .lr = 3e-3f, .evaluate = true});
  expect_exact({.model = kLlama, .sp = true, .batch = 4, .optimizer = "adamw", .lr = 3e-3f, .evaluate = true});
}

// Deeper mlps: an odd hidden layer left whole between the pair and the head, and a second
// pair entered through a copy.
TEST(TensorParallelRanks, DeeperMlpsTwoRanks) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R tensor_parallel_np2)";
  expect_exact({.model = "mlp:784-256-128-64-10", .batch = 8, .lr = 0.15f});
  expect_exact({.model = "mlp:784-128-96-64-32-10", .batch = 8, .lr = 0.15f});
}

TEST(TensorParallelRanks, FourRanks) {
  if (!world_is(4)) GTEST_SKIP() << "runs under mpirun with 4 ranks (ctest -R tensor_parallel_np4)";
  expect_exact({.model = "mlp", .tp = 4, .batch = 8});
  expect_exact({.model = "gpt-mini", .tp = 4, .batch = 1, .evaluate = true});
  expect_exact({.model = "gpt-mini", .tp = 4, .sp = true, .batch = 1, .evaluate = true});
  expect_exact({.model = "gpt-mini", .tp = 2, .batch = 1, .optimizer = "adamw", .lr = 3e-4f, .zero = 1,
                .evaluate = true});  // dp 2 x tp 2
  expect_exact({.model = "mlp", .tp = 2, .batch = 8});                           // dp 2 x tp 2
  expect_exact({.model = "gpt-mini", .tp = 2, .pp = 2, .batch = 1, .accum = 4, .evaluate = true});  // tp 2 x pp 2
}

TEST(TensorParallelRanks, EightRanks) {
  if (!world_is(8)) GTEST_SKIP() << "runs under mpirun with 8 ranks (ctest -R tensor_parallel_np8)";
  expect_exact({.model = "gpt-mini", .tp = 2, .pp = 2, .sp = true, .batch = 1, .accum = 4, .steps = 12,
                .optimizer = "adamw", .lr = 3e-4f, .zero = 1, .evaluate = true});  // dp 2 x tp 2 x pp 2
}

// The bytes the tensor-parallel group's communicator counted per step (tp 2, micro-batch
// b = 2, s = 128, h = 256, L = 4 layers, accum 2): without sequence parallelism 2 + 2
// all-reduces of b*s*h floats per layer, plus the embedding's and the head's and the
// cross-entropy's 3 floats per token; with it all-gathers and reduce-scatters of b*s*h
// instead, plus the LayerNorm gradients' all-reduce once per step. The ring algorithm
// moves 2 (n-1)/n of an all-reduce's payload and (n-1)/n of the others': per layer, the
// same wire volume either way.
TEST(TensorParallelRanks, BytesPerStepAreTheTextbooks) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R tensor_parallel_np2)";
  const double b = 2, s = 128, h = 256, L = 4, f = 4, accum = 2, steps = 3, act = b * s * h * f;
  double wire[2] = {0, 0};
  for (bool sp : {false, true}) {
    RunOut r = train({.model = "gpt-mini", .sp = sp, .accum = 2, .steps = 3}, world(), true);
    const sat::dist::Traffic& t = r.tp_traffic;
    const double per_micro_ce = 3 * b * s * f;
    if (!sp) {
      EXPECT_DOUBLE_EQ(double(t.all_reduce.bytes) / steps, accum * (L * 4 * act + 2 * act + per_micro_ce));
      EXPECT_EQ(t.all_gather.bytes + t.reduce_scatter.bytes, 0u);
      wire[0] = double(t.all_reduce.bytes - uint64_t(steps * accum * per_micro_ce)) * 2 * (2 - 1) / 2;
    } else {
      const double ln = (2 * L + 1) * 2 * h * f;  // LayerNorm weight and bias gradients, once per step
      // Per micro-batch: gathers in forward (2 per layer, the head's) and in the backward of
      // the reduce-scatters (2 per layer, the embedding's); reduce-scatters alike.
      EXPECT_DOUBLE_EQ(double(t.all_gather.bytes) / steps, accum * (L * 4 * act + 2 * act));
      EXPECT_DOUBLE_EQ(double(t.reduce_scatter.bytes) / steps, accum * (L * 4 * act + 2 * act));
      EXPECT_DOUBLE_EQ(double(t.all_reduce.bytes) / steps, accum * per_micro_ce + ln);
      wire[1] = double(t.all_gather.bytes + t.reduce_scatter.bytes) * (2 - 1) / 2;
    }
    EXPECT_EQ(t.p2p.bytes, 0u);
  }
  if (world().rank() == 0)
    std::printf("tp 2: ring wire bytes of the activations per run: %.0f without, %.0f with sequence parallelism\n",
                wire[0], wire[1]);
  EXPECT_DOUBLE_EQ(wire[0], wire[1]);
}

}  // namespace

// ---- whole jobs -----------------------------------------------------------------------------
#ifdef SAT_MPIEXEC
namespace {

double final_loss(const std::filesystem::path& dir) {
  std::ifstream f(dir / "summary.json");
  return nlohmann::json::parse(f)["final_train_loss"].get<double>();
}

}  // namespace

TEST(TensorParallelFailure, BadLayoutsAreRefusedByEveryRank) {
  if (distributed()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  sat::test::expect_every_rank_refuses({
      {3, "--model gpt-mini --batch 1 --tp 3", "--tp 3: gpt-mini has 4 attention heads"},
      {2, "--model gpt-mini --batch 1 --tp 2 --vocab 4097", "--tp 2: gpt-mini's vocabulary"},
      {2, "--model convnet --batch 8 --tp 2", "--tp 2: convnet has no tensor-parallel form"},
      {2, "--model gpt-mini --batch 1 --sequence-parallel", "--sequence-parallel needs --tp 2"},
      {2, "--model mlp --batch 8 --tp 2 --sequence-parallel", "--sequence-parallel: mlp"},
      {2, "--model gpt-mini --batch 1 --tp 4", "--tp 4 x --pp 1 = 4 does not divide the 2"},
  });
}

// Weights saved by tp 2 x pp 2 are the whole model's under PyTorch's names (gathered from
// the tensor-parallel parts and the stages), equal to one process's after the same
// training and loadable by PyTorch's module; a one-process file loaded into tp 4 gives
// the same next loss as in one process.
TEST(TensorParallelJob, WeightsRoundTrip) {
  if (distributed()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("sat_tp_weights_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  // SGD: AdamW's first steps move every weight by about lr whatever its gradient's size, so
  // a gradient near 0 that rounds to the other sign moves it 2 lr the other way: a weight
  // comparison measures that, not the layout (the loss trajectories check AdamW layouts).
  const std::string common = "train --model gpt-mini --data synthetic --batch 1 --accum 4 --steps 3 --threads 1 --eval off "
                             "--optimizer sgd ";
  sat::test::JobEnd tp = sat::test::run_job(
      4, common + "--tp 2 --pp 2 --save-weights " + (d / "tp.safetensors").string() + " --out " + (d / "tp").string(),
      300);
  ASSERT_EQ(tp.status, 0) << tp.out;
  sat::test::JobEnd one = sat::test::run_job(1, common + "--save-weights " + (d / "one.safetensors").string());
  ASSERT_EQ(one.status, 0) << one.out;
  const double worst = sat::test::max_rel_weights("gpt-mini", (d / "tp.safetensors").string(),
                                                  (d / "one.safetensors").string());
  std::printf("gpt-mini after 3 steps: tp 2 x pp 2's saved weights differ from one process's by %.3g (relative)\n",
              worst);
  EXPECT_LT(worst, 1e-4);
  std::ifstream sf(d / "tp" / "summary.json");
  auto s = nlohmann::json::parse(sf);
  EXPECT_EQ(s["layout"]["tp"], 2);
  EXPECT_EQ(s["layout"]["pp"], 2);
  EXPECT_EQ(s["parameters"], sat::build_model(sat::model_config("gpt-mini"), 1).graph->param_count());  // not a part
  ASSERT_EQ(s["ranks"].size(), 4u);
  for (auto& r : s["ranks"]) {
    EXPECT_GT(r["comm_bytes_per_step"]["tp"].get<double>(), 0);
    EXPECT_GT(r["comm_bytes_per_step"]["pp"].get<double>(), 0);
    EXPECT_GT(r["memory_by_kind"]["parameters"].get<double>(), 0);
  }
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0) {
    const std::string cmd = std::string("/usr/bin/python3 ") + SAT_SOURCE_DIR + "/bench/peer/weights.py check gpt-mini " +
                            (d / "tp.safetensors").string() + " 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  } else {
    std::printf("PyTorch is not installed: bench/peer/weights.py check not run\n");
  }
  const std::string from = "--init-weights " + (d / "one.safetensors").string() + " --steps 1 ";
  sat::test::JobEnd t4 = sat::test::run_job(4, common + from + "--tp 4 --out " + (d / "t4").string(), 120);
  sat::test::JobEnd o1 = sat::test::run_job(1, common + from + "--out " + (d / "o1").string());
  ASSERT_EQ(t4.status, 0) << t4.out;
  ASSERT_EQ(o1.status, 0) << o1.out;
  EXPECT_NEAR(final_loss(d / "t4"), final_loss(d / "o1"), 1e-5 * final_loss(d / "o1"));
  fs::remove_all(d);
}
#endif
