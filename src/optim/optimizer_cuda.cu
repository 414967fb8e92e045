// The optimizer's kernels (see optimizer_cuda.h for the sequence and the lr protocol).
// The element updates restate optim/optimizer.cpp expression by expression, so the
// GPU agrees with the CPU optimizer to rounding (both may contract a*b+c to an FMA).
#include "optim/optimizer_cuda.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"

namespace sat {
namespace {

constexpr int kBlock = 256;

enum class Algo { sgd, sgd_momentum, adamw };

// The optimizer's constant hyper-parameters (kernel arguments: they never change).
struct Hyper {
  float wd = 0, momentum = 0, beta1 = 0, beta2 = 0, eps = 0;
  bool nesterov = false;
};

template <int VEC>
__device__ __forceinline__ void load(const float* p, float (&x)[VEC]) {
  if constexpr (VEC == 4) {
    const float4 t = *reinterpret_cast<const float4*>(p);
    x[0] = t.x; x[1] = t.y; x[2] = t.z; x[3] = t.w;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) x[k] = p[k];
  }
}

template <int VEC>
__device__ __forceinline__ void store(float* p, const float (&x)[VEC]) {
  if constexpr (VEC == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[k] = x[k];
  }
}

template <typename L, int VEC>
__device__ __forceinline__ void store_lp(L* p, const float (&x)[VEC]) {
  if constexpr (VEC == 4) {
    struct alignas(4 * sizeof(L)) L4 { L v[4]; };
    L4 t;
#pragma unroll
    for (int k = 0; k < 4; ++k) t.v[k] = cuda::from_f<L>(x[k]);
    *reinterpret_cast<L4*>(p) = t;
  } else {
#pragma unroll
    for (int k = 0; k < VEC; ++k) p[k] = cuda::from_f<L>(x[k]);
  }
}

// (a) found_inf |= any gradient is inf or NaN (PyTorch checks the scaled value).
template <int VEC>
__global__ void __launch_bounds__(kBlock)
    nonfinite_kernel(const float* __restrict__ g, int64_t n, int32_t* __restrict__ found) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int bad = 0;
  const int64_t nv = n / VEC;
  for (int64_t v = tid; v < nv; v += stride) {
    float x[VEC];
    load<VEC>(g + v * VEC, x);
#pragma unroll
    for (int k = 0; k < VEC; ++k) bad |= !isfinite(x[k]);
  }
  for (int64_t i = nv * VEC + tid; i < n; i += stride) bad |= !isfinite(g[i]);
  // Every thread of the block reaches this barrier (no early return above).
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicOr(found, 1);
}

// (b) The step's scalars, one thread.
__global__ void begin_kernel(OptimScalars* s, bool loss_scaling, bool adamw, float beta1, float beta2, float wd) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  // GradScaler.unscale_: inv_scale = scale.double().reciprocal().float(); then clip_grad_norm_'s
  // coefficient (an exact product: inv_scale is a power of 2).
  s->grad_scale = (loss_scaling ? float(1.0 / double(s->loss_scale)) : 1.0f) * s->clip;
  if (s->found_inf) {
    s->skipped += 1;
    return;
  }
  const int64_t t = s->step + 1;
  s->step = t;
  if (adamw) {
    // As Optimizer::step: bias corrections in float64, lr promoted to double.
    const float lr = s->lr;
    const double bc1 = 1.0 - pow(double(beta1), double(t));
    const double bc2 = 1.0 - pow(double(beta2), double(t));
    s->step_size = float(double(lr) / bc1);
    s->bc2_sqrt = float(sqrt(bc2));
    s->decay = 1.0f - lr * wd;
  }
}

