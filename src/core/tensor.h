// Tensor views: a pointer plus shape, dtype and device. A Tensor never owns memory;
// every buffer of a training step lives in an arena laid out by the plan (plan.h).
#pragma once
#include <array>
#include <cstdint>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>
#include "core/error.h"

namespace sat {

// bf16 and f16 are storage types of the CUDA backend's mixed precision (activations
// and GEMM inputs); arithmetic on them always accumulates in float32.
enum class DType : uint8_t { f32, f64, i32, i64, u8, bf16, f16 };
enum class Device : uint8_t { cpu, cuda };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
    case DType::bf16: return 2;
    case DType::f16: return 2;
  }
  return 0;
}
const char* dtype_name(DType t);

// Up to 6 dimensions, row-major (last dimension contiguous), PyTorch order (N,C,H,W).
struct Shape {
  static constexpr int kMaxDims = 6;
  int nd = 0;
  std::array<int64_t, kMaxDims> d{};

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);
  explicit Shape(const std::vector<int64_t>& dims);

  int64_t operator[](int i) const { return d[i < 0 ? nd + i : i]; }
  int64_t& operator[](int i) { return d[i < 0 ? nd + i : i]; }
  // The element count; a sat::Error naming the shape when it does not fit in int64
  // (shapes come from model files and safetensors headers).
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < nd; ++i)
      if (__builtin_mul_overflow(n, d[i], &n)) numel_overflow();
    return n;
  }
  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::vector<int64_t> vec() const { return {d.begin(), d.begin() + nd}; }
  std::string str() const;  // "[2, 3, 4]"

 private:
  [[noreturn]] void numel_overflow() const;
};

struct Tensor {
  void* ptr = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu;

  Tensor() = default;
  Tensor(void* p, Shape s, DType t = DType::f32, Device dev = Device::cpu)
      : ptr(p), shape(s), dtype(t), device(dev) {}

  bool defined() const { return ptr != nullptr; }
  int64_t numel() const { return shape.numel(); }
  size_t bytes() const { return size_t(numel()) * dtype_size(dtype); }
  float* f32() const { return static_cast<float*>(ptr); }
  double* f64() const { return static_cast<double*>(ptr); }
  int32_t* i32() const { return static_cast<int32_t*>(ptr); }
  uint8_t* u8() const { return static_cast<uint8_t*>(ptr); }
};

}  // namespace sat
