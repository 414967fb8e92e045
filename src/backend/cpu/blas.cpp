#include "backend/cpu/blas.h"

#include <cblas.h>
#include <sched.h>
#include <omp.h>
#include <algorithm>
#include <cstdlib>
#include <thread>

namespace sat::cpu {

// Products stay on OpenBLAS rather than oneDNN's matmul, by measurement (bench/gemm_paths:
// the Linear layers' three products of mlp at batch 64 and 512 and of gpt-mini at batch 8,
// 2 threads, Zen 3, two runs; OpenBLAS's time over oneDNN 2.6's): forward and input
// gradient 0.95-1.47 (most within 1.0-1.2, and a shape's ratio moved by up to 0.5 between
// runs), weight gradient (A transposed) 0.51-0.96 (gpt-mini's fc, fc2 and head 0.51-0.60
// in both runs), and 1.3-3.7 only for mlp's 1024 -> 10 layer, 0.1 ms of a 4 ms step. No
// operand order wins both ways by enough to pay for primitives and their scratchpads in the
// plan.
//
// Below kSmallProduct multiply-adds sgemm is as fast as the paths below (and gemv wakes
// OpenBLAS's threads for a product of microseconds: 10x slower for a 1024 -> 10 layer at
// batch 1).
constexpr int64_t kSmallProduct = int64_t(1) << 16;

// A product with one row or one column of output is a matrix-vector product. OpenBLAS
// 0.3.21's sgemm packs the matrix operand first even then (later releases forward such
// calls to gemv themselves): for a layer at batch 1 that reads its weights three times
// instead of once.
static bool gemv_instead(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                         const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (K <= 1 || (M != 1 && N != 1) || M * N * K < kSmallProduct) return false;
  if (M == 1) {  // c[N] = op(B)^T a: a is A's one row (or its column when transposed)
    const int inc_a = ta ? int(lda) : 1;
    if (tb)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(N), int(K), alpha, B, int(ldb), A, inc_a, beta, C, 1);
    else
      cblas_sgemv(CblasRowMajor, CblasTrans, int(K), int(N), alpha, B, int(ldb), A, inc_a, beta, C, 1);
    return true;
  }
  const int inc_b = tb ? 1 : int(ldb);  // c[M] (stride ldc) = op(A) b
  if (ta)
    cblas_sgemv(CblasRowMajor, CblasTrans, int(K), int(M), alpha, A, int(lda), B, inc_b, beta, C, int(ldc));
  else
    cblas_sgemv(CblasRowMajor, CblasNoTrans, int(M), int(K), alpha, A, int(lda), B, inc_b, beta, C, int(ldc));
  return true;
}

// A product over one inner index is an outer product: one pass writing C. sgemm first
// scales C by beta in a pass of its own (zeroes it for beta 0), then reads and writes it
// again (a weight gradient at batch 1: three passes over the layer's weights).
static bool outer_instead(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (K != 1 || (beta != 0.0f && beta != 1.0f) || M * N < kSmallProduct) return false;
  const int64_t sa = ta ? 1 : lda, sb = tb ? ldb : 1;  // op(A)[i][0] = A[i sa], op(B)[0][j] = B[j sb]
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < M; ++i) {
    const float ai = alpha * A[i * sa];
    float* c = C + i * ldc;
    if (beta == 0.0f) {
      for (int64_t j = 0; j < N; ++j) c[j] = ai * B[j * sb];
    } else {
      for (int64_t j = 0; j < N; ++j) c[j] += ai * B[j * sb];
    }
  }
  return true;
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (gemv_instead(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  if (outer_instead(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)) return;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

void gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, int64_t sa, const float* B, int64_t ldb, int64_t sb, float beta, float* C,
                  int64_t ldc, int64_t sc, int64_t batch) {
  // Small GEMMs: run the batch in parallel; inside an active OpenMP region the OpenMP
  // build of OpenBLAS runs each call on one thread. (openblas_set_num_threads would
  // also set OpenMP's own count and serialise this loop.)
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < batch; ++b)
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, int(M), int(N),
                int(K), alpha, A + b * sa, int(lda), B + b * sb, int(ldb), beta, C + b * sc, int(ldc));
}

static int g_threads = 0;

int default_threads(int ranks_on_host) {
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end != env && v > 0) return int(std::min<long>(v, 1 << 16));
  }
  const int host = std::max(1, int(std::thread::hardware_concurrency()));
  cpu_set_t set;
  CPU_ZERO(&set);
  const int bound = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : host;
  if (bound > 0 && bound < host) return bound;
  return std::max(1, host / std::max(1, ranks_on_host));
}

void set_num_threads(int n, int ranks_on_host) {
  if (n <= 0) n = default_threads(ranks_on_host);
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return g_threads ? g_threads : omp_get_max_threads(); }

}  // namespace sat::cpu
