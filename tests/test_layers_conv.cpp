// Conv2d, BatchNorm2d, MaxPool2d, AdaptiveAvgPool2d: finite-difference checks through the
// shared harness, plus forward/backward values against naive references.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstdio>
#include <cstdlib>
#include <barrier>
#include <memory>
#include <thread>
#include <cmath>
#include <limits>
#include <vector>

#include "nn/layers/batchnorm.h"
#include "nn/layers/conv2d.h"
#include "nn/layers/pool.h"
#include "conv_reference.h"
#include "op_harness.h"

using sat::DType;
using sat::Shape;
using sat::Tensor;
using sat::test::check_layer;
using sat::test::InputSpec;
using sat::test::LayerRig;
using sat::test::OpCheck;
using sat::test::max_abs_diff;

namespace {

struct ConvCase {
  int64_t B, C, H, W, O, k, s, p;
  bool bias;
};

std::string name(const ConvCase& c) {
  return sat::str_cat("B", c.B, " C", c.C, " ", c.H, "x", c.W, " O", c.O, " k", c.k, " s", c.s, " p", c.p,
                      c.bias ? " bias" : " nobias");
}

// Covers: kernels 1/3/5/7, strides 1/2/3, paddings 0..3, odd sizes, one input channel,
// the 1x1 path without im2col (HW >= 1024, one image per GEMM), grouped GEMMs with a
// partial last group (B=5, G=3), one image per GEMM with im2col (32x32) and kernel taps
// that only ever see padding (1x1 and 2x2 maps with a 3x3 kernel, a 1-row input).
const std::vector<ConvCase> kConvCases = {
    {2, 3, 7, 5, 4, 3, 1, 1, true},   {2, 3, 7, 5, 4, 3, 2, 1, false}, {2, 3, 7, 5, 4, 1, 1, 0, true},
    {2, 3, 7, 5, 4, 1, 2, 0, false},  {2, 1, 7, 5, 3, 3, 1, 0, true},  {2, 3, 6, 6, 5, 3, 2, 0, true},
    {3, 4, 9, 8, 6, 3, 1, 1, false},  {2, 3, 11, 11, 4, 7, 2, 3, false}, {2, 2, 9, 7, 3, 5, 3, 2, true},
    {2, 3, 32, 33, 4, 1, 1, 0, true}, {5, 2, 20, 20, 3, 3, 1, 1, true}, {2, 2, 32, 32, 3, 3, 1, 1, false},
    {3, 4, 1, 1, 5, 3, 1, 1, true},   {2, 3, 2, 2, 4, 3, 2, 1, false}, {2, 3, 1, 6, 4, 3, 1, 1, true},
    {2, 2, 6, 5, 3, 5, 1, 2, true},   {2, 3, 2, 3, 4, 5, 1, 2, false},
};

// Larger cases, checked against the naive reference only (one forward/backward each):
// big enough that the OpenMP loops (im2col/col2im, bias, gathers, weight gather/scatter
// of pruned taps) actually run in parallel.
const std::vector<ConvCase> kLargeConvCases = {
    {4, 16, 32, 32, 8, 3, 1, 1, true},
    {8, 16, 16, 16, 160, 3, 1, 1, true},
    {4, 128, 1, 1, 256, 3, 1, 1, true},
    {4, 16, 33, 31, 4, 3, 2, 1, false},
};

}  // namespace

TEST(Conv2d, FiniteDifferences) {
  bool saw_direct = false, saw_partial_group = false, saw_single = false, saw_pruned = false;
  for (const auto& cc : kConvCases) {
    SCOPED_TRACE(name(cc));
    sat::Conv2d conv(cc.C, cc.O, cc.k, cc.s, cc.p, cc.bias);
    OpCheck opt;
    opt.inputs = {InputSpec{Shape{cc.B, cc.C, cc.H, cc.W}}};
    check_layer(conv, opt);
    int64_t G = conv.images_per_gemm();
    saw_direct |= (cc.k == 1 && cc.s == 1 && cc.p == 0 && G == 1);
    saw_partial_group |= (G > 1 && cc.B % G != 0);
    saw_single |= (G == 1 && cc.k > 1);
    saw_pruned |= conv.live_taps() < cc.k * cc.k;
  }
  EXPECT_TRUE(saw_direct && saw_partial_group && saw_single && saw_pruned)
      << "the cases no longer cover every code path";
}

