// BatchNorm2d forward and backward. One OpenMP iteration per channel: a channel's
// statistics, output and gradients touch only that channel's planes.
// Sums are taken per plane in float (vectorisable, HW terms) and across planes in double.
// The passes over channels are separate loops so that, with synchronised statistics,
// the per-channel sums can be summed over the replicas between them.
#include "nn/layers/batchnorm.h"

#include <cmath>
#include <type_traits>

#include "backend/cpu/bf16.h"
#include "backend/cpu/cpu_features.h"

namespace sat {

// Elements below which loops stay serial (an OpenMP fork/join costs more than it saves).
namespace {
constexpr int64_t kParallelMin = 1 << 16;
}  // namespace

// Activations in float32, or bf16 under native bf16 (the arithmetic and the statistics in
// float32 either way).
bool BatchNorm2d::bf16_native_cpu() const { return cpu::bf16_native(); }

void BatchNorm2d::forward(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) return forward_as<cpu::StoreBf16>(c);
  forward_as<cpu::StoreF32>(c);
}

void BatchNorm2d::backward(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) return backward_as<cpu::StoreBf16>(c);
  backward_as<cpu::StoreF32>(c);
}

BatchNorm2d::BatchNorm2d(int64_t channels, float eps, float momentum)
    : C_(channels), eps_(eps), momentum_(momentum) {
  SAT_CHECK(channels > 0, "BatchNorm2d: channels must be positive, got ", channels);
}

void BatchNorm2d::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 1, s.name, ": BatchNorm2d takes one input, got ", s.inputs.size());
  const Shape& in = s.in_shape(0);
  SAT_CHECK(in.nd == 4 && in[1] == C_, s.name, ": BatchNorm2d expects input [B, ", C_, ", H, W], got ",
            in.str());
  B_ = in[0];
  HW_ = in[2] * in[3];
  s.param("weight", Shape{C_}, ParamInit::ones());
  s.param("bias", Shape{C_}, ParamInit::zeros());
  s.state("running_mean", Shape{C_}, ParamInit::zeros());
  s.state("running_var", Shape{C_}, ParamInit::ones());
  s.state("num_batches_tracked", Shape{}, ParamInit::zeros(), DType::i64);
  act_ = s.act;
  s.set_output(in, s.act);
  // Per-channel statistics stay f32 under every activation dtype (C floats; backward
  // needs them exact).
  s.save(Shape{C_}, DType::f32);  // saved[0]: per-channel mean used by forward (batch or running)
  s.save(Shape{C_}, DType::f32);  // saved[1]: per-channel 1/sqrt(var + eps) used by forward
  if (s.device == Device::cpu) {
    // Per-channel sums in double (plus a value count), summed over replicas under --sync-bn.
    s.scratch_forward(Shape{C_ + 1}, DType::f64);
    s.scratch_forward(Shape{C_ + 1}, DType::f64);
    s.scratch_backward(Shape{2 * C_ + 1}, DType::f64);
    if (s.act == DType::bf16 && s.bf16_native) {  // the weight and bias widened from their bf16 copy
      s.scratch_forward(Shape{2 * C_});
      s.scratch_backward(Shape{C_});
    }
  }
  const double n = double(in.numel());
  s.flops_fwd = 5.0 * n;  // two statistics passes + scale/shift
  s.flops_bwd = 7.0 * n;
}

template <class L>
void BatchNorm2d::forward_as(LayerCtx& c) {
  using T = typename L::T;
  const int64_t C = C_, B = B_, HW = HW_, n = B * HW;
  const T* x = static_cast<const T*>(c.in[0].ptr);  // [B, C, H, W]
  T* y = static_cast<T*>(c.out.ptr);
  const float* w = c.params[0].f32();
  const float* bias = c.params[1].f32();
  if constexpr (std::is_same_v<T, uint16_t>) {  // native bf16: from the parameters' bf16 copy
    float* p = c.scratch[2].f32();
    cpu::to_f32(c.params_lp[0], p, false);
    cpu::to_f32(c.params_lp[1], p + C_, false);
    w = p, bias = p + C_;
  }
  float* rm = c.states[0].f32();
  float* rv = c.states[1].f32();
  float* mean_s = c.saved[0].f32();
  float* invstd_s = c.saved[1].f32();
  const bool train = c.training;
  const bool par = B * C * HW > kParallelMin;
  // Training: per-channel sums of x, then of (x - mean)^2, each summed over the replicas
  // when statistics are synchronised (the last element carries the value count).
  double* sum = c.scratch[0].f64();  // [C + 1]
  double* sq = c.scratch[1].f64();   // [C + 1]
  double count = double(n);
  if (train) {
#pragma omp parallel for schedule(static) if (par)
    for (int64_t ch = 0; ch < C; ++ch) {
      double acc = 0;
      for (int64_t b = 0; b < B; ++b) {
        const T* p = x + (b * C + ch) * HW;
        float part = 0;
        for (int64_t j = 0; j < HW; ++j) part += L::ld(p, j);
        acc += part;
      }
      sum[ch] = acc;
    }
    sum[C] = count;
    if (c.replicas) c.replicas->sum(sum, size_t(C + 1));
    count = sum[C];
    SAT_CHECK(count > 1, "BatchNorm2d: expected more than 1 value per channel when training, got input [", B,
              ", ", C, ", ", HW, " pixels]");
#pragma omp parallel for schedule(static) if (par)
    for (int64_t ch = 0; ch < C; ++ch) {
      const float mf = float(sum[ch] / count);
      double acc = 0;
      for (int64_t b = 0; b < B; ++b) {
        const T* p = x + (b * C + ch) * HW;
        float part = 0;
        for (int64_t j = 0; j < HW; ++j) {
          float d = L::ld(p, j) - mf;
          part += d * d;
        }
        acc += part;
      }
      sq[ch] = acc;
    }
    sq[C] = 0;
    if (c.replicas) c.replicas->sum(sq, size_t(C + 1));
  }
  const float m = momentum_;
#pragma omp parallel for schedule(static) if (par)
  for (int64_t ch = 0; ch < C; ++ch) {
    double mean, invstd;
    if (train) {
      mean = sum[ch] / count;
      const double var = sq[ch] / count;  // biased: normalisation uses it
      invstd = 1.0 / std::sqrt(var + double(eps_));
      if (!c.recomputing) {
        rm[ch] = float((1.0 - m) * rm[ch] + m * mean);
        rv[ch] = float((1.0 - m) * rv[ch] + m * (sq[ch] / (count - 1)));  // unbiased
      }
    } else {
      mean = rm[ch];
      invstd = 1.0 / std::sqrt(double(rv[ch]) + double(eps_));
    }
    mean_s[ch] = float(mean);
    invstd_s[ch] = float(invstd);
    // y = x * scale + shift
    const float scale = float(double(w[ch]) * invstd);
    const float shift = float(double(bias[ch]) - mean * double(w[ch]) * invstd);
    for (int64_t b = 0; b < B; ++b) {
      const T* p = x + (b * C + ch) * HW;
      T* q = y + (b * C + ch) * HW;
      for (int64_t j = 0; j < HW; ++j) L::st(q, j, L::ld(p, j) * scale + shift);
    }
  }
  if (train && !c.recomputing) ++static_cast<int64_t*>(c.states[2].ptr)[0];
}

