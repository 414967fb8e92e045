#include "nn/layers/layernorm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cpu/bf16.h"
#include "backend/cpu/cpu_features.h"

namespace sat {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements
}

LayerNorm::LayerNorm(int64_t dim, float eps, bool sequence_parallel)
    : dim_(dim), eps_(eps), sequence_parallel_(sequence_parallel) {
  SAT_CHECK(dim > 0, "LayerNorm: dim must be positive, got ", dim);
  SAT_CHECK(eps >= 0.0f, "LayerNorm: eps must be >= 0, got ", eps);
}

void LayerNorm::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 1, "LayerNorm ", s.name, ": expected 1 input, got ", s.inputs.size());
  const TensorSpec& x = s.inputs[0];
  SAT_CHECK(x.dtype == s.act && x.shape.nd >= 1 && x.shape[-1] == dim_, "LayerNorm ", s.name,
            ": expected an ", dtype_name(s.act), " input [..., ", dim_, "], got ", dtype_name(x.dtype), " ",
            x.shape.str());
  s.set_output(x.shape, s.act);
  ParamShard sh;
  sh.partial_grad = sequence_parallel_;
  s.param("weight", {dim_}, ParamInit::ones(), sh);  // slot 0
  s.param("bias", {dim_}, ParamInit::zeros(), sh);   // slot 1
  const int64_t rows = x.shape.numel() / dim_;
  s.save({rows});  // saved 0: mean [rows]
  s.save({rows});  // saved 1: rstd [rows]
  if (s.device == Device::cpu && s.act == DType::bf16 && s.bf16_native) {
    s.scratch_forward({2 * dim_});  // the weight and bias widened from their bf16 copy
    s.scratch_backward({dim_});     // the weight widened
  }
  if (s.device == Device::cuda) {
    const int64_t chunks = grad_chunks(rows);
    s.scratch_backward({chunks, dim_});  // scratch_bwd 0: partial dweight per row chunk
    s.scratch_backward({chunks, dim_});  // scratch_bwd 1: partial dbias per row chunk
  }
  const double n = double(x.shape.numel());
  s.flops_fwd = 7.0 * n;
  s.flops_bwd = 12.0 * n;
}

// Activations in float32, or bf16 under native bf16 (read widened, the statistics and the
// arithmetic in float32, written rounded once).
bool LayerNorm::bf16_native_cpu() const { return cpu::bf16_native(); }

void LayerNorm::forward(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) return forward_as<cpu::StoreBf16>(c);
  forward_as<cpu::StoreF32>(c);
}

void LayerNorm::backward(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) return backward_as<cpu::StoreBf16>(c);
  backward_as<cpu::StoreF32>(c);
}

void LayerNorm::backward_input(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) return input_grad_as<cpu::StoreBf16>(c);
  input_grad_as<cpu::StoreF32>(c);
}

template <class L>
void LayerNorm::forward_as(LayerCtx& c) {
  using T = typename L::T;
  const int64_t D = dim_, rows = c.in[0].numel() / D;
  const T* x = static_cast<const T*>(c.in[0].ptr);  // [rows, D]
  const float* w = c.params[0].f32();  // [D]
  const float* b = c.params[1].f32();  // [D]
  if constexpr (std::is_same_v<T, uint16_t>) {  // native bf16: from the parameters' bf16 copy
    float* p = c.scratch[0].f32();
    cpu::to_f32(c.params_lp[0], p, false);
    cpu::to_f32(c.params_lp[1], p + D, false);
    w = p, b = p + D;
  }
  T* y = static_cast<T*>(c.out.ptr);   // [rows, D]
  float* mean = c.saved[0].f32();      // [rows]
  float* rstd = c.saved[1].f32();      // [rows]
  const float eps = eps_;
#pragma omp parallel for schedule(static) if (rows * D > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * D;
    T* yr = y + r * D;
    // Two passes (mean, then the mean of squared deviations): no cancellation for rows with a
    // large mean and a small spread.
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < D; ++j) sum += L::ld(xr, j);
    const float m = sum / float(D);
    float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
    for (int64_t j = 0; j < D; ++j) {
      const float d = L::ld(xr, j) - m;
      sq += d * d;
    }
    const float rs = 1.0f / std::sqrt(sq / float(D) + eps);
    mean[r] = m;
    rstd[r] = rs;
