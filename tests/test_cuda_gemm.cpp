// The GPU GEMM path: the cuBLASLt wrapper (backend/cuda/gemm.h) against a double
// precision CPU reference, and Linear and CausalSelfAttention against their CPU
// versions through check_layer_cuda. Skipped, visibly, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda_harness.h"
#include "nn/layers/attention.h"
#include "nn/layers/linear.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/gemm.h"

using namespace sat;
using test::detail::round_to;

namespace {

struct Ctx {
  CudaCtx* c = cuda_ctx_create(0);
  ~Ctx() { cuda_ctx_destroy(c); }
};

// Host f32 values -> a new device buffer of dtype t.
CudaBuffer to_dev(const std::vector<float>& h, DType t, cudaStream_t st) {
  CudaBuffer out(h.size() * dtype_size(t));
  if (h.empty()) return out;
  CudaBuffer tmp(h.size() * 4);
  // On st, not the legacy stream: a pageable cudaMemcpy may return before its DMA lands,
  // and st (non-blocking) would not wait for it.
  SAT_CUDA_CHECK(cudaMemcpyAsync(tmp.get(), h.data(), h.size() * 4, cudaMemcpyHostToDevice, st));
  cuda::convert(tmp.get(), DType::f32, out.get(), t, int64_t(h.size()), st);
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
  return out;
}

std::vector<float> to_host(const CudaBuffer& d, DType t, size_t n, cudaStream_t st) {
  std::vector<float> h(n);
  if (n == 0) return h;
  CudaBuffer tmp(n * 4);
  cuda::convert(d.get(), t, tmp.get(), DType::f32, int64_t(n), st);
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
  SAT_CUDA_CHECK(cudaMemcpy(h.data(), tmp.get(), n * 4, cudaMemcpyDeviceToHost));
  return h;
}

// ||got - want|| / ||want|| (infinite when got has a non-finite value).
double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

struct Problem {
  bool ta = false, tb = false;
  int64_t M = 1, N = 1, K = 1;
  DType in = DType::f32, out = DType::f32;
  float alpha = 1.0f, beta = 0.0f;
  int64_t batch = 1;
  int64_t pad_ld = 0, pad_stride = 0;  // extra elements per row / per matrix (general form)
  bool bias = false, gelu = false, aux = false, dgelu = false, bgrad_a = false, bgrad_b = false;
  bool tf32 = false;
  std::string str() const {
    return str_cat("M=", M, " N=", N, " K=", K, " ta=", ta, " tb=", tb, " ", dtype_name(in), "->", dtype_name(out),
                   " alpha=", alpha, " beta=", beta, " batch=", batch, " pad=", pad_ld, "/", pad_stride,
                   bias ? " bias" : "", gelu ? " gelu" : "", aux ? " aux" : "", dgelu ? " dgelu" : "",
                   bgrad_a ? " bgrad_a" : "", bgrad_b ? " bgrad_b" : "", tf32 ? " tf32" : "");
  }
};

struct Errors {
  double d = 0, aux = 0, bgrad = 0;
  bool outside_intact = true;  // D's padding (outside the M x N windows) unchanged
};

// Runs one problem on the GPU and measures it against the double reference. Inputs
// are rounded to their dtype first, so the reference sees the values the GPU sees.
Errors run(CudaCtx* c, const Problem& p, uint64_t seed = 1) {
  Rng rng(seed);
  const bool general = p.batch > 1 || p.pad_ld > 0 || p.pad_stride > 0;
  const int64_t lda = (p.ta ? p.M : p.K) + p.pad_ld, ldb = (p.tb ? p.K : p.N) + p.pad_ld, ldd = p.N + p.pad_ld;
  const int64_t sa = (p.ta ? p.K : p.M) * lda + p.pad_stride, sb = (p.tb ? p.N : p.K) * ldb + p.pad_stride,
                sd = p.M * ldd + p.pad_stride;
  const int64_t aux_ld = (p.N + 7) / 8 * 8;
  // x = alpha A B is about N(0, 1) so that GELU sees its interesting range.
  const float bscale = 1.0f / std::sqrt(float(std::max<int64_t>(p.K, 1)));
  std::vector<float> A(size_t(p.batch * sa)), B(size_t(p.batch * sb)), D0(size_t(p.batch * sd));
  for (auto& v : A) v = round_to(rng.normal(), p.in);
  for (auto& v : B) v = round_to(bscale * rng.normal(), p.in);
  auto in_window = [&](int64_t i) {
    const int64_t r = i % sd;
    return r < p.M * ldd && r % ldd < p.N;
  };
  for (int64_t i = 0; i < p.batch * sd; ++i)
    D0[size_t(i)] = !in_window(i) ? 7.0f : p.beta == 0.0f ? NAN : round_to(rng.normal(), p.out);
  std::vector<float> bias(size_t(p.N)), aux(size_t(p.M * aux_ld));
  for (auto& v : bias) v = round_to(rng.normal(), p.out);
  for (auto& v : aux) v = p.dgelu ? round_to(rng.normal(), p.out) : NAN;
  const size_t nbg = size_t(p.bgrad_a ? p.M : p.N);

  cudaStream_t st = c->stream;
  CudaBuffer dA = to_dev(A, p.in, st), dB = to_dev(B, p.in, st), dD = to_dev(D0, p.out, st);
  CudaBuffer dbias = to_dev(bias, p.out, st), daux = to_dev(aux, p.out, st);
  CudaBuffer dbg = to_dev(std::vector<float>(nbg, NAN), p.out, st);
  GemmEpilogue ep;
  if (p.bias) ep.bias = dbias.get();
  ep.gelu = p.gelu;
  ep.dgelu = p.dgelu;
  if (p.aux || p.dgelu) {
    ep.aux = daux.get();
    ep.aux_ld = aux_ld;
  }
  if (p.bgrad_a) ep.bgrad_a = dbg.get();
  if (p.bgrad_b) ep.bgrad_b = dbg.get();
  c->tf32 = p.tf32;
  if (general)
    cuda::gemm_ex(c, p.ta, p.tb, p.M, p.N, p.K, dA.get(), p.in, lda, sa, dB.get(), p.in, ldb, sb, dD.get(), p.out, ldd,
                  sd, p.batch, p.alpha, p.beta, ep);
  else
    cuda::gemm(c, p.ta, p.tb, p.M, p.N, p.K, dA.get(), p.in, dB.get(), p.in, dD.get(), p.out, p.alpha, p.beta, ep);
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
  c->tf32 = false;
  const std::vector<float> D = to_host(dD, p.out, D0.size(), st);

  // Reference.
  auto a_at = [&](int64_t b, int64_t m, int64_t k) { return double(A[size_t(b * sa + (p.ta ? k * lda + m : m * lda + k))]); };
  auto b_at = [&](int64_t b, int64_t k, int64_t n) { return double(B[size_t(b * sb + (p.tb ? n * ldb + k : k * ldb + n))]); };
  std::vector<double> want_d, want_aux;
  std::vector<float> got_d, got_aux;
  Errors e;
  for (int64_t b = 0; b < p.batch; ++b)
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t n = 0; n < p.N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < p.K; ++k) acc += a_at(b, m, k) * b_at(b, k, n);
        const size_t di = size_t(b * sd + m * ldd + n);
        double x = double(p.alpha) * acc + (p.beta != 0.0f ? double(p.beta) * double(D0[di]) : 0.0);
        if (p.bias) x += double(bias[size_t(n)]);
        if (p.gelu) {
          if (p.aux) {
            want_aux.push_back(x);
            got_aux.push_back(0);  // filled below
          }
          x = gelu(x);
        } else if (p.dgelu) {
          x *= gelu_grad(double(aux[size_t(m * aux_ld + n)]));
        }
        want_d.push_back(x);
        got_d.push_back(D[di]);
      }
  for (size_t i = 0; i < D.size(); ++i)
    if (!in_window(int64_t(i)) && D[i] != 7.0f) e.outside_intact = false;
  e.d = rel_err(got_d, want_d);
  if (p.gelu && p.aux) {
    const std::vector<float> ga = to_host(daux, p.out, aux.size(), st);
    size_t j = 0;
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t n = 0; n < p.N; ++n) got_aux[j++] = ga[size_t(m * aux_ld + n)];
    e.aux = rel_err(got_aux, want_aux);
  }
  if (p.bgrad_a || p.bgrad_b) {
    std::vector<double> want(nbg, 0.0);
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t k = 0; k < p.K; ++k)
        for (int64_t n = 0; n < p.N; ++n) {
          if (p.bgrad_a && n == 0) want[size_t(m)] += a_at(0, m, k);
          if (p.bgrad_b && m == 0) want[size_t(n)] += b_at(0, k, n);
        }
    e.bgrad = rel_err(to_host(dbg, p.out, nbg, st), want);
  }
  return e;
}

