// GEMMs of the CUDA backend: cuBLASLt on row-major matrices, on c->stream, with
// c->workspace as the library's workspace (nothing is allocated).
//
//   D[M, N] = epilogue(alpha * op(A) op(B) + beta * D)     all row-major,
//   op(A) [M, K] = trans_a ? A^T : A,  op(B) [K, N] = trans_b ? B^T : B.
//
// Types: A and B have the same type (f32, bf16 or f16); D has that type or f32
// (weight gradients: bf16 inputs, f32 output, beta = 1 to accumulate). Arithmetic is
// float32 (CUBLAS_COMPUTE_32F), or TF32 tensor cores for f32 inputs when c->tf32.
// beta == 0 never reads D (it may hold garbage, NaN included).
//
// The algorithm is chosen once per problem (shape, leading dimensions, strides,
// dtypes, epilogue, pointer alignments) by cuBLASLt's heuristic and cached, so later
// calls, including those made while a CUDA graph is captured, query nothing. Where
// cuBLASLt offers no algorithm for a plain GEMM (no epilogue) the cached choice is
// cuBLAS's cublasGemmStridedBatchedEx instead; with an epilogue it is an error.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace sat {

struct CudaCtx;

// Fused post-processing, all optional. Combinations: none; bias; gelu (+ bias, + aux);
// dgelu (with aux); bgrad_a; bgrad_b. aux and the bias gradients need batch count 1.
struct GemmEpilogue {
  // D[m, n] += bias[n] before the activation (CUBLASLT_EPILOGUE_BIAS). Same dtype as D,
  // contiguous, length N; shared by every matrix of a batch.
  const void* bias = nullptr;
  // D = gelu(x) with the tanh approximation, x = alpha op(A) op(B) + beta D (+ bias)
  // (CUBLASLT_EPILOGUE_GELU[_AUX][_BIAS]). With aux != nullptr, x itself is also
  // written to aux: row-major [M, N], dtype of D, leading dimension aux_ld.
  bool gelu = false;
  // D = (alpha op(A) op(B)) * gelu'(aux) (CUBLASLT_EPILOGUE_DGELU): the backward of
  // the GELU above, reading x back from aux. Needs beta == 0.
  bool dgelu = false;
  void* aux = nullptr;
  int64_t aux_ld = 0;  // elements; >= N and a multiple of 8 (a cuBLASLt requirement)
  // Bias gradients, written (never accumulated) in the dtype of D, beside the GEMM:
  //   bgrad_a[m] = sum_k op(A)[m, k]   (CUBLASLT_EPILOGUE_BGRADB; Linear's db in
  //                                     dW = dY^T X, i.e. trans_a && !trans_b)
  //   bgrad_b[n] = sum_k op(B)[k, n]   (CUBLASLT_EPILOGUE_BGRADA)
  void* bgrad_a = nullptr;
  void* bgrad_b = nullptr;
};

namespace cuda {

// Contiguous row-major operands (leading dimensions K or M for A, N or K for B, N for D).
void gemm(CudaCtx* c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, DType a_t,
          const void* B, DType b_t, void* D, DType d_t, float alpha, float beta, const GemmEpilogue& ep = {});

// `batch` independent GEMMs: matrix i of A starts at A + i * stride_a elements (and so
// on), each contiguous row-major as in gemm(). Attention's per-(batch, head) products.
void gemm_batched(CudaCtx* c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A,
                  DType a_t, int64_t stride_a, const void* B, DType b_t, int64_t stride_b, void* D, DType d_t,
                  int64_t stride_d, int64_t batch, float alpha, float beta, const GemmEpilogue& ep = {});

// The general form: explicit leading dimensions (elements between rows, at least the
// row length) and batch strides (elements; ignored when batch == 1).
void gemm_ex(CudaCtx* c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, DType a_t,
             int64_t lda, int64_t stride_a, const void* B, DType b_t, int64_t ldb, int64_t stride_b, void* D,
             DType d_t, int64_t ldd, int64_t stride_d, int64_t batch, float alpha, float beta,
             const GemmEpilogue& ep = {});

// Number of cached algorithm choices (tests: a repeated call adds none).
size_t gemm_cache_size();

}  // namespace cuda
}  // namespace sat
