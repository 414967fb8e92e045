// The layers of the Llama family: RMSNorm, Rotary (RoPE), SwiGLU and grouped-query
// CausalSelfAttention. Finite-difference gradients through the shared harness on several
// shapes (the worst error per layer kind is printed), forward values against small known
// values (computed in float64 from the formulas), and grouped-query attention against
// ordinary multi-head attention with each key/value head repeated over its group.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "nn/layers/attention.h"
#include "nn/layers/embedding.h"
#include "nn/layers/rmsnorm.h"
#include "nn/layers/rotary.h"
#include "nn/layers/swiglu.h"
#include "op_harness.h"

using namespace sat;
using sat::test::LayerRig;
using sat::test::OpCheck;

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

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

// sat::test::check_layer, printing the worst relative finite-difference error per kind.
double check(Layer& layer, const OpCheck& o, const char* label = nullptr) {
  static std::map<std::string, double> worst;
  const double w = sat::test::check_layer(layer, o);
  const std::string key = label ? label : layer.kind();
  double& m = worst[key];
  if (w > m) {
    m = w;
    std::printf("[ worst FD ] %s %.2e\n", key.c_str(), m);
  }
  EXPECT_LT(w, o.tol);
  return w;
}

}  // namespace

// ---- RMSNorm ----

TEST(RMSNorm, GradientsManyShapes) {
  for (Shape s : {Shape{1, 5}, Shape{3, 33}, Shape{17, 5}, Shape{2, 3, 8}, Shape{4, 1}, Shape{256, 200}}) {
    SCOPED_TRACE(s.str());
    RMSNorm n(s[-1]);
    check(n, f32_inputs({s}));
  }
}

TEST(RMSNorm, KnownValues) {
  RMSNorm n(4);
  LayerRig rig(n, f32_inputs({{2, 4}}));
  auto& c = rig.ctx();
  set(c.in[0], {1, 2, 3, 4, -1, 0.5f, 0.25f, 2});
  set(c.params[0], {1, 0.5f, 2, -1});
  rig.forward();
  // x / sqrt(mean(x^2) + 1e-5) * w in float64
  const std::vector<double> want = {0.3651481282381064,  0.3651481282381064,  2.1908887694286383,
                                    -1.4605925129524255, -0.8677185645755895, 0.21692964114389737,
                                    0.43385928228779475, -1.735437129151179};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(c.out.f32()[i], want[i], 2e-6) << i;
  EXPECT_NEAR(c.saved[0].f32()[0], 1.0 / std::sqrt(7.5 + 1e-5), 1e-7);  // rstd
  EXPECT_EQ(rig.setup().params[0].init.kind, ParamInit::Kind::ones);
  EXPECT_TRUE(rig.guards_intact());
}

TEST(RMSNorm, SequenceParallelWeightGradientIsPartial) {
  for (bool sp : {false, true}) {
    RMSNorm n(8, 1e-5f, sp);
    LayerSetup s;
    s.name = "model.norm";
    s.inputs = {{Shape{2, 3, 8}}};
    n.setup(s);
    ASSERT_EQ(s.params.size(), 1u);
    EXPECT_EQ(s.params[0].name, "model.norm.weight");
    EXPECT_EQ(s.params[0].shard.partial_grad, sp);
    EXPECT_FALSE(s.params[0].shard.split());
  }
}

TEST(RMSNorm, BadShapesThrow) {
  RMSNorm n(4);
  LayerSetup s;
  s.name = "norm";
  s.inputs = {{Shape{2, 5}}};
  EXPECT_THROW(n.setup(s), Error);
  EXPECT_THROW(RMSNorm(0), Error);
}

// ---- Rotary ----

TEST(Rotary, GradientsManyShapes) {
  struct Case { int64_t B, T, W, hs; };
  for (Case k : {Case{1, 1, 2, 2}, Case{2, 5, 8, 4}, Case{1, 17, 24, 8}, Case{3, 33, 64, 16}}) {
    SCOPED_TRACE(testing::Message() << "B=" << k.B << " T=" << k.T << " W=" << k.W << " hs=" << k.hs);
    Rotary r(k.hs);
    check(r, f32_inputs({{k.B, k.T, k.W}}));
  }
}