TEST(Conv2d, ForwardAndBackwardMatchNaiveReference) {
  std::vector<ConvCase> cases = kConvCases;
  cases.insert(cases.end(), kLargeConvCases.begin(), kLargeConvCases.end());
  for (const auto& cc : cases) {
    SCOPED_TRACE(name(cc));
    sat::Conv2d conv(cc.C, cc.O, cc.k, cc.s, cc.p, cc.bias);
    // When SAT_CONV forces Winograd F(4x4, 3x3) on a shape it takes, its wider rounding
    // (Conv2d.WinogradMatchesReference below) gets a wider bound: a setup tells.
    sat::LayerSetup probe;
    probe.name = "probe";
    probe.inputs = {{Shape{cc.B, cc.C, cc.H, cc.W}}};
    conv.setup(probe);
    sat::test::expect_conv_matches_reference(conv, {cc.B, cc.C, cc.H, cc.W, cc.O, cc.k, cc.s, cc.p, 1}, cc.bias, 7,
                                             conv.winograd_tile() == 4 ? 10.0 : 1.0);
  }
}

namespace {

// Sets SAT_CONV for the scope (Conv2d reads it at setup).
struct ForceConv {
  explicit ForceConv(const char* path) { setenv("SAT_CONV", path, 1); }
  ~ForceConv() { unsetenv("SAT_CONV"); }
};

// ||a - b|| / ||b||.
double rel_err(const float* a, const std::vector<double>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    n += b[i] * b[i];
  }
  return std::sqrt(d / std::max(n, 1e-300));
}

// The relative norm errors of out, dx and dW against the float64 reference.
std::array<double, 3> winograd_errors(sat::Conv2d& conv, const sat::test::ConvShape& c, bool bias) {
  OpCheck opt;
  opt.inputs = {InputSpec{Shape{c.B, c.C, c.H, c.W}}};
  opt.seed = 11;
  LayerRig rig(conv, opt);
  auto& ctx = rig.ctx();
  rig.forward();
  rig.backward();
  const float* x = ctx.in[0].f32();
  const float* w = ctx.params[0].f32();
  const float* dy = ctx.dout.f32();
  const int64_t per_map = c.Ho() * c.Wo();
  std::vector<double> y(size_t(ctx.out.numel())), dx(size_t(ctx.in[0].numel())), dw(size_t(ctx.params[0].numel()));
  for (size_t i = 0; i < y.size(); ++i) y[i] = bias ? ctx.params[1].f32()[(int64_t(i) / per_map) % c.O] : 0.0;
  sat::test::for_each_conv_tap(c, [&](size_t xi, size_t wi, size_t yi) {
    y[yi] += double(w[wi]) * double(x[xi]);
    dx[xi] += double(w[wi]) * dy[yi];
    dw[wi] += double(x[xi]) * dy[yi];
  });
  return {rel_err(ctx.out.f32(), y), rel_err(ctx.din[0].f32(), dx), rel_err(ctx.grads[0].f32(), dw)};
}

}  // namespace

