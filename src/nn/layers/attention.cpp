#include "nn/layers/attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/blas.h"
#include "core/error.h"

namespace sat {

namespace {

// Rows (queries) are processed in blocks of kBlock: the scores of block [i0, i1) are the
// GEMM q[i0:i1] k[0:i1]^T, so only the diagonal blocks compute masked-out entries (about
// kBlock/T more than the causal triangle: 25% at T=128, where the full square would be
// 100%) while each GEMM stays large enough for BLAS to be fast. 32 measured best at
// T=128, hs=64 (16 and 64 were 5-10% slower, the full square 35% slower).
// Forward and backward must use the same blocks: the GEMMs read the zeros that the
// row loops write into the upper triangle of each diagonal block.
constexpr int64_t kBlock = 32;

// Row-major SGEMM for one head, called inside our OpenMP loop over heads (q, k, v are
// read in place from qkv through the leading dimension 3C: no gather copy is needed).
// OpenBLAS's OpenMP build runs single-threaded inside an active parallel region by itself
// (it checks omp_in_parallel()). Calling openblas_set_num_threads(1) instead would be
// wrong: OpenBLAS 0.3.21 also calls omp_set_num_threads() there, which would make our own
// parallel loop run on one thread.
// beta 1 accumulates into C (the dk, dv of a key/value head shared by a query group).
inline void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float* C, int64_t ldc, float beta = 0.0f) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// Row kernels, written with 8-wide vector extensions because GCC does not vectorize the
// scalar loops (the exp and the max reduction stay scalar and cost as much as the GEMMs).
// target_clones builds an AVX2+FMA version and a baseline (x86-64-v2: two SSE halves) and
// picks one at load time. Helpers take vectors by reference: passing 32-byte vectors by
// value in the baseline build draws GCC's -Wpsabi warning (which no pragma silences).
typedef float f8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

#define SAT_INLINE inline __attribute__((always_inline))
SAT_INLINE void load8(f8& v, const float* p) { std::memcpy(&v, p, sizeof v); }
SAT_INLINE void store8(float* p, const f8& v) { std::memcpy(p, &v, sizeof v); }
SAT_INLINE float hsum8(const f8& v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }
SAT_INLINE float hmax8(const f8& v) {
  float m = v[0];
  for (int i = 1; i < 8; ++i) m = std::max(m, v[i]);
  return m;
}

// x = exp(x) for x <= 0 (softmax after subtracting the row max), on floats or f8: Cody-Waite
// range reduction x = n ln2 + r, |r| <= ln2/2, and the Cephes expf polynomial (max relative
// error 8e-8, about 1 ulp). x < -87 is treated as -87 (exp ~ 1.6e-38: zero next to a
// softmax row sum >= 1), which keeps 2^n a normal float.
template <class V, class I>
SAT_INLINE void exp_nonpos(V& x) {
  const V lo = x - x - 87.0f;
  x = x < lo ? lo : x;
  const V n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round to nearest
  V r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  I e;
  if constexpr (std::is_same_v<V, float>)
    e = (int32_t(n) + 127) << 23;
  else
    e = (__builtin_convertvector(n, I) + 127) << 23;  // 2^n, n in [-126, 0]
  V two_n;
  std::memcpy(&two_n, &e, sizeof two_n);
  x = p * two_n;
}

// In place: row[0..n) = softmax(row[0..n)); row[n..end) = 0.
__attribute__((target_clones("arch=x86-64-v3", "default")))
void softmax_causal_row(float* row, int64_t n, int64_t end) {
  const int64_t n8 = n & ~int64_t(7);
  float m = row[0];
  f8 x;
  if (n8) {
    f8 mv;
    load8(mv, row);
    for (int64_t j = 8; j < n8; j += 8) {
      load8(x, row + j);
      mv = x > mv ? x : mv;
    }
    m = hmax8(mv);
  }
  for (int64_t j = n8; j < n; ++j) m = std::max(m, row[j]);
  f8 sv{};
  for (int64_t j = 0; j < n8; j += 8) {
    load8(x, row + j);
    x -= m;
    exp_nonpos<f8, i8>(x);
    store8(row + j, x);
    sv += x;
  }
  float sum = hsum8(sv);
  for (int64_t j = n8; j < n; ++j) {
    float e = row[j] - m;
    exp_nonpos<float, int32_t>(e);
    sum += (row[j] = e);
  }
  const float inv = 1.0f / sum;
  for (int64_t j = 0; j < n8; j += 8) {
    load8(x, row + j);
    store8(row + j, x * inv);
  }
  for (int64_t j = n8; j < n; ++j) row[j] *= inv;
  if (end > n) std::memset(row + n, 0, size_t(end - n) * sizeof(float));
}

// Softmax backward of one row, in place on g = dP:
// g[0..n) = p * (g - sum_j g[j] p[j]) * scale; g[n..end) = 0.
__attribute__((target_clones("arch=x86-64-v3", "default")))
void softmax_backward_row(float* g, const float* p, int64_t n, int64_t end, float scale) {
  const int64_t n8 = n & ~int64_t(7);
  f8 dv{}, x, y;
  for (int64_t j = 0; j < n8; j += 8) {
    load8(x, g + j);
    load8(y, p + j);
    dv += x * y;
  }
  float dot = hsum8(dv);
  for (int64_t j = n8; j < n; ++j) dot += g[j] * p[j];
  for (int64_t j = 0; j < n8; j += 8) {
    load8(x, g + j);
    load8(y, p + j);
    store8(g + j, y * (x - dot) * scale);
  }
  for (int64_t j = n8; j < n; ++j) g[j] = p[j] * (g[j] - dot) * scale;
  if (end > n) std::memset(g + n, 0, size_t(end - n) * sizeof(float));
}
#undef SAT_INLINE

// Where q, k and v of every head lie: in one fused input (row stride (nh + 2 nkv) hs) or
// in three (row strides nh hs, nkv hs, nkv hs). Head h of batch b starts at
// base + b * T * ld + h * hs. The same offsets address the gradients in din.
struct Layout {
  int64_t B, T, nh, nkv, hs;
  int64_t off[3];  // q, k, v: offset of head 0 in its tensor
  int64_t ld[3];   // row strides
  int src[3];      // which input (and din) holds q, k, v
  int64_t group() const { return nh / nkv; }
  int64_t at(int part, int64_t b, int64_t h) const { return off[part] + b * T * ld[part] + h * hs; }
};

Layout layout_of(const std::vector<Tensor>& in, int64_t nh, int64_t nkv) {
  Layout L{};
  L.B = in[0].shape[0];
  L.T = in[0].shape[1];
  L.nh = nh;
  L.nkv = nkv;
  if (in.size() == 1) {
    L.hs = in[0].shape[2] / (nh + 2 * nkv);
    const int64_t w = in[0].shape[2];
    L.off[0] = 0, L.off[1] = nh * L.hs, L.off[2] = (nh + nkv) * L.hs;
    L.ld[0] = L.ld[1] = L.ld[2] = w;
    L.src[0] = L.src[1] = L.src[2] = 0;
  } else {
    L.hs = in[0].shape[2] / nh;
    for (int p = 0; p < 3; ++p) L.off[p] = 0, L.ld[p] = in[size_t(p)].shape[2], L.src[p] = p;
  }
  return L;
}

// Threads for a loop over B * n_head heads that uses `slots` per-thread scratch slots.
int threads_for(int64_t heads, int64_t slots) {
  return int(std::max<int64_t>(1, std::min<int64_t>({heads, slots, int64_t(omp_get_max_threads())})));
}

// P[0:T, 0:T] of one head: the scores q k^T / sqrt(hs), block of rows by block, then the
// causal softmax of each row (zeros above the diagonal). Forward and the recompute of
// selective recomputation both call it, so they compute bitwise the same P.
void probs_block(const float* q, int64_t ldq, const float* k, int64_t ldk, int64_t T, int64_t hs, float scale,
                 int64_t i0, float* P) {
  const int64_t i1 = std::min(T, i0 + kBlock), m = i1 - i0;
  // S[i0:i1, 0:i1] = q[i0:i1] k[0:i1]^T / sqrt(hs)
  sgemm(false, true, m, i1, hs, scale, q + i0 * ldq, ldq, k, ldk, P + i0 * T, T);
  for (int64_t i = i0; i < i1; ++i) softmax_causal_row(P + i * T, i + 1, T);
}

}  // namespace

