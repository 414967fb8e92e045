// Context parallelism's ring attention on the CPU (see ring_attention.h).
#include "nn/ring_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/error.h"

namespace sat::cp {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Row-major SGEMM (OpenBLAS runs single-threaded inside our OpenMP loop over heads).
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// How query chunk qa sees key chunk kb: every key (the keys come first), the causal
// triangle (the same chunk), or none (the keys come after the queries).
enum class Seen { all, causal, none };
Seen seen(const Chunks& qc, int qa, const Chunks& kc, int kb) {
  const int64_t q0 = qc.first[qa], k0 = kc.first[kb];
  return k0 < q0 ? Seen::all : k0 == q0 ? Seen::causal : Seen::none;
}

// Keys visible to local query row i of a chunk pair.
int64_t visible(Seen s, int64_t i, int64_t len) { return s == Seen::causal ? i + 1 : len; }

// S = q k^T / sqrt(hs) of one chunk pair of one head ([len, len], row stride len).
void scores(const Dims& d, const float* q, const float* k, float* S) {
  const int64_t len = d.rows / 2;
  sgemm(false, true, len, len, d.hs, 1.0f / std::sqrt(float(d.hs)), q, d.nh * d.hs, k, d.nkv * d.hs, 0.0f, S, len);
}

// log(exp(a) + exp(b)), -inf when both are.
float log_add(float a, float b) {
  const float m = std::max(a, b);
  if (m == kNegInf) return kNegInf;
  return m + std::log(std::exp(a - m) + std::exp(b - m));
}

// One chunk pair of forward for one head: out rows (stride ldo) and lse (its rows) merged
// with softmax(S) v. S and O are scratch [len, len] and [len, hs].
void forward_pair(const Dims& d, Seen s, const float* q, const float* k, const float* v, float* out, float* lse,
                  float* S, float* O) {
  const int64_t len = d.rows / 2, hs = d.hs, ldo = d.nh * hs;
  scores(d, q, k, S);
  std::vector<float> keep(static_cast<size_t>(len)), add(static_cast<size_t>(len));
  for (int64_t i = 0; i < len; ++i) {
    float* row = S + i * len;
    const int64_t n = visible(s, i, len);
    const float m = *std::max_element(row, row + n);
    float l = 0.0f;
    for (int64_t j = 0; j < n; ++j) l += (row[j] = std::exp(row[j] - m));
    std::fill(row + n, row + len, 0.0f);
    const float merged = log_add(lse[i], m + std::log(l));
    keep[size_t(i)] = lse[i] == kNegInf ? 0.0f : std::exp(lse[i] - merged);
    add[size_t(i)] = std::exp(m - merged);  // softmax(S) v = O / l, O unnormalized
    lse[i] = merged;
  }
  sgemm(false, false, len, hs, len, 1.0f, S, len, v, d.nkv * hs, 0.0f, O, hs);
  for (int64_t i = 0; i < len; ++i)
    for (int64_t j = 0; j < hs; ++j) out[i * ldo + j] = out[i * ldo + j] * keep[size_t(i)] + O[i * hs + j] * add[size_t(i)];
}

// One chunk pair of backward for one head: P recomputed from the saved lse, then
// dv += P^T dout, dS = P (dout v^T - delta) / sqrt(hs), dq += dS k, dk += dS^T q.
// P and dS are scratch [len, len].
void backward_pair(const Dims& d, Seen s, const float* q, const float* k, const float* v, const float* dout,
                   const float* lse, const float* delta, float* dq, float* dk, float* dv, float* P, float* dS) {
  const int64_t len = d.rows / 2, hs = d.hs, ldq = d.nh * hs, ldk = d.nkv * hs;
  const float scale = 1.0f / std::sqrt(float(hs));
  scores(d, q, k, P);
  for (int64_t i = 0; i < len; ++i) {
    float* row = P + i * len;
    const int64_t n = visible(s, i, len);
    for (int64_t j = 0; j < n; ++j) row[j] = std::exp(row[j] - lse[i]);
    std::fill(row + n, row + len, 0.0f);
  }
  sgemm(true, false, len, hs, len, 1.0f, P, len, dout, ldq, 1.0f, dv, ldk);
  sgemm(false, true, len, len, hs, 1.0f, dout, ldq, v, ldk, 0.0f, dS, len);
  for (int64_t i = 0; i < len; ++i)
    for (int64_t j = 0; j < len; ++j) dS[i * len + j] = P[i * len + j] * (dS[i * len + j] - delta[i]) * scale;
  sgemm(false, false, len, hs, len, 1.0f, dS, len, k, ldk, 1.0f, dq, ldq);
  sgemm(true, false, len, hs, len, 1.0f, dS, len, q, ldq, 1.0f, dk, ldk);
}

}  // namespace

