#include "nn/layers/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>

#include "backend/cpu/bf16.h"
#include "backend/cpu/cpu_features.h"
#include "core/rng.h"

namespace sat {

namespace {
constexpr int64_t kParallelMin = 1 << 15;

// dst[0, n) = src[0, n), split over threads for large buffers (memory bound either way).
void parallel_copy_bytes(void* dst, const void* src, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 2)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t b = k * kChunk;
    std::memcpy(static_cast<char*>(dst) + b, static_cast<const char*>(src) + b, size_t(std::min(kChunk, n - b)));
  }
}
void parallel_copy(float* dst, const float* src, int64_t n) { parallel_copy_bytes(dst, src, n * int64_t(sizeof(float))); }
// A tensor into one of its shape and dtype (float32, or bf16 under native bf16).
void parallel_copy(const Tensor& dst, const Tensor& src) { parallel_copy_bytes(dst.ptr, src.ptr, int64_t(src.bytes())); }

void check_inputs(const LayerSetup& s, const char* kind, size_t n_inputs) {
  SAT_CHECK(s.inputs.size() == n_inputs, kind, " ", s.name, ": expected ", n_inputs, " input(s), got ",
            s.inputs.size());
  for (size_t i = 0; i < n_inputs; ++i)
    SAT_CHECK(s.inputs[i].dtype == s.act, kind, " ", s.name, ": input ", i, " must be ", dtype_name(s.act),
              ", got ", dtype_name(s.inputs[i].dtype));
}
}  // namespace

// ---- Add ----

void Add::setup(LayerSetup& s) {
  // Two float32 inputs under a lower activation dtype are losses (a moe model's load-balancing
  // losses added to the cross-entropy): their sum stays float32.
  const bool losses = s.inputs.size() == 2 && s.inputs[0].dtype == DType::f32 && s.inputs[1].dtype == DType::f32;
  if (!losses) check_inputs(s, "Add", 2);
  SAT_CHECK(s.in_shape(0) == s.in_shape(1), "Add ", s.name, ": inputs must have one shape, got ",
            s.in_shape(0).str(), " and ", s.in_shape(1).str());
  s.set_output(s.in_shape(0), losses ? DType::f32 : s.act);
  s.flops_fwd = double(s.in_shape(0).numel());
  s.flops_bwd = 0;
}

bool Add::bf16_native_cpu() const { return cpu::bf16_native(); }
bool Flatten::bf16_native_cpu() const { return cpu::bf16_native(); }

void Add::forward(LayerCtx& c) {
  const int64_t n = c.out.numel();
  if (c.out.dtype == DType::bf16) {  // native bf16: the sum in float32, rounded once
    const uint16_t* a = cpu::bf16_bits(c.in[0]);
    const uint16_t* b = cpu::bf16_bits(c.in[1]);
    uint16_t* y = cpu::bf16_bits(c.out);
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t i = 0; i < n; ++i) y[i] = cpu::to_bf16(cpu::from_bf16(a[i]) + cpu::from_bf16(b[i]));
    return;
  }
  const float* a = c.in[0].f32();
  const float* b = c.in[1].f32();
  float* y = c.out.f32();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void Add::backward(LayerCtx& c) {
  for (int i = 0; i < 2; ++i)
    if (c.din[size_t(i)].defined()) parallel_copy(c.din[size_t(i)], c.dout);
}

// ---- Flatten ----

void Flatten::setup(LayerSetup& s) {
  check_inputs(s, "Flatten", 1);
  const Shape& x = s.in_shape(0);
  SAT_CHECK(x.nd >= 1, "Flatten ", s.name, ": expected an input [B, ...], got a scalar");
  s.set_output({x[0], x[0] == 0 ? 0 : x.numel() / x[0]}, s.act);
}

void Flatten::forward(LayerCtx& c) { parallel_copy(c.out, c.in[0]); }

void Flatten::backward(LayerCtx& c) {
  if (c.din[0].defined()) parallel_copy(c.din[0], c.dout);
}

