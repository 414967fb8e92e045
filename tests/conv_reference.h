// The naive convolution both conv test files check against (the CPU layer in
// test_layers_conv.cpp, channel groups in test_cuda_conv.cpp): forward and its adjoint in
// float64, straight from the definition
//   y[b,o,oh,ow] = bias[o] + sum over c in o's group, kh, kw of w[o,c',kh,kw] x[b,c,oh*s-p+kh,ow*s-p+kw],
// and one check that runs a layer through the op harness and compares out, dx, dW and db.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "nn/layer.h"
#include "op_harness.h"

namespace sat::test {

struct ConvShape {
  int64_t B, C, H, W, O, k, s, p, groups;
  int64_t Ho() const { return (H + 2 * p - k) / s + 1; }
  int64_t Wo() const { return (W + 2 * p - k) / s + 1; }
};

// Calls f(xi, wi, yi) for every product x[xi] * w[wi] that contributes to y[yi].
template <typename F>
void for_each_conv_tap(const ConvShape& c, F&& f) {
  const int64_t Ho = c.Ho(), Wo = c.Wo(), Cg = c.C / c.groups, Og = c.O / c.groups;
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t o = 0; o < c.O; ++o)
      for (int64_t oh = 0; oh < Ho; ++oh)
        for (int64_t ow = 0; ow < Wo; ++ow) {
          const size_t yi = size_t(((b * c.O + o) * Ho + oh) * Wo + ow);
          for (int64_t cw = 0; cw < Cg; ++cw)
            for (int64_t kh = 0; kh < c.k; ++kh)
              for (int64_t kw = 0; kw < c.k; ++kw) {
                const int64_t ih = oh * c.s - c.p + kh, iw = ow * c.s - c.p + kw;
                if (ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                const int64_t ch = (o / Og) * Cg + cw;
                f(size_t(((b * c.C + ch) * c.H + ih) * c.W + iw), size_t(((o * Cg + cw) * c.k + kh) * c.k + kw), yi);
              }
        }
}

inline double max_abs_diff(const float* a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// Runs `conv` (built for shape c) forward and backward on seeded inputs and compares
// everything it computes with the naive reference. tol_scale widens every bound (Winograd
// F(4x4, 3x3)'s transforms round more than a direct sum: see test_layers_conv.cpp).
inline void expect_conv_matches_reference(Layer& conv, const ConvShape& c, bool bias, uint64_t seed,
                                          double tol_scale = 1.0) {
  OpCheck opt;
  opt.inputs = {InputSpec{Shape{c.B, c.C, c.H, c.W}}};
  opt.seed = seed;
  LayerRig rig(conv, opt);
  auto& ctx = rig.ctx();
  ASSERT_EQ(ctx.params[0].shape, (Shape{c.O, c.C / c.groups, c.k, c.k}));
  rig.forward();
  const float* x = ctx.in[0].f32();
  const float* w = ctx.params[0].f32();
  const int64_t per_map = c.Ho() * c.Wo();
  std::vector<double> y(size_t(c.B * c.O * per_map));
  for (size_t i = 0; i < y.size(); ++i) y[i] = bias ? ctx.params[1].f32()[(int64_t(i) / per_map) % c.O] : 0.0;
  for_each_conv_tap(c, [&](size_t xi, size_t wi, size_t yi) { y[yi] += double(w[wi]) * double(x[xi]); });
  ASSERT_EQ(int64_t(y.size()), ctx.out.numel());
  EXPECT_LT(max_abs_diff(ctx.out.f32(), y), 1e-4 * tol_scale);

  rig.backward();  // dy = ctx.dout; the adjoint of the same taps
  const float* dy = ctx.dout.f32();
  std::vector<double> dx(size_t(ctx.in[0].numel())), dw(size_t(ctx.params[0].numel())), db(size_t(c.O));
  for (size_t i = 0; i < y.size(); ++i) db[size_t((int64_t(i) / per_map) % c.O)] += dy[i];
  for_each_conv_tap(c, [&](size_t xi, size_t wi, size_t yi) {
    dx[xi] += double(w[wi]) * dy[yi];
    dw[wi] += double(x[xi]) * dy[yi];
  });
  EXPECT_LT(max_abs_diff(ctx.din[0].f32(), dx), 1e-4 * tol_scale);
  EXPECT_LT(max_abs_diff(ctx.grads[0].f32(), dw), 2e-3 * tol_scale);  // sums of up to B*Ho*Wo terms
  if (bias) {
    EXPECT_LT(max_abs_diff(ctx.grads[1].f32(), db), 1e-3 * tol_scale);
  }
  EXPECT_TRUE(rig.guards_intact());
}

}  // namespace sat::test