Chunks chunks_of(int64_t T, int cp, int rank) {
  SAT_CHECK(cp >= 1, "--cp ", cp, ": the context-parallel size must be at least 1");
  SAT_CHECK(T % (2 * int64_t(cp)) == 0 && T > 0, "--cp ", cp, ": the context of ", T,
            " tokens must be a multiple of 2 x cp = ", 2 * int64_t(cp), " (each rank holds two equal chunks)");
  SAT_CHECK(rank >= 0 && rank < cp, "cp::chunks_of: rank ", rank, " is not in a group of ", cp);
  Chunks c;
  c.len = T / (2 * cp);
  c.first[0] = rank * c.len;
  c.first[1] = (2 * int64_t(cp) - 1 - rank) * c.len;
  return c;
}

void gather_rows(const float* src, float* dst, int64_t B, int64_t T, int64_t width, const Chunks& c) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < 2 * c.len; ++i)
      std::memcpy(dst + (b * 2 * c.len + i) * width, src + (b * T + c.pos(i)) * width, size_t(width) * sizeof(float));
}

void scatter_rows(const float* src, float* dst, int64_t B, int64_t T, int64_t width, const Chunks& c) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < 2 * c.len; ++i)
      std::memcpy(dst + (b * T + c.pos(i)) * width, src + (b * 2 * c.len + i) * width, size_t(width) * sizeof(float));
}

void forward_begin(const Dims& d, float* out, float* lse) {
  std::fill(out, out + d.q_size(), 0.0f);
  std::fill(lse, lse + d.lse_size(), kNegInf);
}

void forward_step(const Dims& d, const float* q, const Chunks& qc, const float* k, const float* v, const Chunks& kc,
                  float* out, float* lse) {
  const int64_t len = d.rows / 2, hs = d.hs, ldq = d.nh * hs, ldk = d.nkv * hs, G = d.nh / d.nkv;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bh = 0; bh < d.B * d.nh; ++bh) {
    const int64_t b = bh / d.nh, h = bh % d.nh;
    std::vector<float> S(size_t(len * len)), O(size_t(len * hs));
    for (int qa = 0; qa < 2; ++qa)
      for (int kb = 0; kb < 2; ++kb) {
        const Seen s = seen(qc, qa, kc, kb);
        if (s == Seen::none) continue;
        const int64_t qrow = b * d.rows + qa * len, krow = b * d.rows + kb * len;
        forward_pair(d, s, q + qrow * ldq + h * hs, k + krow * ldk + h / G * hs, v + krow * ldk + h / G * hs,
                     out + qrow * ldq + h * hs, lse + bh * d.rows + qa * len, S.data(), O.data());
      }
  }
}

void backward_begin(const Dims& d, const float* out, const float* dout, float* delta, float* dq) {
  const int64_t hs = d.hs, ldq = d.nh * hs;
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t h = 0; h < d.nh; ++h)
      for (int64_t i = 0; i < d.rows; ++i) {
        const int64_t at = (b * d.rows + i) * ldq + h * hs;
        float sum = 0.0f;
        for (int64_t j = 0; j < hs; ++j) sum += dout[at + j] * out[at + j];
        delta[(b * d.nh + h) * d.rows + i] = sum;
      }
  std::fill(dq, dq + d.q_size(), 0.0f);
}

