// Conv2d on the GPU: cuDNN's convolution API (forward, backward data, backward filter),
// NCHW, channel groups; the bias and its gradient are our own kernels.
//
// Descriptors and algorithms are made once per layer, on its first GPU call (an eager
// warm-up step, before any CUDA-graph capture; making them is host-only anyway). The
// algorithm of each direction is cuDNN's first heuristic (the _v7 queries) whose
// workspace fits CudaCtx::workspace, a deterministic one preferred, so a step's
// gradients are reproducible.
//
// Precision: data in the activation dtype, compute in float32. bf16/f16 use tensor-op
// math; f32 is true fp32 (FMA math) unless --precision tf32 (CudaCtx::tf32), where cuDNN's
// default math may use TF32 tensor cores. (TENSOR_OP_MATH_ALLOW_CONVERSION is not used:
// it lets cuDNN round f32 data to f16, coarser than TF32.)
//
// The filter gradient is f32 (a master gradient) but cuDNN writes it in the filter's
// dtype: under f32 it goes straight into grads[0] (beta = 1 accumulates), under bf16/f16
// into a scratch buffer in that dtype, then converted and written or added.
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend/cuda/context.h"
#include "backend/cuda/reduce.cuh"
#include "backend/cuda/dtype.cuh"
#include "nn/layers/conv2d.h"

namespace sat {

namespace {

constexpr int kBlock = 256;

cudnnDataType_t dnn_type(DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    default: fail("Conv2d (CUDA): unsupported activation dtype ", dtype_name(t));
  }
}

int to_int(int64_t v, const char* what) {
  SAT_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "Conv2d (CUDA): ", what, " ", v,
            " does not fit cuDNN's int dimensions");
  return int(v);
}

// y [B, O, HW] += bias[o] (bias f32).
template <typename T>
__global__ void add_bias_kernel(T* __restrict__ y, const float* __restrict__ bias, int64_t O, int64_t HW,
                                int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = (i / HW) % O;
    y[i] = cuda::from_f<T>(cuda::to_f<T>(y[i]) + bias[o]);
  }
}

// db[o] (+)= sum over images and pixels of dy[b, o, :]; one block per output channel.
template <typename T>
__global__ void bias_grad_kernel(const T* __restrict__ dy, float* __restrict__ db, int64_t B, int64_t O,
                                 int64_t HW, bool acc) {
  const int64_t o = blockIdx.x, n = B * HW;
  float part = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t b = i / HW, j = i - b * HW;
    part += cuda::to_f<T>(dy[(b * O + o) * HW + j]);
  }
  const float sum = cuda::block_sum(part);
  if (threadIdx.x == 0) db[o] = acc ? db[o] + sum : sum;
}

// dst[i] (+)= src[i]: the filter gradient from the activation dtype into the f32 gradient.
template <typename T>
__global__ void grad_from_lp_kernel(const T* __restrict__ src, float* __restrict__ dst, int64_t n, bool acc) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = cuda::to_f<T>(src[i]);
    dst[i] = acc ? dst[i] + v : v;
  }
}

bool tensor_op(cudnnMathType_t m) { return m == CUDNN_TENSOR_OP_MATH || m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION; }

// The first usable heuristic result whose workspace fits: deterministic ones first.
// strict_fp32: results that would run f32 data on tensor cores are skipped.
template <typename Perf>
const Perf* pick_algo(const std::vector<Perf>& perf, int count, size_t ws, bool strict_fp32) {
  for (int pass = 0; pass < 2; ++pass)
    for (int i = 0; i < count && i < int(perf.size()); ++i) {
      const Perf& p = perf[size_t(i)];
      if (p.status != CUDNN_STATUS_SUCCESS || p.memory > ws) continue;
      if (strict_fp32 && tensor_op(p.mathType)) continue;
      if (pass == 0 && p.determinism != CUDNN_DETERMINISTIC) continue;
      return &p;
    }
  return nullptr;
}

}  // namespace

// Descriptors (x [B, C, H, W], y [B, O, Ho, Wo], filter [O, C/groups, k, k], all in the
// activation dtype; one convolution descriptor per direction, as each direction's
// algorithm has its own math type) and the chosen algorithms with their workspace sizes.
struct Conv2d::CudnnState {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t fwd = nullptr, bwd_data = nullptr, bwd_filter = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_algo{};
  cudnnConvolutionBwdDataAlgo_t data_algo{};
  cudnnConvolutionBwdFilterAlgo_t filter_algo{};
  size_t fwd_ws = 0, data_ws = 0, filter_ws = 0;

  CudnnState() = default;
  CudnnState(const CudnnState&) = delete;
  CudnnState& operator=(const CudnnState&) = delete;
  ~CudnnState() {
    if (x) cudnnDestroyTensorDescriptor(x);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (fwd) cudnnDestroyConvolutionDescriptor(fwd);
    if (bwd_data) cudnnDestroyConvolutionDescriptor(bwd_data);
    if (bwd_filter) cudnnDestroyConvolutionDescriptor(bwd_filter);
  }

