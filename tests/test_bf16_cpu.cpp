// bf16 on the CPU engine (nn/bf16_cpu.h): each layer kind under the bf16 wrapper, given
// the same inputs, parameters and output gradient as its float32 self, matches the
// float32 results within bf16's tolerance (relative norm error <= 1e-2; bf16 keeps 8
// significant bits, a relative rounding of 2^-9 per value), writes no buffer out of
// bounds, and rounds: its bf16 outputs differ from float32 (a wrapper that passed float32
// through would not). The engine-level checks (memory plan, training) are below.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <memory>

#include "backend/cpu/bf16.h"
#include "backend/cpu/blas.h"
#include "backend/cpu/cpu_features.h"
#include "nn/graph.h"
#include "core/rng.h"
#include "data/dataset.h"
#include "nn/bf16_cpu.h"
#include "nn/engine.h"
#include "nn/models.h"
#include "train/trainer.h"
#include "nn/layers/activation.h"
#include "nn/layers/attention.h"
#include "nn/layers/batchnorm.h"
#include "nn/layers/conv2d.h"
#include "nn/layers/cross_entropy.h"
#include "nn/layers/elementwise.h"
#include "nn/layers/embedding.h"
#include "nn/layers/layernorm.h"
#include "nn/layers/linear.h"
#include "nn/layers/pool.h"
#include "op_harness.h"

namespace {

using sat::DType;
using sat::Layer;
using sat::LayerCtx;
using sat::LayerSetup;
using sat::Shape;
using sat::Tensor;
using sat::TensorSpec;
using sat::test::Guarded;

TEST(Bf16Convert, RoundsToNearestEvenAndKeepsSpecialValues) {
  using sat::cpu::round_bf16;
  EXPECT_EQ(round_bf16(1.0f), 1.0f);
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256), 1.0f);                   // a tie: to even (1.0)
  EXPECT_EQ(round_bf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);      // a tie: to even (1 + 2^-6)
  EXPECT_EQ(round_bf16(1.0f + 1.0f / 256 + 1e-6f), 1.0f + 2.0f / 256);  // above the tie: up
  EXPECT_EQ(round_bf16(-3.0f), -3.0f);
  EXPECT_TRUE(std::isinf(round_bf16(INFINITY)));
  EXPECT_TRUE(std::isnan(round_bf16(NAN)));
  EXPECT_TRUE(std::isinf(round_bf16(3.4e38f)));  // past bf16's largest finite value (3.39e38)
  EXPECT_EQ(round_bf16(1e-40f) > 0, true);       // subnormals stay (no flush to zero)
}

// One layer's call, on buffers laid out as its setup declares.
struct Rig {
  Rig(Layer& l, DType act, const std::vector<TensorSpec>& inputs, bool native = false) : layer(l) {
    s.name = "t";
    s.act = act;
    s.bf16_native = native;
    for (const TensorSpec& t : inputs) s.inputs.push_back({t.shape, t.dtype == DType::f32 ? act : t.dtype});
    l.setup(s);
    for (const TensorSpec& t : s.inputs) {
      c.in.push_back(make(t));
      c.din.push_back(t.dtype == act ? make(t) : Tensor(nullptr, t.shape, t.dtype));
    }
    c.out = make(s.output);
    c.dout = make(s.output);
    for (auto& p : s.params) c.params.push_back(make(p.spec)), c.grads.push_back(make(p.spec));
    // bf16: the store's low-precision copy, which the wrapper reads (c.params stay NaN: a
    // read of the float32 parameters shows)
    for (size_t k = 0; k < s.params.size(); ++k)
      c.params_lp.push_back(act == DType::f32 ? c.params[k] : make({s.params[k].spec.shape, act}));
    if (act != DType::f32)
      for (auto& t : c.params) sat::test::fill_nan(t);
    c.accumulate.assign(s.params.size(), false);
    for (auto& st : s.states) c.states.push_back(make(st.spec));
    for (auto& t : s.saved) c.saved.push_back(make(t));
    for (auto& t : s.scratch_fwd) fwd.push_back(make(t));
    for (auto& t : s.scratch_bwd) bwd.push_back(make(t));
    c.seed = 12345;
  }
  Tensor make(const TensorSpec& t) {
    bufs.push_back(std::make_unique<Guarded>(t.bytes()));
    std::memset(bufs.back()->data(), 0, t.bytes());
    return Tensor(bufs.back()->data(), t.shape, t.dtype);
  }
  static void put(const Tensor& t, const std::vector<float>& v) {
    if (t.dtype == DType::i32) for (size_t k = 0; k < v.size(); ++k) t.i32()[k] = int32_t(v[k]);
    else sat::cpu::from_f32(v.data(), t);
  }
  static std::vector<float> get(const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    sat::cpu::to_f32(t, v.data(), false);
    return v;
  }
  void run() {  // scratch starts as NaN: a float32 copy the wrapper did not make shows
    for (auto& t : fwd) sat::test::fill_nan(t);
    c.scratch = fwd;
    layer.forward(c);
    for (auto& t : bwd) sat::test::fill_nan(t);
    c.scratch = bwd;
    layer.backward(c);
  }
  bool intact() const {
    for (auto& b : bufs)
      if (!b->intact()) return false;
    return true;
  }
  Layer& layer;
  LayerSetup s;
  LayerCtx c;
  std::vector<std::unique_ptr<Guarded>> bufs;
  std::vector<Tensor> fwd, bwd;
};