TEST(Rotary, KnownValues) {
  // Two heads of 4 channels, positions 0, 1, 2; angles t * 10000^(-2i/4), i = 0, 1.
  Rotary r(4);
  LayerRig rig(r, f32_inputs({{1, 3, 8}}));
  auto& c = rig.ctx();
  const std::vector<float> x = {0.5f, -1, 2, 0.25f, 1, 2, 3, 4, 1, 0, 0, 0, 0, 1, 0, 0,
                                0.3f, -0.7f, 1.1f, -1.3f, 2, -2, 0.5f, 0.1f};
  set(c.in[0], x);
  rig.forward();
  const std::vector<double> want = {0.5, -1.0, 2.0, 0.25, 1.0, 2.0, 3.0, 4.0,  // position 0: unchanged
                                    0.540302305868, 0.0, 0.841470984808, 0.0,
                                    0.0, 0.999950000417, 0.0, 0.009999833334,
                                    -1.125071220472, -0.673861737965, -0.184972292154, -1.313739075352,
                                    -1.286942386507, -2.001599880002, 1.610521435378, 0.05998266728};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(c.out.f32()[i], want[i], 2e-6) << i;
  // Backward rotates back: with dout = out, din = x (a rotation's transpose is its inverse).
  std::memcpy(c.dout.f32(), c.out.f32(), size_t(c.out.numel()) * sizeof(float));
  rig.backward();
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(c.din[0].f32()[i], x[i], 2e-6) << i;
  EXPECT_TRUE(rig.guards_intact());
}

TEST(Rotary, BadShapesThrow) {
  EXPECT_THROW(Rotary(3), Error);
  Rotary r(4);
  LayerSetup s;
  s.name = "rope";
  s.inputs = {{Shape{2, 3, 10}}};  // 10 channels are not heads of 4
  EXPECT_THROW(r.setup(s), Error);
}

// ---- SwiGLU ----

TEST(SwiGLU, GradientsManyShapes) {
  for (Shape s : {Shape{1, 1}, Shape{3, 7}, Shape{2, 5, 32}, Shape{64, 96}}) {
    SCOPED_TRACE(s.str());
    SwiGLU g;
    check(g, f32_inputs({s, s}));
  }
}

TEST(SwiGLU, KnownValues) {
  SwiGLU g;
  LayerRig rig(g, f32_inputs({{5}, {5}}));
  auto& c = rig.ctx();
  set(c.in[0], {-2, -0.5f, 0, 0.5f, 3});
  set(c.in[1], {1, 2, -1, 0.5f, -0.25f});
  rig.forward();
  // gate * sigmoid(gate) * up in float64
  const std::vector<double> want = {-0.2384058440442351, -0.3775406687981454, 0.0, 0.15561483280046365,
                                    -0.7144305951168249};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(c.out.f32()[i], want[i], 1e-6) << i;
  EXPECT_TRUE(rig.guards_intact());
}

TEST(SwiGLU, MismatchedInputsThrow) {
  SwiGLU g;
  LayerSetup s;
  s.name = "act";
  s.inputs = {{Shape{2, 4}}, {Shape{2, 5}}};
  EXPECT_THROW(g.setup(s), Error);
  s.inputs = {{Shape{2, 4}}};
  EXPECT_THROW(g.setup(s), Error);
}

// ---- Grouped-query attention ----

namespace {

struct Gqa {
  int64_t B, T, nh, nkv, hs;
};

std::vector<float> randn(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& e : x) e = rng.normal();
  return x;
}

// The three inputs' shapes: q [B, T, nh hs], k and v [B, T, nkv hs].
std::vector<Shape> qkv_shapes(const Gqa& k) {
  return {Shape{k.B, k.T, k.nh * k.hs}, Shape{k.B, k.T, k.nkv * k.hs}, Shape{k.B, k.T, k.nkv * k.hs}};
}

// x [B, T, n hs] with every head repeated `rep` times -> [B, T, n rep hs].
std::vector<float> repeat_heads(const std::vector<float>& x, int64_t rows, int64_t n, int64_t hs, int64_t rep) {
  std::vector<float> y;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < n; ++h)
      for (int64_t i = 0; i < rep; ++i)
        y.insert(y.end(), x.begin() + (r * n + h) * hs, x.begin() + (r * n + h + 1) * hs);
  return y;
}

// The inverse's gradient: dx [B, T, n rep hs] summed over each group -> [B, T, n hs], in double.
std::vector<double> sum_groups(const std::vector<float>& dx, int64_t rows, int64_t n, int64_t hs, int64_t rep) {
  std::vector<double> y(size_t(rows * n * hs), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < n; ++h)
      for (int64_t i = 0; i < rep; ++i)
        for (int64_t j = 0; j < hs; ++j) y[size_t((r * n + h) * hs + j)] += dx[size_t(((r * n + h) * rep + i) * hs + j)];
  return y;
}

// The fused qkv [B, T, (nh + 2 nkv) hs] of three separate q, k, v.
std::vector<float> fuse(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                        int64_t rows, int64_t wq, int64_t wkv) {
  std::vector<float> x;
  for (int64_t r = 0; r < rows; ++r) {
    x.insert(x.end(), q.begin() + r * wq, q.begin() + (r + 1) * wq);
    x.insert(x.end(), k.begin() + r * wkv, k.begin() + (r + 1) * wkv);
    x.insert(x.end(), v.begin() + r * wkv, v.begin() + (r + 1) * wkv);
  }
  return x;
}

