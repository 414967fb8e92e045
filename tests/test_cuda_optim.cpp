// The GPU optimizer (optim/optimizer_cuda.h) against the CPU Optimizer on the same
// data: SGD (plain, weight decay, momentum, Nesterov) and AdamW over real ParamStore
// layouts, several sizes, changing learning rates and gradient clipping coefficients;
// the low-precision parameter copy; fp16 loss scaling (skipped steps, backoff, growth);
// and the step captured as a CUDA graph and replayed with the host running ahead (the
// lr protocol).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_harness.h"
#include "nn/params.h"
#include "optim/optimizer.h"

#if SAT_HAVE_CUDA
#include "optim/optimizer_cuda.h"

using namespace sat;

namespace {

struct NamedConfig {
  std::string name;
  OptimConfig cfg;
};

std::vector<NamedConfig> configs() {
  std::vector<NamedConfig> v;
  OptimConfig c;
  c.lr = 0.1f;
  v.push_back({"sgd", c});
  c.weight_decay = 0.05f;
  v.push_back({"sgd_wd", c});
  c = OptimConfig{};
  c.lr = 0.05f;
  c.momentum = 0.9f;
  v.push_back({"momentum", c});
  c.weight_decay = 0.01f;
  v.push_back({"momentum_wd", c});
  c.nesterov = true;
  v.push_back({"nesterov_wd", c});
  c = OptimConfig{};
  c.name = "adamw";
  c.lr = 1e-3f;
  v.push_back({"adamw", c});
  c.lr = 3e-3f;
  c.weight_decay = 0.1f;
  c.beta1 = 0.8f;
  c.beta2 = 0.95f;
  c.eps = 1e-6f;
  v.push_back({"adamw_custom", c});
  return v;
}

ParamDecl decl(const std::string& name, int64_t n) {
  ParamDecl d;
  d.name = name;
  d.spec = TensorSpec{Shape{n}, DType::f32};
  d.init = ParamInit::zeros();
  return d;
}

void fill_normal(const ParamStore& ps, Rng& rng, bool grads, float scale) {
  for (size_t i = 0; i < ps.num_params(); ++i) {
    Tensor t = grads ? ps.grad(i) : ps.param(i);
    for (int64_t k = 0; k < t.numel(); ++k) t.f32()[k] = scale * float(rng.normal());
  }
}

void upload(void* dst, const void* src, size_t bytes, cudaStream_t st) {
  SAT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
}

std::vector<float> download(const float* src, int64_t n, cudaStream_t st) {
  std::vector<float> h(static_cast<size_t>(n));
  if (n == 0) return h;
  SAT_CUDA_CHECK(cudaMemcpyAsync(h.data(), src, size_t(n) * 4, cudaMemcpyDeviceToHost, st));
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
  return h;
}

// The low-precision copy, decoded on the host.
std::vector<float> download_lp(const void* src, DType t, int64_t n, cudaStream_t st) {
  std::vector<uint16_t> raw(static_cast<size_t>(n));
  std::vector<float> h(static_cast<size_t>(n));
  SAT_CUDA_CHECK(cudaMemcpyAsync(raw.data(), src, size_t(n) * 2, cudaMemcpyDeviceToHost, st));
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
  for (size_t i = 0; i < raw.size(); ++i) {
    if (t == DType::bf16) {
      uint32_t u = uint32_t(raw[i]) << 16;
      std::memcpy(&h[i], &u, 4);
    } else {
      __half_raw r;
      r.x = raw[i];
      h[i] = __half2float(__half(r));
    }
  }
  return h;
}

// |gpu - cpu| <= tol * max(|cpu|, rms(cpu)) element by element (NaN fails).
void expect_close(const std::vector<float>& gpu, const float* cpu, int64_t n, const std::string& what,
                  double tol = 1e-6) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(cpu[i]) * double(cpu[i]);
  const double rms = n > 0 ? std::sqrt(ss / double(n)) : 0.0;
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(gpu[size_t(i)]) - double(cpu[i]));
    const double lim = tol * std::max(std::fabs(double(cpu[i])), rms);
    if (!(d <= lim)) {
      if (bad < 5) ADD_FAILURE() << what << " [" << i << "]: gpu " << gpu[size_t(i)] << " cpu " << cpu[i];
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << n << " elements differ";
}