double rel_error(const std::vector<float>& a, const std::vector<float>& ref) {
  double d = 0, r = 0;
  for (size_t k = 0; k < ref.size(); ++k) d += double(a[k] - ref[k]) * (a[k] - ref[k]), r += double(ref[k]) * ref[k];
  return std::sqrt(d) / std::max(std::sqrt(r), 1e-30);
}

struct Case {
  const char* name;
  std::function<std::unique_ptr<Layer>()> make;
  std::vector<TensorSpec> inputs;
  int64_t int_high = 0;  // i32 inputs: uniform in [0, int_high)
};

// How the bf16 side runs: the layer under the conversion wrapper, or its native bf16
// kernels (LayerSetup::bf16_native). Either reads the parameters' bf16 copy only.
enum class Low { wrapper, native };

// Random inputs, parameters and output gradient, the same for both precisions; the
// reference is the layer in float32 (ref_mode: the wrapper's bf16, to compare the native
// kernels with the conversion path).
void check(const Case& k, Low mode = Low::wrapper, bool ref_wrapped = false) {
  SCOPED_TRACE(k.name);
  auto ref_layer = ref_wrapped ? sat::bf16_on_cpu(k.make()) : k.make();
  auto low_layer = mode == Low::wrapper ? sat::bf16_on_cpu(k.make()) : k.make();
  Rig ref(*ref_layer, ref_wrapped ? DType::bf16 : DType::f32, k.inputs),
      low(*low_layer, DType::bf16, k.inputs, mode != Low::wrapper);
  sat::Rng rng(7);
  auto random = [&](const Tensor& t, bool ints) {
    std::vector<float> v(size_t(t.numel()));
    for (float& x : v) x = ints ? float(rng.below(uint64_t(k.int_high))) : rng.normal();
    return v;
  };
  for (size_t i = 0; i < ref.c.in.size(); ++i) {
    const auto v = random(ref.c.in[i], ref.c.in[i].dtype == DType::i32);
    Rig::put(ref.c.in[i], v), Rig::put(low.c.in[i], v);
  }
  for (size_t p = 0; p < ref.c.params.size(); ++p) {
    auto v = random(ref.c.params[p], false);
    for (float& x : v) x *= 0.5f;
    Rig::put(ref.c.params_lp[p], v), Rig::put(low.c.params_lp[p], v);  // bf16: rounded (f32: params_lp is params)
  }
  for (size_t p = 0; p < ref.c.states.size(); ++p) {  // BatchNorm's running variance: ones
    const std::vector<float> v(size_t(ref.c.states[p].numel()), p == 1 ? 1.0f : 0.0f);
    if (ref.c.states[p].dtype == DType::f32) Rig::put(ref.c.states[p], v), Rig::put(low.c.states[p], v);
  }
  const auto g = random(ref.c.dout, false);
  Rig::put(ref.c.dout, g), Rig::put(low.c.dout, g);
  ref.run();
  low.run();
  EXPECT_TRUE(low.intact()) << "a buffer was written out of bounds";
  const auto out = Rig::get(low.c.out), ref_out = Rig::get(ref.c.out);
  EXPECT_LE(rel_error(out, ref_out), 1e-2) << "output";
  std::printf("[ bf16     ] %-26s output %.1e", k.name, rel_error(out, ref_out));
  for (size_t i = 0; i < ref.c.din.size(); ++i)
    if (ref.c.din[i].ptr) std::printf("  din%zu %.1e", i, rel_error(Rig::get(low.c.din[i]), Rig::get(ref.c.din[i])));
  for (size_t p = 0; p < ref.c.grads.size(); ++p)
    std::printf("  grad%zu %.1e", p, rel_error(Rig::get(low.c.grads[p]), Rig::get(ref.c.grads[p])));
  std::printf("\n");
  if (low.c.out.dtype == DType::bf16 && !ref_wrapped) {
    EXPECT_GT(rel_error(out, ref_out), 0) << "the bf16 output equals float32's: nothing was rounded";
    for (float x : out) ASSERT_EQ(x, sat::cpu::round_bf16(x)) << "an output that is not a bf16 value";
  }
  for (size_t i = 0; i < ref.c.din.size(); ++i)
    if (ref.c.din[i].ptr) {
      EXPECT_LE(rel_error(Rig::get(low.c.din[i]), Rig::get(ref.c.din[i])), 1e-2) << "din " << i;
    }
  for (size_t p = 0; p < ref.c.grads.size(); ++p)
    EXPECT_LE(rel_error(Rig::get(low.c.grads[p]), Rig::get(ref.c.grads[p])), 1e-2) << "grad " << p;
}

