// MaxPool2d and AdaptiveAvgPool2d, forward and backward. One OpenMP iteration per
// (image, channel) plane: backward's scatter into a plane is then race-free.
#include "nn/layers/pool.h"

#include <cmath>
#include <algorithm>
#include <cstring>
#include <limits>

#include "backend/cpu/bf16.h"
#include "backend/cpu/cpu_features.h"

namespace sat {

// Elements below which loops stay serial (an OpenMP fork/join costs more than it saves).
namespace {
constexpr int64_t kParallelMin = 1 << 16;
}  // namespace

// ---------------------------------------------------------------- MaxPool2d

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding)
    : k_(kernel), s_(stride == 0 ? kernel : stride), p_(padding) {
  SAT_CHECK(kernel > 0 && s_ > 0 && padding >= 0, "MaxPool2d: invalid configuration (kernel=", kernel,
            ", stride=", stride, ", padding=", padding, ")");
  SAT_CHECK(2 * padding <= kernel, "MaxPool2d: padding ", padding, " must be at most half the kernel ", kernel);
}

void MaxPool2d::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 1, s.name, ": MaxPool2d takes one input, got ", s.inputs.size());
  const Shape& in = s.in_shape(0);
  SAT_CHECK(in.nd == 4, s.name, ": MaxPool2d expects input [B, C, H, W], got ", in.str());
  B_ = in[0], C_ = in[1], H_ = in[2], W_ = in[3];
  SAT_CHECK(H_ + 2 * p_ >= k_ && W_ + 2 * p_ >= k_, s.name, ": MaxPool2d kernel ", k_,
            " larger than the padded input ", in.str());
  Ho_ = (H_ + 2 * p_ - k_) / s_ + 1;
  Wo_ = (W_ + 2 * p_ - k_) / s_ + 1;
  act_ = s.act;
  s.set_output(Shape{B_, C_, Ho_, Wo_}, s.act);
  s.save(Shape{B_, C_, Ho_, Wo_}, DType::i32);  // saved[0]: argmax, index ih*W + iw in the input plane
  s.flops_fwd = double(B_ * C_ * Ho_ * Wo_) * double(k_ * k_);
  s.flops_bwd = double(B_ * C_ * Ho_ * Wo_);
}

// Activations in float32, or bf16 under native bf16 (compared widened, written as they are:
// a maximum is exact; overlapping windows' gradients add in float32 per addition).
bool MaxPool2d::bf16_native_cpu() const { return cpu::bf16_native(); }

void MaxPool2d::forward(LayerCtx& c) {
  if (c.in[0].dtype == DType::bf16) return forward_as<cpu::StoreBf16>(c);
  forward_as<cpu::StoreF32>(c);
}

void MaxPool2d::backward(LayerCtx& c) {
  if (!c.din[0].ptr) return;
  if (c.din[0].dtype == DType::bf16) return backward_as<cpu::StoreBf16>(c);
  backward_as<cpu::StoreF32>(c);
}

template <class L>
void MaxPool2d::forward_as(LayerCtx& c) {
  using T = typename L::T;
  const T* x = static_cast<const T*>(c.in[0].ptr);  // [B, C, H, W]
  T* y = static_cast<T*>(c.out.ptr);                // [B, C, Ho, Wo]
  int32_t* arg = c.saved[0].i32(); // [B, C, Ho, Wo]
  const int64_t planes = B_ * C_, H = H_, W = W_, Ho = Ho_, Wo = Wo_;
#pragma omp parallel for schedule(static) if (planes * Ho * Wo * k_ * k_ > kParallelMin)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const T* xp = x + pl * H * W;
    T* yp = y + pl * Ho * Wo;
    int32_t* ap = arg + pl * Ho * Wo;
    for (int64_t oh = 0; oh < Ho; ++oh) {
      const int64_t h0 = std::max<int64_t>(oh * s_ - p_, 0), h1 = std::min(oh * s_ - p_ + k_, H);
      for (int64_t ow = 0; ow < Wo; ++ow) {
        const int64_t w0 = std::max<int64_t>(ow * s_ - p_, 0), w1 = std::min(ow * s_ - p_ + k_, W);
        float best = -std::numeric_limits<float>::infinity();
        int64_t bi = h0 * W + w0;
        // Branch-free select: on random data "v > best" is unpredictable.
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) {
            const float v = L::ld(xp, ih * W + iw);
            const bool take = (v > best) | (v != v);  // NaN propagates, as in PyTorch
            best = take ? v : best;
            bi = take ? ih * W + iw : bi;
          }
        L::st(yp, oh * Wo + ow, best);
        ap[oh * Wo + ow] = int32_t(bi);
      }
    }
  }
}