// (c) The fused update: VEC consecutive elements per thread and iteration (VEC = 4
// only when every array is aligned for it), then a scalar tail.
template <Algo A, int VEC, typename L>
__global__ void __launch_bounds__(kBlock)
    update_kernel(const OptimScalars* __restrict__ sc, float* __restrict__ p, const float* __restrict__ g,
                  float* __restrict__ s0, float* __restrict__ s1, L* __restrict__ lp, int64_t n, Hyper h) {
  if (sc->found_inf) return;  // skipped step: nothing changes
  const float lr = sc->lr, gs = sc->grad_scale;
  const bool first = sc->step == 1;
  const float step_size = sc->step_size, bc2_sqrt = sc->bc2_sqrt, decay = sc->decay;
  const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;

  // One element: pi the parameter, gi the (unscaled) gradient, ai/bi the slots.
  auto one = [&](float& pi, float gi, float& ai, float& bi) {
    if constexpr (A == Algo::sgd) {
      // p -= lr (g + wd p)
      pi -= lr * (gi + h.wd * pi);
    } else if constexpr (A == Algo::sgd_momentum) {
      // d = g + wd p; buf = first ? d : mu buf + d; p -= lr (nesterov ? d + mu buf : buf)
      const float d = gi + h.wd * pi;
      const float b = first ? d : h.momentum * ai + d;
      ai = b;
      pi -= lr * (h.nesterov ? d + h.momentum * b : b);
    } else {
      // AdamW: p *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
      //        p -= step_size m / (sqrt(v) / sqrt(bc2) + eps)
      const float q = pi * decay;
      const float m = h.beta1 * ai + omb1 * gi;
      const float v = h.beta2 * bi + omb2 * gi * gi;
      ai = m;
      bi = v;
      pi = q - step_size * (m / (sqrtf(v) / bc2_sqrt + h.eps));
    }
  };

  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / VEC;
  for (int64_t v = tid; v < nv; v += stride) {
    const int64_t i = v * VEC;
    float pv[VEC], gv[VEC], av[VEC] = {}, bv[VEC] = {};
    load<VEC>(p + i, pv);
    load<VEC>(g + i, gv);
    if constexpr (A != Algo::sgd) load<VEC>(s0 + i, av);
    if constexpr (A == Algo::adamw) load<VEC>(s1 + i, bv);
#pragma unroll
    for (int k = 0; k < VEC; ++k) one(pv[k], gv[k] * gs, av[k], bv[k]);
    store<VEC>(p + i, pv);
    if constexpr (A != Algo::sgd) store<VEC>(s0 + i, av);
    if constexpr (A == Algo::adamw) store<VEC>(s1 + i, bv);
    if constexpr (!std::is_same_v<L, float>) store_lp<L, VEC>(lp + i, pv);
  }
  for (int64_t i = nv * VEC + tid; i < n; i += stride) {
    float pi = p[i], ai = 0, bi = 0;
    if constexpr (A != Algo::sgd) ai = s0[i];
    if constexpr (A == Algo::adamw) bi = s1[i];
    one(pi, g[i] * gs, ai, bi);
    p[i] = pi;
    if constexpr (A != Algo::sgd) s0[i] = ai;
    if constexpr (A == Algo::adamw) s1[i] = bi;
    if constexpr (!std::is_same_v<L, float>) lp[i] = cuda::from_f<L>(pi);
  }
}

// (d) GradScaler.update (torch._amp_update_scale_), one thread.
__global__ void update_scale_kernel(OptimScalars* s, float growth, float backoff, int64_t interval) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  if (s->found_inf) {
    s->loss_scale = float(double(s->loss_scale) * double(backoff));
    s->growth_tracker = 0;
    return;
  }
  const int64_t ok = s->growth_tracker + 1;
  if (ok == interval) {
    const float grown = float(double(s->loss_scale) * double(growth));
    if (isfinite(grown)) s->loss_scale = grown;
    s->growth_tracker = 0;
  } else {
    s->growth_tracker = ok;
  }
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

template <Algo A, int VEC>
void launch_update(DType lpt, unsigned blocks, cudaStream_t st, const OptimScalars* sc, float* p, const float* g,
                   float* s0, float* s1, void* lp, int64_t n, const Hyper& h) {
  cuda::dispatch_float(lpt, [&](auto* tag) {
    using L = std::remove_pointer_t<decltype(tag)>;
    update_kernel<A, VEC, L><<<blocks, kBlock, 0, st>>>(sc, p, g, s0, s1, static_cast<L*>(lp), n, h);
  });
  SAT_CUDA_LAUNCH_CHECK();
}

template <Algo A>
void launch_update_vec(bool vec4, DType lpt, int max_blocks, cudaStream_t st, const OptimScalars* sc, float* p,
                       const float* g, float* s0, float* s1, void* lp, int64_t n, const Hyper& h) {
  const int64_t units = vec4 ? (n + 3) / 4 : n;
  const unsigned blocks = std::min(cuda::grid_for(units, kBlock), unsigned(max_blocks));
  if (vec4)
    launch_update<A, 4>(lpt, blocks, st, sc, p, g, s0, s1, lp, n, h);
  else
    launch_update<A, 1>(lpt, blocks, st, sc, p, g, s0, s1, lp, n, h);
}

}  // namespace