TEST(Bf16Cpu, EveryLayerKindMatchesFloat32WithinBf16Tolerance) {
  sat::cpu::set_num_threads(2);
  const DType f = DType::f32, i = DType::i32;
  const std::vector<Case> cases = {
      {"Linear", [] { return std::make_unique<sat::Linear>(48, 40); }, {{Shape{6, 48}, f}}},
      {"Conv2d", [] { return std::make_unique<sat::Conv2d>(4, 8, 3, 1, 1); }, {{Shape{2, 4, 9, 9}, f}}},
      {"Conv2d stride 2, no bias", [] { return std::make_unique<sat::Conv2d>(8, 16, 3, 2, 1, false); },
       {{Shape{2, 8, 10, 10}, f}}},
      {"BatchNorm2d", [] { return std::make_unique<sat::BatchNorm2d>(6); }, {{Shape{4, 6, 5, 5}, f}}},
      {"LayerNorm", [] { return std::make_unique<sat::LayerNorm>(32); }, {{Shape{3, 5, 32}, f}}},
      {"ReLU", [] { return std::make_unique<sat::ReLU>(); }, {{Shape{7, 33}, f}}},
      {"GELU", [] { return std::make_unique<sat::GELU>(); }, {{Shape{7, 33}, f}}},
      {"SiLU", [] { return std::make_unique<sat::SiLU>(); }, {{Shape{7, 33}, f}}},
      {"Add", [] { return std::make_unique<sat::Add>(); }, {{Shape{5, 12}, f}, {Shape{5, 12}, f}}},
      {"Flatten", [] { return std::make_unique<sat::Flatten>(); }, {{Shape{3, 2, 4, 4}, f}}},
      {"Dropout", [] { return std::make_unique<sat::Dropout>(0.25f); }, {{Shape{6, 40}, f}}},
      {"MaxPool2d", [] { return std::make_unique<sat::MaxPool2d>(2); }, {{Shape{2, 3, 8, 8}, f}}},
      {"AdaptiveAvgPool2d", [] { return std::make_unique<sat::AdaptiveAvgPool2d>(1, 1); }, {{Shape{2, 5, 4, 4}, f}}},
      {"Embedding", [] { return std::make_unique<sat::Embedding>(50, 16); }, {{Shape{4, 7}, i}}, 50},
      {"GPTEmbedding", [] { return std::make_unique<sat::GPTEmbedding>(50, 16, 24); }, {{Shape{2, 9}, i}}, 50},
      {"CausalSelfAttention", [] { return std::make_unique<sat::CausalSelfAttention>(2); }, {{Shape{2, 9, 48}, f}}},
      {"CrossEntropy", [] { return std::make_unique<sat::CrossEntropy>(); }, {{Shape{12, 20}, f}, {Shape{12}, i}}, 20},
  };
  for (const Case& k : cases) check(k);
}

// ---- native bf16 kernels (AVX512-BF16 and oneDNN) ------------------------------------

bool native_or_skip_message(std::string& why) {
  const auto& f = sat::cpu::cpu_features();
  if (std::getenv("SAT_BF16") && std::string(std::getenv("SAT_BF16")) == "fallback")
    why = "SAT_BF16=fallback is set: the native bf16 kernels are off";
  else if (!sat::cpu::bf16_native())
    why = "this CPU (" + f.describe() + ") or build has no native bf16 path (AVX512-BF16 and oneDNN)";
  return why.empty();
}

