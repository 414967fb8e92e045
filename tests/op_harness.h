// The shared op-test harness: runs one layer standalone on random inputs and checks
//  * backward against central finite differences of L = sum(out * w) (w random = dout),
//    element by element on a random subset, skipping kinks (where the two-sided
//    difference at eps and eps/2 disagree: ReLU at 0, a max-pool tie),
//  * that backward overwrites din and overwrites/accumulates grads as ctx.accumulate says,
//  * that no buffer is written out of bounds (sentinel guards around every buffer),
//  * that forward is deterministic for a fixed seed.
// Float32 differences with eps ~1e-2 and a relative vector-norm bound of ~1e-2:
// a wrong formula gives O(1) errors, rounding gives ~1e-4.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "nn/layer.h"

namespace sat::test {

struct InputSpec {
  Shape shape;
  DType dtype = DType::f32;
  int64_t int_low = 0, int_high = 1;  // i32 inputs: uniform integers in [int_low, int_high)
  bool check_grad = true;             // f32 inputs: check din numerically
  float scale = 1.0f;                 // f32 inputs: N(0, scale^2)
};

struct OpCheck {
  std::vector<InputSpec> inputs;
  bool training = true;
  double eps = 1e-2;
  double tol = 1e-2;       // bound on ||analytic - numeric|| / max(||analytic||, ||numeric||)
  int max_elements = 64;   // elements checked per tensor (random subset)
  float param_scale = 0.5f;  // params start at U(-s, s) around their init (ones stay near 1)
  uint64_t seed = 1;
  // Optional: fill inputs yourself after the random fill (e.g. avoid ties).
  std::function<void(std::vector<Tensor>&)> fill_inputs;
};

// Float buffer with sentinel guards on both sides.
class Guarded {
 public:
  static constexpr int kGuard = 16;
  static constexpr uint32_t kPattern = 0x7fc0dead;  // a NaN payload nobody writes
  Guarded() = default;
  explicit Guarded(size_t bytes) : words_((bytes + 3) / 4), store_(words_ + 2 * kGuard) {
    for (int i = 0; i < kGuard; ++i) { store_[size_t(i)] = kPattern; store_[kGuard + words_ + size_t(i)] = kPattern; }
  }
  void* data() { return store_.data() + kGuard; }
  bool intact() const {
    for (int i = 0; i < kGuard; ++i)
      if (store_[size_t(i)] != kPattern || store_[kGuard + words_ + size_t(i)] != kPattern) return false;
    return true;
  }
 private:
  size_t words_ = 0;
  std::vector<uint32_t> store_;
};

inline void fill_nan(const Tensor& t) {
  if (t.dtype == DType::f32)
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = std::nanf("");
}

// Runs one layer's forward/backward on guarded buffers.
class LayerRig {
 public:
  LayerRig(Layer& layer, const OpCheck& opt) : layer_(layer), opt_(opt), rng_(opt.seed) {
    s_.name = "t";
    s_.training = opt.training;
    for (auto& in : opt.inputs) s_.inputs.push_back({in.shape, in.dtype});
    layer.setup(s_);
    auto make = [&](const TensorSpec& sp) {
      bufs_.push_back(std::make_unique<Guarded>(sp.bytes()));
      return Tensor(bufs_.back()->data(), sp.shape, sp.dtype);
    };
    for (size_t i = 0; i < opt.inputs.size(); ++i) {
      const auto& in = opt.inputs[i];
      Tensor t = make({in.shape, in.dtype});
      if (in.dtype == DType::f32)
        for (int64_t k = 0; k < t.numel(); ++k) t.f32()[k] = in.scale * rng_.normal();
      else if (in.dtype == DType::i32)
        for (int64_t k = 0; k < t.numel(); ++k)
          t.i32()[k] = int32_t(in.int_low + int64_t(rng_.below(uint64_t(in.int_high - in.int_low))));
      ctx_.in.push_back(t);
      bool want = in.dtype == DType::f32 && in.check_grad && opt.training;
      ctx_.din.push_back(want ? make({in.shape, in.dtype}) : Tensor(nullptr, in.shape, in.dtype));
    }
    if (opt.fill_inputs) opt.fill_inputs(ctx_.in);
    ctx_.out = make(s_.output);
    ctx_.dout = make(s_.output);
    for (int64_t k = 0; k < ctx_.dout.numel(); ++k) ctx_.dout.f32()[k] = rng_.normal();
    for (auto& p : s_.params) {
      Tensor t = make(p.spec);
      init(t, p.init);
      ctx_.params.push_back(t);
      ctx_.grads.push_back(make(p.spec));
      ctx_.accumulate.push_back(false);
    }
    for (auto& st : s_.states) {
      Tensor t = make(st.spec);
      init_exact(t, st.init);
      ctx_.states.push_back(t);
    }
    for (auto& sp : s_.saved) ctx_.saved.push_back(make(sp));
    for (auto& sp : s_.scratch_fwd) fwd_scratch_.push_back(make(sp));
    for (auto& sp : s_.scratch_bwd) bwd_scratch_.push_back(make(sp));
    ctx_.training = opt.training;
    ctx_.seed = opt.seed * 7919 + 3;
  }