// Winograd F(2x2, 3x3) and F(4x4, 3x3) (conv2d_winograd.cpp), each forced: finite
// differences, and out, dx and dW against the float64 reference, on the 3x3/stride 1/pad 1
// shapes with channels in multiples of 16 that it takes. Maps with a partial last tile
// (odd sizes), one tile, a map smaller than a tile (1x1, 2x3), ResNet-18's deepest shape
// and a chunk boundary (more images than fit one chunk of tiles).
TEST(Conv2d, WinogradMatchesReference) {
  // It forces each tile size itself: the conv_<path> runs of this suite (SAT_CONV set) skip it.
  if (std::getenv("SAT_CONV")) GTEST_SKIP() << "forces its own paths; runs where SAT_CONV is unset";
  const std::vector<ConvCase> small = {
      {2, 16, 7, 5, 16, 3, 1, 1, true}, {3, 32, 4, 4, 16, 3, 1, 1, false}, {2, 16, 1, 1, 32, 3, 1, 1, true},
      {2, 16, 2, 3, 16, 3, 1, 1, false}, {2, 16, 9, 11, 48, 3, 1, 1, true},
  };
  const std::vector<ConvCase> large = {
      {4, 256, 4, 4, 256, 3, 1, 1, false}, {15, 32, 32, 32, 32, 3, 1, 1, false}, {4, 128, 15, 13, 64, 3, 1, 1, true},
  };
  // Measured relative errors (2026-11-26, printed below): F(2x2) 3e-8 to 5e-7, F(4x4) 1e-7
  // to 4e-6, growing with the channel count. The bounds leave 4-5x of room.
  for (const int64_t m : {2, 4}) {
    const ForceConv force(m == 2 ? "winograd2" : "winograd4");
    const double bound = m == 2 ? 2e-6 : 2e-5;
    for (const auto& cc : small) {
      SCOPED_TRACE(sat::str_cat("F(", m, "x", m, ", 3x3) ", name(cc)));
      sat::Conv2d conv(cc.C, cc.O, cc.k, cc.s, cc.p, cc.bias);
      OpCheck opt;
      opt.inputs = {InputSpec{Shape{cc.B, cc.C, cc.H, cc.W}}};
      check_layer(conv, opt);
      EXPECT_EQ(conv.winograd_tile(), m);
    }
    for (const auto* list : {&small, &large})
      for (const auto& cc : *list) {
        SCOPED_TRACE(sat::str_cat("F(", m, "x", m, ", 3x3) ", name(cc)));
        sat::Conv2d conv(cc.C, cc.O, cc.k, cc.s, cc.p, cc.bias);
        const auto e = winograd_errors(conv, {cc.B, cc.C, cc.H, cc.W, cc.O, cc.k, cc.s, cc.p, 1}, cc.bias);
        ASSERT_EQ(conv.winograd_tile(), m);
        EXPECT_LT(e[0], bound) << "out";
        EXPECT_LT(e[1], bound) << "dx";
        EXPECT_LT(e[2], bound) << "dW";
        std::printf("F(%dx%d) %-40s out %.1e dx %.1e dW %.1e\n", int(m), int(m), name(cc).c_str(), e[0], e[1], e[2]);
      }
  }
  // SAT_CONV=rule: the fixed rule that measuring replaces (conv2d.cpp, Conv2d::rule_path;
  // what measuring chooses is tested in test_kernel_choice.cpp).
  const ForceConv rule("rule");
  sat::Conv2d deep(512, 512, 3, 1, 1, false), mid(128, 128, 3, 1, 1, false), wide(64, 64, 3, 1, 1, false),
      tiny(512, 512, 3, 1, 1, false), narrow(32, 64, 3, 1, 1, false), odd(8, 64, 3, 1, 1, false);
  for (auto [c, hw] : {std::pair{&deep, 4}, {&mid, 16}, {&wide, 32}, {&tiny, 2}, {&narrow, 14}, {&odd, 16}}) {
    sat::LayerSetup s;
    s.name = "c";
    s.inputs = {{Shape{32, c->in_channels(), hw, hw}}};
    c->setup(s);
  }
  EXPECT_EQ(deep.winograd_tile(), 2);
  EXPECT_EQ(mid.winograd_tile(), 2);  // F(2x2) throughout: its weight gradient keeps data parallelism exact
  EXPECT_EQ(wide.winograd_tile(), 0);  // 32x32 maps: oneDNN, for PyTorch parity (conv2d.cpp)
  EXPECT_EQ(tiny.winograd_tile(), 0);    // 2x2 maps: im2col's live taps skip the padding
  EXPECT_EQ(narrow.winograd_tile(), 0);  // 32x64 channel pairs: measured slower (conv2d.cpp)
  EXPECT_EQ(odd.winograd_tile(), 0);     // 8 input channels: not a multiple of 16
}

TEST(Conv2d, NoInputGradientRequested) {
  // din[0].ptr == nullptr: weights still get their gradient, nothing else is written.
  ConvCase cc{3, 4, 9, 8, 6, 3, 1, 1, true};
  sat::Conv2d conv(cc.C, cc.O, cc.k, cc.s, cc.p, cc.bias);
  OpCheck opt;
  opt.inputs = {InputSpec{Shape{cc.B, cc.C, cc.H, cc.W}, DType::f32, 0, 1, /*check_grad=*/false}};
  check_layer(conv, opt);
}

