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

// Under --ep rank q of the group declares only its experts, q E/ep onwards, under their
// global names, marked as held by one rank of the group.
TEST(Moe, DeclaresOnlyItsExpertsUnderExpertParallelism) {
  const int64_t n = 10, C = 8, E = 8, K = 2, F = 6;
  Moe m(E, K, F, 1.25, 4, 2);
  LayerSetup s;
  s.name = "model.layers.0.mlp";
  s.inputs = {{{n, C}}, {{n, E}}};
  m.setup(s);
  ASSERT_EQ(s.params.size(), size_t(3 * E / 4));
  EXPECT_EQ(s.params[0].name, "model.layers.0.mlp.experts.4.gate_proj.weight");
  EXPECT_EQ(s.params[5].name, "model.layers.0.mlp.experts.5.down_proj.weight");
  for (const ParamDecl& p : s.params) EXPECT_TRUE(p.expert) << p.name;
  Moe whole(E, K, F, 1.25);
  LayerSetup one;
  one.name = s.name;
  one.inputs = s.inputs;
  whole.setup(one);
  for (const ParamDecl& p : one.params) EXPECT_FALSE(p.expert) << p.name;
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

// ---- the moe family (nn/models.h) ----

#include "nn/models.h"

TEST(MoeFamily, ParsesBuildsAndRoundTrips) {
  const std::string spec = "moe:layers=2,heads=4,width=32,experts=4,top_k=2,context=16,vocab=64,shared=1,capacity=1.25";
  const ModelConfig c = model_config(spec);
  EXPECT_EQ(c.family, ModelFamily::llama);
  EXPECT_EQ(c.experts, 4);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.shared_experts, 1);
  EXPECT_EQ(c.ffn, 128);      // 4 width unless given
  EXPECT_EQ(c.n_kv_head, 4);  // heads unless given
  EXPECT_FLOAT_EQ(c.capacity, 1.25f);
  EXPECT_FLOAT_EQ(c.aux_coef, 0.01f);
  const ModelConfig back = model_config(model_spec(c));
  EXPECT_EQ(model_spec(back), model_spec(c));
  EXPECT_NE(describe_model(c).find("4 experts"), std::string::npos);
  BuiltModel m = build_model(c, 2, true);
  const Graph& g = *m.graph;
  int moe = 0, aux = 0;
  for (const Node& n : g.nodes()) {
    moe += std::string(n.layer->kind()) == "Moe";
    aux += std::string(n.layer->kind()) == "MoeAux";
  }
  EXPECT_EQ(moe, 2);
  EXPECT_EQ(aux, 2);
  // The layers' load-balancing losses are one running sum (model.layers.1.mlp.aux_sum), added
  // to the loss once: a pipeline cut carries one value of it.
  EXPECT_EQ(g.nodes()[size_t(g.values()[size_t(g.loss())].producer)].name, "loss.plus_aux.0");
  bool summed = false;
  for (const Node& n : g.nodes()) summed = summed || n.name == "model.layers.1.mlp.aux_sum";
  EXPECT_TRUE(summed);
  bool router = false, expert = false, shared = false;
  for (const auto& p : g.params()) {
    router = router || p.name == "model.layers.1.mlp.gate.weight";
    expert = expert || p.name == "model.layers.1.mlp.experts.3.down_proj.weight";
    shared = shared || p.name == "model.layers.0.mlp.shared_expert.up_proj.weight";
  }
  EXPECT_TRUE(router && expert && shared);
  // aux=0: no load-balancing nodes, the loss is the cross-entropy's.
  BuiltModel m0 = build_model(model_config(spec + ",aux=0"), 2, true);
  EXPECT_EQ(m0.aux_losses.size(), 0u);
}

