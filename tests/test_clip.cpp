// Gradient clipping by the total norm (--clip-grad-norm, train/grad_clip.h). In one process:
// the logged norm is the square root of the sum of every gradient element squared (GPT's
// tied embedding once), the stored gradients come out of the step scaled to the bound, and
// the coefficient is clip_grad_norm_'s. Under mpirun with 2 ranks (CMake runs this binary
// as clip_np2): data parallelism, tensor parallelism, a pipeline (whose last stage holds a
// copy of the tied embedding) and ZeRO-1/2/3 follow one process's clipped trajectory, norm
// by norm, with clipping active on most steps. (PyTorch's clip_grad_norm_ itself, with
// AdamW's betas and eps: tests/test_parity.cpp's *_clip goldens.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/blas.h"
#include "data/dataset.h"
#include "dist/comm.h"
#include "mpi_world.h"
#include "nn/models.h"
#include "train/grad_clip.h"
#include "train/trainer.h"
#include "trajectory.h"

namespace {

using sat::test::world;
using sat::test::world_is;

// A small GPT (tied embedding and output head, two blocks: one per pipeline stage, heads and
// widths split by tensor parallelism) keeps each case to seconds.
constexpr const char* kGpt = "gpt:layers=2,heads=2,width=64,context=32,vocab=256";

struct Case {
  std::string model = kGpt;
  int zero = 0, tp = 1, pp = 1;
  bool sp = false;  // sequence parallelism (LayerNorm gradients summed over the tp group first)
  int64_t batch = 1, accum = 2;
  int steps = 20;
  std::string optimizer = "sgd";
  float lr = 0.05f;
  float clip = 1.0f;
};

struct RunOut {
  std::vector<double> losses, norms;
  std::vector<bool> clipped;
  int64_t clipped_steps = 0;
};

sat::TrainConfig config_of(const Case& c, sat::dist::Comm* comm, bool parallel) {
  sat::TrainConfig cfg;
  cfg.tp = parallel ? c.tp : 1;
  cfg.pp = parallel ? c.pp : 1;
  cfg.zero = parallel ? c.zero : 0;
  cfg.sequence_parallel = parallel && c.sp;
  cfg.accum = c.accum;
  cfg.batch = c.batch;
  cfg.steps = c.steps;
  cfg.seed = 3;
  cfg.optim.name = c.optimizer;
  cfg.optim.lr = c.lr;
  cfg.optim.momentum = c.optimizer == "sgd" ? 0.9f : 0.0f;
  cfg.optim.clip_grad_norm = c.clip;
  cfg.evaluate = false;
  cfg.progress = 0;
  cfg.comm = comm;
  return cfg;
}

RunOut train(const Case& c, sat::dist::Comm* comm, bool parallel) {
  sat::cpu::set_num_threads(1);
  auto mc = sat::model_config(c.model);
  auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 7));
  sat::Trainer t(mc, config_of(c, comm, parallel), *data.train, nullptr);
  RunOut out;
  sat::TrainResult r = t.run([&](const sat::StepMetrics& m) {
    out.norms.push_back(m.grad_norm);
    out.clipped.push_back(m.clipped);
  });
  out.losses = r.losses;
  out.clipped_steps = r.clipped_steps;
  return out;
}

// ---- one process -------------------------------------------------------------------------

// The sum of squares of every gradient in the store (one process: each parameter once).
double direct_norm(const sat::ParamStore& ps) {
  double s = 0;
  for (size_t i = 0; i < ps.num_params(); ++i) {
    const sat::Tensor g = ps.grad(i);
    for (int64_t k = 0; k < g.numel(); ++k) s += double(g.f32()[k]) * double(g.f32()[k]);
  }
  return std::sqrt(s);
}

TEST(Clip, CoefficientIsClipGradNormsOwn) {
  EXPECT_EQ(sat::clip_coefficient(2.0, 1.0f), float(1.0 / (2.0 + 1e-6)));
  EXPECT_EQ(sat::clip_coefficient(0.5, 1.0f), 1.0f);
  EXPECT_EQ(sat::clip_coefficient(1.0, 1.0f), float(1.0 / (1.0 + 1e-6))) << "at the bound: 0.999999, as PyTorch's";
  EXPECT_EQ(sat::clip_coefficient(INFINITY, 1.0f), 1.0f) << "a norm that is not finite is not clipped";
  EXPECT_EQ(sat::clip_coefficient(NAN, 1.0f), 1.0f);
}