TEST(Conv2d, SetupDeclaresShapesInitAndFlops) {
  sat::Conv2d conv(3, 8, 3, 2, 1, true);
  sat::LayerSetup s;
  s.name = "conv1";
  s.inputs = {{Shape{4, 3, 9, 7}}};
  conv.setup(s);
  EXPECT_EQ(s.output.shape, (Shape{4, 8, 5, 4}));
  ASSERT_EQ(s.params.size(), 2u);
  EXPECT_EQ(s.params[0].name, "conv1.weight");
  EXPECT_EQ(s.params[0].spec.shape, (Shape{8, 3, 3, 3}));
  EXPECT_EQ(s.params[1].name, "conv1.bias");
  EXPECT_EQ(s.params[1].spec.shape, (Shape{8}));
  const float bound = 1.0f / std::sqrt(27.0f);
  EXPECT_EQ(s.params[0].init.kind, sat::ParamInit::Kind::uniform);
  EXPECT_FLOAT_EQ(s.params[0].init.scale, bound);
  EXPECT_EQ(s.params[1].init.kind, sat::ParamInit::Kind::uniform);
  EXPECT_FLOAT_EQ(s.params[1].init.scale, bound);
  EXPECT_DOUBLE_EQ(s.flops_fwd, 2.0 * 4 * 8 * 5 * 4 * 27);
  EXPECT_DOUBLE_EQ(s.flops_bwd, 2.0 * s.flops_fwd);

  sat::Conv2d custom(3, 8, 3, 1, 0, false, sat::ParamInit::normal(0.05f));
  sat::LayerSetup s2;
  s2.name = "c";
  s2.inputs = {{Shape{1, 3, 5, 5}}};
  custom.setup(s2);
  ASSERT_EQ(s2.params.size(), 1u);
  EXPECT_EQ(s2.params[0].init.kind, sat::ParamInit::Kind::normal);
  EXPECT_FLOAT_EQ(s2.params[0].init.scale, 0.05f);

  // Taps that only ever read padding are skipped (the harness checks the gradients).
  auto taps = [](int64_t H, int64_t W, int64_t s, int64_t p) {
    sat::Conv2d cv(2, 2, 3, s, p);
    sat::LayerSetup ls;
    ls.name = "c";
    ls.inputs = {{Shape{1, 2, H, W}}};
    cv.setup(ls);
    return cv.live_taps();
  };
  EXPECT_EQ(taps(1, 1, 1, 1), 1);  // ResNet layer4 on 32x32 images: only the centre tap
  EXPECT_EQ(taps(2, 2, 2, 1), 4);  // stride-2 into a 1x1 map: rows/cols 1..2
  EXPECT_EQ(taps(1, 6, 1, 1), 3);  // one input row: only kernel row 1
  EXPECT_EQ(taps(2, 2, 1, 1), 9);
  EXPECT_EQ(taps(8, 8, 2, 1), 9);

  sat::LayerSetup bad;
  bad.name = "bad";
  bad.inputs = {{Shape{1, 4, 5, 5}}};
  EXPECT_THROW(conv.setup(bad), sat::Error);  // 4 channels into a 3-channel conv
}

// ------------------------------------------------------------------ BatchNorm2d

TEST(BatchNorm2d, FiniteDifferencesTraining) {
  for (Shape sh : {Shape{2, 3, 4, 5}, Shape{4, 2, 3, 3}, Shape{3, 5, 1, 1}}) {
    SCOPED_TRACE(sh.str());
    sat::BatchNorm2d bn(sh[1]);
    OpCheck opt;
    opt.inputs = {InputSpec{sh, DType::f32, 0, 1, true, 2.0f}};
    check_layer(bn, opt);
  }
}

TEST(BatchNorm2d, EvalModeUsesRunningStatsAndAffineGradient) {
  sat::BatchNorm2d bn(3, 1e-5f);
  OpCheck forward_only;
  forward_only.inputs = {InputSpec{Shape{2, 3, 4, 5}}};
  forward_only.training = false;
  check_layer(bn, forward_only);  // determinism, finiteness, bounds

  // Eval forward and backward on a rig whose ctx is switched to eval mode.
  OpCheck opt;
  opt.inputs = {InputSpec{Shape{2, 3, 4, 5}}};
  LayerRig rig(bn, opt);
  auto& c = rig.ctx();
  c.training = false;
  const float rm[3] = {0.5f, -1.0f, 2.0f}, rv[3] = {0.25f, 4.0f, 1.5f};
  for (int i = 0; i < 3; ++i) c.states[0].f32()[i] = rm[i], c.states[1].f32()[i] = rv[i];
  rig.forward();
  const float* x = c.in[0].f32();
  const float* w = c.params[0].f32();
  const float* b = c.params[1].f32();
  const float* dy = c.dout.f32();
  double err = 0;
  for (int64_t i = 0; i < c.out.numel(); ++i) {
    int64_t ch = (i / 20) % 3;
    double want = (x[i] - rm[ch]) / std::sqrt(double(rv[ch]) + 1e-5) * w[ch] + b[ch];
    err = std::max(err, std::fabs(c.out.f32()[i] - want));
  }
  EXPECT_LT(err, 1e-5);
  EXPECT_EQ(static_cast<int64_t*>(c.states[2].ptr)[0], 0);  // eval does not count batches
  EXPECT_EQ(c.states[0].f32()[1], rm[1]);                     // nor update running stats

  rig.backward();
  double dx_err = 0;
  std::vector<double> dw(3, 0), db(3, 0);
  for (int64_t i = 0; i < c.out.numel(); ++i) {
    int64_t ch = (i / 20) % 3;
    double invstd = 1.0 / std::sqrt(double(rv[ch]) + 1e-5);
    dx_err = std::max(dx_err, std::fabs(c.din[0].f32()[i] - dy[i] * w[ch] * invstd));
    dw[size_t(ch)] += dy[i] * (x[i] - rm[ch]) * invstd;
    db[size_t(ch)] += dy[i];
  }
  EXPECT_LT(dx_err, 1e-5);
  for (int ch = 0; ch < 3; ++ch) {
    EXPECT_NEAR(c.grads[0].f32()[ch], dw[size_t(ch)], 1e-4);
    EXPECT_NEAR(c.grads[1].f32()[ch], db[size_t(ch)], 1e-4);
  }
  // And numerically, in eval mode.
  sat::Rng pick(5);
  std::vector<float> gx(c.din[0].f32(), c.din[0].f32() + c.din[0].numel());
  sat::test::check_tensor_grad(rig, c.in[0], Tensor(gx.data(), c.in[0].shape), opt, "eval input", pick);
}

