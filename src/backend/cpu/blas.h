// The CPU backend's GEMM: row-major C[M,N] = alpha * op(A)[M,K] * op(B)[K,N] + beta * C,
// through OpenBLAS (threaded with the same OpenMP pool as the engine's own loops).
#pragma once
#include <cstdint>

namespace sat::cpu {

// lda/ldb/ldc are row strides of A, B, C as stored (before the transpose is applied).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Batched: `batch` independent GEMMs, each operand advanced by its stride per batch.
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb,
                  int64_t stride_b, float beta, float* C, int64_t ldc, int64_t stride_c, int64_t batch);

// Threads used by BLAS and the engine's OpenMP loops (0 = all cores).
void set_num_threads(int n);
int num_threads();

}  // namespace sat::cpu