#pragma omp simd
    for (int64_t j = 0; j < D; ++j) L::st(yr, j, (L::ld(xr, j) - m) * rs * w[j] + b[j]);
  }
}

// With xhat = (x - mean) rstd and g = dy * weight (per row, means over the D features):
//   dx = rstd (g - mean(g) - xhat mean(g xhat))
//   dweight = sum_rows dy xhat,  dbias = sum_rows dy
template <class L>
void LayerNorm::backward_as(LayerCtx& c) {
  input_grad_as<L>(c);
  param_grads_as<L>(c);
}

template <class L>
void LayerNorm::input_grad_as(LayerCtx& c) {
  using T = typename L::T;
  const int64_t D = dim_, rows = c.in[0].numel() / D;
  const T* x = static_cast<const T*>(c.in[0].ptr);  // [rows, D]
  const float* w = c.params[0].f32();                // [D]
  if constexpr (std::is_same_v<T, uint16_t>) {  // native bf16: from the parameter's bf16 copy
    cpu::to_f32(c.params_lp[0], c.scratch[0].f32(), false);
    w = c.scratch[0].f32();
  }
  const T* dy = static_cast<const T*>(c.dout.ptr);  // [rows, D]
  const float* mean = c.saved[0].f32();   // [rows]
  const float* rstd = c.saved[1].f32();   // [rows]

  if (c.din[0].defined()) {
    T* dx = static_cast<T*>(c.din[0].ptr);  // [rows, D]
#pragma omp parallel for schedule(static) if (rows * D > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * D;
      const T* dyr = dy + r * D;
      T* dxr = dx + r * D;
      const float m = mean[r], rs = rstd[r];
      float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t j = 0; j < D; ++j) {
        const float g = L::ld(dyr, j) * w[j];
        sg += g;
        sgx += g * (L::ld(xr, j) - m) * rs;
      }
      const float mg = sg / float(D), mgx = sgx / float(D);
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) {
        const float xh = (L::ld(xr, j) - m) * rs;
        L::st(dxr, j, rs * (L::ld(dyr, j) * w[j] - mg - xh * mgx));
      }
    }
  }

}

// Parameter gradients: sums over rows. Parallel over blocks of features so each thread owns
// its outputs (no race, fixed order); double accumulators.
template <class L>
void LayerNorm::param_grads_as(LayerCtx& c) {
  using T = typename L::T;
  const int64_t D = dim_, rows = c.in[0].numel() / D;
  const T* x = static_cast<const T*>(c.in[0].ptr);  // [rows, D]
  const T* dy = static_cast<const T*>(c.dout.ptr);  // [rows, D]
  const float* mean = c.saved[0].f32();             // [rows]
  const float* rstd = c.saved[1].f32();             // [rows]
  float* dw = c.grads[0].f32();  // [D]
  float* db = c.grads[1].f32();  // [D]
  const bool acc_w = c.accumulate[0], acc_b = c.accumulate[1];
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (D + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * D > kParallelMin && nblocks > 1)
  for (int64_t bi = 0; bi < nblocks; ++bi) {
    const int64_t c0 = bi * kBlock, n = std::min(kBlock, D - c0);
    double sw[kBlock] = {}, sb[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * D + c0;
      const T* dyr = dy + r * D + c0;
      const float m = mean[r], rs = rstd[r];
      for (int64_t j = 0; j < n; ++j) {
        const float g = L::ld(dyr, j);
        sw[j] += double(g * ((L::ld(xr, j) - m) * rs));
        sb[j] += double(g);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      dw[c0 + j] = float((acc_w ? double(dw[c0 + j]) : 0.0) + sw[j]);
      db[c0 + j] = float((acc_b ? double(db[c0 + j]) : 0.0) + sb[j]);
    }
  }
}

}  // namespace sat
