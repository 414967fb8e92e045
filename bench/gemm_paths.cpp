// The Linear layers' three products through the engine's GEMM (cpu::gemm: OpenBLAS, with its
// matrix-vector and outer-product paths) against oneDNN's matmul primitive (created once per
// shape, as a plan would), on the shapes of the built-in models' Linear layers:
//   forward    Y[M,N]  = X[M,K] W[N,K]^T
//   input grad dX[M,K] = dY[M,N] W[N,K]
//   weight grad dW[N,K] += dY[M,N]^T X[M,K]   (accumulated, as over micro-batches)
// Each product is timed alternately on both paths (the machine is shared and noisy), the best
// of --repeat rounds of about 50 ms each; the ratio is OpenBLAS's time over oneDNN's (above
// 1: oneDNN is faster). This is the measurement behind keeping Linear on cpu::gemm
// (src/backend/cpu/blas.cpp).
//
//   build/gemm_paths [--threads 2] [--repeat 5]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/blas.h"

#if SAT_HAVE_DNNL
#include <dnnl.hpp>
#endif

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Seconds per call: the best over `rounds` of a loop of about 50 ms.
struct Timer {
  int calls = 1;
  double best = 1e30;
  void round(const std::function<void()>& f) {
    const double t0 = now();
    for (int i = 0; i < calls; ++i) f();
    const double t = now() - t0;
    best = std::min(best, t / calls);
    if (t < 0.05) calls = std::max(calls + 1, int(calls * 0.05 / std::max(t, 1e-6)));
  }
};

struct Shape {
  const char* layer;
  int64_t M, N, K;  // rows (samples or tokens), outputs, inputs
};

// mlp (784-1024-1024-10) at batch 64 and 512; gpt-mini (width 256, context 128, vocab 4096)
// at batch 8: 1024 tokens.
const Shape kShapes[] = {
    {"mlp-b64 fc1", 64, 1024, 784},         {"mlp-b64 fc2", 64, 1024, 1024},
    {"mlp-b64 fc3", 64, 10, 1024},          {"mlp-b512 fc1", 512, 1024, 784},
    {"mlp-b512 fc2", 512, 1024, 1024},      {"gpt-mini-b8 qkv", 1024, 768, 256},
    {"gpt-mini-b8 proj", 1024, 256, 256},   {"gpt-mini-b8 fc", 1024, 1024, 256},
    {"gpt-mini-b8 fc2", 1024, 256, 1024},   {"gpt-mini-b8 head", 1024, 4096, 256},
};

#if SAT_HAVE_DNNL
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

// C[m,n] (+)= A[m,k] B[k,n], each operand row-major or transposed (strides), on oneDNN.
struct Matmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream st{eng};
  dnnl::memory a, b, c;
  dnnl::matmul prim;
  Matmul(int64_t m, int64_t n, int64_t k, bool ta, bool tb, bool accumulate, float* A, float* B, float* C) {
    const dnnl::memory::desc ad({m, k}, dt::f32, ta ? dnnl::memory::dims{1, m} : dnnl::memory::dims{k, 1});
    const dnnl::memory::desc bd({k, n}, dt::f32, tb ? dnnl::memory::dims{1, k} : dnnl::memory::dims{n, 1});
    const dnnl::memory::desc cd({m, n}, dt::f32, tag::ab);
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops po;
      po.append_sum(1.0f);
      attr.set_post_ops(po);
    }
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), attr, eng));  // oneDNN 2.x
    a = dnnl::memory(ad, eng, A), b = dnnl::memory(bd, eng, B), c = dnnl::memory(cd, eng, C);
  }
  void run() {
    prim.execute(st, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    st.wait();
  }
};
#endif

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, repeat = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeat")) repeat = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "gemm_paths: unknown flag %s (expected --threads N, --repeat N)\n", argv[i]);
      return 2;
    }
  }
  if (threads < 1 || repeat < 1) {
    std::fprintf(stderr, "gemm_paths: --threads and --repeat: expected positive integers\n");
    return 2;
  }
#if !SAT_HAVE_DNNL
  std::fprintf(stderr, "gemm_paths: this build has no oneDNN (apt-get install libdnnl-dev, then rebuild)\n");
  return 2;
#else
  sat::cpu::set_num_threads(threads);
  omp_set_num_threads(threads);
  std::printf("%-18s %-9s %18s %10s %10s %7s %9s %9s\n", "layer", "product", "M x N x K", "OpenBLAS", "oneDNN",
              "ratio", "GFLOP/s", "(oneDNN)");
  for (const Shape& s : kShapes) {
    std::vector<float> X(size_t(s.M * s.K), 0.5f), W(size_t(s.N * s.K), 0.25f), Y(size_t(s.M * s.N), 0.f);
    std::vector<float> dY(Y.size(), 0.1f), dX(X.size(), 0.f), dW(W.size(), 0.f);
    struct Product {
      const char* name;
      int64_t m, n, k;
      std::function<void()> blas;
      Matmul dnnl;
    };
    Product ps[] = {
        {"forward", s.M, s.N, s.K,
         [&] { sat::cpu::gemm(false, true, s.M, s.N, s.K, 1, X.data(), s.K, W.data(), s.K, 0, Y.data(), s.N); },
         Matmul(s.M, s.N, s.K, false, true, false, X.data(), W.data(), Y.data())},
        {"dX", s.M, s.K, s.N,
         [&] { sat::cpu::gemm(false, false, s.M, s.K, s.N, 1, dY.data(), s.N, W.data(), s.K, 0, dX.data(), s.K); },
         Matmul(s.M, s.K, s.N, false, false, false, dY.data(), W.data(), dX.data())},
        {"dW", s.N, s.K, s.M,
         [&] { sat::cpu::gemm(true, false, s.N, s.K, s.M, 1, dY.data(), s.N, X.data(), s.K, 1, dW.data(), s.K); },
         Matmul(s.N, s.K, s.M, true, false, true, dY.data(), X.data(), dW.data())},
    };
    for (Product& p : ps) {
      Timer b, d;
      p.blas(), p.dnnl.run();  // kernels compiled, pages touched, threads up
      for (int r = 0; r < repeat; ++r) {
        b.round(p.blas);
        d.round([&] { p.dnnl.run(); });
      }
      const double flops = 2.0 * double(p.m) * double(p.n) * double(p.k);
      char dims[40];
      std::snprintf(dims, sizeof dims, "%lld x %lld x %lld", (long long)p.m, (long long)p.n, (long long)p.k);
      std::printf("%-18s %-9s %18s %8.3f ms %7.3f ms %7.2f %9.1f %9.1f\n", s.layer, p.name, dims, b.best * 1e3,
                  d.best * 1e3, b.best / d.best, flops / b.best / 1e9, flops / d.best / 1e9);
    }
  }
  return 0;
#endif
}