void expect_lp_rounded(const std::vector<float>& lp, const std::vector<float>& p, DType t, const std::string& what) {
  int64_t bad = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const float want = test::detail::round_to(p[i], t);
    if (!(lp[i] == want)) {
      if (bad < 5) ADD_FAILURE() << what << " lp[" << i << "] = " << lp[i] << ", want " << want << " (" << p[i] << ")";
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { SAT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
};

// Where the GPU arrays lie relative to the ParamStore layout:
//   padded: the whole flat layout (float4 path, length a multiple of 16);
//   exact: only the first n floats (float4 path with a scalar tail when n % 4 != 0;
//          AdamW's second slot then starts unaligned: scalar path);
//   misaligned: the whole layout, every array shifted by one element (scalar path).
enum class Layout { padded, exact, misaligned };

// Device copies of the store's arrays and the GPU optimizer over them.
struct DevArrays {
  int64_t n = 0;  // floats the GPU optimizer updates
  int slots = 0;
  CudaBuffer p, g, s, lp;
  int off = 0;
  float* dp() const { return p.as<float>() + off; }
  float* dg() const { return g.as<float>() + off; }
  float* ds() const { return slots ? s.as<float>() + off : nullptr; }
  void* dlp() const { return static_cast<uint16_t*>(lp.get()) + off; }

  DevArrays(int64_t n_, int slots_, int off_) : n(n_), slots(slots_), off(off_) {
    const size_t f = size_t(n) + size_t(off);
    p = CudaBuffer(f * 4);
    g = CudaBuffer(f * 4);
    s = CudaBuffer((size_t(slots) * size_t(n) + size_t(off)) * 4 + 4);
    lp = CudaBuffer(f * 2);
    SAT_CUDA_CHECK(cudaMemset(s.get(), 0, s.bytes()));
    SAT_CUDA_CHECK(cudaDeviceSynchronize());  // the memset ran on the legacy stream
  }
};

void run_parity(const NamedConfig& nc, int64_t n, DType lpt, Layout layout) {
  const std::string what = nc.name + " n=" + std::to_string(n) + " lp=" + dtype_name(lpt) + " layout=" +
                           std::to_string(int(layout));
  SCOPED_TRACE(what);
  const OptimConfig rc = resolve_optim(nc.cfg);
  const int slots = optimizer_slots(rc);
  // Two tensors, so the layout has padding inside it (the exact layout uses only "a").
  std::vector<ParamDecl> decls = {decl("a", n)};
  if (layout != Layout::exact) decls.push_back(decl("b", 3));
  ParamStore ps(decls, {}, slots);
  const int64_t F = ps.flat_size();
  const int64_t gn = layout == Layout::exact ? n : F;
  Rng rng(uint64_t(n) * 31 + 7);
  fill_normal(ps, rng, false, 0.5f);

  Stream st;
  DevArrays d(gn, slots, layout == Layout::misaligned ? 1 : 0);
  upload(d.dp(), ps.flat_params(), size_t(gn) * 4, st.s);
  CudaOptimizer gpu(nc.cfg, gn, lpt, false);
  gpu.write_lp(d.dp(), d.dlp(), st.s);
  Optimizer cpu(nc.cfg);

  for (int k = 0; k < 5; ++k) {
    fill_normal(ps, rng, true, 1.0f);
    upload(d.dg(), ps.flat_grads(), size_t(gn) * 4, st.s);
    const float lr = rc.lr * (1.0f + 0.4f * float(k)) / (k == 3 ? 3.0f : 1.0f);
    const float clip = k == 2 ? 0.37f : k == 4 ? 0.8f : 1.0f;  // gradient clipping's coefficient on two steps
    gpu.set_lr(lr, st.s, clip);
    gpu.step(d.dp(), d.dg(), d.ds(), lpt == DType::f32 ? nullptr : d.dlp(), st.s);
    cpu.step(ps, lr, clip);
  }
  auto p = download(d.dp(), gn, st.s);
  expect_close(p, ps.flat_params(), gn, what + " params");
  for (int s = 0; s < slots; ++s)
    expect_close(download(d.ds() + int64_t(s) * gn, gn, st.s), ps.flat_slot(s), gn, what + " slot " + std::to_string(s));
  if (lpt != DType::f32) expect_lp_rounded(download_lp(d.dlp(), lpt, gn, st.s), p, lpt, what);
  EXPECT_EQ(gpu.steps_host(), 5);
  EXPECT_EQ(gpu.skipped_steps_host(), 0);
  EXPECT_EQ(gpu.loss_scale_host(), 1.0f);
  // Padding stays zero.
  if (layout != Layout::exact) {
    for (int64_t i = n; i < F && i < 16 * ((n + 15) / 16); ++i) ASSERT_EQ(p[size_t(i)], 0.0f) << "padding " << i;
  }
}

}  // namespace

TEST(CudaOptim, MatchesCpuOptimizer) {
  SAT_REQUIRE_GPU();
  for (const auto& nc : configs())
    for (int64_t n : {1, 17, 1000, 100003})
      for (DType lpt : {DType::f32, DType::bf16, DType::f16}) run_parity(nc, n, lpt, Layout::padded);
}

TEST(CudaOptim, VectorTailsAndUnalignedArrays) {
  SAT_REQUIRE_GPU();
  for (const auto& nc : configs())
    for (int64_t n : {1, 17, 1000, 100003}) {
      run_parity(nc, n, DType::bf16, Layout::exact);
      run_parity(nc, n, DType::f16, Layout::misaligned);
    }
}

TEST(CudaOptim, EmptyParameterSetStepsTheCounter) {
  SAT_REQUIRE_GPU();
  Stream st;
  OptimConfig c;
  c.name = "adamw";
  CudaOptimizer gpu(c, 0, DType::bf16, true);
  gpu.set_lr(0.5f, st.s);
  gpu.step(nullptr, nullptr, nullptr, nullptr, st.s);
  EXPECT_EQ(gpu.steps_host(), 1);
  EXPECT_EQ(gpu.scalars_host().lr, 0.5f);
}

// fp16 loss scaling: the gradients arrive multiplied by the current scale; an
// inf/NaN gradient skips the step (nothing changes, the Adam step counter included)
// and halves the scale; growth_interval clean steps in a row double it.
TEST(CudaOptim, LossScalingSkipsBacksOffAndGrows) {
  SAT_REQUIRE_GPU();
  for (const char* name : {"adamw", "momentum"}) {
    SCOPED_TRACE(name);
    OptimConfig c;
    if (std::string(name) == "adamw") {
      c.name = "adamw";
      c.lr = 2e-3f;
    } else {
      c.lr = 0.05f;
      c.momentum = 0.9f;
      c.weight_decay = 0.01f;
    }
    const OptimConfig rc = resolve_optim(c);
    const int slots = optimizer_slots(rc);
    ParamStore ps({decl("w", 1000), decl("b", 17)}, {}, slots);
    const int64_t F = ps.flat_size();
    Rng rng(99);
    fill_normal(ps, rng, false, 0.5f);
    Stream st;
    DevArrays d(F, slots, 0);
    upload(d.dp(), ps.flat_params(), size_t(F) * 4, st.s);
    LossScaleConfig ls;
    ls.growth_interval = 3;
    CudaOptimizer gpu(c, F, DType::f16, true, ls);
    gpu.write_lp(d.dp(), d.dlp(), st.s);
    Optimizer cpu(c);
    EXPECT_EQ(gpu.loss_scale_host(), 65536.0f);

    std::vector<float> scaled(static_cast<size_t>(F));
    // One step: fresh gradients g, the GPU sees g * scale (+ a poisoned element).
    auto step = [&](int k, float scale, float poison, int64_t at) {
      fill_normal(ps, rng, true, 1.0f);
      for (int64_t i = 0; i < F; ++i) scaled[size_t(i)] = ps.flat_grads()[i] * scale;
      if (at >= 0) scaled[size_t(at)] = poison;
      upload(d.dg(), scaled.data(), size_t(F) * 4, st.s);
      const float lr = rc.lr * (1.0f + 0.25f * float(k));
      gpu.set_lr(lr, st.s);
      gpu.step(d.dp(), d.dg(), d.ds(), d.dlp(), st.s);
      if (at < 0) cpu.step(ps, lr);
    };
    auto check_matches_cpu = [&](const std::string& when) {
      auto p = download(d.dp(), F, st.s);
      expect_close(p, ps.flat_params(), F, when + " params");
      for (int s = 0; s < slots; ++s)
        expect_close(download(d.ds() + int64_t(s) * F, F, st.s), ps.flat_slot(s), F, when + " slot");
      expect_lp_rounded(download_lp(d.dlp(), DType::f16, F, st.s), p, DType::f16, when);
    };
    auto snapshot = [&] {
      std::vector<float> all = download(d.dp(), F, st.s);
      for (int s = 0; s < slots; ++s) {
        auto v = download(d.ds() + int64_t(s) * F, F, st.s);
        all.insert(all.end(), v.begin(), v.end());
      }
      auto lp = download_lp(d.dlp(), DType::f16, F, st.s);
      all.insert(all.end(), lp.begin(), lp.end());
      return all;
    };

    step(0, 65536.0f, 0, -1);  // clean: growth tracker 1
    check_matches_cpu("after step 1");
    EXPECT_EQ(gpu.loss_scale_host(), 65536.0f);

    auto before = snapshot();
    step(1, 65536.0f, INFINITY, 5);  // inf: skipped, scale halves
    EXPECT_EQ(snapshot(), before) << "a skipped step changed the parameters or the optimizer state";
    EXPECT_EQ(gpu.loss_scale_host(), 32768.0f);
    EXPECT_EQ(gpu.skipped_steps_host(), 1);
    EXPECT_EQ(gpu.steps_host(), 1);

    const int64_t last_b = (ps.grad(1).f32() - ps.flat_grads()) + 16;
    step(2, 32768.0f, NAN, last_b);  // NaN in the last element of "b": skipped again
    EXPECT_EQ(snapshot(), before);
    EXPECT_EQ(gpu.loss_scale_host(), 16384.0f);
    EXPECT_EQ(gpu.skipped_steps_host(), 2);
    EXPECT_EQ(gpu.steps_host(), 1);
    float dev_scale = 0;
    SAT_CUDA_CHECK(cudaMemcpy(&dev_scale, gpu.loss_scale_device(), 4, cudaMemcpyDeviceToHost));
    EXPECT_EQ(dev_scale, 16384.0f);

    step(3, 16384.0f, 0, -1);
    step(4, 16384.0f, 0, -1);
    EXPECT_EQ(gpu.loss_scale_host(), 16384.0f) << "grew before growth_interval clean steps";
    step(5, 16384.0f, 0, -1);  // third clean step in a row: the scale doubles
    EXPECT_EQ(gpu.loss_scale_host(), 32768.0f);
    EXPECT_EQ(gpu.steps_host(), 4);
    EXPECT_EQ(gpu.skipped_steps_host(), 2);
    EXPECT_EQ(gpu.scalars_host().growth_tracker, 0);
    // The skipped steps left Adam's step counter (bias correction) and the momentum
    // buffer's first step where PyTorch leaves them.
    check_matches_cpu("after 6 steps, 2 skipped");
  }
}

// The step captured once as a CUDA graph (lr upload, loss scaling, update) and
// replayed with the host launching several steps ahead of the GPU: each replay must
// use its own learning rate.
TEST(CudaOptim, GraphReplayWithHostRunningAhead) {
  SAT_REQUIRE_GPU();
  OptimConfig c;
  c.name = "adamw";
  c.lr = 1e-3f;
  const OptimConfig rc = resolve_optim(c);
  ParamStore ps({decl("w", 100003), decl("b", 17)}, {}, 2);
  const int64_t F = ps.flat_size();
  Rng rng(5);
  fill_normal(ps, rng, false, 0.5f);
  fill_normal(ps, rng, true, 1.0f);  // the same gradients every step
  Stream st;
  DevArrays d(F, 2, 0);
  upload(d.dp(), ps.flat_params(), size_t(F) * 4, st.s);
  std::vector<float> scaled(static_cast<size_t>(F));
  for (int64_t i = 0; i < F; ++i) scaled[size_t(i)] = ps.flat_grads()[i] * 65536.0f;
  upload(d.dg(), scaled.data(), size_t(F) * 4, st.s);

  CudaOptimizer gpu(c, F, DType::f16, true);
  gpu.write_lp(d.dp(), d.dlp(), st.s);
  SAT_CUDA_CHECK(cudaStreamSynchronize(st.s));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  SAT_CUDA_CHECK(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal));
  gpu.upload_lr(st.s);
  gpu.step(d.dp(), d.dg(), d.ds(), d.dlp(), st.s);
  SAT_CUDA_CHECK(cudaStreamEndCapture(st.s, &graph));
  SAT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));

  std::vector<float> lrs;
  for (int k = 0; k < 8; ++k) {
    lrs.push_back(rc.lr * (1.0f + 0.5f * float(k)));
    gpu.set_lr_host(lrs.back());
    SAT_CUDA_CHECK(cudaGraphLaunch(exec, st.s));  // no synchronisation between replays
  }
  Optimizer cpu(c);
  for (float lr : lrs) cpu.step(ps, lr);
  SAT_CUDA_CHECK(cudaStreamSynchronize(st.s));
  auto p = download(d.dp(), F, st.s);
  expect_close(p, ps.flat_params(), F, "graph params");
  expect_close(download(d.ds(), F, st.s), ps.flat_slot(0), F, "graph m");
  expect_close(download(d.ds() + F, F, st.s), ps.flat_slot(1), F, "graph v");
  expect_lp_rounded(download_lp(d.dlp(), DType::f16, F, st.s), p, DType::f16, "graph");
  EXPECT_EQ(gpu.steps_host(), 8);

  // A replay with an inf gradient is skipped inside the graph too.
  const float inf = INFINITY;
  upload(d.dg() + 3, &inf, 4, st.s);
  gpu.set_lr_host(1.0f);
  SAT_CUDA_CHECK(cudaGraphLaunch(exec, st.s));
  SAT_CUDA_CHECK(cudaStreamSynchronize(st.s));
  EXPECT_EQ(download(d.dp(), F, st.s), p);
  EXPECT_EQ(gpu.steps_host(), 8);
  EXPECT_EQ(gpu.skipped_steps_host(), 1);
  EXPECT_EQ(gpu.loss_scale_host(), 32768.0f);

  SAT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  SAT_CUDA_CHECK(cudaGraphDestroy(graph));
}

#else
TEST(CudaOptim, NotBuilt) { GTEST_SKIP() << "skipped: saturate was built without the CUDA backend"; }
#endif  // SAT_HAVE_CUDA