struct Size {
  int64_t M, N, K;
};
const Size kSizes[] = {{1, 1, 1}, {7, 13, 5}, {33, 65, 129}, {256, 512, 64}};

}  // namespace

TEST(CudaGemm, AllTransposesMatchReference) {
  SAT_REQUIRE_GPU();
  Ctx x;
  struct Types {
    DType in, out;
    double tol;
  };
  for (Types ty : {Types{DType::f32, DType::f32, 1e-5}, Types{DType::bf16, DType::f32, 1e-2},
                   Types{DType::bf16, DType::bf16, 1e-2}, Types{DType::f16, DType::f32, 1e-2},
                   Types{DType::f16, DType::f16, 1e-2}})
    for (const Size& s : kSizes)
      for (int t = 0; t < 4; ++t) {
        Problem p;
        p.M = s.M, p.N = s.N, p.K = s.K, p.ta = t & 1, p.tb = t & 2, p.in = ty.in, p.out = ty.out;
        SCOPED_TRACE(p.str());
        const Errors e = run(x.c, p);  // D starts as NaN: beta = 0 must not read it
        EXPECT_LE(e.d, ty.tol);
        EXPECT_TRUE(e.outside_intact);
      }
}

TEST(CudaGemm, AlphaAndBetaAccumulate) {
  SAT_REQUIRE_GPU();
  Ctx x;
  for (DType in : {DType::f32, DType::bf16})
    for (const Size& s : kSizes)
      for (int t = 0; t < 4; ++t)
        for (float alpha : {1.0f, 0.5f}) {
          Problem p;
          p.M = s.M, p.N = s.N, p.K = s.K, p.ta = t & 1, p.tb = t & 2, p.in = in, p.out = DType::f32;
          p.alpha = alpha;
          p.beta = alpha == 1.0f ? 1.0f : 0.25f;
          SCOPED_TRACE(p.str());
          EXPECT_LE(run(x.c, p).d, in == DType::f32 ? 1e-5 : 1e-2);
        }
}

