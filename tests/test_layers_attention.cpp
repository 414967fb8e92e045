// CausalSelfAttention: finite-difference gradients (shared harness), values against a
// naive double-precision reference, causality, and shape errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "nn/layers/attention.h"
#include "op_harness.h"

using namespace sat;

namespace {

// Naive GPT-2 attention in double: qkv [B, T, 3C] -> y [B, T, C].
std::vector<double> reference(const std::vector<float>& qkv, int64_t B, int64_t T, int64_t C, int64_t nh) {
  const int64_t hs = C / nh;
  std::vector<double> y(size_t(B * T * C), 0.0);
  std::vector<double> w(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < nh; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const float* q = &qkv[size_t((b * T + t) * 3 * C + h * hs)];
        double mx = -1e300;
        for (int64_t s = 0; s <= t; ++s) {
          const float* k = &qkv[size_t((b * T + s) * 3 * C + C + h * hs)];
          double dot = 0;
          for (int64_t j = 0; j < hs; ++j) dot += double(q[j]) * double(k[j]);
          w[size_t(s)] = dot / std::sqrt(double(hs));
          mx = std::max(mx, w[size_t(s)]);
        }
        double sum = 0;
        for (int64_t s = 0; s <= t; ++s) sum += (w[size_t(s)] = std::exp(w[size_t(s)] - mx));
        for (int64_t s = 0; s <= t; ++s) {
          const float* v = &qkv[size_t((b * T + s) * 3 * C + 2 * C + h * hs)];
          for (int64_t j = 0; j < hs; ++j) y[size_t((b * T + t) * C + h * hs + j)] += w[size_t(s)] / sum * v[j];
        }
      }
  return y;
}

// Naive backward in double: d(qkv) [B, T, 3C] from dy [B, T, C].
std::vector<double> reference_backward(const std::vector<float>& qkv, const std::vector<float>& dy, int64_t B,
                                       int64_t T, int64_t C, int64_t nh) {
  const int64_t hs = C / nh;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<double> dx(size_t(B * T * 3 * C), 0.0);
  std::vector<double> P(static_cast<size_t>(T * T)), dS(static_cast<size_t>(T * T));
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t j) {
    return size_t((b * T + t) * 3 * C + part * C + h * hs + j);
  };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t t = 0; t < T; ++t) {  // P
        double mx = -1e300, sum = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double dot = 0;
          for (int64_t j = 0; j < hs; ++j) dot += double(qkv[at(b, t, 0, h, j)]) * qkv[at(b, s, 1, h, j)];
          P[size_t(t * T + s)] = dot * scale;
          mx = std::max(mx, dot * scale);
        }
        for (int64_t s = 0; s <= t; ++s) sum += (P[size_t(t * T + s)] = std::exp(P[size_t(t * T + s)] - mx));
        for (int64_t s = 0; s <= t; ++s) P[size_t(t * T + s)] /= sum;
      }
      for (int64_t t = 0; t < T; ++t) {  // dS = P * (dP - rowsum(P dP)) * scale
        const float* g = &dy[size_t((b * T + t) * C + h * hs)];
        double rs = 0;
        for (int64_t s = 0; s <= t; ++s) {
          double dp = 0;
          for (int64_t j = 0; j < hs; ++j) dp += double(g[j]) * qkv[at(b, s, 2, h, j)];
          dS[size_t(t * T + s)] = dp;
          rs += dp * P[size_t(t * T + s)];
        }
        for (int64_t s = 0; s <= t; ++s) {
          const double ds = P[size_t(t * T + s)] * (dS[size_t(t * T + s)] - rs) * scale;
          for (int64_t j = 0; j < hs; ++j) {
            dx[at(b, t, 0, h, j)] += ds * qkv[at(b, s, 1, h, j)];                   // dq
            dx[at(b, s, 1, h, j)] += ds * qkv[at(b, t, 0, h, j)];                   // dk
            dx[at(b, s, 2, h, j)] += P[size_t(t * T + s)] * double(g[j]);           // dv
          }
        }
      }
    }
  return dx;
}

// Runs forward on the given qkv through the harness rig (guarded buffers).
std::vector<float> run_forward(const std::vector<float>& qkv, int64_t B, int64_t T, int64_t C, int64_t nh,
                               bool training) {
  CausalSelfAttention layer(nh);
  test::OpCheck opt;
  opt.inputs = {{Shape{B, T, 3 * C}}};
  opt.training = training;
  test::LayerRig rig(layer, opt);
  auto& c = rig.ctx();
  std::copy(qkv.begin(), qkv.end(), c.in[0].f32());
  rig.forward();
  EXPECT_TRUE(rig.guards_intact());
  return std::vector<float>(c.out.f32(), c.out.f32() + c.out.numel());
}

