#include "nn/layers/ring_self_attention.h"

#include <cstring>

#include "core/error.h"
#include "dist/comm.h"
#include "nn/ring_attention.h"

namespace sat {

namespace {

// dst[r, 0:w) = src[r, c0:c0+w) over n rows (src row stride ld), and the reverse.
void take_cols(const float* src, int64_t ld, int64_t c0, int64_t w, float* dst, int64_t n) {
  for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * w, src + r * ld + c0, size_t(w) * sizeof(float));
}
void put_cols(const float* src, int64_t w, float* dst, int64_t ld, int64_t c0, int64_t n) {
  for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * ld + c0, src + r * w, size_t(w) * sizeof(float));
}

}  // namespace

RingSelfAttention::RingSelfAttention(int64_t n_head, int64_t n_kv_head, int cp, int cp_rank)
    : n_head_(n_head), n_kv_head_(n_kv_head == 0 ? n_head : n_kv_head), cp_(cp), cp_rank_(cp_rank) {
  SAT_CHECK(n_head > 0 && n_kv_head_ > 0 && n_head % n_kv_head_ == 0, "RingSelfAttention: n_head=", n_head,
            " must be a positive multiple of n_kv_head=", n_kv_head_);
  SAT_CHECK(cp >= 1 && cp_rank >= 0 && cp_rank < cp, "RingSelfAttention: rank ", cp_rank, " is not in a ring of ", cp);
}

void RingSelfAttention::setup(LayerSetup& s) {
  SAT_CHECK(s.device == Device::cpu && s.act == DType::f32, s.name,
            ": RingSelfAttention (--cp) runs on the CPU in f32 only yet");
  SAT_CHECK(s.inputs.size() == 1 || s.inputs.size() == 3, s.name,
            ": RingSelfAttention takes one input (qkv) or three (q, k, v), got ", s.inputs.size());
  const Shape& x = s.in_shape(0);
  const bool fused = s.inputs.size() == 1;
  const int64_t parts = fused ? n_head_ + 2 * n_kv_head_ : n_head_;
  SAT_CHECK(x.nd == 3 && x[2] > 0 && x[2] % parts == 0, s.name, ": RingSelfAttention expects ",
            fused ? "qkv" : "q", " [B, rows, ", parts, " heads x hs], got ", x.str());
  const int64_t B = x[0], rows = x[1], hs = x[2] / parts;
  SAT_CHECK(rows > 0 && rows % 2 == 0, s.name, ": RingSelfAttention expects an even number of rows (two chunks), got ",
            rows);
  const Shape qs{B, rows, n_head_ * hs}, kvs{B, rows, n_kv_head_ * hs};
  for (size_t i = 1; i < s.inputs.size(); ++i)
    SAT_CHECK(s.in_shape(int(i)) == kvs, s.name, ": RingSelfAttention expects ", i == 1 ? "k" : "v", " ", kvs.str(),
              ", got ", s.in_shape(int(i)).str());
  s.set_output(qs);
  if (s.training) s.save(Shape{B, n_head_, rows});  // lse
  else s.scratch_forward(Shape{B, n_head_, rows});
  if (fused) {
    for (const Shape& sh : {qs, kvs, kvs}) s.scratch_forward(sh);
    if (s.training)
      for (const Shape& sh : {qs, kvs, kvs, qs, kvs, kvs}) s.scratch_backward(sh);  // q, k, v, dq, dk, dv
  }
  // The ring's buffers, last: the travelling key/value block and the one arriving (forward),
  // with their gradients and delta (backward).
  const cp::Dims d{B, rows, n_head_, n_kv_head_, hs};
  s.scratch_forward(Shape{cp::forward_work(d)});
  if (s.training) s.scratch_backward(Shape{cp::backward_work(d)});
  // This rank's share of the causal triangle of the whole sequence (rows * cp tokens).
  const double T = double(rows) * cp_, pairs = T * (T + 1) / 2.0 / cp_;
  s.flops_fwd = 4.0 * double(B * n_head_) * pairs * double(hs);
  s.flops_bwd = 2.0 * s.flops_fwd;
  s.comm_fwd = double(cp_ - 1) * 2.0 * double(kvs.numel()) * 4.0;
  s.comm_bwd = double(2 * cp_ - 1) * 2.0 * double(kvs.numel()) * 4.0;
}