TEST(BatchNorm2d, RunningStatisticsFollowPyTorch) {
  const int64_t B = 2, C = 2, H = 2, W = 3, HW = H * W, n = B * HW;
  const float momentum = 0.2f, eps = 1e-3f;
  sat::BatchNorm2d bn(C, eps, momentum);
  OpCheck opt;
  opt.inputs = {InputSpec{Shape{B, C, H, W}}};
  LayerRig rig(bn, opt);
  auto& c = rig.ctx();
  ASSERT_EQ(rig.setup().states.size(), 3u);
  EXPECT_EQ(rig.setup().states[2].name, "t.num_batches_tracked");
  EXPECT_EQ(rig.setup().states[2].spec.dtype, DType::i64);
  EXPECT_EQ(rig.setup().states[2].spec.shape.nd, 0);
  for (int ch = 0; ch < C; ++ch) c.params[0].f32()[ch] = 1.0f, c.params[1].f32()[ch] = 0.0f;

  double rm[2] = {0, 0}, rv[2] = {1, 1};
  for (int step = 0; step < 2; ++step) {
    float* x = c.in[0].f32();
    for (int64_t i = 0; i < B * C * HW; ++i) x[i] = float((i * 7 + step * 3) % 11) * (step ? 0.5f : 1.5f) - 2.0f;
    rig.forward();
    for (int64_t ch = 0; ch < C; ++ch) {
      double sum = 0, sq = 0;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < HW; ++j) sum += x[(b * C + ch) * HW + j];
      double mean = sum / double(n);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < HW; ++j) sq += std::pow(x[(b * C + ch) * HW + j] - mean, 2);
      rm[ch] = (1 - momentum) * rm[ch] + momentum * mean;
      rv[ch] = (1 - momentum) * rv[ch] + momentum * sq / double(n - 1);
      // Output normalised with the biased batch variance.
      double invstd = 1.0 / std::sqrt(sq / double(n) + eps);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < HW; ++j) {
          int64_t i = (b * C + ch) * HW + j;
          EXPECT_NEAR(c.out.f32()[i], (x[i] - mean) * invstd, 1e-5);
        }
    }
  }
  for (int ch = 0; ch < C; ++ch) {
    EXPECT_NEAR(c.states[0].f32()[ch], rm[ch], 1e-6) << "running_mean[" << ch << "]";
    EXPECT_NEAR(c.states[1].f32()[ch], rv[ch], 1e-6) << "running_var[" << ch << "]";
  }
  EXPECT_EQ(static_cast<int64_t*>(c.states[2].ptr)[0], 2);
}

TEST(BatchNorm2d, TrainingForwardBackwardMatchReference) {
  // Large enough for the channel loop to run in parallel. Reference in double:
  // y = xhat*w + b, dx = w*invstd*(dy - mean(dy) - xhat*mean(dy*xhat)).
  const int64_t B = 8, C = 16, HW = 32 * 32, n = B * HW;
  sat::BatchNorm2d bn(C);
  OpCheck opt;
  opt.inputs = {InputSpec{Shape{B, C, 32, 32}, DType::f32, 0, 1, true, 3.0f}};
  LayerRig rig(bn, opt);
  auto& c = rig.ctx();
  for (int64_t i = 0; i < c.in[0].numel(); ++i) c.in[0].f32()[i] += float((i / HW) % C);  // per-channel offsets
  rig.forward();
  rig.backward();
  const float *x = c.in[0].f32(), *dy = c.dout.f32(), *w = c.params[0].f32(), *b = c.params[1].f32();
  double ey = 0, edx = 0;
  for (int64_t ch = 0; ch < C; ++ch) {
    double sum = 0, sq = 0, sdy = 0, sdyx = 0;
    auto at = [&](int64_t bi, int64_t j) { return (bi * C + ch) * HW + j; };
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t j = 0; j < HW; ++j) sum += x[at(bi, j)];
    const double mean = sum / double(n);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t j = 0; j < HW; ++j) sq += (x[at(bi, j)] - mean) * (x[at(bi, j)] - mean);
    const double invstd = 1.0 / std::sqrt(sq / double(n) + 1e-5);
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t j = 0; j < HW; ++j) {
        const double xh = (x[at(bi, j)] - mean) * invstd;
        ey = std::max(ey, std::fabs(c.out.f32()[at(bi, j)] - (xh * w[ch] + b[ch])));
        sdy += dy[at(bi, j)];
        sdyx += dy[at(bi, j)] * xh;
      }
    EXPECT_NEAR(c.grads[0].f32()[ch], sdyx, 1e-2) << ch;
    EXPECT_NEAR(c.grads[1].f32()[ch], sdy, 1e-2) << ch;
    EXPECT_NEAR(c.saved[0].f32()[ch], mean, 1e-4) << ch;
    EXPECT_NEAR(c.saved[1].f32()[ch], invstd, 1e-4) << ch;
    for (int64_t bi = 0; bi < B; ++bi)
      for (int64_t j = 0; j < HW; ++j) {
        const double xh = (x[at(bi, j)] - mean) * invstd;
        const double want = w[ch] * invstd * (dy[at(bi, j)] - sdy / double(n) - xh * sdyx / double(n));
        edx = std::max(edx, std::fabs(c.din[0].f32()[at(bi, j)] - want));
      }
  }
  EXPECT_LT(ey, 1e-4);
  EXPECT_LT(edx, 1e-4);
}

