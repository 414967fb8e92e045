// cuBLASLt GEMMs on row-major matrices (see gemm.h).
//
// cuBLASLt is column-major. A row-major matrix X [r, c] with leading dimension ld is
// the column-major X^T [c, r] with the same ld, so the row-major D = op(A) op(B) is the
// column-major D^T = op(B)^T op(A)^T: cuBLASLt's A is our B (transposed as trans_b
// says), its B is our A (as trans_a says), and its (m, n, k) is our (N, M, K). The bias
// vector cuBLASLt broadcasts along D^T's rows is then one value per column of our D.
//
// Descriptors live on the stack (the *Init functions need no allocation); only the
// algorithm choice is cached, under a mutex, keyed by everything the heuristic sees.
#include "backend/cuda/gemm.h"

#include <array>
#include <climits>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"

namespace sat::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    default: break;
  }
  fail("cuda::gemm: unsupported dtype ", dtype_name(t), " (f32, bf16 or f16 expected)");
}

// Largest power of two (at most 256) dividing the address of every matrix of the
// batch and every row start: what cuBLASLt may assume about the buffer's alignment.
uint32_t alignment(const void* p, int64_t ld, int64_t stride, int64_t batch, size_t esize) {
  uint64_t a = uint64_t(reinterpret_cast<uintptr_t>(p)) | (uint64_t(ld) * esize);
  if (batch > 1) a |= uint64_t(stride) * esize;
  if (a == 0) return 256;
  const uint64_t low = a & (~a + 1);
  return low >= 256 ? 256u : uint32_t(low);
}

using Key = std::array<int64_t, 27>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (int64_t v : k) {
      h ^= uint64_t(v);
      h *= 1099511628211ull;
    }
    return size_t(h);
  }
};
struct Choice {
  bool lt = true;  // false: cublasGemmStridedBatchedEx (plain GEMMs cuBLASLt declined)
  cublasLtMatmulAlgo_t algo{};
};

std::mutex g_mu;
std::unordered_map<Key, Choice, KeyHash>& cache() {
  static auto* m = new std::unordered_map<Key, Choice, KeyHash>();  // never destroyed: no exit-order issues
  return *m;
}

// D = beta * D over the M x N window of each matrix (the K == 0 product); beta == 0
// writes zeros without reading D.
template <typename T>
__global__ void scale_kernel(T* d, int64_t M, int64_t N, int64_t ldd, int64_t stride, int64_t batch, float beta) {
  const int64_t n = batch * M * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t col = i % N, r = i / N, row = r % M, b = r / M;
    T* p = d + b * stride + row * ldd + col;
    *p = from_f<T>(beta == 0.0f ? 0.0f : beta * to_f<T>(*p));
  }
}

void scale_matrices(void* d, DType t, int64_t M, int64_t N, int64_t ldd, int64_t stride, int64_t batch, float beta,
                    cudaStream_t st) {
  const int64_t n = batch * M * N;
  if (n <= 0) return;
  unsigned g = grid_for(n);
  if (g > 65535u * 4) g = 65535u * 4;
  dispatch_float(t, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    scale_kernel<T><<<g, 256, 0, st>>>(static_cast<T*>(d), M, N, ldd, stride, batch, beta);
  });
  SAT_CUDA_LAUNCH_CHECK();
}

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "bias";
    case CUBLASLT_EPILOGUE_GELU: return "gelu";
    case CUBLASLT_EPILOGUE_GELU_AUX: return "gelu+aux";
    case CUBLASLT_EPILOGUE_GELU_BIAS: return "bias+gelu";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "bias+gelu+aux";
    case CUBLASLT_EPILOGUE_DGELU: return "dgelu";
    case CUBLASLT_EPILOGUE_BGRADA: return "bgrad_b";
    case CUBLASLT_EPILOGUE_BGRADB: return "bgrad_a";
    default: return "?";
  }
}

}  // namespace

size_t gemm_cache_size() {
  std::lock_guard<std::mutex> lk(g_mu);
  return cache().size();
}

