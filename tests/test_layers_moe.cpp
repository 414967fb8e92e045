// The mixture-of-experts layers (nn/layers/moe.h): finite-difference gradients of Moe (the
// experts' weights, the input and the router logits, with and without capacity drops) and
// of MoeAux, forward values against a per-token float64 reference, the deterministic
// token-order drop at capacity and the load counters, the buffers declared to the plan,
// and the errors for impossible configurations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "nn/layers/moe.h"
#include "op_harness.h"

using namespace sat;
using sat::test::LayerRig;
using sat::test::OpCheck;

namespace {

OpCheck moe_inputs(int64_t n, int64_t C, int64_t E) {
  OpCheck o;
  o.inputs.push_back({{n / 2, 2, C}});
  o.inputs.push_back({{n / 2, 2, E}, DType::f32, 0, 1, true, 2.0f});
  return o;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// y of token t through expert e's weights (params 3e, 3e+1, 3e+2), in float64.
std::vector<double> expert_ref(const LayerCtx& c, int64_t e, const float* x, int64_t C, int64_t F) {
  const float* wg = c.params[size_t(3 * e)].f32();
  const float* wu = c.params[size_t(3 * e + 1)].f32();
  const float* wd = c.params[size_t(3 * e + 2)].f32();
  std::vector<double> a(static_cast<size_t>(F)), y(static_cast<size_t>(C), 0.0);
  for (int64_t f = 0; f < F; ++f) {
    double g = 0, u = 0;
    for (int64_t i = 0; i < C; ++i) g += double(wg[f * C + i]) * x[i], u += double(wu[f * C + i]) * x[i];
    a[size_t(f)] = silu(g) * u;
  }
  for (int64_t i = 0; i < C; ++i)
    for (int64_t f = 0; f < F; ++f) y[size_t(i)] += double(wd[i * F + f]) * a[size_t(f)];
  return y;
}

}  // namespace

TEST(Moe, Gradients) {
  struct Case { int64_t n, C, E, K, F; double cf; };
  for (Case k : {Case{10, 8, 4, 2, 6, 0.0}, Case{10, 8, 4, 2, 6, 1.0}, Case{12, 6, 3, 1, 5, 0.0},
                 Case{8, 4, 5, 3, 7, 0.75}, Case{6, 5, 2, 2, 4, 1.0}}) {
    SCOPED_TRACE(str_cat("n ", k.n, " E ", k.E, " k ", k.K, " cf ", k.cf));
    Moe m(k.E, k.K, k.F, k.cf);
    OpCheck o = moe_inputs(k.n, k.C, k.E);
    const double w = sat::test::check_layer(m, o);
    std::printf("[ worst FD ] Moe n %lld E %lld k %lld cf %.2f: %.2e\n", (long long)k.n, (long long)k.E,
                (long long)k.K, k.cf, w);
    EXPECT_LT(w, o.tol);
  }
  (void)take_moe_load();
}

TEST(MoeAux, Gradients) {
  for (int64_t K : {1, 2, 3}) {
    MoeAux a(5, K, 0.7f);
    OpCheck o;
    o.inputs.push_back({{3, 4, 5}, DType::f32, 0, 1, true, 2.0f});
    const double w = sat::test::check_layer(a, o);
    std::printf("[ worst FD ] MoeAux k %lld: %.2e\n", (long long)K, w);
    EXPECT_LT(w, o.tol);
  }
}

TEST(Moe, ForwardMatchesReferenceWithDrops) {
  const int64_t n = 12, C = 6, E = 4, K = 2, F = 5;
  const double cf = 1.0;
  Moe m(E, K, F, cf);
  LayerRig rig(m, moe_inputs(n, C, E));
  (void)take_moe_load();
  rig.forward();
  LayerCtx& c = rig.ctx();
  const int64_t cap = moe_capacity(cf, n, E, K);
  EXPECT_EQ(cap, 6);
  std::vector<int64_t> fill(size_t(E), 0);
  int64_t dropped = 0;
  double worst = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* l = c.in[1].f32() + t * E;
    std::vector<double> p(static_cast<size_t>(E));
    double mx = *std::max_element(l, l + E), z = 0;
    for (int64_t e = 0; e < E; ++e) z += (p[size_t(e)] = std::exp(double(l[e]) - mx));
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[size_t(a)] > p[size_t(b)]; });
    double S = 0;
    for (int64_t j = 0; j < K; ++j) S += p[size_t(order[size_t(j)])];
    std::vector<double> y(size_t(C), 0.0);
    for (int64_t j = 0; j < K; ++j) {
      const int64_t e = order[size_t(j)];
      if (fill[size_t(e)]++ >= cap) { ++dropped; continue; }
      const auto ye = expert_ref(c, e, c.in[0].f32() + t * C, C, F);
      for (int64_t i = 0; i < C; ++i) y[size_t(i)] += p[size_t(e)] / S * ye[size_t(i)];
    }
    for (int64_t i = 0; i < C; ++i) worst = std::max(worst, std::abs(y[size_t(i)] - c.out.f32()[t * C + i]));
  }
  EXPECT_LT(worst, 1e-5);
  EXPECT_GT(dropped, 0);  // the case exercises the capacity
  const auto load = take_moe_load();
  ASSERT_EQ(load.count("t"), 1u);
  const MoeLoad& L = load.at("t");
  EXPECT_EQ(L.dropped, dropped);
  EXPECT_EQ(L.routed, n * K);
  for (int64_t e = 0; e < E; ++e) EXPECT_EQ(L.tokens[size_t(e)], std::min(fill[size_t(e)], cap)) << e;
  EXPECT_TRUE(rig.guards_intact());
}