#define SKIP_WITHOUT_NATIVE_BF16()                               \
  do {                                                           \
    std::string why;                                             \
    if (!native_or_skip_message(why)) GTEST_SKIP() << why;       \
  } while (0)

std::vector<Case> native_cases() {
  const DType f = DType::f32;
  return {
      {"Linear", [] { return std::make_unique<sat::Linear>(48, 40); }, {{Shape{6, 48}, f}}},
      {"Linear 3-D input, no bias", [] { return std::make_unique<sat::Linear>(64, 96, false); }, {{Shape{2, 9, 64}, f}}},
      {"Linear wide", [] { return std::make_unique<sat::Linear>(128, 512); }, {{Shape{4, 16, 128}, f}}},
      {"Conv2d", [] { return std::make_unique<sat::Conv2d>(4, 8, 3, 1, 1); }, {{Shape{2, 4, 9, 9}, f}}},
      {"Conv2d stride 2, no bias", [] { return std::make_unique<sat::Conv2d>(8, 16, 3, 2, 1, false); },
       {{Shape{2, 8, 10, 10}, f}}},
      {"Conv2d 1x1", [] { return std::make_unique<sat::Conv2d>(32, 64, 1); }, {{Shape{3, 32, 6, 6}, f}}},
      {"Conv2d 32->64 3x3", [] { return std::make_unique<sat::Conv2d>(32, 64, 3, 1, 1); }, {{Shape{4, 32, 14, 14}, f}}},
      {"Conv2d 1->32 5x5", [] { return std::make_unique<sat::Conv2d>(1, 32, 5, 1, 2); }, {{Shape{4, 1, 28, 28}, f}}},
      {"ReLU", [] { return std::make_unique<sat::ReLU>(); }, {{Shape{7, 33}, f}}},
      {"Add", [] { return std::make_unique<sat::Add>(); }, {{Shape{5, 12}, f}, {Shape{5, 12}, f}}},
      {"Flatten", [] { return std::make_unique<sat::Flatten>(); }, {{Shape{3, 2, 4, 4}, f}}},
      {"BatchNorm2d", [] { return std::make_unique<sat::BatchNorm2d>(6); }, {{Shape{4, 6, 5, 5}, f}}},
      {"MaxPool2d", [] { return std::make_unique<sat::MaxPool2d>(2); }, {{Shape{2, 3, 8, 8}, f}}},
      {"LayerNorm", [] { return std::make_unique<sat::LayerNorm>(32); }, {{Shape{3, 5, 32}, f}}},
      {"GELU", [] { return std::make_unique<sat::GELU>(); }, {{Shape{7, 33}, f}}},
      {"SiLU", [] { return std::make_unique<sat::SiLU>(); }, {{Shape{7, 33}, f}}},
      {"MaxPool2d overlapping", [] { return std::make_unique<sat::MaxPool2d>(3, 2, 1); }, {{Shape{2, 3, 9, 9}, f}}},
  };
}

// The native kernels (oneDNN's bf16 primitives, float32 accumulation) against the layers'
// float32 code: outputs, input gradients and the float32 weight and bias gradients within
// bf16's tolerance, reading the parameters' bf16 copy (ctx.params stay NaN).
TEST(Bf16CpuNative, ProductsMatchFloat32WithinBf16Tolerance) {
  SKIP_WITHOUT_NATIVE_BF16();
  sat::cpu::set_num_threads(2);
  for (const Case& k : native_cases()) check(k, Low::native);
}

// The native kernels and the conversion path (SAT_BF16=fallback's) agree within bf16's
// tolerance: both are bf16 operands with float32 accumulation.
TEST(Bf16CpuNative, AgreesWithTheConversionPath) {
  SKIP_WITHOUT_NATIVE_BF16();
  sat::cpu::set_num_threads(2);
  for (const Case& k : native_cases()) check(k, Low::native, /*ref_wrapped=*/true);
}