CudaOptimizer::CudaOptimizer(const OptimConfig& c, int64_t flat_size, DType lp, bool loss_scaling,
                             const LossScaleConfig& ls)
    : c_(resolve_optim(c)), n_(flat_size), lp_(lp), loss_scaling_(loss_scaling), ls_(ls) {
  SAT_CHECK(n_ >= 0, "CudaOptimizer: negative flat size ", n_);
  SAT_CHECK(lp_ == DType::f32 || lp_ == DType::bf16 || lp_ == DType::f16,
            "CudaOptimizer: the parameter copy must be f32, bf16 or f16, got ", dtype_name(lp_));
  if (loss_scaling_) {
    SAT_CHECK(std::isfinite(ls_.init_scale) && ls_.init_scale > 0, "loss scaling: initial scale must be > 0");
    SAT_CHECK(std::isfinite(ls_.growth_factor) && ls_.growth_factor > 1, "loss scaling: growth factor must be > 1");
    SAT_CHECK(ls_.backoff_factor > 0 && ls_.backoff_factor < 1, "loss scaling: backoff factor must be in (0, 1)");
    SAT_CHECK(ls_.growth_interval >= 1, "loss scaling: growth interval must be >= 1");
  }
  int dev = 0, sms = 0;
  SAT_CUDA_CHECK(cudaGetDevice(&dev));
  SAT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  max_blocks_ = std::max(1, sms * (2048 / kBlock));  // enough to fill every SM, then grid-stride
  try {
    static_assert(sizeof(OptimScalars) == kCudaStepScalarsBytes, "the memory plan counts the scalars");
    d_ = static_cast<OptimScalars*>(cuda_alloc(sizeof(OptimScalars)));
    SAT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&h_lr_), 2 * sizeof(float), cudaHostAllocDefault));
    SAT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&h_io_), sizeof(OptimScalars), cudaHostAllocDefault));
    SAT_CUDA_CHECK(cudaEventCreateWithFlags(&lr_copied_, cudaEventDisableTiming));
    OptimScalars s;
    s.lr = c_.lr;
    s.loss_scale = loss_scaling_ ? ls_.init_scale : 1.0f;
    s.grad_scale = loss_scaling_ ? float(1.0 / double(s.loss_scale)) : 1.0f;
    h_lr_[0] = c_.lr;
    h_lr_[1] = 1.0f;
    *h_io_ = s;
    // From pinned memory: complete when cudaMemcpy returns.
    SAT_CUDA_CHECK(cudaMemcpy(d_, h_io_, sizeof(OptimScalars), cudaMemcpyHostToDevice));
  } catch (...) {
    release();
    throw;
  }
}

CudaOptimizer::~CudaOptimizer() { release(); }

void CudaOptimizer::release() noexcept {
  // A queued upload_lr copy may still read h_lr_.
  if (lr_copied_) {
    cudaEventSynchronize(lr_copied_);
    cudaEventDestroy(lr_copied_);
    lr_copied_ = nullptr;
  }
  if (h_lr_) cudaFreeHost(h_lr_);
  if (h_io_) cudaFreeHost(h_io_);
  h_lr_ = nullptr;
  h_io_ = nullptr;
  cuda_free(d_);  // cudaFree waits for the device's queued work
  d_ = nullptr;
}

void CudaOptimizer::step(float* params, const float* grads, float* slots, void* params_lp, cudaStream_t stream) {
  step(std::vector<Span>{{params, grads, 0, n_, params_lp}}, grads, slots, stream);
}

void CudaOptimizer::step(const std::vector<Span>& spans, const float* grads, float* slots, cudaStream_t stream) {
  last_stream_ = stream;
  const int nslots = optimizer_slots(c_);
  SAT_ASSERT(nslots == 0 || n_ == 0 || slots);
  const bool adamw = c_.name == "adamw";
  if (loss_scaling_) {
    SAT_CUDA_CHECK(cudaMemsetAsync(&d_->found_inf, 0, sizeof(int32_t), stream));
    if (n_ > 0) {
      SAT_ASSERT(grads);
      const bool vec4 = aligned(grads, 16);
      const unsigned blocks = std::min(cuda::grid_for(vec4 ? (n_ + 3) / 4 : n_, kBlock), unsigned(max_blocks_));
      if (vec4)
        nonfinite_kernel<4><<<blocks, kBlock, 0, stream>>>(grads, n_, &d_->found_inf);
      else
        nonfinite_kernel<1><<<blocks, kBlock, 0, stream>>>(grads, n_, &d_->found_inf);
      SAT_CUDA_LAUNCH_CHECK();
    }
  }

  begin_kernel<<<1, 1, 0, stream>>>(d_, loss_scaling_, adamw, c_.beta1, c_.beta2, c_.weight_decay);
  SAT_CUDA_LAUNCH_CHECK();

  for (const Span& sp : spans) update(sp, slots, stream);

  if (loss_scaling_) {
    update_scale_kernel<<<1, 1, 0, stream>>>(d_, ls_.growth_factor, ls_.backoff_factor, ls_.growth_interval);
    SAT_CUDA_LAUNCH_CHECK();
  }
}

