#include "nn/shard.h"

#include <cstring>

namespace sat {
namespace {

// The full tensor seen as [outer, stride, parts, piece, inner] along the split dimension:
// part `index` is [outer, stride, piece, inner] of it. to_full: local -> full.
void copy_part(const ParamDecl& d, int index, const void* src, void* dst, size_t elem, bool to_full) {
  const Shape& s = d.spec.shape;
  if (!d.shard.split()) {
    std::memcpy(dst, src, size_t(s.numel()) * elem);
    return;
  }
  const ParamShard& sh = d.shard;
  SAT_CHECK(sh.dim < s.nd && sh.stride >= 1 && s[sh.dim] % sh.stride == 0 && index >= 0 && index < sh.parts,
            "internal error: parameter ", d.name, " has an impossible shard");
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < sh.dim; ++i) outer *= s[i];
  for (int i = sh.dim + 1; i < s.nd; ++i) inner *= s[i];
  const int64_t piece = s[sh.dim] / sh.stride;
  const size_t run = size_t(piece * inner) * elem;  // contiguous in both
  auto* from = static_cast<const uint8_t*>(src);
  auto* to = static_cast<uint8_t*>(dst);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < sh.stride; ++b) {
      const int64_t local = (o * sh.stride + b) * piece * inner;
      const int64_t full = ((o * sh.stride + b) * sh.parts + index) * piece * inner;
      if (to_full) std::memcpy(to + size_t(full) * elem, from + size_t(local) * elem, run);
      else std::memcpy(to + size_t(local) * elem, from + size_t(full) * elem, run);
    }
}

}  // namespace

void shard_extract(const ParamDecl& d, const void* full, void* local, size_t elem) {
  copy_part(d, d.shard.index, full, local, elem, false);
}

void shard_insert(const ParamDecl& d, const void* local, void* full, size_t elem) {
  copy_part(d, d.shard.index, local, full, elem, true);
}

void shard_insert_part(const ParamDecl& d, int index, const void* local, void* full, size_t elem) {
  copy_part(d, index, local, full, elem, true);
}

}  // namespace sat