namespace {

// Replicas as threads: sum() gathers every replica's vector, waits for all of them and
// adds them in replica order (the order an MPI reduction of two ranks would use).
class ThreadReplicas {
 public:
  explicit ThreadReplicas(int n) : slots_(size_t(n)), bar_(n) {
    for (int r = 0; r < n; ++r) views_.push_back(std::make_unique<View>(this, r));
  }
  sat::ReplicaSum* view(int r) { return views_[size_t(r)].get(); }
  int calls() const { return calls_; }

 private:
  struct View : sat::ReplicaSum {
    View(ThreadReplicas* g, int r) : g(g), r(r) {}
    void sum(double* v, size_t n) override { g->sum(r, v, n); }
    ThreadReplicas* g;
    int r;
  };
  void sum(int r, double* v, size_t n) {
    slots_[size_t(r)].assign(v, v + n);
    bar_.arrive_and_wait();
    for (size_t i = 0; i < n; ++i) {
      double acc = 0;
      for (auto& s : slots_) acc += s.at(i);
      v[i] = acc;
    }
    if (r == 0) ++calls_;
    bar_.arrive_and_wait();
  }
  std::vector<std::vector<double>> slots_;
  std::barrier<> bar_;
  std::vector<std::unique_ptr<View>> views_;
  int calls_ = 0;
};

}  // namespace

TEST(BatchNorm2d, SynchronisedStatisticsMatchOneBatch) {
  // One BatchNorm over a batch of 6 against two replicas of 3 rows each whose statistics
  // are summed over both (--sync-bn): the same outputs, input gradients and running
  // statistics, and parameter gradients that add up to the whole batch's.
  const int64_t B = 6, R = 2, C = 3, H = 4, W = 5, plane = C * H * W;
  sat::BatchNorm2d full_bn(C);
  OpCheck opt;
  opt.inputs = {InputSpec{Shape{B, C, H, W}, DType::f32, 0, 1, true, 2.0f}};
  LayerRig full(full_bn, opt);
  std::vector<std::unique_ptr<sat::BatchNorm2d>> bns;
  std::vector<std::unique_ptr<LayerRig>> reps;
  OpCheck ropt = opt;
  ropt.inputs = {InputSpec{Shape{B / R, C, H, W}}};
  ThreadReplicas group(static_cast<int>(R));
  for (int64_t r = 0; r < R; ++r) {
    bns.push_back(std::make_unique<sat::BatchNorm2d>(C));
    reps.push_back(std::make_unique<LayerRig>(*bns.back(), ropt));
    auto& c = reps.back()->ctx();
    const auto& f = full.ctx();
    std::copy_n(f.in[0].f32() + r * (B / R) * plane, (B / R) * plane, c.in[0].f32());
    std::copy_n(f.dout.f32() + r * (B / R) * plane, (B / R) * plane, c.dout.f32());
    for (size_t p = 0; p < 2; ++p) std::copy_n(f.params[p].f32(), C, c.params[p].f32());
    c.replicas = group.view(int(r));
  }
  full.forward();
  full.backward();
  auto run = [&](bool fwd) {
    std::vector<std::thread> ts;
    for (auto& rig : reps) ts.emplace_back([&rig, fwd] { fwd ? void(rig->forward()) : rig->backward(); });
    for (auto& t : ts) t.join();
  };
  run(true);
  run(false);
  EXPECT_EQ(group.calls(), 3) << "forward sums mean and variance terms, backward the gradient terms";
  const auto& f = full.ctx();
  double eo = 0, edx = 0;
  for (int64_t r = 0; r < R; ++r) {
    const auto& c = reps[size_t(r)]->ctx();
    for (int64_t i = 0; i < (B / R) * plane; ++i) {
      eo = std::max(eo, double(std::fabs(c.out.f32()[i] - f.out.f32()[r * (B / R) * plane + i])));
      edx = std::max(edx, double(std::fabs(c.din[0].f32()[i] - f.din[0].f32()[r * (B / R) * plane + i])));
    }
    for (int64_t ch = 0; ch < C; ++ch) {
      EXPECT_NEAR(c.states[0].f32()[ch], f.states[0].f32()[ch], 1e-6) << "running_mean " << ch;
      EXPECT_NEAR(c.states[1].f32()[ch], f.states[1].f32()[ch], 1e-6) << "running_var " << ch;
    }
    EXPECT_TRUE(reps[size_t(r)]->guards_intact());
  }
  EXPECT_LT(eo, 1e-5);
  EXPECT_LT(edx, 1e-5);
  for (size_t p = 0; p < 2; ++p)
    for (int64_t ch = 0; ch < C; ++ch) {
      double s = 0;
      for (auto& rig : reps) s += rig->ctx().grads[p].f32()[ch];
      EXPECT_NEAR(s, f.grads[p].f32()[ch], 1e-4) << (p ? "bias" : "weight") << " grad " << ch;
    }
  // Without synchronisation each replica normalises with its own statistics: different.
  for (auto& rig : reps) rig->ctx().replicas = nullptr;
  reps[0]->forward();
  double diff = 0;
  for (int64_t i = 0; i < (B / R) * plane; ++i)
    diff = std::max(diff, double(std::fabs(reps[0]->ctx().out.f32()[i] - f.out.f32()[i])));
  EXPECT_GT(diff, 1e-3);
}