  // The layer's state, made on the first call (thread-safe: devices may share a layer).
  static CudnnState& of(Conv2d& L, CudaCtx& cx) {
    std::lock_guard<std::mutex> lk(L.dnn_mu_);
    if (!L.dnn_) {
      auto st = std::make_shared<CudnnState>();
      st->init(L, cx);  // on a throw, st's destructor frees what was made
      L.dnn_ = std::move(st);
    }
    return *L.dnn_;
  }

  void init(const Conv2d& L, CudaCtx& cx) {
    const cudnnDataType_t dt = dnn_type(L.act_);
    const bool strict_fp32 = L.act_ == DType::f32 && !cx.tf32;
    const cudnnMathType_t math =
        L.act_ != DType::f32 ? CUDNN_TENSOR_OP_MATH : (cx.tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH);
    const int B = to_int(L.B_, "batch"), C = to_int(L.C_, "in channels"), H = to_int(L.H_, "height"),
              W = to_int(L.W_, "width"), O = to_int(L.O_, "out channels"), Ho = to_int(L.Ho_, "out height"),
              Wo = to_int(L.Wo_, "out width"), k = to_int(L.k_, "kernel"), s = to_int(L.s_, "stride"),
              p = to_int(L.p_, "padding"), groups = to_int(L.groups_, "groups");
    to_int(L.B_ * L.C_ * L.H_ * L.W_, "input size");
    to_int(L.B_ * L.O_ * L.Ho_ * L.Wo_, "output size");

    SAT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    SAT_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    SAT_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    SAT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&fwd));
    SAT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&bwd_data));
    SAT_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&bwd_filter));
    SAT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, dt, B, C, H, W));
    SAT_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, dt, B, O, Ho, Wo));
    SAT_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, dt, CUDNN_TENSOR_NCHW, O, C / groups, k, k));
    for (cudnnConvolutionDescriptor_t d : {fwd, bwd_data, bwd_filter}) {
      SAT_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(d, p, p, s, s, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
      SAT_CUDNN_CHECK(cudnnSetConvolutionGroupCount(d, groups));
      SAT_CUDNN_CHECK(cudnnSetConvolutionMathType(d, math));
    }
    int on = 0, oc = 0, oh = 0, ow = 0;
    SAT_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(fwd, x, w, &on, &oc, &oh, &ow));
    SAT_CHECK(on == B && oc == O && oh == Ho && ow == Wo, "Conv2d (CUDA): cuDNN's output shape [", on, ", ", oc,
              ", ", oh, ", ", ow, "] differs from the layer's [", B, ", ", O, ", ", Ho, ", ", Wo, "]");

    const size_t ws = cx.workspace_bytes;
    auto no_algo = [&](const char* dir) {
      fail("Conv2d (CUDA): no cuDNN ", dir, " algorithm for input [", B, ", ", C, ", ", H, ", ", W, "], kernel ", k,
           ", stride ", s, ", padding ", p, ", groups ", groups, ", dtype ", dtype_name(L.act_), " fits the ", ws,
           "-byte workspace");
    };
    {
      int n = 0, got = 0;
      SAT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(cx.dnn, &n));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(size_t(n > 0 ? n : 1));
      SAT_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(cx.dnn, x, w, fwd, y, int(perf.size()), &got, perf.data()));
      const auto* a = pick_algo(perf, got, ws, strict_fp32);
      if (!a) no_algo("forward");
      fwd_algo = a->algo;
      if (!strict_fp32) SAT_CUDNN_CHECK(cudnnSetConvolutionMathType(fwd, a->mathType));
      SAT_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(cx.dnn, x, w, fwd, y, fwd_algo, &fwd_ws));
    }
    {
      int n = 0, got = 0;
      SAT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cx.dnn, &n));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(size_t(n > 0 ? n : 1));
      SAT_CUDNN_CHECK(
          cudnnGetConvolutionBackwardDataAlgorithm_v7(cx.dnn, w, y, bwd_data, x, int(perf.size()), &got, perf.data()));
      const auto* a = pick_algo(perf, got, ws, strict_fp32);
      if (!a) no_algo("backward-data");
      data_algo = a->algo;
      if (!strict_fp32) SAT_CUDNN_CHECK(cudnnSetConvolutionMathType(bwd_data, a->mathType));
      SAT_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(cx.dnn, w, y, bwd_data, x, data_algo, &data_ws));
    }
    {
      int n = 0, got = 0;
      SAT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cx.dnn, &n));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(size_t(n > 0 ? n : 1));
      SAT_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(cx.dnn, x, y, bwd_filter, w, int(perf.size()),
                                                                    &got, perf.data()));
      const auto* a = pick_algo(perf, got, ws, strict_fp32);
      if (!a) no_algo("backward-filter");
      filter_algo = a->algo;
      if (!strict_fp32) SAT_CUDNN_CHECK(cudnnSetConvolutionMathType(bwd_filter, a->mathType));
      SAT_CUDNN_CHECK(
          cudnnGetConvolutionBackwardFilterWorkspaceSize(cx.dnn, x, y, bwd_filter, w, filter_algo, &filter_ws));
    }
    SAT_CHECK(fwd_ws <= ws && data_ws <= ws && filter_ws <= ws, "Conv2d (CUDA): cuDNN workspace (", fwd_ws, ", ",
              data_ws, ", ", filter_ws, " bytes) exceeds the ", ws, "-byte workspace");
  }
};