TEST(MoeFamily, Errors) {
  auto msg = [](const std::string& spec) {
    try { (void)model_config(spec); } catch (const Error& e) { return std::string(e.what()); }
    return std::string("no error");
  };
  const std::string base = "moe:layers=1,heads=2,width=16,context=8,vocab=32";
  EXPECT_NE(msg(base + ",experts=4,top_k=5").find("top_k 5 is more than experts 4"), std::string::npos);
  EXPECT_NE(msg(base + ",top_k=1").find("missing 'experts'"), std::string::npos);
  EXPECT_NE(msg(base + ",experts=4,top_k=1,capacity=-1").find("'capacity' must be a number >= 0"), std::string::npos);
  EXPECT_NE(msg(base + ",experts=4,top_k=1,aux=x").find("'aux' must be a number >= 0"), std::string::npos);
  EXPECT_NE(msg(base + ",experts=4,top_k=1,bogus=1").find("unknown key 'bogus'"), std::string::npos);
  // --tp splits the attention and leaves the moe layers whole; not with sequence parallelism.
  EXPECT_NO_THROW(check_tensor_parallel(model_config(base + ",experts=4,top_k=1"), 2, false));
  try {
    check_tensor_parallel(model_config(base + ",experts=4,top_k=1"), 2, true);
    ADD_FAILURE() << "--tp 2 --sequence-parallel accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--sequence-parallel: "), std::string::npos) << e.what();
  }
}

#include <filesystem>
#include <fstream>
#include <unistd.h>

// The model-file type: a mixture of experts between two linears of an image classifier.
TEST(MoeFamily, ModelFileType) {
  namespace fs = std::filesystem;
  const fs::path path = fs::temp_directory_path() / ("sat_moe_" + std::to_string(getpid()) + ".json");
  auto net = [&](const std::string& moe_fields) {
    std::ofstream(path) << R"({"name": "moenet",
      "inputs": {"x": {"shape": [1, 28, 28]}, "y": {"shape": [], "dtype": "int32"}},
      "layers": [{"name": "flat", "type": "flatten"}, {"name": "fc1", "type": "linear", "out": 16},
                 {"name": "mix", "type": "moe", )" << moe_fields << R"(},
                 {"name": "fc2", "type": "linear", "out": 10},
                 {"name": "loss", "type": "cross_entropy", "inputs": ["fc2", "y"]}]})";
    return model_config("file:" + path.string());
  };
  BuiltModel m = build_model(net(R"("experts": 4, "top_k": 2, "ffn": 8, "shared": 1, "capacity": 1.5)"), 6, true);
  const Graph& g = *m.graph;
  ASSERT_EQ(m.aux_losses.size(), 1u);
  EXPECT_EQ(g.nodes()[size_t(g.values()[size_t(g.loss())].producer)].name, "loss.plus_aux.0");
  bool expert = false;
  for (const auto& p : g.params()) expert = expert || p.name == "mix.experts.2.up_proj.weight";
  EXPECT_TRUE(expert);
  try {
    (void)build_model(net(R"("experts": 2, "top_k": 3, "ffn": 8)"), 2, true);
    ADD_FAILURE() << "top_k 3 of 2 experts accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'top_k' 3 is more than 'experts' 2"), std::string::npos) << e.what();
  }
  fs::remove(path);
}

#include <nlohmann/json.hpp>

#include "run_command.h"

// summary.json reports each layer's routing over the run: 3 steps of 4 x 16 tokens, 2 experts each.
TEST(MoeFamily, SummaryReportsLoad) {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / ("sat_moe_run_" + std::to_string(getpid()));
  fs::remove_all(out);
  const auto r = sat::test::run_command(std::string(SAT_BINARY) +
                                        " train --model moe:layers=2,heads=2,width=16,ffn=16,experts=4,top_k=2,"
                                        "capacity=1,context=16,vocab=64 --data synthetic --batch 4 --steps 3 "
                                        "--threads 1 --eval off --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const auto s = nlohmann::json::parse(std::ifstream(out / "summary.json"));
  ASSERT_TRUE(s.contains("moe_load")) << s.dump();
  const auto& L = s["moe_load"]["model.layers.1.mlp"];
  EXPECT_EQ(L["routed"].get<int64_t>(), 3 * 4 * 16 * 2);
  int64_t kept = 0;
  for (const auto& n : L["tokens_per_expert"]) {
    EXPECT_LE(n.get<int64_t>(), 3 * 32);  // capacity ceil(64 * 2 / 4) per step
    kept += n.get<int64_t>();
  }
  EXPECT_EQ(kept + L["dropped"].get<int64_t>(), L["routed"].get<int64_t>());
  fs::remove_all(out);
}
