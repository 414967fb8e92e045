#include "nn/layers/swiglu.h"

#include "nn/layers/activation.h"

namespace sat {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements
}

void SwiGLU::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 2, "SwiGLU ", s.name, ": expected 2 inputs (gate, up), got ", s.inputs.size());
  const TensorSpec &g = s.inputs[0], &u = s.inputs[1];
  SAT_CHECK(g.dtype == s.act && u.dtype == s.act && g.shape == u.shape && g.shape.nd >= 1, "SwiGLU ", s.name,
            ": expected gate and up of one shape in ", dtype_name(s.act), ", got ", g.shape.str(), " and ",
            u.shape.str());
  s.set_output(g.shape, s.act);
  const double n = double(g.shape.numel());
  s.flops_fwd = 5.0 * n;   // exp counted as one
  s.flops_bwd = 10.0 * n;
}

void SwiGLU::forward(LayerCtx& c) {
  const int64_t n = c.in[0].numel();
  const float* g = c.in[0].f32();
  const float* u = c.in[1].f32();
  float* y = c.out.f32();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] / (1.0f + vexp(-g[i])) * u[i];
}

// With s = sigmoid(g): d up = dy g s;  d gate = dy up s (1 + g (1 - s)).
void SwiGLU::backward(LayerCtx& c) {
  const int64_t n = c.in[0].numel();
  const float* g = c.in[0].f32();
  const float* u = c.in[1].f32();
  const float* dy = c.dout.f32();
  float* dg = c.din[0].defined() ? c.din[0].f32() : nullptr;
  float* du = c.din[1].defined() ? c.din[1].f32() : nullptr;
  if (dg) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) {
      const float s = 1.0f / (1.0f + vexp(-g[i]));
      dg[i] = dy[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
  }
  if (du) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) du[i] = dy[i] * g[i] / (1.0f + vexp(-g[i]));
  }
}

}  // namespace sat