void gemm_ex(CudaCtx* c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, DType a_t,
             int64_t lda, int64_t stride_a, const void* B, DType b_t, int64_t ldb, int64_t stride_b, void* D,
             DType d_t, int64_t ldd, int64_t stride_d, int64_t batch, float alpha, float beta,
             const GemmEpilogue& ep) {
  SAT_CHECK(c != nullptr, "cuda::gemm: no CUDA context");
  SAT_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, "cuda::gemm: negative size M=", M, " N=", N, " K=", K,
            " batch=", batch);
  if (M == 0 || N == 0 || batch == 0) return;
  SAT_CHECK(batch <= INT32_MAX, "cuda::gemm: batch count ", batch, " too large");
  SAT_CHECK(a_t == b_t, "cuda::gemm: A and B must have the same dtype, got ", dtype_name(a_t), " and ",
            dtype_name(b_t));
  SAT_CHECK(d_t == a_t || d_t == DType::f32, "cuda::gemm: output dtype ", dtype_name(d_t), " with ",
            dtype_name(a_t), " inputs (the input dtype or f32 expected)");
  const cudaDataType_t ab_type = cuda_type(a_t), d_type = cuda_type(d_t);
  const int64_t a_row = trans_a ? M : K, b_row = trans_b ? K : N;  // row lengths of A and B as stored
  SAT_CHECK(ldd >= N && (K == 0 || (lda >= a_row && ldb >= b_row)), "cuda::gemm: leading dimensions lda=", lda,
            " ldb=", ldb, " ldd=", ldd, " shorter than the rows of ", a_row, ", ", b_row, ", ", N);
  if (batch > 1)
    SAT_CHECK(stride_a >= 0 && stride_b >= 0 && stride_d >= 0, "cuda::gemm: negative batch stride");
  else
    stride_a = stride_b = stride_d = 0;

  // The epilogue, and the vector the BIAS_POINTER attribute names (bias or bias gradient).
  const bool bgrad = ep.bgrad_a || ep.bgrad_b;
  cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
  const void* vec = nullptr;
  if (ep.dgelu) {
    SAT_CHECK(!ep.gelu && !ep.bias && !bgrad && ep.aux, "cuda::gemm: dgelu takes aux (the GELU input) and no other epilogue");
    SAT_CHECK(beta == 0.0f, "cuda::gemm: dgelu needs beta == 0");
    epi = CUBLASLT_EPILOGUE_DGELU;
  } else if (ep.gelu) {
    SAT_CHECK(!bgrad, "cuda::gemm: gelu and a bias gradient cannot be combined");
    epi = ep.aux ? (ep.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                 : (ep.bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU);
    vec = ep.bias;
  } else if (ep.bias) {
    SAT_CHECK(!bgrad && !ep.aux, "cuda::gemm: bias combines only with gelu");
    epi = CUBLASLT_EPILOGUE_BIAS;
    vec = ep.bias;
  } else if (bgrad) {
    SAT_CHECK(!(ep.bgrad_a && ep.bgrad_b) && !ep.aux, "cuda::gemm: one bias gradient at a time, without aux");
    epi = ep.bgrad_a ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
    vec = ep.bgrad_a ? static_cast<const void*>(ep.bgrad_a) : static_cast<const void*>(ep.bgrad_b);
  } else {
    SAT_CHECK(!ep.aux, "cuda::gemm: aux given without gelu or dgelu");
  }
  const bool use_aux = ep.aux != nullptr;
  if (use_aux)
    SAT_CHECK(ep.aux_ld >= N && ep.aux_ld % 8 == 0, "cuda::gemm: aux_ld=", ep.aux_ld,
              " must be >= N=", N, " and a multiple of 8");
  SAT_CHECK(batch == 1 || !(use_aux || bgrad), "cuda::gemm: aux and bias gradients need batch count 1");

  if (K == 0) {  // op(A) op(B) = 0
    SAT_CHECK(epi == CUBLASLT_EPILOGUE_DEFAULT, "cuda::gemm: K == 0 with an epilogue");
    scale_matrices(D, d_t, M, N, ldd, stride_d, batch, beta, c->stream);
    return;
  }

  const cublasComputeType_t compute =
      (c->tf32 && a_t == DType::f32 && d_t == DType::f32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t op_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A: our B
  const cublasOperation_t op_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B: our A

  cublasLtMatmulDescOpaque_t desc_mem;
  cublasLtMatmulDesc_t desc = &desc_mem;
  SAT_CUBLAS_CHECK(cublasLtMatmulDescInit(desc, compute, CUDA_R_32F));
  SAT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  SAT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  SAT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
  if (vec) SAT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
  if (use_aux) {
    void* aux = ep.aux;
    const int64_t aux_ld = ep.aux_ld;
    SAT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    SAT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
  }

  // Column-major layouts: cuBLASLt's A (our B) is m x k = N x K before its op, i.e.
  // stored K x N when transposed; its B (our A) is k x n = K x M, stored M x K when
  // transposed; D is N x M.
  cublasLtMatrixLayoutOpaque_t la_mem, lb_mem, ld_mem;
  cublasLtMatrixLayout_t la = &la_mem, lb = &lb_mem, ldl = &ld_mem;
  SAT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(la, ab_type, uint64_t(trans_b ? K : N), uint64_t(trans_b ? N : K), ldb));
  SAT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(lb, ab_type, uint64_t(trans_a ? M : K), uint64_t(trans_a ? K : M), lda));
  SAT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(ldl, d_type, uint64_t(N), uint64_t(M), ldd));
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    const std::pair<cublasLtMatrixLayout_t, int64_t> ls[] = {{la, stride_b}, {lb, stride_a}, {ldl, stride_d}};
    for (const auto& [l, stride] : ls) {
      SAT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      SAT_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
    }
  }

  const size_t ab_size = dtype_size(a_t), d_size = dtype_size(d_t);
  const uint32_t align_a = alignment(B, ldb, stride_b, batch, ab_size);  // cuBLASLt's A
  const uint32_t align_b = alignment(A, lda, stride_a, batch, ab_size);  // cuBLASLt's B
  const uint32_t align_d = alignment(D, ldd, stride_d, batch, d_size);
  const uint32_t align_vec = vec ? alignment(vec, 0, 0, 1, 1) : 0;
  const uint32_t align_aux = use_aux ? alignment(ep.aux, ep.aux_ld, 0, 1, d_size) : 0;

  const Key key = {int64_t(c->device), int64_t(c->workspace_bytes), trans_a, trans_b, M, N, K, lda, ldb, ldd,
                   stride_a, stride_b, stride_d, batch, int64_t(a_t), int64_t(d_t), int64_t(compute), int64_t(epi),
                   use_aux ? ep.aux_ld : 0, align_a, align_b, align_d, align_vec, align_aux, 0, 0, 0};
  Choice choice;
  bool found = false;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = cache().find(key);
    if (it != cache().end()) {
      choice = it->second;
      found = true;
    }
  }
  if (!found) {
    cublasLtMatmulPreferenceOpaque_t pref_mem;
    cublasLtMatmulPreference_t pref = &pref_mem;
    SAT_CUBLAS_CHECK(cublasLtMatmulPreferenceInit(pref));
    const uint64_t ws = c->workspace_bytes;
    SAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    SAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a)));
    SAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b)));
    SAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_d, sizeof(align_d)));
    SAT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d)));
    cublasLtMatmulHeuristicResult_t res;
    std::memset(&res, 0, sizeof(res));
    int returned = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(c->lt, desc, la, lb, ldl, ldl, pref, 1, &res, &returned);
    if (st == CUBLAS_STATUS_SUCCESS && returned > 0 && res.state == CUBLAS_STATUS_SUCCESS &&
        res.workspaceSize <= c->workspace_bytes) {
      choice.lt = true;
      choice.algo = res.algo;
    } else if (epi == CUBLASLT_EPILOGUE_DEFAULT) {
      choice.lt = false;
    } else {
      fail("cuda::gemm: cuBLASLt has no algorithm for M=", M, " N=", N, " K=", K, " trans_a=", trans_a,
           " trans_b=", trans_b, " batch=", batch, " ", dtype_name(a_t), " -> ", dtype_name(d_t), " epilogue ",
           epilogue_name(epi), " (heuristic: ", cublasGetStatusString(st), ", ", returned, " results)");
    }
    std::lock_guard<std::mutex> lk(g_mu);
    cache().emplace(key, choice);
  }

  if (choice.lt) {
    SAT_CUBLAS_CHECK(cublasLtMatmul(c->lt, desc, &alpha, B, la, A, lb, &beta, D, ldl, D, ldl, &choice.algo,
                                    c->workspace, c->workspace_bytes, c->stream));
  } else {
    SAT_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(c->blas, op_a, op_b, N, M, K, &alpha, B, ab_type, ldb, stride_b, A,
                                                   ab_type, lda, stride_a, &beta, D, d_type, ldd, stride_d, batch,
                                                   compute, CUBLAS_GEMM_DEFAULT));
  }
}

void gemm(CudaCtx* c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, DType a_t,
          const void* B, DType b_t, void* D, DType d_t, float alpha, float beta, const GemmEpilogue& ep) {
  gemm_ex(c, trans_a, trans_b, M, N, K, A, a_t, trans_a ? M : K, 0, B, b_t, trans_b ? K : N, 0, D, d_t, N, 0, 1,
          alpha, beta, ep);
}

void gemm_batched(CudaCtx* c, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A,
                  DType a_t, int64_t stride_a, const void* B, DType b_t, int64_t stride_b, void* D, DType d_t,
                  int64_t stride_d, int64_t batch, float alpha, float beta, const GemmEpilogue& ep) {
  gemm_ex(c, trans_a, trans_b, M, N, K, A, a_t, trans_a ? M : K, stride_a, B, b_t, trans_b ? K : N, stride_b, D, d_t,
          N, stride_d, batch, alpha, beta, ep);
}

}  // namespace sat::cuda
