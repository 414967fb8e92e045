// The GPU side of the op-test harness: runs one layer on the CPU (the reference) and
// on the GPU with the same random inputs, parameters and output gradient, and compares
// out, din, parameter gradients and states by relative norm error
//   ||gpu - cpu|| / max(||cpu||, tiny)
// (NaN never passes). Under bf16/f16 the inputs and parameters are first rounded to
// the activation dtype on the host, so the CPU reference sees exactly the values the
// GPU sees and the error measures only the GPU's arithmetic and output rounding.
// It also checks, on the GPU:
//  * guard bytes on both sides of every device buffer are untouched (no overruns),
//  * din and grads are overwritten (pre-filled with NaN) and, with accumulate,
//    added into (a second backward doubles the gradients).
// Tests start with SAT_REQUIRE_GPU(): without a GPU they are skipped with a message
// saying why, visible in the test output.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/device.h"
#include "core/rng.h"
#include "nn/layer.h"
#include "op_harness.h"

#define SAT_REQUIRE_GPU()                                                                      \
  do {                                                                                          \
    if (::sat::cuda_device_count() == 0)                                                        \
      GTEST_SKIP() << "skipped, no GPU here: " << ::sat::cuda_unavailable_reason();             \
  } while (0)

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"

namespace sat::test {

struct CudaCheck {
  std::vector<InputSpec> inputs;  // shapes and integer ranges; floating inputs use `act`
  bool training = true;
  DType act = DType::f32;
  double tol = 1e-4;              // bound on the relative norm error of every compared tensor
  float param_scale = 0.5f;
  uint64_t seed = 1;
  bool backward = true;
  std::function<void(std::vector<Tensor>&)> fill_inputs;  // on the host, f32 values
};

// Errors measured by check_layer_cuda, for printing.
struct CudaErrors {
  double out = 0, din = 0, grads = 0, states = 0;
};

namespace detail {

inline float round_to(float v, DType t) {
  if (t == DType::bf16) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return v;
    u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
    u &= 0xffff0000u;
    std::memcpy(&v, &u, 4);
    return v;
  }
  if (t == DType::f16) return __half2float(__float2half(v));
  return v;
}

// A device buffer with 256 guard bytes on each side (pattern 0xA5).
class DevGuarded {
 public:
  static constexpr size_t kGuard = 256;
  DevGuarded() = default;
  explicit DevGuarded(size_t bytes) : bytes_(bytes), buf_(bytes + 2 * kGuard) {
    SAT_CUDA_CHECK(cudaMemset(buf_.get(), 0xA5, bytes + 2 * kGuard));
  }
  void* data() const { return static_cast<char*>(buf_.get()) + kGuard; }
  bool intact() const {
    std::vector<unsigned char> h(bytes_ + 2 * kGuard);
    SAT_CUDA_CHECK(cudaMemcpy(h.data(), buf_.get(), h.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < kGuard; ++i)
      if (h[i] != 0xA5 || h[kGuard + bytes_ + i] != 0xA5) return false;
    return true;
  }
 private:
  size_t bytes_ = 0;
  CudaBuffer buf_;
};

struct DevTensor {
  std::unique_ptr<DevGuarded> mem;
  Tensor t;
};

inline DevTensor dev_alloc(const TensorSpec& s) {
  DevTensor d;
  d.mem = std::make_unique<DevGuarded>(s.bytes());
  d.t = Tensor(d.mem->data(), s.shape, s.dtype, Device::cuda);
  return d;
}

// Host f32/int tensor -> device tensor of dtype dst.dtype.
inline void upload(const Tensor& host, const Tensor& dev, cudaStream_t st) {
  if (host.dtype == dev.dtype) {
    SAT_CUDA_CHECK(cudaMemcpyAsync(dev.ptr, host.ptr, host.bytes(), cudaMemcpyHostToDevice, st));
    return;
  }
  SAT_ASSERT(host.dtype == DType::f32);
  CudaBuffer tmp(host.bytes());
  SAT_CUDA_CHECK(cudaMemcpyAsync(tmp.get(), host.ptr, host.bytes(), cudaMemcpyHostToDevice, st));
  cuda::convert(tmp.get(), DType::f32, dev.ptr, dev.dtype, host.numel(), st);
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
}

// Device tensor (any float dtype) -> host f32 vector.
inline std::vector<float> download(const Tensor& dev, cudaStream_t st) {
  std::vector<float> h(size_t(dev.numel()));
  CudaBuffer tmp(h.size() * 4);
  cuda::convert(dev.ptr, dev.dtype, tmp.get(), DType::f32, dev.numel(), st);
  SAT_CUDA_CHECK(cudaStreamSynchronize(st));
  SAT_CUDA_CHECK(cudaMemcpy(h.data(), tmp.get(), h.size() * 4, cudaMemcpyDeviceToHost));
  return h;
}

inline double rel_err(const std::vector<float>& gpu, const float* cpu, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    double d = double(gpu[i]) - double(cpu[i]);
    if (!std::isfinite(gpu[i])) return INFINITY;
    num += d * d;
    den += double(cpu[i]) * double(cpu[i]);
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

inline bool is_float(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

}  // namespace detail

// Runs `make()`'s layer on both devices and checks it (see the top of this file).
inline CudaErrors check_layer_cuda(const std::function<std::unique_ptr<Layer>()>& make, const CudaCheck& opt) {
  using namespace detail;
  CudaErrors errs;
  auto cpu_layer = make();
  auto gpu_layer = make();
  LayerSetup s, sg;
  s.name = sg.name = "layer";
  s.training = sg.training = opt.training;
  sg.act = opt.act;
  sg.device = Device::cuda;
  for (auto& in : opt.inputs) {
    s.inputs.push_back({in.shape, in.dtype});
    sg.inputs.push_back({in.shape, in.dtype == DType::f32 ? opt.act : in.dtype});
  }
  cpu_layer->setup(s);
  gpu_layer->setup(sg);
  EXPECT_EQ(s.output.shape, sg.output.shape);
  EXPECT_EQ(s.params.size(), sg.params.size());
  EXPECT_EQ(s.states.size(), sg.states.size());

  Rng rng(opt.seed);
  std::vector<std::vector<float>> hostf;  // owns host float/int storage (as bytes in floats)
  auto host = [&](const TensorSpec& sp) {
    hostf.emplace_back((sp.bytes() + 3) / 4 + 1);
    return Tensor(hostf.back().data(), sp.shape, sp.dtype);
  };
  auto rnd = [&](const Tensor& t, float scale, float base) {
    for (int64_t k = 0; k < t.numel(); ++k) t.f32()[k] = round_to(base + scale * float(rng.normal()), opt.act);
  };

  // CPU reference context.
  LayerCtx c;
  c.training = opt.training;
  c.seed = opt.seed * 7919 + 3;
  for (size_t i = 0; i < s.inputs.size(); ++i) {
    const InputSpec& in = opt.inputs[i];
    Tensor t = host(s.inputs[i]);
    if (in.dtype == DType::f32) {
      rnd(t, in.scale, 0);
    } else if (in.dtype == DType::i32) {
      for (int64_t k = 0; k < t.numel(); ++k)
        t.i32()[k] = int32_t(in.int_low + int64_t(rng.below(uint64_t(in.int_high - in.int_low))));
    } else {
      ADD_FAILURE() << "cuda harness: unsupported input dtype " << dtype_name(in.dtype);
    }
    c.in.push_back(t);
  }
  if (opt.fill_inputs) {
    opt.fill_inputs(c.in);
    for (size_t i = 0; i < c.in.size(); ++i)
      if (c.in[i].dtype == DType::f32)
        for (int64_t k = 0; k < c.in[i].numel(); ++k) c.in[i].f32()[k] = round_to(c.in[i].f32()[k], opt.act);
  }
  for (auto& p : s.params) {
    Tensor t = host(p.spec);
    float base = p.init.kind == ParamInit::Kind::ones ? 1.0f : 0.0f;
    for (int64_t k = 0; k < t.numel(); ++k)
      t.f32()[k] = round_to(base + opt.param_scale * float(2 * rng.uniform() - 1), opt.act);
    c.params.push_back(t);
    c.grads.push_back(host(p.spec));
    c.accumulate.push_back(false);
  }
  for (auto& st : s.states) {
    Tensor t = host(st.spec);
    float v = st.init.kind == ParamInit::Kind::ones ? 1.0f : st.init.kind == ParamInit::Kind::constant ? st.init.scale : 0.0f;
    for (int64_t k = 0; k < t.numel(); ++k) {
      if (st.spec.dtype == DType::f32) t.f32()[k] = v;
      else if (st.spec.dtype == DType::i64) static_cast<int64_t*>(t.ptr)[k] = 0;
    }
    c.states.push_back(t);
  }
  std::vector<Tensor> states0;  // initial states, to upload the same values
  for (auto& st : c.states) {
    Tensor t = host({st.shape, st.dtype});
    std::memcpy(t.ptr, st.ptr, st.bytes());
    states0.push_back(t);
  }
  c.out = host(s.output);
  for (auto& sv : s.saved) c.saved.push_back(host(sv));
  std::vector<Tensor> sf, sb;
  for (auto& sc : s.scratch_fwd) sf.push_back(host(sc));
  for (auto& sc : s.scratch_bwd) sb.push_back(host(sc));
  c.scratch = sf;
  cpu_layer->forward(c);
  Tensor dout_h;
  if (opt.backward) {
    dout_h = host(s.output);
    rnd(dout_h, 1.0f, 0);
    c.dout = dout_h;
    for (size_t i = 0; i < s.inputs.size(); ++i)
      c.din.push_back(is_float(s.inputs[i].dtype) && opt.inputs[i].check_grad ? host(s.inputs[i]) : Tensor());
    c.scratch = sb;
    cpu_layer->backward(c);
  }

  // GPU context over guarded device buffers.
  CudaCtx* cx = cuda_ctx_create(0);
  std::vector<DevTensor> keep;
  auto dev = [&](const TensorSpec& sp) {
    keep.push_back(dev_alloc(sp));
    return keep.back().t;
  };
  auto nan_fill = [&](const Tensor& t) {
    if (is_float(t.dtype)) cuda::fill(t.ptr, t.dtype, NAN, t.numel(), cx->stream);
  };
  LayerCtx g;
  g.training = opt.training;
  g.seed = c.seed;
  g.cuda = cx;
  CudaBuffer seed_dev(8);
  SAT_CUDA_CHECK(cudaMemcpyAsync(seed_dev.get(), &g.seed, 8, cudaMemcpyHostToDevice, cx->stream));
  SAT_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
  g.seed_dev = seed_dev.as<uint64_t>();
  for (size_t i = 0; i < sg.inputs.size(); ++i) {
    Tensor t = dev(sg.inputs[i]);
    upload(c.in[i], t, cx->stream);
    g.in.push_back(t);
  }
  for (size_t p = 0; p < sg.params.size(); ++p) {
    Tensor t = dev(sg.params[p].spec);
    upload(c.params[p], t, cx->stream);
    g.params.push_back(t);
    Tensor lp = dev({sg.params[p].spec.shape, opt.act});
    upload(c.params[p], lp, cx->stream);
    g.params_lp.push_back(lp);
    Tensor gr = dev(sg.params[p].spec);
    nan_fill(gr);
    g.grads.push_back(gr);
    g.accumulate.push_back(false);
  }
  for (size_t i = 0; i < sg.states.size(); ++i) {
    Tensor t = dev(sg.states[i].spec);
    upload(states0[i], t, cx->stream);
    g.states.push_back(t);
  }
  g.out = dev(sg.output);
  nan_fill(g.out);
  for (auto& sv : sg.saved) g.saved.push_back(dev(sv));
  std::vector<Tensor> gsf, gsb;
  for (auto& sc : sg.scratch_fwd) { gsf.push_back(dev(sc)); nan_fill(gsf.back()); }
  for (auto& sc : sg.scratch_bwd) { gsb.push_back(dev(sc)); nan_fill(gsb.back()); }
  g.scratch = gsf;
  SAT_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
  gpu_layer->forward_cuda(g);
  SAT_CUDA_CHECK(cudaStreamSynchronize(cx->stream));

  errs.out = rel_err(download(g.out, cx->stream), c.out.f32(), size_t(c.out.numel()));
  EXPECT_LE(errs.out, opt.tol) << "forward output differs from the CPU reference";
  if (!opt.backward) {
    // Inference: states must be unchanged on both sides.
  } else {
    g.dout = dev(sg.output);
    upload(dout_h, g.dout, cx->stream);
    for (size_t i = 0; i < sg.inputs.size(); ++i) {
      if (!c.din[i].defined()) { g.din.push_back(Tensor()); continue; }
      Tensor t = dev(sg.inputs[i]);
      nan_fill(t);
      g.din.push_back(t);
    }
    g.scratch = gsb;
    gpu_layer->backward_cuda(g);
    SAT_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
    for (size_t i = 0; i < g.din.size(); ++i) {
      if (!g.din[i].defined()) continue;
      double e = rel_err(download(g.din[i], cx->stream), c.din[i].f32(), size_t(c.din[i].numel()));
      errs.din = std::max(errs.din, e);
      EXPECT_LE(e, opt.tol) << "input gradient " << i << " differs from the CPU reference";
    }
    std::vector<std::vector<float>> g1;
    for (size_t p = 0; p < g.grads.size(); ++p) {
      g1.push_back(download(g.grads[p], cx->stream));
      double e = rel_err(g1.back(), c.grads[p].f32(), size_t(c.grads[p].numel()));
      errs.grads = std::max(errs.grads, e);
      EXPECT_LE(e, opt.tol) << "gradient of " << sg.params[p].name << " differs from the CPU reference";
    }
    // Accumulation: a second backward with accumulate=true doubles every gradient.
    if (!g.grads.empty()) {
      for (size_t p = 0; p < g.accumulate.size(); ++p) g.accumulate[p] = true;
      gpu_layer->backward_cuda(g);
      SAT_CUDA_CHECK(cudaStreamSynchronize(cx->stream));
      for (size_t p = 0; p < g.grads.size(); ++p) {
        auto g2 = download(g.grads[p], cx->stream);
        std::vector<float> twice(g1[p].size());
        for (size_t k = 0; k < twice.size(); ++k) twice[k] = 2 * g1[p][k];
        EXPECT_LE(rel_err(g2, twice.data(), twice.size()), 1e-5)
            << "accumulate=true must add into the gradient of " << sg.params[p].name;
      }
    }
  }
  for (size_t i = 0; i < g.states.size(); ++i) {
    if (g.states[i].dtype != DType::f32) continue;
    double e = rel_err(download(g.states[i], cx->stream), c.states[i].f32(), size_t(c.states[i].numel()));
    errs.states = std::max(errs.states, e);
    EXPECT_LE(e, opt.tol) << "state " << sg.states[i].name << " differs from the CPU reference";
  }
  for (size_t k = 0; k < keep.size(); ++k)
    EXPECT_TRUE(keep[k].mem->intact()) << "device buffer " << k << " written out of bounds";
  keep.clear();
  cuda_ctx_destroy(cx);
  return errs;
}

}  // namespace sat::test
#endif  // SAT_HAVE_CUDA
