#include "nn/layers/activation.h"

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

void ReLU::forward(LayerCtx& c) {
  const int64_t n = c.in[0].numel();
  const float* x = c.in[0].f32();
  float* y = c.out.f32();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] < 0.0f ? 0.0f : x[i];  // NaN passes through, as in PyTorch
}

void ReLU::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
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

void GELU::forward(LayerCtx& c) {
  const int64_t n = c.in[0].numel();
  const float* x = c.in[0].f32();
  float* y = c.out.f32();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float u = kBeta * (v + kKappa * v * v * v);
    y[i] = v / (1.0f + vexp(-2.0f * u));
  }
}

void GELU::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  const int64_t n = c.in[0].numel();
  const float* x = c.in[0].f32();
  const float* dy = c.dout.f32();
  float* dx = c.din[0].f32();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float v2 = v * v;
    const float u = kBeta * (v + kKappa * v2 * v);
    const float du = kBeta * (1.0f + 3.0f * kKappa * v2);
    const float sg = 1.0f / (1.0f + vexp(-2.0f * u));
    dx[i] = dy[i] * (sg + 2.0f * v * sg * (1.0f - sg) * du);
  }
}

}  // namespace sat
