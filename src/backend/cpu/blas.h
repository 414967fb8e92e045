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

// Threads used by BLAS and the engine's OpenMP loops: n, or with n = 0 default_threads.
void set_num_threads(int n, int ranks_on_host = 1);
int num_threads();
// The cores this process may use, so that no launch oversubscribes the host by default:
//   OMP_NUM_THREADS when set (the launcher's or the user's choice); else the CPU set the
//   process is bound to (sched_getaffinity: mpirun's --bind-to, Slurm's --cpus-per-task,
//   taskset) when it is smaller than the host; else the host's cores divided among the
//   ranks_on_host ranks running on it (at least 1).
int default_threads(int ranks_on_host);

}  // namespace sat::cpu