TEST(CudaGemm, BiasEpilogue) {
  SAT_REQUIRE_GPU();
  Ctx x;
  struct Types {
    DType in, out;
    double tol;
  };
  for (Types ty : {Types{DType::f32, DType::f32, 1e-5}, Types{DType::bf16, DType::bf16, 1e-2},
                   Types{DType::bf16, DType::f32, 1e-2}})
    for (const Size& s : kSizes)
      for (int t = 0; t < 4; ++t) {
        Problem p;
        p.M = s.M, p.N = s.N, p.K = s.K, p.ta = t & 1, p.tb = t & 2, p.in = ty.in, p.out = ty.out, p.bias = true;
        SCOPED_TRACE(p.str());
        EXPECT_LE(run(x.c, p).d, ty.tol);
      }
}

// GELU (tanh approximation) fused after the bias, with the pre-activation kept in aux,
// and its backward (dgelu). The bound is looser than the GEMM's: cuBLASLt may evaluate
// tanh with a fast approximation.
TEST(CudaGemm, GeluEpilogues) {
  SAT_REQUIRE_GPU();
  Ctx x;
  for (DType dt : {DType::f32, DType::bf16})
    for (const Size& s : kSizes)
      for (int variant = 0; variant < 4; ++variant) {
        Problem p;
        p.M = s.M, p.N = s.N, p.K = s.K, p.in = dt, p.out = dt, p.tb = true;  // Linear's forward layout
        p.gelu = variant < 3;
        p.bias = variant == 1 || variant == 2;
        p.aux = variant == 2;
        p.dgelu = variant == 3;
        SCOPED_TRACE(p.str());
        const Errors e = run(x.c, p);
        const double tol = dt == DType::f32 ? 1e-3 : 1e-2;
        EXPECT_LE(e.d, tol);
        if (p.aux) {
          EXPECT_LE(e.aux, dt == DType::f32 ? 1e-5 : 1e-2);
        }
      }
}

