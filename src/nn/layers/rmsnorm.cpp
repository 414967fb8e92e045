#include "nn/layers/rmsnorm.h"

#include <algorithm>
#include <cmath>

namespace sat {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements
}

RMSNorm::RMSNorm(int64_t dim, float eps, bool sequence_parallel)
    : dim_(dim), eps_(eps), sequence_parallel_(sequence_parallel) {
  SAT_CHECK(dim > 0, "RMSNorm: dim must be positive, got ", dim);
  SAT_CHECK(eps >= 0.0f, "RMSNorm: eps must be >= 0, got ", eps);
}

void RMSNorm::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 1, "RMSNorm ", s.name, ": expected 1 input, got ", s.inputs.size());
  const TensorSpec& x = s.inputs[0];
  SAT_CHECK(x.dtype == s.act && x.shape.nd >= 1 && x.shape[-1] == dim_, "RMSNorm ", s.name, ": expected an ",
            dtype_name(s.act), " input [..., ", dim_, "], got ", dtype_name(x.dtype), " ", x.shape.str());
  s.set_output(x.shape, s.act);
  ParamShard sh;
  sh.partial_grad = sequence_parallel_;
  s.param("weight", {dim_}, ParamInit::ones(), sh);  // slot 0
  s.save({x.shape.numel() / dim_});                 // saved 0: rstd [rows]
  const double n = double(x.shape.numel());
  s.flops_fwd = 4.0 * n;
  s.flops_bwd = 8.0 * n;
}

void RMSNorm::forward(LayerCtx& c) {
  const int64_t D = dim_, rows = c.in[0].numel() / D;
  const float* x = c.in[0].f32();      // [rows, D]
  const float* w = c.params[0].f32();  // [D]
  float* y = c.out.f32();              // [rows, D]
  float* rstd = c.saved[0].f32();      // [rows]
  const float eps = eps_;
#pragma omp parallel for schedule(static) if (rows * D > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < D; ++j) sq += xr[j] * xr[j];
    const float rs = 1.0f / std::sqrt(sq / float(D) + eps);
    rstd[r] = rs;
    // (x * rstd) * w in this order, as PyTorch's reference computes it.
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) yr[j] = (xr[j] * rs) * w[j];
  }
}

// With xhat = x rstd and g = dy * weight (means over the D features of a row):
//   dx = rstd (g - xhat mean(g xhat)),  dweight = sum_rows dy xhat
// (LayerNorm's formula without the mean terms).
void RMSNorm::backward(LayerCtx& c) {
  backward_input(c);
  param_grads(c);
}

void RMSNorm::backward_input(LayerCtx& c) {
  const int64_t D = dim_, rows = c.in[0].numel() / D;
  const float* x = c.in[0].f32();        // [rows, D]
  const float* w = c.params[0].f32();    // [D]
  const float* dy = c.dout.f32();        // [rows, D]
  const float* rstd = c.saved[0].f32();  // [rows]

  if (c.din[0].defined()) {
    float* dx = c.din[0].f32();  // [rows, D]
#pragma omp parallel for schedule(static) if (rows * D > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * D;
      const float* dyr = dy + r * D;
      float* dxr = dx + r * D;
      const float rs = rstd[r];
      float sgx = 0.0f;
#pragma omp simd reduction(+ : sgx)
      for (int64_t j = 0; j < D; ++j) sgx += dyr[j] * w[j] * xr[j] * rs;
      const float mgx = sgx / float(D);
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) dxr[j] = rs * (dyr[j] * w[j] - xr[j] * rs * mgx);
    }
  }

}

// dweight: sums over rows, parallel over blocks of features so each thread owns its
// outputs (no race, fixed order); double accumulators.
void RMSNorm::param_grads(LayerCtx& c) {
  const int64_t D = dim_, rows = c.in[0].numel() / D;
  const float* x = c.in[0].f32();        // [rows, D]
  const float* dy = c.dout.f32();        // [rows, D]
  const float* rstd = c.saved[0].f32();  // [rows]
  float* dw = c.grads[0].f32();  // [D]
  const bool acc = c.accumulate[0];
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * D > kParallelMin && nblocks > 1)
  for (int64_t bi = 0; bi < nblocks; ++bi) {
    const int64_t c0 = bi * kBlock, n = std::min(kBlock, D - c0);
    double sw[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * D + c0;
      const float* dyr = dy + r * D + c0;
      const float rs = rstd[r];
      for (int64_t j = 0; j < n; ++j) sw[j] += double(dyr[j] * (xr[j] * rs));
    }
    for (int64_t j = 0; j < n; ++j) dw[c0 + j] = float((acc ? double(dw[c0 + j]) : 0.0) + sw[j]);
  }
}

}  // namespace sat