CausalSelfAttention::CausalSelfAttention(int64_t n_head, bool recompute, int64_t n_kv_head)
    : n_head_(n_head), n_kv_head_(n_kv_head == 0 ? n_head : n_kv_head), recompute_(recompute) {
  SAT_CHECK(n_head > 0, "CausalSelfAttention: n_head must be positive, got ", n_head);
  SAT_CHECK(n_kv_head_ > 0 && n_head % n_kv_head_ == 0, "CausalSelfAttention: n_head=", n_head,
            " must be a multiple of n_kv_head=", n_kv_head_, " (each key/value head serves a group of query heads)");
}

namespace {

// The head size from the one fused qkv input [B, T, (nh + 2 nkv) hs] or the three inputs
// q [B, T, nh hs], k and v [B, T, nkv hs]; sat::Error naming the layer otherwise.
int64_t head_size(const LayerSetup& s, int64_t nh, int64_t nkv) {
  const Shape& x = s.in_shape(0);
  for (const TensorSpec& t : s.inputs)
    SAT_CHECK(t.dtype == s.act, s.name, ": CausalSelfAttention expects ", dtype_name(s.act), " inputs");
  if (s.inputs.size() == 1) {
    const int64_t parts = nh + 2 * nkv;
    SAT_CHECK(x.nd == 3 && x[2] % parts == 0 && x[2] > 0 && x[1] > 0, s.name,
              ": CausalSelfAttention expects qkv [B, T, ", nh == nkv ? "3C" : str_cat("(", nh, " + 2*", nkv, ") hs"),
              "], got ", x.str());
    const int64_t hs = x[2] / parts;
    if (nh == nkv)
      SAT_CHECK((x[2] / 3) % nh == 0, s.name, ": CausalSelfAttention: n_embd C=", x[2] / 3,
                " is not divisible by n_head=", nh);
    return hs;
  }
  SAT_CHECK(s.inputs.size() == 3, s.name, ": CausalSelfAttention takes one input (qkv) or three (q, k, v), got ",
            s.inputs.size());
  SAT_CHECK(x.nd == 3 && x[1] > 0 && x[2] > 0 && x[2] % nh == 0, s.name, ": CausalSelfAttention expects q [B, T, ",
            nh, " heads x hs], got ", x.str());
  const int64_t hs = x[2] / nh;
  for (int i = 1; i < 3; ++i)
    SAT_CHECK(s.in_shape(i) == (Shape{x[0], x[1], nkv * hs}), s.name, ": CausalSelfAttention expects ",
              i == 1 ? "k" : "v", " [", x[0], ", ", x[1], ", ", nkv * hs, "] (", nkv, " heads of ", hs, "), got ",
              s.in_shape(i).str());
  return hs;
}

}  // namespace

