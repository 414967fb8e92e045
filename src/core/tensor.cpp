#include "core/tensor.h"

namespace sat {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "?";
}

Shape::Shape(std::initializer_list<int64_t> dims) {
  SAT_ASSERT(int(dims.size()) <= kMaxDims);
  for (int64_t v : dims) d[nd++] = v;
}

Shape::Shape(const std::vector<int64_t>& dims) {
  SAT_CHECK(int(dims.size()) <= kMaxDims, "tensor has ", dims.size(), " dimensions; at most ",
            kMaxDims, " are supported");
  for (int64_t v : dims) d[nd++] = v;
}

bool Shape::operator==(const Shape& o) const {
  if (nd != o.nd) return false;
  for (int i = 0; i < nd; ++i)
    if (d[i] != o.d[i]) return false;
  return true;
}

void Shape::numel_overflow() const {
  fail("a tensor of shape ", str(), " has more elements than fit in 64 bits");
}

std::string Shape::str() const {
  std::string s = "[";
  for (int i = 0; i < nd; ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  return s + "]";
}

}  // namespace sat
