// Deterministic, counter-based random numbers. The same generator is written in
// bench/peer/common.py so PyTorch and saturate can start from identical weights
// and data (splitmix64: https://prng.di.unimi.it/splitmix64.c).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace sat {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// FNV-1a, 64 bit: stable names -> seeds (parameter names, data streams).
inline uint64_t fnv1a64(const char* s, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) { h ^= uint8_t(s[i]); h *= 0x100000001b3ull; }
  return h;
}
template <class S> inline uint64_t fnv1a64(const S& s) { return fnv1a64(s.data(), s.size()); }

// unit(h, k): a float in [0,1) with 24 random bits, from a (stream, index) pair.
// bench/peer/common.py computes the same numbers for PyTorch.
inline float hash_unit(uint64_t h, uint64_t k) { return float(splitmix64(h + k) >> 40) * (1.0f / 16777216.0f); }

// Hash of (seed, stream) pairs for deriving independent generators.
inline uint64_t mix_seed(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b + 0x632BE59BD9B4E019ull)); }

struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next_u64() {
    uint64_t r = splitmix64(state);
    state += 0x9E3779B97F4A7C15ull;
    return r;
  }
  // Uniform in [0, 1) with 24 random bits (exactly representable in float32).
  float uniform() { return float(next_u64() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal by Box-Muller (one value per call, the second is discarded for simplicity).
  float normal() {
    double u1 = (double(next_u64() >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = double(next_u64() >> 11) * (1.0 / 9007199254740992.0);
    return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  uint64_t below(uint64_t n) { return next_u64() % n; }
};

}  // namespace sat