std::vector<float> random_qkv(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& e : x) e = scale * rng.normal();
  return x;
}

}  // namespace

TEST(CausalSelfAttention, GradientsFiniteDifference) {
  struct Case { int64_t B, T, C, nh; };
  for (Case k : {Case{1, 1, 4, 1}, Case{2, 5, 8, 2}, Case{2, 17, 12, 3}, Case{1, 64, 32, 4}, Case{1, 70, 12, 2}}) {
    SCOPED_TRACE(testing::Message() << "B=" << k.B << " T=" << k.T << " C=" << k.C << " nh=" << k.nh);
    CausalSelfAttention layer(k.nh);
    test::OpCheck opt;
    opt.inputs = {{Shape{k.B, k.T, 3 * k.C}}};
    double worst = test::check_layer(layer, opt);
    EXPECT_LT(worst, 1e-2);
  }
}

// Selective recomputation: P is not saved; backward recomputes it per head.
TEST(CausalSelfAttention, SelectiveRecomputeGradientsFiniteDifference) {
  struct Case { int64_t B, T, C, nh; };
  for (Case k : {Case{1, 1, 4, 1}, Case{2, 5, 8, 2}, Case{2, 17, 12, 3}, Case{1, 70, 12, 2}}) {
    SCOPED_TRACE(testing::Message() << "B=" << k.B << " T=" << k.T << " C=" << k.C << " nh=" << k.nh);
    CausalSelfAttention layer(k.nh, true);
    test::OpCheck opt;
    opt.inputs = {{Shape{k.B, k.T, 3 * k.C}}};
    double worst = test::check_layer(layer, opt);
    EXPECT_LT(worst, 1e-2);
  }
}

// ... and computes bitwise the same gradient as the layer that keeps P (the same code
// computes P in both), with no saved buffer and one more [slots, T, T] backward scratch.
TEST(CausalSelfAttention, SelectiveRecomputeIsBitwiseTheSame) {
  const int64_t B = 2, T = 70, C = 48, nh = 3;
  std::vector<float> din[2];
  for (bool recompute : {false, true}) {
    CausalSelfAttention layer(nh, recompute);
    test::OpCheck opt;
    opt.inputs = {{Shape{B, T, 3 * C}}};
    test::LayerRig rig(layer, opt);
    auto& c = rig.ctx();
    auto qkv = random_qkv(B * T * 3 * C, 9, 1.0f);
    std::copy(qkv.begin(), qkv.end(), c.in[0].f32());
    for (int64_t i = 0; i < c.dout.numel(); ++i) c.dout.f32()[i] = float(i % 7) * 0.25f - 0.75f;
    rig.forward();
    rig.backward();
    EXPECT_TRUE(rig.guards_intact());
    din[recompute].assign(c.din[0].f32(), c.din[0].f32() + c.din[0].numel());
    LayerSetup s;
    s.name = "attn";
    s.inputs = {{Shape{B, T, 3 * C}}};
    layer.setup(s);
    EXPECT_EQ(s.saved.size(), recompute ? 0u : 1u);
    EXPECT_EQ(s.scratch_fwd.size(), recompute ? 1u : 0u);
    EXPECT_EQ(s.scratch_bwd.size(), recompute ? 2u : 1u);
  }
  ASSERT_EQ(din[0].size(), din[1].size());
  EXPECT_EQ(std::memcmp(din[0].data(), din[1].data(), din[0].size() * sizeof(float)), 0);
}

TEST(CausalSelfAttention, EvalModeChecks) {
  CausalSelfAttention layer(3);
  test::OpCheck opt;
  opt.inputs = {{Shape{2, 40, 3 * 12}}};
  opt.training = false;
  test::check_layer(layer, opt);
}

TEST(CausalSelfAttention, SetupShapesAndFlops) {
  CausalSelfAttention layer(4);
  LayerSetup s;
  s.name = "h.0.attn";
  s.inputs = {{Shape{8, 128, 3 * 256}}};
  layer.setup(s);
  EXPECT_EQ(s.output.shape, (Shape{8, 128, 256}));
  EXPECT_TRUE(s.params.empty());
  ASSERT_EQ(s.saved.size(), 1u);
  EXPECT_EQ(s.saved[0].shape, (Shape{8, 4, 128, 128}));
  EXPECT_DOUBLE_EQ(s.flops_fwd, 4.0 * 8 * 4 * 64 * (128.0 * 129 / 2));
  EXPECT_DOUBLE_EQ(s.flops_bwd, 2 * s.flops_fwd);
}