template <class L>
void BatchNorm2d::backward_as(LayerCtx& c) {
  using T = typename L::T;
  const int64_t C = C_, B = B_, HW = HW_, n = B * HW;
  const T* x = static_cast<const T*>(c.in[0].ptr);
  const T* dy = static_cast<const T*>(c.dout.ptr);
  const float* w = c.params[0].f32();
  if constexpr (std::is_same_v<T, uint16_t>) {  // native bf16: from the parameter's bf16 copy
    cpu::to_f32(c.params_lp[0], c.scratch[1].f32(), false);
    w = c.scratch[1].f32();
  }
  float* dw = c.grads[0].f32();
  float* db = c.grads[1].f32();
  const bool acc_w = c.accumulate[0], acc_b = c.accumulate[1];
  const float* mean_s = c.saved[0].f32();
  const float* invstd_s = c.saved[1].f32();
  T* dx = static_cast<T*>(c.din[0].ptr);
  const bool train = c.training;
  const bool par = B * C * HW > kParallelMin;
  // sums[ch] = sum(dy), sums[C + ch] = sum(dy * (x - mean)) over this replica's batch;
  // the parameter gradients are this replica's (data parallelism averages them), while
  // dx needs the sums over the batch the statistics came from.
  double* sums = c.scratch[0].f64();  // [2C + 1]
#pragma omp parallel for schedule(static) if (par)
  for (int64_t ch = 0; ch < C; ++ch) {
    const float mean = mean_s[ch];
    double sdy = 0, sdyx = 0;
    for (int64_t b = 0; b < B; ++b) {
      const T* p = x + (b * C + ch) * HW;
      const T* g = dy + (b * C + ch) * HW;
      float a0 = 0, a1 = 0;
      for (int64_t j = 0; j < HW; ++j) {
        const float gj = L::ld(g, j);
        a0 += gj;
        a1 += gj * (L::ld(p, j) - mean);
      }
      sdy += a0;
      sdyx += a1;
    }
    const double sdy_xhat = sdyx * invstd_s[ch];  // sum(dy * xhat)
    dw[ch] = acc_w ? dw[ch] + float(sdy_xhat) : float(sdy_xhat);
    db[ch] = acc_b ? db[ch] + float(sdy) : float(sdy);
    sums[ch] = sdy;
    sums[C + ch] = sdyx;
  }
  if (!dx) return;
  sums[2 * C] = double(n);
  if (train && c.replicas) c.replicas->sum(sums, size_t(2 * C + 1));
  const double count = sums[2 * C];
#pragma omp parallel for schedule(static) if (par)
  for (int64_t ch = 0; ch < C; ++ch) {
    const float mean = mean_s[ch], invstd = invstd_s[ch];
    const double sdy = sums[ch], sdy_xhat = sums[C + ch] * invstd;
    const double a = double(w[ch]) * invstd;
    float k_dy = float(a), k_x = 0, k_c = 0;  // dx = k_dy*dy + k_x*(x - mean) + k_c
    if (train) {
      // dx = a * (dy - mean(dy) - xhat * mean(dy * xhat)): the batch statistics depend on x.
      k_c = float(-a * sdy / count);
      k_x = float(-a * invstd * sdy_xhat / count);
    }
    for (int64_t b = 0; b < B; ++b) {
      const T* p = x + (b * C + ch) * HW;
      const T* g = dy + (b * C + ch) * HW;
      T* q = dx + (b * C + ch) * HW;
      for (int64_t j = 0; j < HW; ++j) L::st(q, j, k_dy * L::ld(g, j) + k_x * (L::ld(p, j) - mean) + k_c);
    }
  }
}

}  // namespace sat