// Bias gradients beside the GEMM: bgrad_a in Linear's dW = dY^T X layout (cuBLASLt's
// BGRADB, as llm.c uses it), bgrad_b in the mirrored layout (BGRADA).
TEST(CudaGemm, BiasGradientEpilogues) {
  SAT_REQUIRE_GPU();
  Ctx x;
  for (DType in : {DType::f32, DType::bf16})
    for (const Size& s : kSizes)
      for (int which = 0; which < 2; ++which) {
        Problem p;
        p.M = s.M, p.N = s.N, p.K = s.K, p.in = in, p.out = DType::f32;
        if (which == 0) {
          p.ta = true, p.tb = false, p.bgrad_a = true;
        } else {
          p.ta = false, p.tb = false, p.bgrad_b = true;
        }
        SCOPED_TRACE(p.str());
        const Errors e = run(x.c, p);
        EXPECT_LE(e.d, in == DType::f32 ? 1e-5 : 1e-2);
        EXPECT_LE(e.bgrad, in == DType::f32 ? 1e-5 : 1e-2);
      }
}

TEST(CudaGemm, BatchedStridedAndPadded) {
  SAT_REQUIRE_GPU();
  Ctx x;
  for (DType in : {DType::f32, DType::bf16})
    for (const Size& s : {Size{1, 1, 1}, Size{7, 13, 5}, Size{33, 65, 129}, Size{64, 64, 64}})
      for (int t = 0; t < 4; ++t)
        for (int layout = 0; layout < 3; ++layout) {
          Problem p;
          p.M = s.M, p.N = s.N, p.K = s.K, p.ta = t & 1, p.tb = t & 2, p.in = in, p.out = in;
          p.batch = layout == 0 ? 1 : 3;
          p.pad_ld = layout == 1 ? 0 : 3;
          p.pad_stride = layout == 0 ? 0 : 5;
          p.beta = layout == 2 ? 1.0f : 0.0f;
          SCOPED_TRACE(p.str());
          const Errors e = run(x.c, p);
          EXPECT_LE(e.d, in == DType::f32 ? 1e-5 : 1e-2);
          EXPECT_TRUE(e.outside_intact);
        }
}

TEST(CudaGemm, Tf32WhenAskedFor) {
  SAT_REQUIRE_GPU();
  Ctx x;
  for (const Size& s : kSizes) {
    Problem p;
    p.M = s.M, p.N = s.N, p.K = s.K, p.tf32 = true;
    SCOPED_TRACE(p.str());
    EXPECT_LE(run(x.c, p).d, 1e-2);
  }
}

TEST(CudaGemm, EmptyInnerDimensionScalesD) {
  SAT_REQUIRE_GPU();
  Ctx x;
  for (float beta : {0.0f, 0.5f}) {
    Problem p;
    p.M = 5, p.N = 3, p.K = 0, p.beta = beta;
    SCOPED_TRACE(p.str());
    EXPECT_LE(run(x.c, p).d, 1e-6);
  }
}