TEST(CausalSelfAttention, MatchesNaiveReference) {
  struct Case { int64_t B, T, C, nh; };
  for (Case k : {Case{2, 5, 8, 2}, Case{2, 70, 48, 3}, Case{1, 33, 16, 1}, Case{3, 128, 64, 4}}) {
    SCOPED_TRACE(testing::Message() << "B=" << k.B << " T=" << k.T << " C=" << k.C << " nh=" << k.nh);
    auto qkv = random_qkv(k.B * k.T * 3 * k.C, 42 + uint64_t(k.T), 1.0f);
    auto want = reference(qkv, k.B, k.T, k.C, k.nh);
    for (bool training : {true, false}) {
      auto got = run_forward(qkv, k.B, k.T, k.C, k.nh, training);
      double err = 0;
      for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(double(got[i]) - want[i]));
      EXPECT_LT(err, 1e-5) << "training=" << training;
    }
  }
}

TEST(CausalSelfAttention, BackwardMatchesNaiveReference) {
  // Every element of d(qkv), across several row blocks (T = 70, 128 are not one block).
  struct Case { int64_t B, T, C, nh; };
  for (Case k : {Case{2, 5, 8, 2}, Case{2, 70, 48, 3}, Case{2, 128, 64, 4}}) {
    SCOPED_TRACE(testing::Message() << "B=" << k.B << " T=" << k.T << " C=" << k.C << " nh=" << k.nh);
    CausalSelfAttention layer(k.nh);
    test::OpCheck opt;
    opt.inputs = {{Shape{k.B, k.T, 3 * k.C}}};
    test::LayerRig rig(layer, opt);
    auto& c = rig.ctx();
    rig.forward();
    test::fill_nan(c.din[0]);
    rig.backward();
    std::vector<float> qkv(c.in[0].f32(), c.in[0].f32() + c.in[0].numel());
    std::vector<float> dy(c.dout.f32(), c.dout.f32() + c.dout.numel());
    auto want = reference_backward(qkv, dy, k.B, k.T, k.C, k.nh);
    double err = 0, mag = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::fabs(double(c.din[0].f32()[i]) - want[i]));  // NaN fails below
      if (!std::isfinite(c.din[0].f32()[i])) err = INFINITY;
      mag = std::max(mag, std::fabs(want[i]));
    }
    EXPECT_LT(err, 1e-5 * std::max(1.0, mag)) << "max |d(qkv)| = " << mag;
    EXPECT_TRUE(rig.guards_intact());
  }
}

TEST(CausalSelfAttention, LargeScoresStayFinite) {
  // Scores of order 100 (softmax saturates): still matches the reference.
  const int64_t B = 1, T = 40, C = 16, nh = 2;
  auto qkv = random_qkv(B * T * 3 * C, 7, 4.0f);
  auto want = reference(qkv, B, T, C, nh);
  auto got = run_forward(qkv, B, T, C, nh, true);
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::fabs(double(got[i]) - want[i]));
  EXPECT_LT(err, 1e-4);
}

TEST(CausalSelfAttention, Causal) {
  const int64_t B = 2, T = 50, C = 12, nh = 3;
  auto qkv = random_qkv(B * T * 3 * C, 5, 1.0f);
  auto y0 = run_forward(qkv, B, T, C, nh, true);
  const int64_t t_change = 31;
  auto qkv2 = qkv;
  Rng rng(11);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < 3 * C; ++j) qkv2[size_t((b * T + t_change) * 3 * C + j)] += 3.0f * rng.normal();
  auto y1 = run_forward(qkv2, B, T, C, nh, true);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      bool differs = false;
      for (int64_t j = 0; j < C; ++j) {
        size_t i = size_t((b * T + t) * C + j);
        if (y0[i] != y1[i]) differs = true;
      }
      if (t < t_change) EXPECT_FALSE(differs) << "output at t=" << t << " depends on token " << t_change;
      else EXPECT_TRUE(differs) << "output at t=" << t << " does not depend on token " << t_change;
    }
}

TEST(CausalSelfAttention, BadShapesThrow) {
  {
    CausalSelfAttention layer(3);
    LayerSetup s;
    s.name = "attn";
    s.inputs = {{Shape{2, 4, 3 * 10}}};  // C = 10 not divisible by 3 heads
    EXPECT_THROW(layer.setup(s), Error);
  }
  {
    CausalSelfAttention layer(2);
    LayerSetup s;
    s.name = "attn";
    s.inputs = {{Shape{2, 4, 10}}};  // last dim not 3C
    EXPECT_THROW(layer.setup(s), Error);
  }
  {
    CausalSelfAttention layer(2);
    LayerSetup s;
    s.name = "attn";
    s.inputs = {{Shape{8, 12}}};  // not [B, T, 3C]
    EXPECT_THROW(layer.setup(s), Error);
  }
  EXPECT_THROW(CausalSelfAttention(0), Error);
}
