#include "nn/layers/activation.h"

#include "backend/cpu/bf16.h"
#include "backend/cpu/cpu_features.h"

namespace sat {

namespace {
constexpr int64_t kParallelMin = 1 << 15;  // below this, thread start-up costs more than it saves

void setup_unary(LayerSetup& s, const char* kind, double fwd_per_elem, double bwd_per_elem) {
  SAT_CHECK(s.inputs.size() == 1, kind, " ", s.name, ": expected 1 input, got ", s.inputs.size());
  SAT_CHECK(s.inputs[0].dtype == s.act, kind, " ", s.name, ": expected an ", dtype_name(s.act), " input, got ",
            dtype_name(s.inputs[0].dtype));
  s.set_output(s.in_shape(0), s.act);
  const double n = double(s.in_shape(0).numel());
  s.flops_fwd = fwd_per_elem * n;
  s.flops_bwd = bwd_per_elem * n;
}

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;
}  // namespace

// ---- ReLU ----

void ReLU::setup(LayerSetup& s) { setup_unary(s, "ReLU", 1, 1); }

// Native bf16 (LayerSetup::bf16_native: the tensors are bf16): on the bits. A bf16 value is
// below zero when its sign is set and it is neither a zero nor a NaN; above zero when its
// sign is clear and it is neither.
namespace {
inline bool bf16_below_zero(uint16_t h) { return (h & 0x8000u) && uint16_t(h & 0x7fffu) - 1u < 0x7f80u; }
inline bool bf16_above_zero(uint16_t h) { return !(h & 0x8000u) && uint16_t(h & 0x7fffu) - 1u < 0x7f80u; }
}  // namespace

bool ReLU::bf16_native_cpu() const { return cpu::bf16_native(); }

void ReLU::forward(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) {
    const int64_t n = c.in[0].numel();
    const uint16_t* x = cpu::bf16_bits(c.in[0]);
    uint16_t* y = cpu::bf16_bits(c.out);
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_below_zero(x[i]) ? uint16_t(0) : x[i];
    return;
  }
  const int64_t n = c.in[0].numel();
  const float* x = c.in[0].f32();
  float* y = c.out.f32();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN passes through, as in PyTorch
}

void ReLU::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  if (c.out.dtype == DType::bf16) {
    const int64_t n = c.out.numel();
    const uint16_t* y = cpu::bf16_bits(c.out);
    const uint16_t* dy = cpu::bf16_bits(c.dout);
    uint16_t* dx = cpu::bf16_bits(c.din[0]);
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t g = dy[i];
      dx[i] = bf16_above_zero(y[i]) ? g : uint16_t(0);
    }
    return;
  }
  const int64_t n = c.out.numel();
  const float* y = c.out.f32();
  const float* dy = c.dout.f32();
  float* dx = c.din[0].f32();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float g = dy[i];  // an unconditional load, so the select vectorises
    dx[i] = y[i] > 0.0f ? g : 0.0f;
  }
}

// ---- GELU (tanh approximation) ----
// With u = kBeta (x + kKappa x^3) and s = sigmoid(2u) = (1 + tanh u) / 2:
//   y  = x s
//   dy/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u' = s + 2 x s (1 - s) u',
//   u' = kBeta (1 + 3 kKappa x^2).

void GELU::setup(LayerSetup& s) { setup_unary(s, "GELU", 12, 20); }

namespace {

// y = f(x) and dx = dy g(x), elementwise over the layer's input in L's storage (float32, or
// bf16 computed in float32 and rounded once). Simd: an `omp simd` loop (off for std::erf).
template <class L, bool Simd = true, class F>
void unary_map(const LayerCtx& c, F f) {
  using T = typename L::T;
  const int64_t n = c.in[0].numel();
  const T* x = static_cast<const T*>(c.in[0].ptr);
  T* y = static_cast<T*>(c.out.ptr);
  if constexpr (Simd) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) L::st(y, i, f(L::ld(x, i)));
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) L::st(y, i, f(L::ld(x, i)));
  }
}

