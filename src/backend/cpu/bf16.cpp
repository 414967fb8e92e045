#include "backend/cpu/bf16.h"

namespace sat::cpu {

namespace {
constexpr int64_t kParallel = 1 << 15;  // below this, one thread converts faster than a team starts
}

void to_bf16(const float* x, uint16_t* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallel) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = to_bf16(x[i]);
}

void from_bf16(const uint16_t* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallel) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = from_bf16(x[i]);
}

void round_bf16(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd if (n > kParallel) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = round_bf16(x[i]);
}

void to_f32(const Tensor& x, float* y, bool round) {
  SAT_CHECK(x.dtype == DType::f32 || x.dtype == DType::bf16, "internal error: to_f32 of a ", dtype_name(x.dtype),
            " tensor");
  const int64_t n = x.numel();
  if (x.dtype == DType::bf16) from_bf16(static_cast<const uint16_t*>(x.ptr), y, n);
  else if (round) round_bf16(x.f32(), y, n);
  else if (y != x.f32()) std::memcpy(y, x.ptr, size_t(n) * 4);
}

void from_f32(const float* x, const Tensor& dst) {
  SAT_CHECK(dst.dtype == DType::f32 || dst.dtype == DType::bf16, "internal error: from_f32 into a ",
            dtype_name(dst.dtype), " tensor");
  if (dst.dtype == DType::bf16) to_bf16(x, static_cast<uint16_t*>(dst.ptr), dst.numel());
  else if (x != dst.f32()) std::memcpy(dst.ptr, x, dst.bytes());
}

void add_into(const Tensor& dst, const Tensor& src) {
  SAT_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel() &&
                (dst.dtype == DType::f32 || dst.dtype == DType::bf16),
            "internal error: add_into of ", dtype_name(src.dtype), " into ", dtype_name(dst.dtype));
  const int64_t n = dst.numel();
  if (dst.dtype == DType::f32) {
    float* d = dst.f32();
    const float* s = src.f32();
#pragma omp parallel for simd if (n > 65536)
    for (int64_t k = 0; k < n; ++k) d[k] += s[k];
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(dst.ptr);
  const uint16_t* s = static_cast<const uint16_t*>(src.ptr);
#pragma omp parallel for simd if (n > 65536)
  for (int64_t k = 0; k < n; ++k) d[k] = to_bf16(from_bf16(d[k]) + from_bf16(s[k]));
}

}  // namespace sat::cpu