void CausalSelfAttention::setup(LayerSetup& s) {
  SAT_CHECK(!s.inputs.empty(), s.name, ": CausalSelfAttention takes one input (qkv) or three (q, k, v), got none");
  const int64_t hs = head_size(s, n_head_, n_kv_head_);
  const Shape& x = s.in_shape(0);
  const int64_t B = x[0], T = x[1], C = n_head_ * hs;
  s.set_output(Shape{B, T, C}, s.act);

  const bool keep = s.training && !recompute_;  // P saved for backward
  if (s.device == Device::cuda) {
    // GPU (attention.cu): per-head copies of q, k, v and batched GEMMs over all heads.
    // Selective recomputation is planned here (P not kept, recomputed into backward
    // scratch) so that a plan for the GPU can weigh it, but the GPU kernels refuse it yet.
    // So is grouped-query attention (and three inputs): planned as if each key/value head
    // were copied once per query head (HF's repeat_kv), refused by the kernels yet, so
    // that the planner can lay out Llama on GPUs.
    const Shape heads3{3, B, n_head_, T, hs}, heads1{B, n_head_, T, hs}, probs{B, n_head_, T, T};
    const bool f32 = s.act == DType::f32;
    if (keep) s.save(probs, s.act);                       // P, kept for backward
    s.scratch_forward(heads3, s.act);                     // 0: q, k, v as [3, B, nh, T, hs]
    s.scratch_forward(heads1, s.act);                     // 1: y as [B, nh, T, hs]
    if (!keep) s.scratch_forward(probs, s.act);           // 2: P (not kept)
    if (!f32) s.scratch_forward(probs, DType::f32);       // last: scores (under f32 computed in P)
    if (s.training) {
      s.scratch_backward(heads3, s.act);                  // 0: q, k, v as [3, B, nh, T, hs]
      s.scratch_backward(heads1, s.act);                  // 1: dy as [B, nh, T, hs]
      s.scratch_backward(heads3, s.act);                  // 2: dq, dk, dv as [3, B, nh, T, hs]
      s.scratch_backward(probs, DType::f32);              // 3: dP (under f32 also dS, in place)
      if (!f32) s.scratch_backward(probs, s.act);         // 4: dS
      if (!keep) s.scratch_backward(probs, s.act);        // last: P recomputed
    }
  } else {
    // Per-thread scratch slots: sized for the OpenMP threads available now (and never more
    // than there are heads to process); forward/backward never use more threads than this.
    const int64_t slots = std::max<int64_t>(1, std::min<int64_t>(cpu::num_threads(), B * n_head_));
    if (keep) s.save(Shape{B, n_head_, T, T});     // P, kept for backward
    else s.scratch_forward(Shape{slots, T, T});    // P, one per thread (not kept)
    if (s.training) {
      s.scratch_backward(Shape{slots, T, T});      // 0: dP, then dS in place, one per thread
      if (!keep) s.scratch_backward(Shape{slots, T, T});  // 1: P recomputed, one per thread
    }
  }

  // Multiply-adds over the causal triangle (T(T+1)/2 (query, key) pairs per head):
  // forward q k^T and P v; backward dY v^T, P^T dY, dS k, dS^T q. Softmax not counted.
  const double pairs = double(T) * double(T + 1) / 2.0;
  s.flops_fwd = 2.0 * 2.0 * double(B * n_head_) * pairs * double(hs);
  s.flops_bwd = 2.0 * s.flops_fwd;
}