namespace {

struct Parts {
  cp::Dims d;
  const float *q, *k, *v;
};

// q, k and v of the inputs, contiguous (copied from the fused input into `into`).
Parts parts_of(const std::vector<Tensor>& in, const std::vector<Tensor>& into, size_t first, int64_t nh,
               int64_t nkv) {
  const Shape& x = in[0].shape;
  const bool fused = in.size() == 1;
  const int64_t hs = x[2] / (fused ? nh + 2 * nkv : nh), n = x[0] * x[1];
  Parts p{{x[0], x[1], nh, nkv, hs}, in[0].f32(), nullptr, nullptr};
  if (!fused) {
    p.k = in[1].f32(), p.v = in[2].f32();
    return p;
  }
  float* q = into[first].f32();
  float* k = into[first + 1].f32();
  float* v = into[first + 2].f32();
  take_cols(in[0].f32(), x[2], 0, nh * hs, q, n);
  take_cols(in[0].f32(), x[2], nh * hs, nkv * hs, k, n);
  take_cols(in[0].f32(), x[2], (nh + nkv) * hs, nkv * hs, v, n);
  p.q = q, p.k = k, p.v = v;
  return p;
}

cp::Shift shift_of(LayerCtx& c, int cp, int rank) {
  if (cp == 1) return [](const float*, float*, size_t, int) { SAT_ASSERT(false); };
  SAT_CHECK(c.cp_group && c.cp_group->size() == cp && c.cp_group->rank() == rank,
            "internal error: RingSelfAttention without its context-parallel group");
  return cp::comm_shift(*c.cp_group);
}

}  // namespace

void RingSelfAttention::forward(LayerCtx& c) {
  const bool keep = !c.saved.empty();
  const Parts p = parts_of(c.in, c.scratch, keep ? 0 : 1, n_head_, n_kv_head_);
  float* lse = keep ? c.saved[0].f32() : c.scratch[0].f32();
  const cp::Chunks mine = cp::chunks_of(p.d.rows * cp_, cp_, cp_rank_);
  cp::ring_forward(p.d, cp_, cp_rank_, mine, p.q, p.k, p.v, c.out.f32(), lse, shift_of(c, cp_, cp_rank_),
                   c.scratch.back().f32());
}

void RingSelfAttention::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  SAT_CHECK(!c.saved.empty(), "RingSelfAttention: backward called on a layer set up without training");
  const bool fused = c.in.size() == 1;
  const Parts p = parts_of(c.in, c.scratch, 0, n_head_, n_kv_head_);
  const cp::Chunks mine = cp::chunks_of(p.d.rows * cp_, cp_, cp_rank_);
  float* dq = fused ? c.scratch[3].f32() : c.din[0].f32();
  float* dk = fused ? c.scratch[4].f32() : c.din[1].f32();
  float* dv = fused ? c.scratch[5].f32() : c.din[2].f32();
  cp::ring_backward(p.d, cp_, cp_rank_, mine, p.q, p.k, p.v, c.out.f32(), c.dout.f32(), c.saved[0].f32(), dq, dk,
                    dv, shift_of(c, cp_, cp_rank_), c.scratch.back().f32());
  if (!fused) return;
  const int64_t W = c.in[0].shape[2], n = p.d.B * p.d.rows, hs = p.d.hs, nh = n_head_, nkv = n_kv_head_;
  put_cols(dq, nh * hs, c.din[0].f32(), W, 0, n);
  put_cols(dk, nkv * hs, c.din[0].f32(), W, nh * hs, n);
  put_cols(dv, nkv * hs, c.din[0].f32(), W, (nh + nkv) * hs, n);
}

}  // namespace sat