// Every token prefers expert 0: with capacity 2 the first two tokens keep it and the rest
// get their second choice only (k 2) or nothing (k 1).
TEST(Moe, DropsInTokenOrder) {
  for (int64_t K : {1, 2}) {
    const int64_t n = 4, C = 3, E = 2;
    Moe m(E, K, 4, 1.0);  // capacity ceil(4 k / 2) = 2 k
    OpCheck o = moe_inputs(n, C, E);
    o.fill_inputs = [](std::vector<Tensor>& in) {
      for (int64_t t = 0; t < in[1].numel() / 2; ++t) in[1].f32()[2 * t] = 3.0f, in[1].f32()[2 * t + 1] = 0.0f;
    };
    LayerRig rig(m, o);
    (void)take_moe_load();
    rig.forward();
    const MoeLoad L = take_moe_load().at("t");
    if (K == 1) {  // capacity 2: tokens 2, 3 dropped, their output zero
      EXPECT_EQ(L.tokens, (std::vector<int64_t>{2, 0}));
      EXPECT_EQ(L.dropped, 2);
      for (int64_t i = 2 * C; i < n * C; ++i) EXPECT_EQ(rig.ctx().out.f32()[i], 0.0f);
      for (int64_t i = 0; i < 2 * C; ++i) EXPECT_NE(rig.ctx().out.f32()[i], 0.0f);
    } else {  // capacity 4: nothing dropped
      EXPECT_EQ(L.tokens, (std::vector<int64_t>{4, 4}));
      EXPECT_EQ(L.dropped, 0);
    }
  }
}

TEST(MoeAux, BalancedIsCoefficient) {
  MoeAux a(4, 2, 0.25f);
  OpCheck o;
  o.inputs.push_back({{8, 4}});
  // Token t prefers experts t % 4 and (t + 1) % 4 equally often: f and P uniform.
  o.fill_inputs = [](std::vector<Tensor>& in) {
    for (int64_t t = 0; t < 8; ++t)
      for (int64_t e = 0; e < 4; ++e) in[0].f32()[t * 4 + e] = (e == t % 4 || e == (t + 1) % 4) ? 1.0f : 0.0f;
  };
  LayerRig rig(a, o);
  rig.forward();
  EXPECT_NEAR(rig.ctx().out.f32()[0], 0.25f, 1e-6f);
}

TEST(Moe, DeclaresItsBuffers) {
  const int64_t n = 10, C = 8, E = 4, K = 2, F = 6;
  Moe m(E, K, F, 1.25);
  LayerSetup s;
  s.name = "model.layers.0.mlp.experts";
  s.inputs = {{{n, C}}, {{n, E}}};
  m.setup(s);
  ASSERT_EQ(s.params.size(), size_t(3 * E));
  EXPECT_EQ(s.params[3].name, "model.layers.0.mlp.experts.experts.1.gate_proj.weight");
  EXPECT_EQ(s.params[5].spec.shape, (Shape{C, F}));
  size_t saved = 0;
  for (auto& t : s.saved) saved += t.bytes();
  // probs, the routing (top, gates, slots), offsets, the permutation, the two hidden halves
  EXPECT_EQ(saved, size_t(4 * (n * E + 3 * n * K + E + 1 + n * K + 2 * n * K * F)));
  EXPECT_GT(s.flops_fwd, 0);
}

TEST(Moe, Errors) {
  auto msg = [](auto f) {
    try { f(); } catch (const Error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  EXPECT_NE(msg([] { Moe(4, 5, 8); }).find("top_k must be in [1, experts = 4], got 5"), std::string::npos);
  EXPECT_NE(msg([] { MoeAux(4, 0, 0.01f); }).find("top_k"), std::string::npos);
  EXPECT_NE(msg([] { MoeAux(4, 1, -1.0f); }).find("coefficient"), std::string::npos);
  Moe m(4, 2, 8);
  LayerSetup s;
  s.name = "moe";
  s.inputs = {{{6, 8}}, {{6, 3}}};
  EXPECT_NE(msg([&] { m.setup(s); }).find("router logits [..., 4]"), std::string::npos);
}