void CausalSelfAttention::forward(LayerCtx& c) {
  const Layout L = layout_of(c.in, n_head_, n_kv_head_);
  const int64_t T = L.T, hs = L.hs, C = L.nh * hs, heads = L.B * L.nh;
  const float scale = 1.0f / std::sqrt(float(hs));
  const float* q_all = c.in[size_t(L.src[0])].f32();
  const float* k_all = c.in[size_t(L.src[1])].f32();
  const float* v_all = c.in[size_t(L.src[2])].f32();
  float* y = c.out.f32();
  // P lives in the saved buffer [B, nh, T, T] when training, else in per-thread scratch.
  const bool keep = !c.saved.empty();
  float* P_all = keep ? c.saved[0].f32() : c.scratch[0].f32();
  const int nthr = threads_for(heads, keep ? heads : c.scratch[0].shape[0]);

#pragma omp parallel for num_threads(nthr) schedule(dynamic, 1)
  for (int64_t bh = 0; bh < heads; ++bh) {
    const int64_t b = bh / L.nh, h = bh % L.nh, kvh = h / L.group();
    const float* q = q_all + L.at(0, b, h);  // [T, hs], row stride ld[0]
    const float* k = k_all + L.at(1, b, kvh);
    const float* v = v_all + L.at(2, b, kvh);
    float* P = P_all + (keep ? bh : int64_t(omp_get_thread_num())) * T * T;  // [T, T]
    float* yh = y + b * T * C + h * hs;  // [T, hs], row stride C
    for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
      const int64_t i1 = std::min(T, i0 + kBlock), m = i1 - i0;
      probs_block(q, L.ld[0], k, L.ld[1], T, hs, scale, i0, P);
      // y[i0:i1] = P[i0:i1, 0:i1] v[0:i1]
      sgemm(false, false, m, hs, i1, 1.0f, P + i0 * T, T, v, L.ld[2], yh + i0 * C, C);
    }
  }
}