// The algorithm is chosen once per problem; a call captured into a CUDA graph uses the
// cached choice and replays correctly.
TEST(CudaGemm, CachedAlgorithmAndGraphCapture) {
  SAT_REQUIRE_GPU();
  Ctx x;
  const int64_t M = 48, N = 40, K = 24;
  std::vector<float> A(size_t(M * K)), B(size_t(K * N)), D0(size_t(M * N));
  Rng rng(5);
  for (auto& v : A) v = rng.normal();
  for (auto& v : B) v = rng.normal();
  for (auto& v : D0) v = rng.normal();
  cudaStream_t st = x.c->stream;
  CudaBuffer dA = to_dev(A, DType::f32, st), dB = to_dev(B, DType::f32, st), dD = to_dev(D0, DType::f32, st);
  CudaBuffer scratch(size_t(M * N) * 4);
  cuda::gemm(x.c, false, false, M, N, K, dA.get(), DType::f32, dB.get(), DType::f32, scratch.get(), DType::f32, 1, 0);
  const size_t cached = cuda::gemm_cache_size();
  cuda::gemm(x.c, false, false, M, N, K, dA.get(), DType::f32, dB.get(), DType::f32, scratch.get(), DType::f32, 1, 0);
  EXPECT_EQ(cuda::gemm_cache_size(), cached);
  // Warm the accumulate problem's cache entry (the choice does not depend on beta), then capture it.
  cuda::gemm(x.c, false, false, M, N, K, dA.get(), DType::f32, dB.get(), DType::f32, scratch.get(), DType::f32, 1, 1);
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
  const size_t before = cuda::gemm_cache_size();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SAT_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  cuda::gemm(x.c, false, false, M, N, K, dA.get(), DType::f32, dB.get(), DType::f32, dD.get(), DType::f32, 1, 1);
  SAT_CUDA_CHECK(cudaStreamEndCapture(st, &graph));
  EXPECT_EQ(cuda::gemm_cache_size(), before);
  SAT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  SAT_CUDA_CHECK(cudaGraphLaunch(exec, st));
  SAT_CUDA_CHECK(cudaGraphLaunch(exec, st));
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
  SAT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SAT_CUDA_CHECK(cudaGraphDestroy(graph));
  const std::vector<float> D = to_host(dD, DType::f32, D0.size(), st);
  std::vector<double> want(D0.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) acc += double(A[size_t(m * K + k)]) * double(B[size_t(k * N + n)]);
      want[size_t(m * N + n)] = double(D0[size_t(m * N + n)]) + 2.0 * acc;
    }
  EXPECT_LE(rel_err(D, want), 1e-5);
}

// Argument errors are reported before anything touches the device (no GPU needed).
TEST(CudaGemm, RejectsBadArguments) {
  CudaCtx fake;  // never used: every case fails its checks first
  int dummy[64] = {};
  void* p = dummy;
  auto call = [&](DType a, DType b, DType d, float beta, const GemmEpilogue& ep) {
    cuda::gemm(&fake, false, false, 4, 4, 4, p, a, p, b, p, d, 1.0f, beta, ep);
  };
  EXPECT_THROW(call(DType::f32, DType::bf16, DType::f32, 0, {}), Error);   // mixed inputs
  EXPECT_THROW(call(DType::f32, DType::f32, DType::bf16, 0, {}), Error);   // f32 -> bf16
  EXPECT_THROW(call(DType::i32, DType::i32, DType::i32, 0, {}), Error);    // not floating
  GemmEpilogue ep;
  ep.gelu = true;
  ep.aux = p;
  ep.aux_ld = 4;  // not a multiple of 8
  EXPECT_THROW(call(DType::f32, DType::f32, DType::f32, 0, ep), Error);
  GemmEpilogue dg;
  dg.dgelu = true;
  dg.aux = p;
  dg.aux_ld = 8;
  EXPECT_THROW(call(DType::f32, DType::f32, DType::f32, 1, dg), Error);  // dgelu with beta != 0
  GemmEpilogue both;
  both.bias = p;
  both.bgrad_a = p;
  EXPECT_THROW(call(DType::f32, DType::f32, DType::f32, 0, both), Error);
  try {
    call(DType::f32, DType::bf16, DType::f32, 0, {});
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("same dtype"), std::string::npos) << e.what();
  }
}