// The norm a step logs is the square root of the sum of its gradients' squares (GPT: the
// embedding, tied to the output head, counted once), and the step leaves the gradients
// scaled to the bound (on the host the store's gradients are scaled in place, as
// clip_grad_norm_ leaves p.grad). A bound above every norm changes nothing.
TEST(Clip, NormIsTheSumOfSquaresAndTheStepScalesTheGradients) {
  sat::cpu::set_num_threads(1);
  for (const char* model : {kGpt, "mlp"}) {
    for (float bound : {1e30f, 0.25f}) {
      Case c{.model = model, .batch = 2, .steps = 3, .clip = bound};
      auto mc = sat::model_config(model);
      auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 7));
      sat::Trainer t(mc, config_of(c, nullptr, false), *data.train, nullptr);
      int checked = 0;
      t.run([&](const sat::StepMetrics& m) {
        const double after = direct_norm(t.params());
        const double want = bound < m.grad_norm ? bound * m.grad_norm / (m.grad_norm + 1e-6) : m.grad_norm;
        EXPECT_NEAR(after, want, 1e-6 * want) << model << " step " << m.step << " bound " << bound;
        EXPECT_EQ(m.clipped, m.grad_norm > bound) << model;
        EXPECT_GT(m.grad_norm, 0.25) << model << ": the case is meant to clip";
        ++checked;
      });
      EXPECT_EQ(checked, 3);
    }
  }
}

// ---- under mpirun: every layout follows one process's clipped trajectory ------------------

// The layout on 2 ranks against one process with the same global batch: losses and each
// step's norm within 1e-5, the same steps clipped, and clipping active on most of them.
void expect_exact(const Case& c) {
  sat::dist::Comm& w = world();
  const int dp = w.size() / (c.tp * c.pp);
  const RunOut run = train(c, &w, true);
  if (w.rank() == 0) {
    Case one = c;
    one.accum = c.accum * dp;
    const RunOut ref = train(one, nullptr, false);
    const double loss = sat::test::max_rel(run.losses, ref.losses);
    const double norm = sat::test::max_rel(run.norms, ref.norms);
    int over = 0;  // steps whose logged norm exceeded the bound
    for (double n : ref.norms) over += n > c.clip;
    std::printf("ZeRO-%d dp %d x tp %d%s x pp %d, accum %lld, %s, --clip-grad-norm %g: clipped %d of %d steps; "
                "max relative difference from one process: loss %.3g, norm %.3g (%.5f -> %.5f)\n",
                c.zero, dp, c.tp, c.sp ? " (sequence parallel)" : "", c.pp, (long long)c.accum, c.optimizer.c_str(),
                double(c.clip), over,
                c.steps, loss, norm, ref.losses.front(), ref.losses.back());
    EXPECT_LT(loss, 1e-5);
    EXPECT_LT(norm, 1e-5);
    EXPECT_EQ(run.clipped, ref.clipped);
    EXPECT_EQ(run.clipped_steps, over);
    EXPECT_GE(over, c.steps * 3 / 4) << "clipping is active on most steps";
    EXPECT_LT(ref.losses.back(), 0.97 * ref.losses.front()) << c.model << " did not learn";
  }
  w.barrier();
}

TEST(ClipRanks, DataParallel) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R clip_np2)";
  expect_exact({});
}

TEST(ClipRanks, TensorParallel) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R clip_np2)";
  expect_exact({.tp = 2});
  expect_exact({.tp = 2, .sp = true});
}

// The last stage holds a copy of the tied embedding: its gradient counts once.
TEST(ClipRanks, Pipeline) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R clip_np2)";
  expect_exact({.pp = 2, .accum = 4});
}

TEST(ClipRanks, Zero) {
  if (!world_is(2)) GTEST_SKIP() << "runs under mpirun with 2 ranks (ctest -R clip_np2)";
  for (int zero : {1, 2, 3}) expect_exact({.zero = zero});
  expect_exact({.zero = 3, .optimizer = "adamw", .lr = 1e-3f});
}

}  // namespace