// A second backward with accumulate set adds the same float32 gradients: twice the first.
TEST(Bf16CpuNative, GradientsAccumulate) {
  SKIP_WITHOUT_NATIVE_BF16();
  sat::cpu::set_num_threads(2);
  for (const Case& k : native_cases()) {
    SCOPED_TRACE(k.name);
    auto layer = k.make();
    Rig r(*layer, DType::bf16, k.inputs, true);
    sat::Rng rng(3);
    auto fill = [&](const Tensor& t, float scale) {
      std::vector<float> v(size_t(t.numel()));
      for (float& x : v) x = scale * rng.normal();
      Rig::put(t, v);
    };
    for (auto& t : r.c.in) fill(t, 1);
    for (auto& t : r.c.params_lp) fill(t, 0.5f);
    fill(r.c.dout, 1);
    r.run();
    std::vector<std::vector<float>> once;
    for (auto& gt : r.c.grads) once.push_back(Rig::get(gt));
    r.c.accumulate.assign(r.c.grads.size(), true);
    r.c.scratch = r.bwd;
    layer->backward(r.c);
    EXPECT_TRUE(r.intact());
    for (size_t p = 0; p < once.size(); ++p) {
      auto twice = Rig::get(r.c.grads[p]);
      for (float& x : once[p]) x *= 2;
      EXPECT_LE(rel_error(twice, once[p]), 1e-6) << "grad " << p;
    }
  }
}

// Which layers the Graph wraps: under bf16 on a CPU with AVX512-BF16, the products that
// read no data input take their native kernels (no wrapper); SAT_BF16=fallback wraps all.
TEST(Bf16CpuNative, GraphWrapsOnlyWhatHasNoNativeKernel) {
  SKIP_WITHOUT_NATIVE_BF16();
  auto build = [] {
    auto g = std::make_unique<sat::Graph>(true, DType::bf16, sat::Device::cpu);
    int x = g->input("x", Shape{2, 3, 8, 8});
    x = g->add<sat::Conv2d>("c1", {x}, 3, 8, 3, 1, 1);
    x = g->add<sat::ReLU>("r1", {x});
    x = g->add<sat::Conv2d>("c2", {x}, 8, 8, 3, 1, 1);
    x = g->add<sat::MaxPool2d>("mp", {x}, 2);
    x = g->add<sat::AdaptiveAvgPool2d>("p", {x}, 4, 4);
    x = g->add<sat::Flatten>("f", {x});
    g->add<sat::Linear>("fc", {x}, 8 * 4 * 4, 10);
    return g;
  };
  auto wrapped = [](const sat::Graph& g, const std::string& name) {
    for (const auto& n : g.nodes())
      if (n.name == name) return &n.layer->unwrapped() != n.layer.get();
    ADD_FAILURE() << "no node " << name;
    return false;
  };
  {
    auto g = build();
    EXPECT_TRUE(wrapped(*g, "c1")) << "reads the data input (float32 from the loader)";
    EXPECT_TRUE(wrapped(*g, "p")) << "no native bf16 kernel";
    for (const char* n : {"r1", "c2", "mp", "f", "fc"}) EXPECT_FALSE(wrapped(*g, n)) << n;
  }
  setenv("SAT_BF16", "fallback", 1);
  auto g = build();
  unsetenv("SAT_BF16");
  for (const char* n : {"c1", "r1", "c2", "p", "f", "fc"}) EXPECT_TRUE(wrapped(*g, n)) << n;
}

TEST(Bf16CpuNative, BadSatBf16IsAnErrorNamingIt) {
  setenv("SAT_BF16", "fast", 1);
  try {
    sat::cpu::bf16_native();
    ADD_FAILURE() << "no error";
  } catch (const sat::Error& e) {
    EXPECT_NE(std::string(e.what()).find("SAT_BF16"), std::string::npos) << e.what();
  }
  unsetenv("SAT_BF16");
}

// ---- the engine and the trainer in bf16 ---------------------------------------------

sat::TrainConfig config(int64_t batch, sat::Precision p, int steps) {
  sat::TrainConfig cfg;
  cfg.batch = batch;
  cfg.steps = steps;
  cfg.precision = p;
  cfg.optim.name = "adamw";
  cfg.optim.lr = 1e-3f;
  cfg.evaluate = false;
  cfg.progress = 0;
  return cfg;
}