// ------------------------------------------------------------------ Pooling

namespace {

// Naive max pool with explicit -inf padding; returns values and argmax (ih*W + iw).
void maxpool_ref(const float* x, int64_t P, int64_t H, int64_t W, int64_t k, int64_t s, int64_t p,
                 std::vector<float>& y, std::vector<int32_t>& idx) {
  int64_t Ho = (H + 2 * p - k) / s + 1, Wo = (W + 2 * p - k) / s + 1;
  y.assign(size_t(P * Ho * Wo), 0);
  idx.assign(size_t(P * Ho * Wo), -1);
  for (int64_t pl = 0; pl < P; ++pl)
    for (int64_t oh = 0; oh < Ho; ++oh)
      for (int64_t ow = 0; ow < Wo; ++ow) {
        float best = -std::numeric_limits<float>::infinity();
        int32_t bi = -1;
        for (int64_t kh = 0; kh < k; ++kh)
          for (int64_t kw = 0; kw < k; ++kw) {
            int64_t ih = oh * s - p + kh, iw = ow * s - p + kw;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            float v = x[(pl * H + ih) * W + iw];
            if (bi < 0 || v > best) best = v, bi = int32_t(ih * W + iw);
          }
        y[size_t((pl * Ho + oh) * Wo + ow)] = best;
        idx[size_t((pl * Ho + oh) * Wo + ow)] = bi;
      }
}

}  // namespace

TEST(MaxPool2d, FiniteDifferencesAndNaiveReference) {
  struct Case { int64_t B, C, H, W, k, s, p; bool fd; };  // fd: also run the finite-difference harness
  for (Case cs : {Case{2, 3, 8, 8, 2, 2, 0, true}, Case{2, 3, 7, 5, 3, 2, 1, true}, Case{1, 2, 6, 7, 3, 1, 0, true},
                  Case{2, 2, 9, 9, 3, 3, 1, true}, Case{2, 4, 16, 16, 3, 2, 1, true},
                  Case{4, 32, 32, 32, 3, 2, 1, false}}) {  // large: the parallel path
    SCOPED_TRACE(sat::str_cat("k", cs.k, " s", cs.s, " p", cs.p, " ", cs.H, "x", cs.W));
    sat::MaxPool2d pool(cs.k, cs.s, cs.p);
    OpCheck opt;
    opt.inputs = {InputSpec{Shape{cs.B, cs.C, cs.H, cs.W}}};
    if (cs.fd) check_layer(pool, opt);

    LayerRig rig(pool, opt);
    auto& c = rig.ctx();
    rig.forward();
    std::vector<float> y;
    std::vector<int32_t> idx;
    maxpool_ref(c.in[0].f32(), cs.B * cs.C, cs.H, cs.W, cs.k, cs.s, cs.p, y, idx);
    ASSERT_EQ(int64_t(y.size()), c.out.numel());
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(c.out.f32()[i], y[i]) << i;
      ASSERT_EQ(c.saved[0].i32()[i], idx[i]) << i;
    }
    // Backward routes each dout to its argmax (summing where windows share a maximum).
    rig.backward();
    std::vector<double> dx(size_t(c.in[0].numel()), 0.0);
    const int64_t OHW = c.out.shape[2] * c.out.shape[3];
    for (size_t i = 0; i < y.size(); ++i) dx[size_t(int64_t(i) / OHW * cs.H * cs.W + idx[i])] += c.dout.f32()[i];
    EXPECT_LT(max_abs_diff(c.din[0].f32(), dx), 1e-6);
  }
  sat::MaxPool2d pool(3);
  sat::LayerSetup s;
  s.name = "pool";
  s.inputs = {{Shape{1, 1, 9, 10}}};
  pool.setup(s);
  EXPECT_EQ(s.output.shape, (Shape{1, 1, 3, 3}));  // stride defaults to the kernel
  EXPECT_THROW(sat::MaxPool2d(2, 1, 2), sat::Error);  // padding larger than half the kernel
}

