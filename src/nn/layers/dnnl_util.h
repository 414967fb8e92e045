// oneDNN (SAT_HAVE_DNNL) helpers shared by the layers that run primitives: the CPU engine
// and stream, and the engine's tensors viewed as oneDNN memories, reordered through plan
// scratch when a primitive wants another layout or data type (so the memory plan stays
// exact: nothing here allocates).
#pragma once
#if SAT_HAVE_DNNL
#include <dnnl.hpp>

#include "nn/layer.h"

namespace sat::dnnl_util {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using md = dnnl::memory::desc;

inline dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

inline dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

// A scratch slot for a primitive's buffer when its layout is not the engine's own (-1: the
// engine's tensor is used as it is).
inline int buffer_slot(LayerSetup& s, bool backward, const md& want, const md& have) {
  if (want == have) return -1;
  const Shape bytes{int64_t(want.get_size())};
  return backward ? s.scratch_backward(bytes, DType::u8) : s.scratch_forward(bytes, DType::u8);
}

// The engine's tensor as a oneDNN memory, or the scratch it is reordered to/from when the
// primitive wants another layout (slot >= 0).
struct View {
  dnnl::memory user, prim;
  bool reorder = false;
};

inline View view(const md& user_md, void* ptr, const md& prim_md, int slot, const LayerCtx& c) {
  View v;
  v.user = dnnl::memory(user_md, engine(), ptr);
  if (slot < 0 || user_md == prim_md) {
    v.prim = dnnl::memory(prim_md, engine(), ptr);
  } else {
    v.prim = dnnl::memory(prim_md, engine(), c.scratch[size_t(slot)].ptr);
    v.reorder = true;
  }
  return v;
}

inline void to_prim(View& v) {
  if (v.reorder) dnnl::reorder(v.user, v.prim).execute(stream(), v.user, v.prim);
}

inline void from_prim(View& v) {
  if (v.reorder) dnnl::reorder(v.prim, v.user).execute(stream(), v.prim, v.user);
}

inline dnnl::memory pad_memory(const md& want, int slot, const LayerCtx& c) {
  return dnnl::memory(want, engine(), slot >= 0 ? c.scratch[size_t(slot)].ptr : nullptr);
}

inline dt dnnl_dtype(DType d) { return d == DType::bf16 ? dt::bf16 : dt::f32; }

}  // namespace sat::dnnl_util

#endif