template <class L, bool Simd = true, class G>
void unary_grad(const LayerCtx& c, G g) {
  using T = typename L::T;
  const int64_t n = c.in[0].numel();
  const T* x = static_cast<const T*>(c.in[0].ptr);
  const T* dy = static_cast<const T*>(c.dout.ptr);
  T* dx = static_cast<T*>(c.din[0].ptr);
  if constexpr (Simd) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) L::st(dx, i, L::ld(dy, i) * g(L::ld(x, i)));
  } else {
#pragma omp parallel for schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) L::st(dx, i, L::ld(dy, i) * g(L::ld(x, i)));
  }
}

// The tanh GELU: y = x sigmoid(2u), u = beta (x + kappa x^3).
inline float gelu_tanh(float v) {
  const float u = kBeta * (v + kKappa * v * v * v);
  return v / (1.0f + vexp(-2.0f * u));
}
inline float gelu_tanh_grad(float v) {
  const float v2 = v * v;
  const float u = kBeta * (v + kKappa * v2 * v);
  const float du = kBeta * (1.0f + 3.0f * kKappa * v2);
  const float sg = 1.0f / (1.0f + vexp(-2.0f * u));
  return sg + 2.0f * v * sg * (1.0f - sg) * du;
}

// The exact GELU: y = x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2; dy/dx = Phi(x) + x phi(x),
// phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
inline float gelu_erf(float v) { return 0.5f * v * (1.0f + std::erf(v * kInvSqrt2)); }
inline float gelu_erf_grad(float v) {
  const float cdf = 0.5f * (1.0f + std::erf(v * kInvSqrt2)), pdf = kInvSqrt2Pi * std::exp(-0.5f * v * v);
  return cdf + v * pdf;
}

template <class L>
void gelu_forward(const LayerCtx& c, bool exact) {
  if (exact) return unary_map<L, false>(c, [](float v) { return gelu_erf(v); });
  unary_map<L>(c, [](float v) { return gelu_tanh(v); });
}

template <class L>
void gelu_backward(const LayerCtx& c, bool exact) {
  if (exact) return unary_grad<L, false>(c, [](float v) { return gelu_erf_grad(v); });
  unary_grad<L>(c, [](float v) { return gelu_tanh_grad(v); });
}

}  // namespace

// Activations in float32, or bf16 under native bf16 (computed in float32, rounded once).
bool GELU::bf16_native_cpu() const { return cpu::bf16_native(); }

void GELU::forward(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) return gelu_forward<cpu::StoreBf16>(c, exact_);
  gelu_forward<cpu::StoreF32>(c, exact_);
}

void GELU::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  if (c.in[0].dtype == DType::bf16) return gelu_backward<cpu::StoreBf16>(c, exact_);
  gelu_backward<cpu::StoreF32>(c, exact_);
}

// ---- SiLU ----
// With e = exp(-x) and s = sigmoid(x) = 1 / (1 + e):
//   y = x s = x / (1 + e)
//   dy/dx = s + x s (1 - s) = s (1 + x e s), with 1 - s as e s (no cancellation near s = 1).
// vexp clamps exp(-x) to exp(88) for x < -88 rather than overflowing: s stays finite there.

void SiLU::setup(LayerSetup& s) { setup_unary(s, "SiLU", 5, 8); }

namespace {
inline float silu(float v) { return v / (1.0f + vexp(-v)); }
inline float silu_grad(float v) {
  const float e = vexp(-v);
  const float sg = 1.0f / (1.0f + e);
  return sg * (1.0f + v * (e * sg));
}
}  // namespace

bool SiLU::bf16_native_cpu() const { return cpu::bf16_native(); }

void SiLU::forward(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) return unary_map<cpu::StoreBf16>(c, [](float v) { return silu(v); });
  unary_map<cpu::StoreF32>(c, [](float v) { return silu(v); });
}

void SiLU::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  if (c.in[0].dtype == DType::bf16) return unary_grad<cpu::StoreBf16>(c, [](float v) { return silu_grad(v); });
  unary_grad<cpu::StoreF32>(c, [](float v) { return silu_grad(v); });
}

}  // namespace sat