// The fused update of one span (c).
void CudaOptimizer::update(const Span& sp, float* slots, cudaStream_t stream) {
  if (sp.n <= 0) return;
  const int nslots = optimizer_slots(c_);
  SAT_ASSERT(sp.params && sp.grads);
  SAT_ASSERT(lp_ == DType::f32 || sp.params_lp);
  SAT_ASSERT(sp.slot >= 0 && sp.slot + sp.n <= n_);
  const bool adamw = c_.name == "adamw";
  const Algo algo = adamw ? Algo::adamw : c_.momentum > 0 ? Algo::sgd_momentum : Algo::sgd;
  float* s0 = nslots >= 1 ? slots + sp.slot : nullptr;
  float* s1 = nslots >= 2 ? slots + n_ + sp.slot : nullptr;
  float* p = sp.params;
  const float* g = sp.grads;
  void* lp = sp.params_lp;
  // float4 (and 4 x 16-bit) access needs every array aligned to it.
  const bool vec4 = aligned(p, 16) && aligned(g, 16) && (!s0 || aligned(s0, 16)) && (!s1 || aligned(s1, 16)) &&
                    (lp_ == DType::f32 || aligned(lp, 8));
  Hyper h;
  h.wd = c_.weight_decay;
  h.momentum = c_.momentum;
  h.nesterov = c_.nesterov;
  h.beta1 = c_.beta1;
  h.beta2 = c_.beta2;
  h.eps = c_.eps;
  switch (algo) {
    case Algo::sgd:
      launch_update_vec<Algo::sgd>(vec4, lp_, max_blocks_, stream, d_, p, g, s0, s1, lp, sp.n, h);
      break;
    case Algo::sgd_momentum:
      launch_update_vec<Algo::sgd_momentum>(vec4, lp_, max_blocks_, stream, d_, p, g, s0, s1, lp, sp.n, h);
      break;
    case Algo::adamw:
      launch_update_vec<Algo::adamw>(vec4, lp_, max_blocks_, stream, d_, p, g, s0, s1, lp, sp.n, h);
      break;
  }
}

void CudaOptimizer::set_lr_host(float lr, float clip) {
  // The copy queued by the previous upload_lr (eager or a graph replay) must have
  // read h_lr_ before it is overwritten. Returns at once if none is pending.
  SAT_CUDA_CHECK(cudaEventSynchronize(lr_copied_));
  h_lr_[0] = lr;
  h_lr_[1] = clip;
}

void CudaOptimizer::upload_lr(cudaStream_t stream) {
  last_stream_ = stream;
  static_assert(offsetof(OptimScalars, clip) == offsetof(OptimScalars, lr) + sizeof(float), "lr and clip side by side");
  SAT_CUDA_CHECK(cudaMemcpyAsync(&d_->lr, h_lr_, 2 * sizeof(float), cudaMemcpyHostToDevice, stream));
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  SAT_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
  // Inside a capture a plain record only orders streams within the graph; the
  // external flag makes it a real event-record node that the host can wait on.
  if (cs == cudaStreamCaptureStatusActive)
    SAT_CUDA_CHECK(cudaEventRecordWithFlags(lr_copied_, stream, cudaEventRecordExternal));
  else
    SAT_CUDA_CHECK(cudaEventRecord(lr_copied_, stream));
}

void CudaOptimizer::set_lr(float lr, cudaStream_t stream, float clip) {
  set_lr_host(lr, clip);
  upload_lr(stream);
}

void CudaOptimizer::write_lp(const float* params, void* params_lp, cudaStream_t stream) const {
  if (lp_ == DType::f32 || n_ == 0) return;
  cuda::convert(params, DType::f32, params_lp, lp_, n_, stream);
}

OptimScalars CudaOptimizer::scalars_host() {
  SAT_CUDA_CHECK(cudaStreamSynchronize(last_stream_));
  SAT_CUDA_CHECK(cudaMemcpy(h_io_, d_, sizeof(OptimScalars), cudaMemcpyDeviceToHost));
  return *h_io_;
}

void CudaOptimizer::set_scalars_host(const OptimScalars& s, cudaStream_t stream) {
  last_stream_ = stream;
  SAT_CUDA_CHECK(cudaStreamSynchronize(stream));
  *h_io_ = s;
  SAT_CUDA_CHECK(cudaMemcpy(d_, h_io_, sizeof(OptimScalars), cudaMemcpyHostToDevice));
}

const float* CudaOptimizer::loss_scale_device() const { return &d_->loss_scale; }

}  // namespace sat