// The plan is the memory a bf16 step really takes (to the byte: the arena is the plan),
// and the activations between layers and their gradients take half the bytes of float32;
// the float32 copies the wrapper works on are one layer's at a time (scratch).
TEST(Bf16Cpu, MemoryPlanIsExactAndKeptActivationsTakeHalf) {
  sat::cpu::set_num_threads(2);
  for (std::string model : {"resnet18", "gpt-mini"})
    for (int64_t batch : {2, 16}) {
      SCOPED_TRACE(model + " batch " + std::to_string(batch));
      const auto mc = sat::model_config(model);
      auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
      const auto f = sat::Trainer::plan(mc, config(batch, sat::Precision::fp32, 1), *data.train, nullptr);
      const auto cfg = config(batch, sat::Precision::bf16, 1);
      const auto b = sat::Trainer::plan(mc, cfg, *data.train, nullptr);
      sat::Trainer t(mc, cfg, *data.train, nullptr);
      const auto r = t.run();
      EXPECT_EQ(r.predicted_memory_bytes, b.total());
      EXPECT_LE(r.peak_memory_bytes, b.total());
      EXPECT_GE(double(r.peak_memory_bytes), 0.98 * double(b.total()));
      EXPECT_TRUE(std::isfinite(r.final_train_loss));
      using K = sat::MemKind;
      for (K k : {K::activations, K::activation_grads}) {  // (saved: mostly f32 statistics, kept f32)
        const double ratio = double(b.by_kind[size_t(k)]) / double(f.by_kind[size_t(k)]);
        EXPECT_GE(ratio, 0.45) << sat::mem_kind_name(k);
        EXPECT_LE(ratio, 0.56) << sat::mem_kind_name(k);
      }
      // f32 master weights, gradients, optimizer state, and the bf16 copy of the parameters
      // the layers read: half the master's bytes, laid out alike
      EXPECT_EQ(b.by_kind[size_t(K::lp_params)] * 2, b.by_kind[size_t(K::parameters)]);
      EXPECT_EQ(f.by_kind[size_t(K::lp_params)], 0u);
      EXPECT_EQ(b.persistent, f.persistent + b.by_kind[size_t(K::lp_params)]);
      // Where activations dominate the peak, bf16 lowers it. At batch 2 the parameters
      // outweigh the activations saved: bf16 keeps a bf16 copy of them beside the float32
      // master (half its bytes) and widens a layer's copy into float32 scratch while the
      // layer runs (gpt-mini's embedding table too); ResNet-18's peak is in layer 4's
      // backward, among its weights, their float32 copies and Winograd's transformed
      // weights. bf16 planned 244.0 MiB against 221.3 for ResNet-18, 96.7 against 93.5 for
      // gpt-mini (like mlp, README "Mixed precision").
      if (batch >= 16) {
        EXPECT_LT(b.total(), f.total());
      }
      std::printf("[ bf16     ] %-8s batch %2lld: fp32 plan %6.1f MiB, bf16 plan %6.1f MiB (peak %6.1f), "
                  "activations %.3f, their gradients %.3f of fp32's\n",
                  model.c_str(), (long long)batch, f.total() / 1048576.0, b.total() / 1048576.0,
                  r.peak_memory_bytes / 1048576.0,
                  double(b.by_kind[size_t(K::activations)]) / double(f.by_kind[size_t(K::activations)]),
                  double(b.by_kind[size_t(K::activation_grads)]) / double(f.by_kind[size_t(K::activation_grads)]));
    }
}

// A bf16 run of gpt-mini follows the float32 run from the same initial weights: every
// step's loss within 2% of it, and not identical to it. (convnet's curve is checked by
// its accuracy after an epoch, test_learning.cpp: its first steps with AdamW amplify
// any difference, bf16 ended 10% apart from float32 at step 8 of 20, both falling fast.)
TEST(Bf16Cpu, LossFollowsFloat32) {
  sat::cpu::set_num_threads(2);
  for (auto [model, batch, steps] : {std::tuple{"gpt-mini", 4, 12}}) {
    SCOPED_TRACE(model);
    const auto mc = sat::model_config(model);
    auto data = sat::open_dataset("synthetic", sat::data_options_for(mc, 0));
    sat::Trainer tf(mc, config(batch, sat::Precision::fp32, steps), *data.train, nullptr);
    const auto f = tf.run().losses;
    sat::Trainer tb(mc, config(batch, sat::Precision::bf16, steps), *data.train, nullptr);
    const auto b = tb.run().losses;
    ASSERT_EQ(f.size(), b.size());
    double worst = 0;
    bool differ = false;
    for (size_t k = 0; k < f.size(); ++k) {
      worst = std::max(worst, std::fabs(b[k] - f[k]) / std::fabs(f[k]));
      differ = differ || b[k] != f[k];
    }
    EXPECT_LE(worst, 0.02);
    EXPECT_TRUE(differ) << "bf16 gave float32's losses exactly: nothing was rounded";
    std::printf("[ bf16     ] %-8s %zu steps: loss %.4f -> %.4f (fp32 %.4f -> %.4f), worst step %.3f%% apart\n",
                model, f.size(), b.front(), b.back(), f.front(), f.back(), 100 * worst);
  }
}

}  // namespace
