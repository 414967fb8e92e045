// Basic layers: finite-difference checks through the shared harness (op_harness.h) on several
// shapes each, plus forward values against small hand/PyTorch computations.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "nn/layers/activation.h"
#include "nn/layers/cross_entropy.h"
#include "nn/layers/elementwise.h"
#include "nn/layers/embedding.h"
#include "nn/layers/layernorm.h"
#include "backend/cpu/blas.h"
#include "nn/layers/linear.h"
#include "nn/layers/rmsnorm.h"
#include "op_harness.h"

using namespace sat;
using sat::test::InputSpec;
using sat::test::LayerRig;
using sat::test::OpCheck;
using sat::test::check_backward_split;

namespace {

OpCheck f32_inputs(std::vector<Shape> shapes) {
  OpCheck o;
  for (auto& s : shapes) o.inputs.push_back({s});
  return o;
}

void set(const Tensor& t, std::vector<float> v) {
  ASSERT_EQ(int64_t(v.size()), t.numel());
  for (size_t i = 0; i < v.size(); ++i) t.f32()[i] = v[i];
}

void set_i32(const Tensor& t, std::vector<int32_t> v) {
  ASSERT_EQ(int64_t(v.size()), t.numel());
  for (size_t i = 0; i < v.size(); ++i) t.i32()[i] = v[i];
}

// sat::test::check_layer, recording the worst relative finite-difference error per layer kind as a
// test property (visible with --gtest_output=xml, silent otherwise).
double check(Layer& layer, const OpCheck& o) {
  static std::map<std::string, double> worst;
  double w = sat::test::check_layer(layer, o);
  double& m = worst[layer.kind()];
  m = std::max(m, w);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2e", m);
  ::testing::Test::RecordProperty(std::string("worst_fd_rel_err_") + layer.kind(), buf);
  return w;
}

// Runs setup on a fresh LayerRig and returns the message of the sat::Error it throws ("" if none).
std::string setup_error(Layer& layer, const OpCheck& o) {
  try {
    LayerRig rig(layer, o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---- vexp (the vectorised exp behind GELU and CrossEntropy) ----

TEST(VExp, MatchesStdExpToAFewUlp) {
  double worst = 0;
  for (int i = -200000; i <= 200000; ++i) {
    float x = float(i) * 4.35e-4f;  // [-87, 87]
    double want = std::exp(double(x));
    worst = std::max(worst, std::fabs(double(vexp(x)) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(vexp(0.0f), 1.0f);
  EXPECT_EQ(vexp(-88.0f), 0.0f);  // flushed
  EXPECT_EQ(vexp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_GT(vexp(-86.9f), 0.0f);
  EXPECT_TRUE(std::isfinite(vexp(1000.0f)));
}

// ---- Linear ----

TEST(Linear, GradientsManyShapes) {
  struct Case { Shape x; int64_t out; bool bias; };
  std::vector<Case> cases = {{{1, 5}, 3, true},      {{3, 33}, 17, true},     {{17, 5}, 33, true},
                             {{3, 33}, 5, false},    {{2, 3, 7}, 4, true},    {{2, 3, 7}, 1, false},
                             {{64, 40}, 70, true},   {{256, 9}, 260, true},   // threaded bias-grad path
                             {{1, 300}, 260, true}};  // batch 1: matrix-vector products, an outer-product gradient
  for (auto& cs : cases) {
    SCOPED_TRACE("x " + cs.x.str() + " out " + std::to_string(cs.out) + (cs.bias ? " bias" : " no bias"));
    Linear lin(cs.x[-1], cs.out, cs.bias);
    check(lin, f32_inputs({cs.x}));
  }
}

// cpu::gemm hands products with one output row or column to gemv and products over one
// inner index to an outer-product loop: every transpose, beta and leading dimension (padded
// here) against the plain triple loop, at sizes past the thresholds of those paths.
TEST(Gemm, MatrixVectorAndOuterProductsMatchTheReference) {
  struct Case { int64_t M, N, K; };
  for (Case c : {Case{1, 300, 260}, Case{300, 1, 260}, Case{300, 260, 1}, Case{1, 1, 70000}, Case{3, 300, 260}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 1.0f, 0.5f}) {
          SCOPED_TRACE(str_cat("M ", c.M, " N ", c.N, " K ", c.K, ta ? " A^T" : "", tb ? " B^T" : "", " beta ", beta));
          const int64_t ar = ta ? c.K : c.M, ac = ta ? c.M : c.K, br = tb ? c.N : c.K, bc = tb ? c.K : c.N;
          const int64_t lda = ac + 3, ldb = bc + 2, ldc = c.N + 5;
          std::vector<float> A(size_t(ar * lda)), B(size_t(br * ldb)), C(size_t(c.M * ldc));
          for (size_t i = 0; i < A.size(); ++i) A[i] = float(int(i * 7 % 13) - 6) / 8;
          for (size_t i = 0; i < B.size(); ++i) B[i] = float(int(i * 5 % 11) - 5) / 4;
          for (size_t i = 0; i < C.size(); ++i) C[i] = float(int(i % 9) - 4);
          std::vector<float> want = C;
          for (int64_t i = 0; i < c.M; ++i)
            for (int64_t j = 0; j < c.N; ++j) {
              double acc = 0;
              for (int64_t k = 0; k < c.K; ++k)
                acc += double(ta ? A[size_t(k * lda + i)] : A[size_t(i * lda + k)]) *
                       double(tb ? B[size_t(j * ldb + k)] : B[size_t(k * ldb + j)]);
              float& w = want[size_t(i * ldc + j)];
              w = float(0.75 * acc + (beta == 0 ? 0.0 : double(beta) * double(w)));
            }
          if (beta == 0)  // beta 0 must not read C (BLAS semantics): garbage there is ignored
            for (int64_t i = 0; i < c.M; ++i) C[size_t(i * ldc)] = std::numeric_limits<float>::quiet_NaN();
          cpu::gemm(ta, tb, c.M, c.N, c.K, 0.75f, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
          double worst = 0;
          for (size_t i = 0; i < C.size(); ++i) {
            const bool in_c = int64_t(i % size_t(ldc)) < c.N;
            if (!in_c) {
              ASSERT_EQ(C[i], want[i]) << "element " << i << " outside the N columns was written";
              continue;
            }
            worst = std::max(worst, std::fabs(double(C[i]) - double(want[i])) / (1 + std::fabs(double(want[i]))));
          }
          EXPECT_LT(worst, 1e-5);
        }
}

// A rank's part of a column- or row-parallel Linear is a Linear of its own: gradients of
// every part, and its parameters declare their place in the full tensor. (A row-parallel
// layer adds its bias on part 0 only, so that the sum has it once; the other parts' bias
// gradient is the whole layer's, not their own output's: tests/test_tensor_parallel.cpp
// checks it against one process.)
TEST(Linear, TensorParallelPartsHaveGradients) {
  for (auto split : {LinearTP::Split::column, LinearTP::Split::row})
    for (int index : {0, 1}) {
      SCOPED_TRACE(std::string(split == LinearTP::Split::column ? "column" : "row") + " part " + std::to_string(index));
      Linear lin(12, 6, true, std::nullopt, std::nullopt, "", LinearTP{split, TPRank{2, index}, 1});
      const int64_t in = split == LinearTP::Split::row ? 6 : 12;
      if (split == LinearTP::Split::column || index == 0) check(lin, f32_inputs({{3, in}}));
      LayerSetup s;
      s.name = "fc";
      s.inputs = {{Shape{3, in}}};
      lin.setup(s);
      ASSERT_EQ(s.params.size(), 2u);
      EXPECT_EQ(s.params[0].full_shape(), (Shape{6, 12}));
      EXPECT_EQ(s.params[0].shard.index, index);
      EXPECT_EQ(s.params[1].shard.split(), split == LinearTP::Split::column);
    }
}

TEST(Linear, TiedWeightIsSharedAndHasNoBias) {
  Linear lin(6, 11, true, std::nullopt, std::nullopt, "transformer.wte.weight");
  OpCheck o = f32_inputs({{2, 3, 6}});
  {
    LayerRig rig(lin, o);
    ASSERT_EQ(rig.setup().params.size(), 1u);
    EXPECT_EQ(rig.setup().params[0].name, "transformer.wte.weight");
    EXPECT_TRUE(rig.setup().params[0].shared);
    EXPECT_EQ(rig.setup().params[0].spec.shape, Shape({11, 6}));
  }
  check(lin, o);
}

TEST(Linear, SetupShapesInitsAndFlops) {
  Linear lin(8, 3);
  LayerRig rig(lin, f32_inputs({{2, 5, 8}}));
  auto& s = rig.setup();
  EXPECT_EQ(s.output.shape, Shape({2, 5, 3}));
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_EQ(s.params[0].name, "t.weight");
  EXPECT_EQ(s.params[0].spec.shape, Shape({3, 8}));
  EXPECT_EQ(s.params[1].name, "t.bias");
  EXPECT_EQ(s.params[0].init.kind, ParamInit::Kind::uniform);
  EXPECT_FLOAT_EQ(s.params[0].init.scale, 1.0f / std::sqrt(8.0f));
  EXPECT_EQ(s.params[1].init.kind, ParamInit::Kind::uniform);
  EXPECT_FLOAT_EQ(s.params[1].init.scale, 1.0f / std::sqrt(8.0f));
  EXPECT_DOUBLE_EQ(s.flops_fwd, 2.0 * 10 * 8 * 3);
  EXPECT_DOUBLE_EQ(s.flops_bwd, 4.0 * 10 * 8 * 3);
  Linear custom(8, 3, true, ParamInit::normal(0.02f), ParamInit::zeros());
  LayerRig rig2(custom, f32_inputs({{4, 8}}));
  EXPECT_EQ(rig2.setup().params[0].init.kind, ParamInit::Kind::normal);
  EXPECT_EQ(rig2.setup().params[1].init.kind, ParamInit::Kind::zeros);
}

TEST(Linear, ForwardAndBackwardByHand) {
  Linear lin(2, 3);
  OpCheck o = f32_inputs({{2, 2}});
  LayerRig rig(lin, o);
  auto& c = rig.ctx();
  set(c.in[0], {1, 2, -1, 0.5f});
  set(c.params[0], {1, 0, 0.5f, -1, 2, 3});  // W [3, 2]
  set(c.params[1], {0.1f, 0.2f, 0.3f});
  rig.forward();
  const std::vector<float> want = {1.1f, -1.3f, 8.3f, -0.9f, -0.8f, -0.2f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(c.out.f32()[i], want[size_t(i)], 1e-6) << i;
  set(c.dout, {1, 0, 0, 0, 1, 1});
  rig.backward();
  // dX = dY W: row 0 = W[0] = (1, 0); row 1 = W[1] + W[2] = (2.5, 2)
  const std::vector<float> dx = {1, 0, 2.5f, 2};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(c.din[0].f32()[i], dx[size_t(i)], 1e-6) << i;
  // dW = dY^T X: row 0 = x0 = (1, 2); rows 1, 2 = x1 = (-1, 0.5)
  const std::vector<float> dw = {1, 2, -1, 0.5f, -1, 0.5f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(c.grads[0].f32()[i], dw[size_t(i)], 1e-6) << i;
  const std::vector<float> db = {1, 1, 1};
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(c.grads[1].f32()[i], db[size_t(i)], 1e-6) << i;
}

TEST(Linear, RejectsWrongInput) {
  Linear lin(5, 3);
  EXPECT_NE(setup_error(lin, f32_inputs({{4, 6}})).find("[..., 5]"), std::string::npos);
  EXPECT_THROW(Linear(0, 3), Error);
}

// ---- activations ----

TEST(ReLU, GradientsManyShapes) {
  for (Shape s : {Shape{1}, Shape{3, 5}, Shape{17, 33}, Shape{2, 3, 4, 5}}) {
    SCOPED_TRACE(s.str());
    ReLU relu;
    OpCheck o = f32_inputs({s});
    // Keep inputs at least 0.05 from the kink: the harness's kink test (eps vs eps/2) cannot see
    // one closer than ~eps/4 to x, where both differences are biased about equally.
    o.fill_inputs = [](std::vector<Tensor>& in) {
      for (int64_t k = 0; k < in[0].numel(); ++k) {
        float& v = in[0].f32()[k];
        if (std::fabs(v) < 0.05f) v = v < 0 ? v - 0.05f : v + 0.05f;
      }
    };
    check(relu, o);
  }
}

TEST(ReLU, Values) {
  ReLU relu;
  LayerRig rig(relu, f32_inputs({{4}}));
  set(rig.ctx().in[0], {-2, 0, 0.5f, 3});
  rig.forward();
  EXPECT_EQ(rig.ctx().out.f32()[0], 0.0f);
  EXPECT_EQ(rig.ctx().out.f32()[1], 0.0f);
  EXPECT_EQ(rig.ctx().out.f32()[2], 0.5f);
  EXPECT_EQ(rig.ctx().out.f32()[3], 3.0f);
}

TEST(GELU, GradientsManyShapes) {
  for (Shape s : {Shape{1}, Shape{3, 5}, Shape{17, 33}, Shape{2, 3, 4, 5}, Shape{300, 301}}) {
    SCOPED_TRACE(s.str());
    GELU gelu;
    OpCheck o = f32_inputs({s});
    o.inputs[0].scale = 2.0f;  // reach the tails
    check(gelu, o);
  }
}

TEST(GELU, MatchesPyTorchTanhGelu) {
  // torch.nn.functional.gelu(x, approximate='tanh') in float64.
  const std::vector<float> x = {1.0f, -0.5f, 2.0f, -3.0f, 0.1f, -10.0f, 0.0f, 20.0f};
  const std::vector<double> want = {0.8411919906, -0.1542859902, 1.9545976941, -0.0036373921,
                                    0.0539827510, -0.0,          0.0,          20.0};
  GELU gelu;
  LayerRig rig(gelu, f32_inputs({{int64_t(x.size())}}));
  set(rig.ctx().in[0], x);
  rig.forward();
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(rig.ctx().out.f32()[i], want[i], 2e-7 + 1e-6 * std::fabs(want[i])) << "gelu(" << x[i] << ")";
  // The brief's float32 reference values.
  EXPECT_NEAR(rig.ctx().out.f32()[0], 0.8411920071, 1e-6);
  EXPECT_NEAR(rig.ctx().out.f32()[1], -0.1542859972, 1e-6);
}

TEST(GELU, ExactErfGradientsManyShapes) {
  for (Shape s : {Shape{1}, Shape{3, 5}, Shape{17, 33}, Shape{2, 3, 4, 5}, Shape{300, 301}}) {
    SCOPED_TRACE(s.str());
    GELU gelu(true);
    OpCheck o = f32_inputs({s});
    o.inputs[0].scale = 2.0f;  // reach the tails
    check(gelu, o);
  }
}

TEST(GELU, ExactErfMatchesPyTorchGelu) {
  // torch.nn.functional.gelu(x) (approximate='none') in float64.
  const std::vector<float> x = {1.0f, -0.5f, 2.0f, -3.0f, 0.1f, -10.0f, 0.0f, 20.0f};
  const std::vector<double> want = {0.8413447461, -0.1542687694, 1.9544997361, -0.0040496941, 0.0539827837, -0.0000000000, 0.0000000000, 20.0000000000};
  GELU gelu(true);
  EXPECT_STREQ(gelu.kind(), "GELU(erf)");
  LayerRig rig(gelu, f32_inputs({{int64_t(x.size())}}));
  set(rig.ctx().in[0], x);
  rig.forward();
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(rig.ctx().out.f32()[i], want[i], 2e-7 + 1e-6 * std::fabs(want[i])) << "gelu(" << x[i] << ")";
}

TEST(GELU, BackwardMatchesAnalyticDerivative) {
  const std::vector<float> x = {-4, -1.5f, -0.3f, 0, 0.7f, 2.5f};
  GELU gelu;
  LayerRig rig(gelu, f32_inputs({{int64_t(x.size())}}));
  set(rig.ctx().in[0], x);
  set(rig.ctx().dout, std::vector<float>(x.size(), 1.0f));
  rig.forward();
  rig.backward();
  for (size_t i = 0; i < x.size(); ++i) {
    double v = x[i], k = std::sqrt(2.0 / M_PI), u = k * (v + 0.044715 * v * v * v);
    double t = std::tanh(u);
    double d = 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * k * (1 + 3 * 0.044715 * v * v);
    EXPECT_NEAR(rig.ctx().din[0].f32()[i], d, 1e-6) << "x=" << v;
  }
}

TEST(SiLU, GradientsManyShapes) {
  for (Shape s : {Shape{1}, Shape{3, 5}, Shape{17, 33}, Shape{2, 3, 4, 5}, Shape{300, 301}}) {
    SCOPED_TRACE(s.str());
    SiLU silu;
    OpCheck o = f32_inputs({s});
    o.inputs[0].scale = 4.0f;  // reach the tails
    check(silu, o);
  }
}

TEST(SiLU, MatchesPyTorchSilu) {
  // torch.nn.functional.silu(x) in float64.
  const std::vector<float> x = {1.0f, -0.5f, 2.0f, -3.0f, 0.1f, -10.0f, 0.0f, 20.0f, -100.0f, -20.0f};
  const std::vector<double> want = {0.7310585786, -0.1887703344,   1.761594156, -0.1422776195, 0.05249791875,
                                    -0.000453978687, 0.0, 19.99999996, -3.720075976e-42, -4.122307236e-08};
  SiLU silu;
  EXPECT_STREQ(silu.kind(), "SiLU");
  EXPECT_FALSE(silu.backward_reads_output());  // the memory plan keeps its input, not its output
  EXPECT_TRUE(silu.backward_reads_inputs());
  LayerRig rig(silu, f32_inputs({{int64_t(x.size())}}));
  set(rig.ctx().in[0], x);
  rig.forward();
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(rig.ctx().out.f32()[i], want[i], 2e-7 + 1e-6 * std::fabs(want[i])) << "silu(" << x[i] << ")";
}

TEST(SiLU, BackwardMatchesPyTorchGradient) {
  // x.grad of torch.nn.functional.silu(x).sum() in float64: s (1 + x (1 - s)).
  const std::vector<float> x = {1.0f, -0.5f, 2.0f, -3.0f, 0.1f, -10.0f, 0.0f, 20.0f, -100.0f, -20.0f};
  const std::vector<double> want = {0.9276705119, 0.2600388127,    1.090784249, -0.08810410602, 0.5499167915,
                                    -0.0004085602087, 0.5, 1.000000039, -3.682875216e-42, -3.916191866e-08};
  SiLU silu;
  LayerRig rig(silu, f32_inputs({{int64_t(x.size())}}));
  set(rig.ctx().in[0], x);
  set(rig.ctx().dout, std::vector<float>(x.size(), 1.0f));
  rig.forward();
  rig.backward();
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_NEAR(rig.ctx().din[0].f32()[i], want[i], 2e-7 + 1e-6 * std::fabs(want[i])) << "x=" << x[i];
}

// ---- Add, Flatten, Dropout ----

TEST(Add, GradientsAndValues) {
  for (Shape s : {Shape{1}, Shape{3, 5}, Shape{17, 33}, Shape{300, 301}}) {
    SCOPED_TRACE(s.str());
    Add add;
    check(add, f32_inputs({s, s}));
  }
  Add add;
  LayerRig rig(add, f32_inputs({{3}, {3}}));
  set(rig.ctx().in[0], {1, 2, 3});
  set(rig.ctx().in[1], {0.5f, -2, 10});
  rig.forward();
  EXPECT_EQ(rig.ctx().out.f32()[0], 1.5f);
  EXPECT_EQ(rig.ctx().out.f32()[1], 0.0f);
  EXPECT_EQ(rig.ctx().out.f32()[2], 13.0f);
  Add bad;
  EXPECT_NE(setup_error(bad, f32_inputs({{3}, {4}})).find("one shape"), std::string::npos);
}

TEST(Flatten, ShapesGradientsAndValues) {
  for (Shape s : {Shape{1, 5}, Shape{3, 2, 5}, Shape{2, 3, 4, 5}}) {
    SCOPED_TRACE(s.str());
    Flatten fl;
    check(fl, f32_inputs({s}));
  }
  Flatten fl;
  LayerRig rig(fl, f32_inputs({{2, 3, 4, 5}}));
  EXPECT_EQ(rig.setup().output.shape, Shape({2, 60}));
  rig.forward();
  for (int64_t i = 0; i < 120; ++i) ASSERT_EQ(rig.ctx().out.f32()[i], rig.ctx().in[0].f32()[i]);
}

TEST(Dropout, GradientsTrainingAndEval) {
  for (Shape s : {Shape{1}, Shape{3, 5}, Shape{17, 33}}) {
    for (float p : {0.0f, 0.3f, 0.9f}) {
      SCOPED_TRACE(s.str() + " p=" + std::to_string(p));
      Dropout d(p);
      check(d, f32_inputs({s}));
      OpCheck ev = f32_inputs({s});
      ev.training = false;
      check(d, ev);
    }
  }
}

TEST(Dropout, EvalIsIdentity) {
  Dropout d(0.5f);
  OpCheck o = f32_inputs({{1000}});
  o.training = false;
  LayerRig rig(d, o);
  rig.forward();
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(rig.ctx().out.f32()[i], rig.ctx().in[0].f32()[i]);
}

TEST(Dropout, TrainingKeepsAboutOneMinusPAndScales) {
  const int64_t n = 200001;  // odd: the last element has no pair partner
  for (float p : {0.1f, 0.5f, 0.8f}) {
    SCOPED_TRACE("p=" + std::to_string(p));
    Dropout d(p);
    OpCheck o = f32_inputs({{n}});
    LayerRig rig(d, o);
    auto& c = rig.ctx();
    for (int64_t i = 0; i < n; ++i) c.in[0].f32()[i] = 1.0f + float(i % 13);  // never zero
    rig.forward();
    std::vector<float> out1(c.out.f32(), c.out.f32() + n);
    int64_t kept = 0;
    const float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; ++i) {
      float y = c.out.f32()[i];
      if (y != 0.0f) {
        ++kept;
        ASSERT_FLOAT_EQ(y, c.in[0].f32()[i] * scale) << i;
      }
    }
    double frac = double(kept) / double(n);
    double sd = std::sqrt(p * (1 - p) / double(n));
    EXPECT_NEAR(frac, 1.0 - p, 5 * sd);
    // Backward uses the same mask: din = dout * scale where kept, 0 where dropped.
    rig.backward();
    for (int64_t i = 0; i < n; ++i) {
      float want = out1[size_t(i)] != 0.0f ? c.dout.f32()[i] * scale : 0.0f;
      ASSERT_FLOAT_EQ(c.din[0].f32()[i], want) << i;
    }
    // Another seed (another step / micro-batch) draws another mask.
    c.seed += 1;
    rig.forward();
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += (c.out.f32()[i] != 0.0f) == (out1[size_t(i)] != 0.0f);
    EXPECT_LT(double(same) / double(n), 1.0 - 0.5 * 2 * p * (1 - p));
  }
  EXPECT_THROW(Dropout(1.5f), Error);
}

// ---- the zero-bubble split of a backward ----

// The layers of the gpt, llama and mlp families with parameters and input gradients split
// their backward exactly (the others run whole in one part: nn/graph.h backward_parts).
TEST(BackwardSplit, LinearLayerNormRMSNormSplitExactly) {
  const std::vector<Shape> shapes{Shape{3, 8}, Shape{2, 5, 16}};
  for (const Shape& s : shapes) {
    OpCheck o = f32_inputs({s});
    Linear fc(s[-1], 12);
    check_backward_split(fc, o);
    Linear nobias(s[-1], 4, false);
    check_backward_split(nobias, o);
    LayerNorm ln(s[-1]);
    check_backward_split(ln, o);
    RMSNorm rms(s[-1]);
    check_backward_split(rms, o);
  }
}

// ---- LayerNorm ----

TEST(LayerNorm, GradientsManyShapes) {
  for (Shape s : {Shape{1, 5}, Shape{3, 33}, Shape{17, 5}, Shape{2, 3, 8}, Shape{4, 1}, Shape{256, 200}}) {
    SCOPED_TRACE(s.str());
    LayerNorm ln(s[-1]);
    OpCheck o = f32_inputs({s});
    if (s[-1] == 1) o.inputs[0].check_grad = false;  // dim 1: y = bias, dx = 0 exactly
    check(ln, o);
  }
}

TEST(LayerNorm, MatchesPyTorch) {
  LayerNorm ln(4);
  LayerRig rig(ln, f32_inputs({{2, 4}}));
  auto& c = rig.ctx();
  set(c.in[0], {1, 2, 3, 4, -1, 0.5f, 0.25f, 2});
  set(c.params[0], {1, 0.5f, 2, -1});
  set(c.params[1], {0, 0.1f, -0.2f, 0.3f});
  rig.forward();
  // torch.nn.functional.layer_norm(x, (4,), w, b, 1e-5) in float64
  const std::vector<double> want = {-1.341635419968927, -0.12360590332815455, 0.6944236133126178,
                                    -1.0416354199689268, -1.3482779474926398, 0.12931039016288348,
                                    -0.5517246819546018, -1.1655195081441738};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(c.out.f32()[i], want[i], 2e-6) << i;
  EXPECT_NEAR(c.saved[0].f32()[0], 2.5, 1e-6);                         // mean
  EXPECT_NEAR(c.saved[1].f32()[0], 1.0 / std::sqrt(1.25 + 1e-5), 1e-6);  // rstd
  // Inits: weight ones, bias zeros.
  EXPECT_EQ(rig.setup().params[0].init.kind, ParamInit::Kind::ones);
  EXPECT_EQ(rig.setup().params[1].init.kind, ParamInit::Kind::zeros);
}

TEST(LayerNorm, LargeMeanSmallSpreadIsStable) {
  LayerNorm ln(3);
  LayerRig rig(ln, f32_inputs({{1, 3}}));
  auto& c = rig.ctx();
  set(c.in[0], {1000.0f, 1000.5f, 1001.0f});
  set(c.params[0], {1, 1, 1});
  set(c.params[1], {0, 0, 0});
  rig.forward();
  const double v = std::sqrt(1.0 / 6.0 + 1e-5);  // biased var of (-0.5, 0, 0.5) = 1/6
  EXPECT_NEAR(c.out.f32()[0], -0.5 / v, 1e-4);
  EXPECT_NEAR(c.out.f32()[1], 0.0, 1e-4);
  EXPECT_NEAR(c.out.f32()[2], 0.5 / v, 1e-4);
}

// ---- Embedding ----

TEST(Embedding, GradientsManyShapes) {
  struct Case { Shape idx; int64_t num, dim; };
  for (Case cs : std::vector<Case>{{{1}, 3, 5}, {{3}, 7, 33}, {{17}, 5, 3}, {{2, 9}, 4, 17}, {{64}, 3, 40}, {{8, 64}, 7, 64}}) {
    SCOPED_TRACE(cs.idx.str() + " num " + std::to_string(cs.num) + " dim " + std::to_string(cs.dim));
    Embedding emb(cs.num, cs.dim);
    OpCheck o;
    o.inputs.push_back({cs.idx, DType::i32, 0, cs.num});  // few classes: repeated indices
    check(emb, o);
  }
}

TEST(Embedding, ValuesScatterAddAndRangeError) {
  Embedding emb(3, 2);
  OpCheck o;
  o.inputs.push_back({{4}, DType::i32, 0, 3});
  LayerRig rig(emb, o);
  auto& c = rig.ctx();
  EXPECT_EQ(rig.setup().output.shape, Shape({4, 2}));
  EXPECT_EQ(rig.setup().params[0].name, "t.weight");
  EXPECT_EQ(rig.setup().params[0].init.kind, ParamInit::Kind::normal);
  EXPECT_EQ(rig.setup().params[0].init.scale, 1.0f);
  set_i32(c.in[0], {2, 0, 2, 1});
  set(c.params[0], {1, 2, 3, 4, 5, 6});
  rig.forward();
  const std::vector<float> want = {5, 6, 1, 2, 5, 6, 3, 4};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(c.out.f32()[i], want[i]) << i;
  set(c.dout, {1, 1, 2, 2, 10, 10, 3, 3});
  rig.backward();
  const std::vector<float> dw = {2, 2, 3, 3, 11, 11};  // row 2 gets 1 + 10
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_EQ(c.grads[0].f32()[i], dw[i]) << i;

  c.in[0].i32()[1] = 3;
  try {
    rig.forward();
    ADD_FAILURE() << "index 3 with a vocabulary of 3 did not throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("index 3"), std::string::npos) << m;
    EXPECT_NE(m.find("size 3"), std::string::npos) << m;
  }
  c.in[0].i32()[1] = -1;
  EXPECT_THROW(rig.forward(), Error);
}

TEST(GPTEmbedding, GradientsManyShapes) {
  struct Case { int64_t B, T, vocab, max_t, dim; };
  for (Case cs : std::vector<Case>{{1, 1, 5, 4, 3}, {2, 3, 7, 3, 5}, {3, 5, 11, 8, 33}, {2, 17, 4, 20, 8}, {8, 64, 50, 70, 40}}) {
    SCOPED_TRACE("B " + std::to_string(cs.B) + " T " + std::to_string(cs.T) + " dim " + std::to_string(cs.dim));
    GPTEmbedding emb(cs.vocab, cs.max_t, cs.dim);
    OpCheck o;
    o.inputs.push_back({{cs.B, cs.T}, DType::i32, 0, cs.vocab});
    check(emb, o);
  }
}

TEST(GPTEmbedding, NamesValuesAndErrors) {
  GPTEmbedding emb(4, 3, 2, 0.02f);
  OpCheck o;
  o.inputs.push_back({{2, 2}, DType::i32, 0, 4});
  LayerRig rig(emb, o);
  auto& s = rig.setup();
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_EQ(s.params[0].name, "t.wte.weight");
  EXPECT_EQ(s.params[0].spec.shape, Shape({4, 2}));
  EXPECT_EQ(s.params[1].name, "t.wpe.weight");
  EXPECT_EQ(s.params[1].spec.shape, Shape({3, 2}));
  EXPECT_EQ(s.params[0].init.kind, ParamInit::Kind::normal);
  EXPECT_FLOAT_EQ(s.params[0].init.scale, 0.02f);
  EXPECT_EQ(s.output.shape, Shape({2, 2, 2}));
  auto& c = rig.ctx();
  set_i32(c.in[0], {3, 1, 1, 1});
  set(c.params[0], {0, 0, 1, 2, 3, 4, 5, 6});  // wte [4, 2]
  set(c.params[1], {10, 20, 30, 40, 50, 60});  // wpe [3, 2]
  rig.forward();
  const std::vector<float> want = {15, 26, 31, 42, 11, 22, 31, 42};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(c.out.f32()[i], want[i]) << i;
  set(c.dout, {1, 2, 3, 4, 5, 6, 7, 8});
  rig.backward();
  const std::vector<float> dwte = {0, 0, 15, 18, 0, 0, 1, 2};  // token 1 at 3 places: (3+5+7, 4+6+8)
  for (size_t i = 0; i < dwte.size(); ++i) EXPECT_EQ(c.grads[0].f32()[i], dwte[i]) << i;
  const std::vector<float> dwpe = {6, 8, 10, 12, 0, 0};  // t = 2 unused
  for (size_t i = 0; i < dwpe.size(); ++i) EXPECT_EQ(c.grads[1].f32()[i], dwpe[i]) << i;

  c.in[0].i32()[2] = 4;
  EXPECT_THROW(rig.forward(), Error);

  GPTEmbedding small(4, 3, 2);
  OpCheck too_long;
  too_long.inputs.push_back({{1, 4}, DType::i32, 0, 4});
  EXPECT_NE(setup_error(small, too_long).find("exceeds"), std::string::npos);
}

// ---- CrossEntropy ----

namespace {
OpCheck ce_inputs(Shape logits, int64_t low_label = -1) {
  OpCheck o;
  o.inputs.push_back({logits, DType::f32, 0, 1, true, 2.0f});
  Shape lead = logits;
  lead.nd -= 1;
  o.inputs.push_back({lead, DType::i32, low_label, logits[-1]});
  return o;
}
}  // namespace

TEST(CrossEntropy, GradientsManyShapesWithIgnoredLabels) {
  for (Shape s : {Shape{1, 5}, Shape{3, 5}, Shape{17, 33}, Shape{2, 3, 7}, Shape{3, 300}}) {
    SCOPED_TRACE(s.str());
    CrossEntropy ce;
    OpCheck o = ce_inputs(s, s[0] == 1 ? 0 : -1);  // labels in [-1, C): some ignored
    o.max_elements = 128;
    // Wide rows: each logit's gradient is ~1/(C rows), so the float32 loss's rounding dominates a
    // small step; a larger step is still far inside the loss's smooth region.
    if (s[-1] >= 300) o.eps = 0.1;
    check(ce, o);
  }
}

TEST(CrossEntropy, MatchesPyTorch) {
  {
    CrossEntropy ce;
    LayerRig rig(ce, ce_inputs({1, 3}));
    set(rig.ctx().in[0], {1, 2, 3});
    set_i32(rig.ctx().in[1], {2});
    rig.forward();
    EXPECT_NEAR(rig.ctx().out.f32()[0], 0.4076059644, 1e-6);
    EXPECT_EQ(rig.setup().output.shape, Shape({1}));
  }
  {
    // F.cross_entropy(l, [0, -100, 1]) with the middle row ignored = 1.5520582281132298
    CrossEntropy ce;
    LayerRig rig(ce, ce_inputs({3, 3}));
    auto& c = rig.ctx();
    set(c.in[0], {1, 2, 3, 0.5f, -1, 2, 3, 3, -2});
    set_i32(c.in[1], {0, -1, 1});
    rig.forward();
    EXPECT_NEAR(c.out.f32()[0], 1.5520582281132298, 1e-6);
    // Backward: (softmax - onehot) / 2 on valid rows, 0 on the ignored one; dout scales it.
    c.dout.f32()[0] = 2.0f;
    rig.backward();
    double z0 = std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
    EXPECT_NEAR(c.din[0].f32()[0], std::exp(1.0) / z0 - 1.0, 1e-6);
    EXPECT_NEAR(c.din[0].f32()[2], std::exp(3.0) / z0, 1e-6);
    for (int j = 3; j < 6; ++j) EXPECT_EQ(c.din[0].f32()[j], 0.0f);
    double z2 = 2 * std::exp(3.0) + std::exp(-2.0);
    EXPECT_NEAR(c.din[0].f32()[7], std::exp(3.0) / z2 - 1.0, 1e-6);
    EXPECT_FALSE(c.din[1].defined());
  }
}

TEST(CrossEntropy, LargeVocabularyIsStableAndAccurate) {
  const int64_t rows = 4, V = 50257;
  CrossEntropy ce;
  LayerRig rig(ce, ce_inputs({rows, V}, 0));
  auto& c = rig.ctx();
  for (int64_t k = 0; k < rows * V; ++k) c.in[0].f32()[k] = 30.0f * std::sin(0.37f * float(k)) + 500.0f;  // big offset
  set_i32(c.in[1], {0, 17, 50256, 4242});
  rig.forward();
  double want = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = c.in[0].f32() + r * V;
    double m = -1e300, s = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(x[j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(x[j]) - m);
    want += m + std::log(s) - x[c.in[1].i32()[r]];
  }
  want /= rows;
  EXPECT_NEAR(c.out.f32()[0], want, 1e-5 * std::fabs(want));
  c.dout.f32()[0] = 1.0f;
  rig.backward();
  double worst = 0;
  // (rows * V is above the parallel threshold: this also covers the threaded path.)
  for (int64_t r = 0; r < rows; ++r) {  // din = (softmax - onehot) / rows, against double
    const float* x = c.in[0].f32() + r * V;
    double m = -1e300, s = 0, sum_grad = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(x[j]));
    for (int64_t j = 0; j < V; ++j) s += std::exp(double(x[j]) - m);
    for (int64_t j = 0; j < V; ++j) {
      double want_g = (std::exp(double(x[j]) - m) / s - (j == c.in[1].i32()[r] ? 1.0 : 0.0)) / double(rows);
      worst = std::max(worst, std::fabs(c.din[0].f32()[r * V + j] - want_g));
      sum_grad += c.din[0].f32()[r * V + j];
    }
    EXPECT_NEAR(sum_grad, 0.0, 1e-5);  // softmax sums to 1
  }
  EXPECT_LT(worst, 1e-6);
}

TEST(CrossEntropy, NonFiniteLogits) {
  CrossEntropy ce;
  LayerRig rig(ce, ce_inputs({2, 4}, 0));
  auto& c = rig.ctx();
  const float inf = std::numeric_limits<float>::infinity();
  // Row 0: a masked class (-inf) counts as absent; row 1 alone below.
  set(c.in[0], {1, 2, -inf, 3, 0.5f, 0.5f, 0.5f, 0.5f});
  set_i32(c.in[1], {3, 0});
  rig.forward();
  double row0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0, row1 = std::log(4.0);
  EXPECT_NEAR(c.out.f32()[0], (row0 + row1) / 2, 1e-6);
  c.dout.f32()[0] = 1.0f;
  rig.backward();
  EXPECT_EQ(c.din[0].f32()[2], 0.0f);
  EXPECT_NEAR(c.din[0].f32()[4], (0.25 - 1.0) / 2, 1e-6);
  // A NaN logit makes the loss NaN (a diverged model must not look healthy).
  c.in[0].f32()[5] = std::nanf("");
  rig.forward();
  EXPECT_TRUE(std::isnan(c.out.f32()[0]));
}

TEST(CrossEntropy, AllIgnoredAndBadLabels) {
  CrossEntropy ce;
  LayerRig rig(ce, ce_inputs({3, 4}));
  auto& c = rig.ctx();
  set_i32(c.in[1], {-1, -100, -1});
  rig.forward();
  EXPECT_EQ(c.out.f32()[0], 0.0f);
  rig.backward();
  for (int64_t k = 0; k < 12; ++k) EXPECT_EQ(c.din[0].f32()[k], 0.0f);
  set_i32(c.in[1], {0, 4, 1});
  try {
    rig.forward();
    ADD_FAILURE() << "label 4 with 4 classes did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("label 4"), std::string::npos) << e.what();
  }
  CrossEntropy bad;
  OpCheck o = ce_inputs({3, 4});
  o.inputs[1].shape = Shape({4});
  EXPECT_NE(setup_error(bad, o).find("must match"), std::string::npos);
}