void backward_step(const Dims& d, const float* q, const Chunks& qc, const float* k, const float* v, const Chunks& kc,
                   const float* dout, const float* lse, const float* delta, float* dq, float* dk, float* dv) {
  const int64_t len = d.rows / 2, hs = d.hs, ldq = d.nh * hs, ldk = d.nkv * hs, G = d.nh / d.nkv;
  // One iteration per (batch, key/value head): its group's query heads add to its dk, dv in
  // turn, so no two threads write the same rows.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t bk = 0; bk < d.B * d.nkv; ++bk) {
    const int64_t b = bk / d.nkv, kvh = bk % d.nkv;
    std::vector<float> P(size_t(len * len)), dS(size_t(len * len));
    for (int64_t h = kvh * G; h < (kvh + 1) * G; ++h)
      for (int qa = 0; qa < 2; ++qa)
        for (int kb = 0; kb < 2; ++kb) {
          const Seen s = seen(qc, qa, kc, kb);
          if (s == Seen::none) continue;
          const int64_t qrow = b * d.rows + qa * len, krow = b * d.rows + kb * len;
          const int64_t qat = qrow * ldq + h * hs, kat = krow * ldk + kvh * hs, lat = (b * d.nh + h) * d.rows + qa * len;
          backward_pair(d, s, q + qat, k + kat, v + kat, dout + qat, lse + lat, delta + lat, dq + qat, dk + kat,
                        dv + kat, P.data(), dS.data());
        }
  }
}

Shift comm_shift(dist::Comm& group) {
  return [&group](const float* send, float* recv, size_t n, int dir) {
    const int C = group.size(), r = group.rank();
    group.send_recv(send, n, ((r + dir) % C + C) % C, recv, n, ((r - dir) % C + C) % C, DType::f32)->wait();
  };
}

int64_t forward_work(const Dims& d) { return 4 * d.kv_size(); }
int64_t backward_work(const Dims& d) { return 8 * d.kv_size() + d.lse_size(); }

void ring_forward(const Dims& d, int cp, int rank, const Chunks& mine, const float* q, const float* k,
                  const float* v, float* out, float* lse, const Shift& shift, float* work) {
  const int64_t T = 2 * mine.len * cp, n = d.kv_size();
  std::vector<float> own(work ? 0 : size_t(forward_work(d)));
  if (!work) work = own.data();
  float* cur = work;          // the block held: k, v
  float* next = work + 2 * n;  // the block arriving
  std::copy(k, k + n, cur);
  std::copy(v, v + n, cur + n);
  forward_begin(d, out, lse);
  for (int s = 0; s < cp; ++s) {  // step s holds the block of rank - s
    const Chunks kc = chunks_of(T, cp, (rank - s + cp) % cp);
    forward_step(d, q, mine, cur, cur + n, kc, out, lse);
    if (s + 1 < cp) {
      shift(cur, next, size_t(2 * n), +1);
      std::swap(cur, next);
    }
  }
}

void ring_backward(const Dims& d, int cp, int rank, const Chunks& mine, const float* q, const float* k,
                   const float* v, const float* out, const float* dout, const float* lse, float* dq, float* dk,
                   float* dv, const Shift& shift, float* work) {
  const int64_t T = 2 * mine.len * cp, n = d.kv_size();
  std::vector<float> own(work ? 0 : size_t(backward_work(d)));
  if (!work) work = own.data();
  // The travelling block: k, v, then the dk, dv accumulated for it.
  float* cur = work;
  float* next = work + 4 * n;
  float* delta = work + 8 * n;
  std::copy(k, k + n, cur);
  std::copy(v, v + n, cur + n);
  std::fill(cur + 2 * n, cur + 4 * n, 0.0f);
  backward_begin(d, out, dout, delta, dq);
  for (int s = 0; s < cp; ++s) {  // step s holds the block of rank + s
    const Chunks kc = chunks_of(T, cp, (rank + s) % cp);
    backward_step(d, q, mine, cur, cur + n, kc, dout, lse, delta, dq, cur + 2 * n, cur + 3 * n);
    if (s + 1 < cp) {
      shift(cur, next, size_t(4 * n), -1);
      std::swap(cur, next);
    }
  }
  if (cp > 1) {  // the last block held is rank + cp - 1's: one more shift brings ours home
    shift(cur + 2 * n, next + 2 * n, size_t(2 * n), -1);
    std::swap(cur, next);
  }
  std::copy(cur + 2 * n, cur + 3 * n, dk);
  std::copy(cur + 3 * n, cur + 4 * n, dv);
}

}  // namespace sat::cp
