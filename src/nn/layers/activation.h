// Element-wise activations. Input x and output y have the same (any) shape and the
// activation dtype (f32 on the CPU; f32, bf16 or f16 on the GPU, computed in float32).
//   ReLU: y = max(x, 0); backward uses the output (kept alive until backward).
//   GELU: PyTorch's gelu(approximate='tanh'):
//         y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
//         computed as x * sigmoid(2u) (the same function; one exp instead of a tanh, and
//         more accurate for negative x where 1 + tanh(u) cancels). Backward uses the input.
//         GELU(true) is the exact gelu(approximate='none'): y = 0.5 x (1 + erf(x / sqrt 2)).
//   SiLU: PyTorch's silu (nn.SiLU): y = x sigmoid(x), computed as x / (1 + exp(-x)) with
//         vexp (which clamps instead of overflowing, so no inf / inf). Backward uses the input.
// Also vexp(): a float exp that vectorises (used by GELU, SiLU and CrossEntropy).
#pragma once
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "nn/layer.h"

namespace sat {

namespace detail {
// A signed integer with the order of the floats (-0 just below +0; NaNs beyond +-inf): min/max
// and clamps on it are integer MIN/MAX, which GCC vectorises; float compares feeding a constant
// do not vectorise under the default -ftrapping-math (the constant arm gets folded into a branch).
constexpr int32_t ordered_key(float a) {
  const int32_t b = std::bit_cast<int32_t>(a);
  return b ^ ((b >> 31) & 0x7fffffff);
}
constexpr float from_ordered_key(int32_t k) { return std::bit_cast<float>(k ^ ((k >> 31) & 0x7fffffff)); }
}  // namespace detail

// exp(x) in float, branch-free so that loops calling it vectorise (glibc's expf only does under
// -ffast-math). Cephes' expf: Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, and a degree-7
// polynomial; relative error < 2e-7. exp(x < -87) is 0 (also for -inf; the true value is below
// 1.6e-38), and x > 88 is clamped to exp(88) ~ 1.65e38 rather than inf. NaN is NOT propagated
// (it lands on one end): callers that can see NaN check for it themselves (CrossEntropy does;
// GELU's x / (1 + exp) carries a NaN x through anyway).
inline float vexp(float x) {
  using detail::ordered_key;
  const int32_t k = ordered_key(x);
  const int32_t keep = -int32_t(k >= ordered_key(-87.0f));  // all ones, or 0: flush exp(x < -87) to 0
  x = detail::from_ordered_key(std::min(std::max(k, ordered_key(-87.0f)), ordered_key(88.0f)));
  // n = floor(x log2(e) + 0.5) by truncating a positive number (cvttps2dq; std::floor does not
  // vectorise at -march=x86-64-v2).
  const int32_t ni = int32_t(x * 1.44269504088896341f + 128.5f) - 128;
  const float n = float(ni);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln2 split so n * hi is exact
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f;
  return std::bit_cast<float>(std::bit_cast<int32_t>(p * std::bit_cast<float>((ni + 127) << 23)) & keep);
}

class ReLU : public Layer {
 public:
  ReLU() = default;
  const char* kind() const override { return "ReLU"; }
  bool backward_reads_inputs() const override { return false; }  // it reads its output
  bool bf16_native_cpu() const override;  // bf16 tensors as they are
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER
};

class GELU : public Layer {
 public:
  GELU() = default;
  explicit GELU(bool exact) : exact_(exact) {}  // exact: erf; default: the tanh approximation
  const char* kind() const override { return exact_ ? "GELU(erf)" : "GELU"; }
  bool exact() const { return exact_; }
  bool backward_reads_output() const override { return false; }
  bool bf16_native_cpu() const override;  // bf16 activations read and written as they are
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

 private:
  bool exact_ = false;
};

class SiLU : public Layer {
 public:
  SiLU() = default;
  const char* kind() const override { return "SiLU"; }
  bool backward_reads_output() const override { return false; }  // it reads its input
  bool bf16_native_cpu() const override;  // bf16 activations read and written as they are
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER
};

}  // namespace sat