  LayerSetup& setup() { return s_; }
  LayerCtx& ctx() { return ctx_; }

  // Objective L = sum(out * dout), in double.
  double forward() {
    ctx_.scratch = fwd_scratch_;
    for (auto& t : fwd_scratch_) fill_nan(t);
    layer_.forward(ctx_);
    double L = 0;
    const float* o = ctx_.out.f32();
    const float* w = ctx_.dout.f32();
    for (int64_t k = 0; k < ctx_.out.numel(); ++k) L += double(o[k]) * double(w[k]);
    return L;
  }
  void backward() {
    ctx_.scratch = bwd_scratch_;
    for (auto& t : bwd_scratch_) fill_nan(t);
    layer_.backward(ctx_);
  }
  bool guards_intact() const {
    for (auto& b : bufs_)
      if (!b->intact()) return false;
    return true;
  }

 private:
  void init(Tensor& t, ParamInit pi) {
    float base = pi.kind == ParamInit::Kind::ones ? 1.0f : pi.kind == ParamInit::Kind::constant ? pi.scale : 0.0f;
    for (int64_t k = 0; k < t.numel(); ++k) t.f32()[k] = base + rng_.uniform(-opt_.param_scale, opt_.param_scale);
  }
  void init_exact(Tensor& t, ParamInit pi) {
    if (t.dtype != DType::f32) { std::memset(t.ptr, 0, t.bytes()); return; }
    float v = pi.kind == ParamInit::Kind::ones ? 1.0f : pi.kind == ParamInit::Kind::constant ? pi.scale : 0.0f;
    for (int64_t k = 0; k < t.numel(); ++k) t.f32()[k] = v;
  }
  Layer& layer_;
  OpCheck opt_;
  Rng rng_;
  LayerSetup s_;
  LayerCtx ctx_;
  std::vector<std::unique_ptr<Guarded>> bufs_;
  std::vector<Tensor> fwd_scratch_, bwd_scratch_;
};

// Zero-bubble split (Layer::backward_input, then backward_weight with every din unset):
// bitwise the whole backward's din and grads, backward_input leaving grads untouched and
// backward_weight writing no din.
inline void check_backward_split(Layer& layer, const OpCheck& opt) {
  ASSERT_TRUE(layer.splits_backward()) << layer.kind();
  LayerRig rig(layer, opt);
  auto& c = rig.ctx();
  rig.forward();
  rig.backward();
  auto copy = [](const std::vector<Tensor>& ts) {
    std::vector<std::vector<float>> v;
    for (auto& t : ts) v.emplace_back(t.defined() ? std::vector<float>(t.f32(), t.f32() + t.numel()) : std::vector<float>{});
    return v;
  };
  auto fill = [](const std::vector<Tensor>& ts, float x) {
    for (auto& t : ts)
      if (t.defined()) std::fill(t.f32(), t.f32() + t.numel(), x);
  };
  const auto din = copy(c.din), grads = copy(c.grads);
  fill(c.din, 5.0f), fill(c.grads, 7.0f);
  layer.backward_input(c);  // (c.scratch: still the backward's, from rig.backward())
  EXPECT_EQ(copy(c.din), din) << layer.kind() << ": backward_input's input gradients";
  for (auto& g : copy(c.grads))
    EXPECT_EQ(g, std::vector<float>(g.size(), 7.0f)) << layer.kind() << ": backward_input wrote a parameter gradient";
  std::vector<Tensor> unset;
  for (auto& d : c.din) unset.push_back(Tensor(nullptr, d.shape, d.dtype));
  std::swap(c.din, unset);
  layer.backward_weight(c);
  std::swap(c.din, unset);
  EXPECT_EQ(copy(c.grads), grads) << layer.kind() << ": backward_weight's parameter gradients";
  EXPECT_EQ(copy(c.din), din) << layer.kind() << ": backward_weight wrote an input gradient";
}

// Compares analytic and numeric gradients of one tensor; returns the relative error.
inline double check_tensor_grad(LayerRig& rig, const Tensor& x, const Tensor& g, const OpCheck& opt,
                                const std::string& what, Rng& pick) {
  std::vector<int64_t> idx;
  int64_t n = x.numel();
  if (n <= opt.max_elements)
    for (int64_t k = 0; k < n; ++k) idx.push_back(k);
  else
    for (int k = 0; k < opt.max_elements; ++k) idx.push_back(int64_t(pick.below(uint64_t(n))));
  double num2 = 0, ana2 = 0, diff2 = 0;
  int used = 0, kinks = 0;
  float* xp = x.f32();
  for (int64_t k : idx) {
    float orig = xp[k];
    auto deriv = [&](double h) {
      xp[k] = float(orig + h);
      double hp = double(xp[k]) - orig;  // the step actually taken in float32
      double lp = rig.forward();
      xp[k] = float(orig - h);
      double hm = orig - double(xp[k]);
      double lm = rig.forward();
      xp[k] = orig;
      return (lp - lm) / (hp + hm);
    };
    double d1 = deriv(opt.eps), d2 = deriv(opt.eps / 2);
    double scale = std::max({std::fabs(d1), std::fabs(d2), 1e-3});
    if (std::fabs(d1 - d2) > 0.1 * scale) { ++kinks; continue; }  // a kink between x-eps and x+eps
    double a = g.f32()[k];
    num2 += d2 * d2;
    ana2 += a * a;
    diff2 += (a - d2) * (a - d2);
    ++used;
  }
  rig.forward();  // restore outputs/saved buffers for the unperturbed input
  EXPECT_GE(used, int(idx.size()) / 2) << what << ": too many kinks (" << kinks << " of " << idx.size() << ")";
  double denom = std::max({std::sqrt(num2), std::sqrt(ana2), 1e-6});
  double rel = std::sqrt(diff2) / denom;
  EXPECT_LT(rel, opt.tol) << what << ": analytic vs finite-difference gradient, relative error " << rel
                          << " over " << used << " elements (|analytic|=" << std::sqrt(ana2)
                          << ", |numeric|=" << std::sqrt(num2) << ")";
  return rel;
}

// The full check. Returns the worst relative gradient error seen (for reporting).
inline double check_layer(Layer& layer, const OpCheck& opt) {
  LayerRig rig(layer, opt);
  auto& c = rig.ctx();
  double L0 = rig.forward();
  double L0b = rig.forward();
  EXPECT_EQ(L0, L0b) << layer.kind() << ": forward is not deterministic";
  EXPECT_TRUE(std::isfinite(L0)) << layer.kind() << ": forward produced non-finite output";
  double worst = 0;
  if (!opt.training) {
    EXPECT_TRUE(rig.guards_intact()) << layer.kind() << ": a buffer was written out of bounds";
    return 0;
  }
  // Backward must overwrite din and (accumulate=false) grads: pre-fill them with NaN.
  for (auto& d : c.din) if (d.defined()) fill_nan(d);
  for (auto& g : c.grads) fill_nan(g);
  rig.backward();
  for (size_t i = 0; i < c.din.size(); ++i)
    if (c.din[i].defined())
      for (int64_t k = 0; k < c.din[i].numel(); ++k)
        if (!std::isfinite(c.din[i].f32()[k])) {
          ADD_FAILURE() << layer.kind() << ": din[" << i << "][" << k << "] not written (or not finite)";
          break;
        }
  for (size_t p = 0; p < c.grads.size(); ++p)
    for (int64_t k = 0; k < c.grads[p].numel(); ++k)
      if (!std::isfinite(c.grads[p].f32()[k])) {
        ADD_FAILURE() << layer.kind() << ": grad of " << rig.setup().params[p].name << "[" << k << "] not written";
        break;
      }
  // Keep copies: the numeric check re-runs forward.
  std::vector<std::vector<float>> din_copy, grad_copy;
  for (auto& d : c.din) din_copy.emplace_back(d.defined() ? std::vector<float>(d.f32(), d.f32() + d.numel()) : std::vector<float>{});
  for (auto& g : c.grads) grad_copy.emplace_back(g.f32(), g.f32() + g.numel());

  Rng pick(opt.seed + 99);
  for (size_t i = 0; i < c.din.size(); ++i) {
    if (!c.din[i].defined()) continue;
    Tensor g(din_copy[i].data(), c.din[i].shape);
    worst = std::max(worst, check_tensor_grad(rig, c.in[i], g, opt, std::string(layer.kind()) + " input " + std::to_string(i), pick));
  }
  for (size_t p = 0; p < c.params.size(); ++p) {
    Tensor g(grad_copy[p].data(), c.grads[p].shape);
    worst = std::max(worst, check_tensor_grad(rig, c.params[p], g, opt, std::string(layer.kind()) + " " + rig.setup().params[p].name, pick));
  }
  // accumulate=true must add: grads start at G0, expect G0 + g.
  if (!c.grads.empty()) {
    rig.forward();
    std::vector<std::vector<float>> g0;
    for (size_t p = 0; p < c.grads.size(); ++p) {
      c.accumulate[p] = true;
      g0.emplace_back(c.grads[p].numel());
      for (int64_t k = 0; k < c.grads[p].numel(); ++k) c.grads[p].f32()[k] = g0[p][size_t(k)] = float(k % 7) - 3.0f;
    }
    rig.backward();
    for (size_t p = 0; p < c.grads.size(); ++p) {
      double err = 0, ref = 0;
      for (int64_t k = 0; k < c.grads[p].numel(); ++k) {
        double want = double(g0[p][size_t(k)]) + grad_copy[p][size_t(k)];
        err = std::max(err, std::fabs(c.grads[p].f32()[k] - want));
        ref = std::max(ref, std::fabs(want));
      }
      EXPECT_LE(err, 1e-4 * std::max(1.0, ref)) << layer.kind() << ": accumulate=true did not add into "
                                                << rig.setup().params[p].name;
      c.accumulate[p] = false;
    }
  }
  EXPECT_TRUE(rig.guards_intact()) << layer.kind() << ": a buffer was written out of bounds";
  return worst;
}

}  // namespace sat::test