void CausalSelfAttention::backward(LayerCtx& c) {
  const size_t needed = size_t(std::count_if(c.din.begin(), c.din.end(), [](const Tensor& t) { return t.defined(); }));
  if (needed == 0) return;
  SAT_CHECK(needed == c.din.size(), "CausalSelfAttention: the gradients of q, k and v are needed together");
  SAT_CHECK(!c.saved.empty() || c.scratch.size() == 2,
            "CausalSelfAttention: backward called on a layer set up without training");
  const bool kept = !c.saved.empty();  // else recomputed per head into scratch[1]
  const Layout L = layout_of(c.in, n_head_, n_kv_head_);
  const int64_t T = L.T, hs = L.hs, C = L.nh * hs, G = L.group(), kv_heads = L.B * L.nkv;
  const int64_t ldq = L.ld[0], ldk = L.ld[1], ldv = L.ld[2];
  const float scale = 1.0f / std::sqrt(float(hs));
  const float* dy = c.dout.f32();
  const float* P_all = kept ? c.saved[0].f32() : nullptr;
  float* Pr_all = kept ? nullptr : c.scratch[1].f32();
  float* dS_all = c.scratch[0].f32();
  const int nthr = threads_for(kv_heads, c.scratch[0].shape[0]);

  // One iteration per (batch, key/value head): its query heads in turn, the first
  // overwriting dk and dv and the others adding to them (beta 1).
#pragma omp parallel for num_threads(nthr) schedule(dynamic, 1)
  for (int64_t bk = 0; bk < kv_heads; ++bk) {
    const int64_t b = bk / L.nkv, kvh = bk % L.nkv;
    const float* k = c.in[size_t(L.src[1])].f32() + L.at(1, b, kvh);  // [T, hs], row stride ldk
    const float* v = c.in[size_t(L.src[2])].f32() + L.at(2, b, kvh);
    float* dk = c.din[size_t(L.src[1])].f32() + L.at(1, b, kvh);
    float* dv = c.din[size_t(L.src[2])].f32() + L.at(2, b, kvh);
    const int64_t slot = int64_t(omp_get_thread_num());
    float* dS = dS_all + slot * T * T;  // [T, T]
    for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h) {
      const float beta = h == kvh * G ? 0.0f : 1.0f;
      const float* q = c.in[size_t(L.src[0])].f32() + L.at(0, b, h);  // [T, hs], row stride ldq
      float* dq = c.din[size_t(L.src[0])].f32() + L.at(0, b, h);
      const float* dyh = dy + b * T * C + h * hs;  // [T, hs], row stride C
      const float* P;                              // [T, T], zero above the diagonal
      if (kept) {
        P = P_all + (b * L.nh + h) * T * T;
      } else {
        float* Pr = Pr_all + slot * T * T;
        for (int64_t i0 = 0; i0 < T; i0 += kBlock) probs_block(q, ldq, k, ldk, T, hs, scale, i0, Pr);
        P = Pr;
      }
      for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
        const int64_t i1 = std::min(T, i0 + kBlock), m = i1 - i0;
        // dP[i0:i1, 0:i1] = dY[i0:i1] v[0:i1]^T
        sgemm(false, true, m, i1, hs, 1.0f, dyh + i0 * C, C, v, ldv, dS + i0 * T, T);
        // dS = P * (dP - rowsum(dP * P)) / sqrt(hs) on the triangle, 0 above it (in this block).
        for (int64_t i = i0; i < i1; ++i) softmax_backward_row(dS + i * T, P + i * T, i + 1, i1, scale);
        // dq[i0:i1] = dS[i0:i1, 0:i1] k[0:i1]
        sgemm(false, false, m, hs, i1, 1.0f, dS + i0 * T, T, k, ldk, dq + i0 * ldq, ldq);
      }
      // Keys/values j in [j0, j1) get contributions from queries i >= j0 only.
      for (int64_t j0 = 0; j0 < T; j0 += kBlock) {
        const int64_t j1 = std::min(T, j0 + kBlock), m = j1 - j0;
        // dv[j0:j1] (+)= P[j0:T, j0:j1]^T dY[j0:T]
        sgemm(true, false, m, hs, T - j0, 1.0f, P + j0 * T + j0, T, dyh + j0 * C, C, dv + j0 * ldv, ldv, beta);
        // dk[j0:j1] (+)= dS[j0:T, j0:j1]^T q[j0:T]
        sgemm(true, false, m, hs, T - j0, 1.0f, dS + j0 * T + j0, T, q + j0 * ldq, ldq, dk + j0 * ldk, ldk, beta);
      }
    }
  }
}

}  // namespace sat