struct Outputs {
  std::vector<float> y;
  std::vector<std::vector<float>> din;
};

// Forward and backward of `layer` on the given inputs and output gradient (guarded rig).
Outputs run(Layer& layer, const std::vector<Shape>& shapes, const std::vector<std::vector<float>>& in,
        const std::vector<float>& dy, bool check_guards = true) {
  LayerRig rig(layer, f32_inputs(shapes));
  auto& c = rig.ctx();
  for (size_t i = 0; i < in.size(); ++i) std::copy(in[i].begin(), in[i].end(), c.in[i].f32());
  std::copy(dy.begin(), dy.end(), c.dout.f32());
  rig.forward();
  for (auto& d : c.din) test::fill_nan(d);
  rig.backward();
  EXPECT_TRUE(rig.guards_intact() || !check_guards);
  Outputs r{values(c.out), {}};
  for (auto& d : c.din) r.din.push_back(values(d));
  return r;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::isfinite(a[i]) ? std::fabs(double(a[i]) - b[i]) : INFINITY);
  return e;
}

std::vector<double> as_double(const std::vector<float>& x) { return std::vector<double>(x.begin(), x.end()); }

}  // namespace

TEST(GroupedQueryAttention, GradientsFiniteDifference) {
  for (Gqa k : {Gqa{1, 1, 2, 1, 4}, Gqa{2, 5, 4, 2, 4}, Gqa{2, 17, 6, 3, 4}, Gqa{1, 40, 8, 2, 8}, Gqa{1, 70, 4, 1, 6}}) {
    SCOPED_TRACE(testing::Message() << "B=" << k.B << " T=" << k.T << " nh=" << k.nh << " nkv=" << k.nkv
                                    << " hs=" << k.hs);
    for (bool recompute : {false, true}) {
      CausalSelfAttention separate(k.nh, recompute, k.nkv);
      check(separate, f32_inputs(qkv_shapes(k)), "GQA q,k,v");
      CausalSelfAttention fused(k.nh, recompute, k.nkv);
      check(fused, f32_inputs({{k.B, k.T, (k.nh + 2 * k.nkv) * k.hs}}), "GQA fused qkv");
    }
  }
}

// Grouped-query attention is multi-head attention whose key/value heads are repeated
// over their group (HuggingFace's repeat_kv): outputs agree, and the gradients of k and v
// are the repeated heads' gradients summed over each group.
TEST(GroupedQueryAttention, EqualsMultiHeadWithRepeatedKeysAndValues) {
  for (Gqa k : {Gqa{2, 5, 4, 2, 4}, Gqa{2, 70, 6, 2, 8}, Gqa{1, 33, 8, 1, 16}}) {
    SCOPED_TRACE(testing::Message() << "T=" << k.T << " nh=" << k.nh << " nkv=" << k.nkv);
    const int64_t rows = k.B * k.T, G = k.nh / k.nkv;
    const auto q = randn(rows * k.nh * k.hs, 1), kk = randn(rows * k.nkv * k.hs, 2), v = randn(rows * k.nkv * k.hs, 3);
    const auto dy = randn(rows * k.nh * k.hs, 4);
    CausalSelfAttention gqa(k.nh, false, k.nkv), mha(k.nh, false, k.nh);
    const Outputs g = run(gqa, qkv_shapes(k), {q, kk, v}, dy);
    const Gqa full{k.B, k.T, k.nh, k.nh, k.hs};
    const Outputs m = run(mha, qkv_shapes(full), {q, repeat_heads(kk, rows, k.nkv, k.hs, G), repeat_heads(v, rows, k.nkv, k.hs, G)}, dy);
    EXPECT_LT(max_abs_diff(g.y, as_double(m.y)), 1e-6);
    EXPECT_LT(max_abs_diff(g.din[0], as_double(m.din[0])), 1e-5);
    EXPECT_LT(max_abs_diff(g.din[1], sum_groups(m.din[1], rows, k.nkv, k.hs, G)), 1e-5);
    EXPECT_LT(max_abs_diff(g.din[2], sum_groups(m.din[2], rows, k.nkv, k.hs, G)), 1e-5);
  }
}