TEST(AdaptiveAvgPool2d, NonDivisibleWindowsByHand) {
  // H=5 -> 3: windows [0,2), [1,4), [3,5) (floor start, ceil end; they overlap).
  sat::AdaptiveAvgPool2d pool(3, 1);
  OpCheck opt;
  opt.inputs = {InputSpec{Shape{1, 1, 5, 1}}};
  LayerRig rig(pool, opt);
  auto& c = rig.ctx();
  for (int i = 0; i < 5; ++i) c.in[0].f32()[i] = float(i);
  rig.forward();
  EXPECT_FLOAT_EQ(c.out.f32()[0], 0.5f);
  EXPECT_FLOAT_EQ(c.out.f32()[1], 2.0f);
  EXPECT_FLOAT_EQ(c.out.f32()[2], 3.5f);
  c.dout.f32()[0] = 1, c.dout.f32()[1] = 3, c.dout.f32()[2] = 2;
  rig.backward();
  const float want[5] = {0.5f, 0.5f + 1.0f, 1.0f, 1.0f + 1.0f, 1.0f};
  for (int i = 0; i < 5; ++i) EXPECT_FLOAT_EQ(c.din[0].f32()[i], want[i]) << i;
}

TEST(AdaptiveAvgPool2d, FiniteDifferencesAndNaiveReference) {
  struct Case { int64_t B, C, H, W, oh, ow; bool fd; };  // fd: also run the finite-difference harness
  for (Case cs : {Case{2, 3, 4, 4, 1, 1, true}, Case{2, 3, 5, 7, 3, 2, true}, Case{1, 2, 7, 5, 2, 3, true},
                  Case{2, 2, 3, 3, 4, 5, true}, Case{2, 3, 8, 8, 4, 4, true},
                  Case{4, 32, 32, 32, 1, 1, false}, Case{4, 32, 32, 32, 3, 5, false}}) {  // large: parallel path
    SCOPED_TRACE(sat::str_cat(cs.H, "x", cs.W, " -> ", cs.oh, "x", cs.ow));
    sat::AdaptiveAvgPool2d pool(cs.oh, cs.ow);
    OpCheck opt;
    opt.inputs = {InputSpec{Shape{cs.B, cs.C, cs.H, cs.W}}};
    if (cs.fd) check_layer(pool, opt);

    LayerRig rig(pool, opt);
    auto& c = rig.ctx();
    rig.forward();
    const float* x = c.in[0].f32();
    std::vector<double> y(size_t(cs.B * cs.C * cs.oh * cs.ow)), dx(size_t(c.in[0].numel()), 0.0);
    for (int64_t pl = 0; pl < cs.B * cs.C; ++pl)
      for (int64_t i = 0; i < cs.oh; ++i)
        for (int64_t j = 0; j < cs.ow; ++j) {
          int64_t h0 = int64_t(std::floor(double(i * cs.H) / double(cs.oh)));
          int64_t h1 = int64_t(std::ceil(double((i + 1) * cs.H) / double(cs.oh)));
          int64_t w0 = int64_t(std::floor(double(j * cs.W) / double(cs.ow)));
          int64_t w1 = int64_t(std::ceil(double((j + 1) * cs.W) / double(cs.ow)));
          double sum = 0;
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) sum += x[(pl * cs.H + ih) * cs.W + iw];
          y[size_t((pl * cs.oh + i) * cs.ow + j)] = sum / double((h1 - h0) * (w1 - w0));
          const double g = c.dout.f32()[(pl * cs.oh + i) * cs.ow + j] / double((h1 - h0) * (w1 - w0));
          for (int64_t ih = h0; ih < h1; ++ih)
            for (int64_t iw = w0; iw < w1; ++iw) dx[size_t((pl * cs.H + ih) * cs.W + iw)] += g;
        }
    EXPECT_LT(max_abs_diff(c.out.f32(), y), 1e-5);
    rig.backward();
    EXPECT_LT(max_abs_diff(c.din[0].f32(), dx), 1e-5);
  }
}
