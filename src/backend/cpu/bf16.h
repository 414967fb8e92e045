// bfloat16 on the CPU: storage of the CPU engine's mixed precision (--precision bf16).
// A bf16 value is the top half of a float32 (8-bit exponent, 7-bit mantissa); conversion
// from float32 rounds to nearest, ties to even, as PyTorch and oneDNN round. Arithmetic
// always happens in float32: a product of two bf16 values is exact in float32, so a
// float32 product of bf16-rounded operands gives bf16's numerics with fp32 accumulation.
#pragma once
#include <cstdint>
#include <cstring>

#include "core/tensor.h"

namespace sat::cpu {

inline uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                          // round to nearest, ties to even
  return uint16_t(u >> 16);
}

inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float round_bf16(float f) { return from_bf16(to_bf16(f)); }

// A bf16 tensor's values as their bits.
inline uint16_t* bf16_bits(const Tensor& t) { return static_cast<uint16_t*>(t.ptr); }

// How a layer's CPU code reads and writes activations stored as T, for code templated over
// the two (native bf16: read widened, computed in float32, written rounded once).
struct StoreF32 {
  using T = float;
  static float ld(const T* p, int64_t j) { return p[j]; }
  static void st(T* p, int64_t j, float v) { p[j] = v; }
};
struct StoreBf16 {
  using T = uint16_t;
  static float ld(const T* p, int64_t j) { return from_bf16(p[j]); }
  static void st(T* p, int64_t j, float v) { p[j] = to_bf16(v); }
};

// Element-wise over n values (OpenMP across the engine's threads for large n).
void to_bf16(const float* x, uint16_t* y, int64_t n);
void from_bf16(const uint16_t* x, float* y, int64_t n);
void round_bf16(const float* x, float* y, int64_t n);  // y may be x

// x (f32 or bf16) into float32 y: widens bf16; rounds f32 to bf16 values when `round` is
// set, copies it otherwise.
void to_f32(const Tensor& x, float* y, bool round);
// float32 x into dst: copies into f32, rounds into bf16.
void from_f32(const float* x, const Tensor& dst);
// dst += src, both of one dtype (f32 or bf16; bf16 sums in float32 and rounds once).
void add_into(const Tensor& dst, const Tensor& src);

}  // namespace sat::cpu