void Conv2d::forward_cuda(LayerCtx& c) {
  CudaCtx& cx = *c.cuda;
  SAT_CHECK(c.in[0].dtype == act_ && c.out.dtype == act_ && c.params_lp[0].dtype == act_,
            "Conv2d (CUDA): tensors must be in the activation dtype ", dtype_name(act_));
  if (B_ == 0) return;
  CudnnState& st = CudnnState::of(*this, cx);
  SAT_CHECK(st.fwd_ws <= cx.workspace_bytes, "Conv2d (CUDA): workspace too small");
  const float one = 1.0f, zero = 0.0f;
  SAT_CUDNN_CHECK(cudnnConvolutionForward(cx.dnn, &one, st.x, c.in[0].ptr, st.w, c.params_lp[0].ptr, st.fwd,
                                          st.fwd_algo, cx.workspace, st.fwd_ws, &zero, st.y, c.out.ptr));
  if (bias_) {
    const int64_t n = B_ * O_ * Ho_ * Wo_;
    const float* b = c.params[1].f32();
    cuda::dispatch_float(act_, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      add_bias_kernel<T><<<cuda::grid_stride_blocks(n, kBlock), kBlock, 0, cx.stream>>>(static_cast<T*>(c.out.ptr), b, O_, Ho_ * Wo_, n);
      SAT_CUDA_LAUNCH_CHECK();
    });
  }
}

void Conv2d::backward_cuda(LayerCtx& c) {
  CudaCtx& cx = *c.cuda;
  SAT_CHECK(c.dout.dtype == act_ && c.in[0].dtype == act_ && c.params_lp[0].dtype == act_,
            "Conv2d (CUDA): tensors must be in the activation dtype ", dtype_name(act_));
  const int64_t nw = O_ * (C_ / groups_) * k_ * k_;
  float* dw = c.grads[0].f32();
  if (B_ == 0) {  // no terms: gradients are zero (din is empty)
    if (!c.accumulate[0]) SAT_CUDA_CHECK(cudaMemsetAsync(dw, 0, size_t(nw) * sizeof(float), cx.stream));
    if (bias_ && !c.accumulate[1])
      SAT_CUDA_CHECK(cudaMemsetAsync(c.grads[1].ptr, 0, size_t(O_) * sizeof(float), cx.stream));
    return;
  }
  CudnnState& st = CudnnState::of(*this, cx);
  SAT_CHECK(st.data_ws <= cx.workspace_bytes && st.filter_ws <= cx.workspace_bytes,
            "Conv2d (CUDA): workspace too small");
  const float one = 1.0f, zero = 0.0f;

  cuda::dispatch_float(act_, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    if (bias_) {
      bias_grad_kernel<T><<<unsigned(O_), kBlock, 0, cx.stream>>>(static_cast<const T*>(c.dout.ptr), c.grads[1].f32(),
                                                                  B_, O_, Ho_ * Wo_, c.accumulate[1]);
      SAT_CUDA_LAUNCH_CHECK();
    }
    if constexpr (std::is_same_v<T, float>) {
      const float beta = c.accumulate[0] ? 1.0f : 0.0f;  // cuDNN does not read dw when beta is 0
      SAT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cx.dnn, &one, st.x, c.in[0].ptr, st.y, c.dout.ptr,
                                                     st.bwd_filter, st.filter_algo, cx.workspace, st.filter_ws,
                                                     &beta, st.w, dw));
    } else {
      SAT_ASSERT(bwd_dw_lp_ >= 0);
      T* tmp = static_cast<T*>(c.scratch[size_t(bwd_dw_lp_)].ptr);
      SAT_CUDNN_CHECK(cudnnConvolutionBackwardFilter(cx.dnn, &one, st.x, c.in[0].ptr, st.y, c.dout.ptr,
                                                     st.bwd_filter, st.filter_algo, cx.workspace, st.filter_ws,
                                                     &zero, st.w, tmp));
      grad_from_lp_kernel<T><<<cuda::grid_stride_blocks(nw, kBlock), kBlock, 0, cx.stream>>>(tmp, dw, nw, c.accumulate[0]);
      SAT_CUDA_LAUNCH_CHECK();
    }
  });

  if (c.din[0].ptr) {
    SAT_CHECK(c.din[0].dtype == act_, "Conv2d (CUDA): din must be in the activation dtype");
    SAT_CUDNN_CHECK(cudnnConvolutionBackwardData(cx.dnn, &one, st.w, c.params_lp[0].ptr, st.y, c.dout.ptr,
                                                 st.bwd_data, st.data_algo, cx.workspace, st.data_ws, &zero, st.x,
                                                 c.din[0].ptr));
  }
}

}  // namespace sat