// ---- Dropout ----

Dropout::Dropout(float p, TPRank rows, CpRows cp) : p_(p), rows_(rows), cp_(cp) {
  SAT_CHECK(p >= 0.0f && p <= 1.0f, "Dropout: p must be in [0, 1], got ", p);
  SAT_CHECK(cp.cp >= 1 && cp.rank >= 0 && cp.rank < cp.cp && (cp.cp == 1 || cp.rows > 0),
            "Dropout: rank ", cp.rank, " is not in a ring of ", cp.cp);
}

uint64_t Dropout::pair_of(int64_t k) const {
  if (cp_.cp == 1) return pair_offset_ + uint64_t(k);
  const int64_t half = width_ / 2, j = first_row_ + k / half;  // the row among the rank's B x rows
  const int64_t b = j / cp_.rows, i = j % cp_.rows, T = cp_.rows * cp_.cp;
  const int64_t len = cp_.rows / 2, chunk = i < len ? cp_.rank : 2 * int64_t(cp_.cp) - 1 - cp_.rank;
  return uint64_t((b * T + chunk * len + i % len) * half + k % half);
}

void Dropout::setup(LayerSetup& s) {
  check_inputs(s, "Dropout", 1);
  s.set_output(s.in_shape(0), s.act);
  // FNV-1a of the layer name, mixed into the mask seed.
  uint64_t h = 1469598103934665603ull;
  for (char ch : std::string_view(s.name)) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  name_hash_ = h;
  const int64_t local = s.in_shape(0).numel();
  SAT_CHECK(!rows_.on() || local % 2 == 0, "Dropout ", s.name, ": a part of the rows must hold an even number of "
            "elements, got ", local);
  pair_offset_ = uint64_t(rows_.index) * uint64_t(local / 2);
  if (cp_.cp > 1) {
    width_ = s.in_shape(0)[-1];
    SAT_CHECK(s.device == Device::cpu && width_ % 2 == 0 && cp_.rows % 2 == 0,
              "Dropout ", s.name, ": under --cp the activations must be the rank's two chunks of whole sequences of "
              "an even width on the CPU, got ", s.in_shape(0).str());
    first_row_ = rows_.on() ? rows_.index * (local / width_) : 0;
  }
  const double n = double(local);
  s.flops_fwd = n;
  s.flops_bwd = n;
}

void Dropout::apply(const LayerCtx& c, const float* src, float* dst, int64_t n) const {
  if (!c.training || p_ == 0.0f) {
    parallel_copy(dst, src, n);
    return;
  }
  if (p_ >= 1.0f) {  // everything dropped (the 1/(1-p) scale would be infinite)
    std::memset(dst, 0, size_t(n) * sizeof(float));
    return;
  }
  const uint64_t seed = mix_seed(c.seed, name_hash_);
  const uint32_t threshold = uint32_t(std::min(4294967295.0, std::ldexp(double(p_), 32)));
  const float scale = 1.0f / (1.0f - p_);
  // One splitmix64 hash gives the 32-bit draws of two neighbouring elements (i = 2k, 2k+1); an
  // element is kept when its draw >= threshold = p * 2^32 (probability 1 - p, to 2^-32).
  const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t k = 0; k < pairs; ++k) {
    const uint64_t h = splitmix64(seed + pair_of(k) * 0x9E3779B97F4A7C15ull);
    const int64_t i = 2 * k;
    dst[i] = uint32_t(h) >= threshold ? src[i] * scale : 0.0f;
    if (i + 1 < n) dst[i + 1] = uint32_t(h >> 32) >= threshold ? src[i + 1] * scale : 0.0f;
  }
}

void Dropout::forward(LayerCtx& c) { apply(c, c.in[0].f32(), c.out.f32(), c.out.numel()); }

void Dropout::backward(LayerCtx& c) {
  if (c.din[0].defined()) apply(c, c.dout.f32(), c.din[0].f32(), c.dout.numel());
}

}  // namespace sat
