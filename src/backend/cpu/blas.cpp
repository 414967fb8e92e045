#include "backend/cpu/blas.h"

#include <cblas.h>
#include <omp.h>
#include <thread>

namespace sat::cpu {

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
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

void set_num_threads(int n) {
  if (n <= 0) n = int(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  g_threads = n;
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return g_threads ? g_threads : omp_get_max_threads(); }

}  // namespace sat::cpu