// Multi-head attention on three inputs computes bitwise what the fused qkv layer (GPT's)
// computes, and so does a fused grouped input against three grouped inputs.
TEST(GroupedQueryAttention, FusedAndSeparateInputsAgreeBitwise) {
  for (Gqa k : {Gqa{2, 70, 3, 3, 16}, Gqa{2, 40, 8, 2, 8}}) {
    SCOPED_TRACE(testing::Message() << "nh=" << k.nh << " nkv=" << k.nkv);
    const int64_t rows = k.B * k.T, wq = k.nh * k.hs, wkv = k.nkv * k.hs;
    const auto q = randn(rows * wq, 5), kk = randn(rows * wkv, 6), v = randn(rows * wkv, 7), dy = randn(rows * wq, 8);
    // n_kv_head = n_head spelled as the default (GPT's constructor call) for the fused layer.
    CausalSelfAttention separate(k.nh, false, k.nkv), fused(k.nh, false, k.nkv == k.nh ? 0 : k.nkv);
    const Outputs s = run(separate, qkv_shapes(k), {q, kk, v}, dy);
    const Outputs f = run(fused, {Shape{k.B, k.T, wq + 2 * wkv}}, {fuse(q, kk, v, rows, wq, wkv)}, dy);
    ASSERT_EQ(s.y.size(), f.y.size());
    EXPECT_EQ(std::memcmp(s.y.data(), f.y.data(), s.y.size() * sizeof(float)), 0);
    const auto dfused = fuse(s.din[0], s.din[1], s.din[2], rows, wq, wkv);
    ASSERT_EQ(dfused.size(), f.din[0].size());
    EXPECT_EQ(std::memcmp(dfused.data(), f.din[0].data(), dfused.size() * sizeof(float)), 0);
  }
}

TEST(GroupedQueryAttention, BadConfigurationsThrow) {
  EXPECT_THROW(CausalSelfAttention(6, false, 4), Error);  // 6 query heads in groups of 4 kv heads
  CausalSelfAttention a(4, false, 2);
  LayerSetup s;
  s.name = "attn";
  s.inputs = {{Shape{2, 5, 16}}, {Shape{2, 5, 16}}, {Shape{2, 5, 8}}};  // k has 4 heads of 4, not 2
  EXPECT_THROW(a.setup(s), Error);
  s.inputs = {{Shape{2, 5, 16}}, {Shape{2, 5, 8}}};  // two inputs
  EXPECT_THROW(a.setup(s), Error);
  s.inputs = {{Shape{2, 5, 30}}};  // fused: 30 is not (4 + 2*2) heads
  EXPECT_THROW(a.setup(s), Error);
}

// A GPU plan of grouped-query attention builds (the planner lays out Llama on GPUs); the
// kernels refuse to run it (attention.cu), as they refuse selective recomputation.
TEST(GroupedQueryAttention, PlansForTheGpu) {
  CausalSelfAttention a(4, false, 2);
  LayerSetup s;
  s.name = "attn";
  s.device = Device::cuda;
  s.inputs = {{Shape{2, 5, 16}}, {Shape{2, 5, 8}}, {Shape{2, 5, 8}}};
  a.setup(s);
  EXPECT_EQ(s.output.shape, (Shape{2, 5, 16}));
  ASSERT_EQ(s.saved.size(), 1u);
  EXPECT_EQ(s.saved[0].shape, (Shape{2, 4, 5, 5}));  // P of every query head
}

// ---- vocabulary-parallel Embedding (Llama's embed_tokens) ----

// Two parts' outputs add up to the whole table's output, and each part's weight gradient
// is its rows of the whole gradient.
TEST(Embedding, VocabularyPartsSumToTheWhole) {
  const int64_t V = 10, D = 3;
  const std::vector<int32_t> ids = {0, 9, 4, 5, 4, 7};
  auto run_part = [&](TPRank tp, const std::vector<float>& table, std::vector<float>& grad) {
    Embedding e(V, D, ParamInit::normal(1.0f), tp);
    OpCheck o;
    o.inputs = {{Shape{2, 3}, DType::i32}};
    LayerRig rig(e, o);
    auto& c = rig.ctx();
    for (size_t i = 0; i < ids.size(); ++i) c.in[0].i32()[i] = ids[i];
    const int64_t rows = c.params[0].shape[0];
    std::copy(table.begin() + tp.index * rows * D, table.begin() + (tp.index + 1) * rows * D, c.params[0].f32());
    for (int64_t i = 0; i < c.dout.numel(); ++i) c.dout.f32()[i] = float(i) * 0.5f - 2.0f;
    rig.forward();
    rig.backward();
    EXPECT_TRUE(rig.guards_intact());
    grad = values(c.grads[0]);
    return values(c.out);
  };
  const std::vector<float> table = randn(V * D, 21);
  std::vector<float> g_whole, g0, g1;
  const auto whole = run_part({}, table, g_whole);
  const auto y0 = run_part({2, 0}, table, g0), y1 = run_part({2, 1}, table, g1);
  for (size_t i = 0; i < whole.size(); ++i) EXPECT_EQ(y0[i] + y1[i], whole[i]) << i;  // one of them is 0
  g0.insert(g0.end(), g1.begin(), g1.end());
  EXPECT_EQ(g0, g_whole);
}