template <class L>
void MaxPool2d::backward_as(LayerCtx& c) {
  using T = typename L::T;
  T* dx = static_cast<T*>(c.din[0].ptr);
  const T* dy = static_cast<const T*>(c.dout.ptr);
  const int32_t* arg = c.saved[0].i32();
  const int64_t planes = B_ * C_, HW = H_ * W_, OHW = Ho_ * Wo_;
#pragma omp parallel for schedule(static) if (planes * HW > kParallelMin)
  for (int64_t pl = 0; pl < planes; ++pl) {
    T* dp = dx + pl * HW;
    std::memset(dp, 0, size_t(HW) * sizeof(T));
    const T* g = dy + pl * OHW;
    const int32_t* a = arg + pl * OHW;
    for (int64_t j = 0; j < OHW; ++j) L::st(dp, a[j], L::ld(dp, a[j]) + L::ld(g, j));
  }
}

// ------------------------------------------------------- AdaptiveAvgPool2d

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int64_t out_h, int64_t out_w) : oh_(out_h), ow_(out_w) {
  SAT_CHECK(out_h > 0 && out_w > 0, "AdaptiveAvgPool2d: output size must be positive, got ", out_h, "x", out_w);
}

void AdaptiveAvgPool2d::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 1, s.name, ": AdaptiveAvgPool2d takes one input, got ", s.inputs.size());
  const Shape& in = s.in_shape(0);
  SAT_CHECK(in.nd == 4 && in[2] > 0 && in[3] > 0, s.name, ": AdaptiveAvgPool2d expects input [B, C, H, W], got ",
            in.str());
  B_ = in[0], C_ = in[1], H_ = in[2], W_ = in[3];
  act_ = s.act;
  s.set_output(Shape{B_, C_, oh_, ow_}, s.act);
  // Each input element is read about once per overlapping window (at most twice per axis).
  s.flops_fwd = double(B_ * C_) * double(std::max(H_, oh_) * std::max(W_, ow_));
  s.flops_bwd = s.flops_fwd;
}

namespace {
inline int64_t win_start(int64_t i, int64_t in, int64_t out) { return (i * in) / out; }
inline int64_t win_end(int64_t i, int64_t in, int64_t out) { return ((i + 1) * in + out - 1) / out; }
}  // namespace

void AdaptiveAvgPool2d::forward(LayerCtx& c) {
  const float* x = c.in[0].f32();  // [B, C, H, W]
  float* y = c.out.f32();          // [B, C, oh, ow]
  const int64_t planes = B_ * C_, H = H_, W = W_, OH = oh_, OW = ow_;
#pragma omp parallel for schedule(static) if (planes * H * W > kParallelMin)
  for (int64_t pl = 0; pl < planes; ++pl) {
    const float* xp = x + pl * H * W;
    float* yp = y + pl * OH * OW;
    for (int64_t i = 0; i < OH; ++i) {
      const int64_t h0 = win_start(i, H, OH), h1 = win_end(i, H, OH);
      for (int64_t j = 0; j < OW; ++j) {
        const int64_t w0 = win_start(j, W, OW), w1 = win_end(j, W, OW);
        float sum = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) sum += xp[ih * W + iw];
        yp[i * OW + j] = sum / float((h1 - h0) * (w1 - w0));
      }
    }
  }
}

void AdaptiveAvgPool2d::backward(LayerCtx& c) {
  if (!c.din[0].ptr) return;
  float* dx = c.din[0].f32();
  const float* dy = c.dout.f32();
  const int64_t planes = B_ * C_, H = H_, W = W_, OH = oh_, OW = ow_;
#pragma omp parallel for schedule(static) if (planes * H * W > kParallelMin)
  for (int64_t pl = 0; pl < planes; ++pl) {
    float* dp = dx + pl * H * W;
    std::memset(dp, 0, size_t(H * W) * sizeof(float));
    const float* g = dy + pl * OH * OW;
    for (int64_t i = 0; i < OH; ++i) {
      const int64_t h0 = win_start(i, H, OH), h1 = win_end(i, H, OH);
      for (int64_t j = 0; j < OW; ++j) {
        const int64_t w0 = win_start(j, W, OW), w1 = win_end(j, W, OW);
        const float v = g[i * OW + j] / float((h1 - h0) * (w1 - w0));
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) dp[ih * W + iw] += v;
      }
    }
  }
}

}  // namespace sat