// ---- layers ----

namespace {
struct ActTol {
  DType act;
  double tol;
};
const ActTol kActs[] = {{DType::f32, 1e-4}, {DType::bf16, 1e-2}};
}  // namespace

TEST(CudaLinear, MatchesCpu) {
  SAT_REQUIRE_GPU();
  struct Case {
    Shape x;
    int64_t out;
    bool bias;
  };
  const std::vector<Case> cases = {{{1, 5}, 3, true},    {{1, 1}, 1, true},      {{3, 33}, 17, true},
                                   {{17, 5}, 33, true},  {{3, 33}, 5, false},    {{2, 3, 7}, 4, true},
                                   {{2, 3, 7}, 1, false}, {{64, 40}, 70, true},  {{256, 9}, 260, true},
                                   {{4, 8, 64}, 96, true}};
  for (const ActTol& at : kActs)
    for (const Case& cs : cases) {
      SCOPED_TRACE(str_cat(dtype_name(at.act), " x ", cs.x.str(), " out ", cs.out, cs.bias ? " bias" : " no bias"));
      test::CudaCheck o;
      o.inputs = {{cs.x}};
      o.act = at.act;
      o.tol = at.tol;
      test::check_layer_cuda([&] { return std::make_unique<Linear>(cs.x[-1], cs.out, cs.bias); }, o);
    }
}

TEST(CudaLinear, TiedWeightAndInference) {
  SAT_REQUIRE_GPU();
  for (const ActTol& at : kActs) {
    SCOPED_TRACE(dtype_name(at.act));
    test::CudaCheck o;
    o.inputs = {{Shape{2, 3, 6}}};
    o.act = at.act;
    o.tol = at.tol;
    test::check_layer_cuda(
        [] { return std::make_unique<Linear>(6, 11, true, std::nullopt, std::nullopt, "transformer.wte.weight"); }, o);
    test::CudaCheck inf = o;
    inf.training = false;
    inf.backward = false;
    test::check_layer_cuda([] { return std::make_unique<Linear>(6, 11); }, inf);
  }
}

TEST(CudaCausalSelfAttention, MatchesCpu) {
  SAT_REQUIRE_GPU();
  struct Case {
    int64_t B, T, C, nh;
  };
  const std::vector<Case> cases = {{1, 1, 4, 1},  {1, 1, 16, 4},  {2, 5, 8, 1},   {2, 17, 12, 4},
                                   {1, 17, 24, 1}, {3, 33, 32, 4}, {2, 64, 64, 4}, {1, 128, 256, 4}};
  for (const ActTol& at : {ActTol{DType::f32, 1e-4}, ActTol{DType::bf16, 1e-2}, ActTol{DType::f16, 1e-2}})
    for (const Case& cs : cases)
      for (bool training : {true, false}) {
        SCOPED_TRACE(str_cat(dtype_name(at.act), " B=", cs.B, " T=", cs.T, " C=", cs.C, " n_head=", cs.nh,
                             training ? " training" : " inference"));
        test::CudaCheck o;
        o.inputs = {{Shape{cs.B, cs.T, 3 * cs.C}}};
        o.act = at.act;
        o.tol = at.tol;
        o.training = training;
        o.backward = training;
        test::check_layer_cuda([&] { return std::make_unique<CausalSelfAttention>(cs.nh); }, o);
      }
}

#else
TEST(CudaGemm, NotBuilt) { GTEST_SKIP() << "skipped: built without the CUDA backend"; }
#endif  // SAT_HAVE_CUDA
