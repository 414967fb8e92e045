// GPU CrossEntropy (see cross_entropy.h and the CPU in cross_entropy.cpp). Probabilities are
// never stored: forward keeps the per-row log-sum-exp (as the CPU), backward recomputes
// softmax = exp(x - lse).
//   forward:  one block per row: max (NaN tracked apart), sum of exps, lse and the row's loss
//             (f32); then one block adds the row losses in double in a fixed order, counts the
//             valid labels and writes the mean loss and the count (saved 1, GPU only).
//   backward: one block per row: din = (softmax - onehot(label)) * dout / count, zero rows for
//             ignored labels; dout and the count are read from device memory (no host sync).
// Vocabulary parallel (tp.parts > 1; the CPU's forward_vocab_parallel): one block per row
// writes the max of this rank's logits into lse (saved 0), all-reduced (max) over the group;
// one block per row writes the sum of exp(x - max) and the target logit (this rank's when it
// holds the label's class, else 0) into scratch_fwd 1 [2, rows], all-reduced (sum); then per
// row lse = max + log(sum) and the loss, and the mean as above. The all-reduces are NCCL ops
// enqueued on the step's stream between the kernels (nothing waits on the host). Backward is
// the same kernel, the one-hot only on the rank holding the label's class.
#include <cmath>
#include <type_traits>

#include "backend/cuda/context.h"
#include "backend/cuda/dtype.cuh"
#include "backend/cuda/reduce.cuh"
#include "dist/comm.h"
#include "nn/layers/cross_entropy.h"

namespace sat {

namespace {

constexpr int kFinalThreads = 512;

// lse[r] = log sum_j exp(x[r, j]) and loss[r] = lse[r] - x[r, label] (0 for label < 0, NaN for
// label >= C). A NaN logit gives a NaN lse; an all -inf row gives -inf and a +inf logit +inf
// (as the CPU's exact path); -inf logits count as 0.
template <typename T>
__global__ void ce_fwd_rows(const T* __restrict__ x, const int32_t* __restrict__ labels, float* __restrict__ lse,
                            float* __restrict__ loss, int64_t C) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  float m = -INFINITY;
  int has_nan = 0;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const float v = cuda::to_f(xr[j]);
    has_nan |= int(isnan(v));
    m = fmaxf(m, v);
  }
  m = cuda::block_max(m);
  has_nan = cuda::block_or(has_nan);  // m and has_nan are the same in every thread: the branches below are uniform
  float l;
  if (has_nan) {
    l = NAN;
  } else if (isinf(m)) {
    l = m;
  } else {
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) s += expf(cuda::to_f(xr[j]) - m);
    l = m + logf(cuda::block_sum(s));
  }
  if (threadIdx.x == 0) {
    const int64_t lab = labels[r];
    lse[r] = l;
    loss[r] = lab < 0 ? 0.0f : lab < C ? l - cuda::to_f(xr[lab]) : NAN;
  }
}

// out[0] = sum of row losses / count of labels >= 0 (0 when none), summed in double in a fixed
// order; count[0] = that count. One block of kFinalThreads.
__global__ void ce_fwd_final(const float* __restrict__ loss, const int32_t* __restrict__ labels, int64_t rows,
                             float* __restrict__ out, int32_t* __restrict__ count) {
  double total = 0.0;
  int n = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    total += double(loss[r]);
    n += labels[r] >= 0 ? 1 : 0;
  }
  total = cuda::block_sum(total);
  n = cuda::block_sum(n);
  if (threadIdx.x == 0) {
    out[0] = n > 0 ? float(total / double(n)) : 0.0f;
    count[0] = n;
  }
}

// Vocabulary parallel, first pass: m[r] = max of this rank's logits of row r (NaN ignored: a
// NaN logit reaches the loss through the sum of exps).
template <typename T>
__global__ void ce_tp_max(const T* __restrict__ x, float* __restrict__ m, int64_t C) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  float v = -INFINITY;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) v = fmaxf(v, cuda::to_f(xr[j]));
  v = cuda::block_max(v);
  if (threadIdx.x == 0) m[r] = v;
}

// Vocabulary parallel, second pass (m: the maxima over the group): sums[r] = sum over this
// rank's classes of exp(x[r, j] - m[r]), tgt[r] = x[r, label - lo] when this rank holds the
// label's class [lo, lo + C), else 0. A NaN logit makes the sum NaN; an infinite max (+inf
// logit, or a row of -inf) leaves the sum 0 and lse = the max (as ce_fwd_rows).
template <typename T>
__global__ void ce_tp_sums(const T* __restrict__ x, const int32_t* __restrict__ labels, const float* __restrict__ m,
                           float* __restrict__ sums, float* __restrict__ tgt, int64_t C, int64_t lo) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  const float mr = m[r];
  const bool inf_max = isinf(mr);  // the same in every thread
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    const float v = cuda::to_f(xr[j]);
    s += isnan(v) ? v : inf_max ? 0.0f : expf(v - mr);
  }
  s = cuda::block_sum(s);
  if (threadIdx.x == 0) {
    const int64_t k = int64_t(labels[r]) - lo;
    sums[r] = s;
    tgt[r] = k >= 0 && k < C ? cuda::to_f(xr[k]) : 0.0f;
  }
}

// Vocabulary parallel, per row once sums and target logits are all-reduced: lse[r] (holding
// the max) becomes max + log(sum), loss[r] = lse[r] - target logit (0 for label < 0, NaN for a
// label >= total, the whole vocabulary).
__global__ void ce_tp_rows(const int32_t* __restrict__ labels, const float* __restrict__ sums,
                           const float* __restrict__ tgt, float* __restrict__ lse, float* __restrict__ loss,
                           int64_t rows, int64_t total) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < rows; r += int64_t(gridDim.x) * blockDim.x) {
    const float m = lse[r], s = sums[r];
    const float l = isinf(m) && !isnan(s) ? m : m + logf(s);
    const int64_t lab = labels[r];
    lse[r] = l;
    loss[r] = lab < 0 ? 0.0f : lab < total ? l - tgt[r] : NAN;
  }
}

// din rows; the label's class is column label - lo of this rank's C (lo = 0, total = C
// without vocabulary parallelism; otherwise total = C * parts and only the rank holding the
// class subtracts the one-hot).
template <typename T>
__global__ void ce_bwd(const T* __restrict__ x, const int32_t* __restrict__ labels, const float* __restrict__ lse,
                       const float* __restrict__ dout, const int32_t* __restrict__ count, T* __restrict__ dx,
                       int64_t C, int64_t lo, int64_t total) {
  const int64_t r = blockIdx.x;
  const T* xr = x + r * C;
  T* dr = dx + r * C;
  const int64_t lab = labels[r];
  if (lab < 0 || lab >= total) {  // ignored row: zeros; an out-of-range label: NaN (the CPU throws)
    const float v = lab < 0 ? 0.0f : NAN;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) dr[j] = cuda::from_f<T>(v);
    return;
  }
  const int n = count[0];
  const float scale = n > 0 ? dout[0] / float(n) : 0.0f;
  const float l = lse[r];
  const int64_t k = lab - lo;  // outside [0, C): another rank's class
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    float v = scale * expf(cuda::to_f(xr[j]) - l);
    if (j == k) v -= scale;
    dr[j] = cuda::from_f<T>(v);
  }
}

}  // namespace

void CrossEntropy::forward_cuda(LayerCtx& c) {
  if (tp_.on()) return forward_vocab_parallel_cuda(c);
  const int64_t C = classes_, rows = c.in[1].numel();
  SAT_CHECK(rows < (int64_t(1) << 31), "CrossEntropy ", name_, ": ", rows, " rows exceed the GPU grid limit");
  SAT_ASSERT(c.saved.size() >= 2 && c.saved[1].dtype == DType::i32 && c.out.dtype == DType::f32);
  cudaStream_t st = c.cuda->stream;
  const int32_t* labels = c.in[1].i32();
  if (rows > 0) {
    cuda::dispatch_float(c.in[0].dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      ce_fwd_rows<T><<<unsigned(rows), cuda::row_threads(C), 0, st>>>(static_cast<const T*>(c.in[0].ptr), labels,
                                                                      c.saved[0].f32(), c.scratch[0].f32(), C);
      SAT_CUDA_LAUNCH_CHECK();
    });
  }
  ce_fwd_final<<<1, kFinalThreads, 0, st>>>(c.scratch[0].f32(), labels, rows, c.out.f32(), c.saved[1].i32());
  SAT_CUDA_LAUNCH_CHECK();
}

void CrossEntropy::forward_vocab_parallel_cuda(LayerCtx& c) {
  const int64_t C = classes_, rows = c.in[1].numel(), lo = C * tp_.index;
  SAT_CHECK(rows < (int64_t(1) << 31), "CrossEntropy ", name_, ": ", rows, " rows exceed the GPU grid limit");
  SAT_CHECK(c.group && c.group->size() == tp_.parts && c.group->rank() == tp_.index, "internal error: CrossEntropy ",
            name_, " runs without its tensor-parallel group of ", tp_.parts, " ranks");
  dist::Comm& g = *c.group;
  SAT_CHECK(g.device() == Device::cuda, "CrossEntropy ", name_,
            " (vocabulary parallel) on the GPU needs a tensor-parallel group on device memory (NCCL); the group given is ",
            g.backend_name(), " (this saturate may have been built without NCCL)");
  SAT_ASSERT(c.saved.size() >= 2 && c.saved[0].dtype == DType::f32 && c.saved[1].dtype == DType::i32 &&
             c.out.dtype == DType::f32 && c.scratch.size() >= 2 && c.scratch[1].dtype == DType::f32 &&
             c.scratch[1].numel() == 2 * rows);
  cudaStream_t st = c.cuda->stream;
  const int32_t* labels = c.in[1].i32();
  float* lse = c.saved[0].f32();      // [rows]: the maxima first
  float* sums = c.scratch[1].f32();   // [rows] sums of exps, then [rows] target logits
  float* tgt = sums + rows;
  float* loss = c.scratch[0].f32();   // [rows]
  if (rows > 0) {  // the same on every rank of the group: all of them post the all-reduces or none
    cuda::dispatch_float(c.in[0].dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      ce_tp_max<T><<<unsigned(rows), cuda::row_threads(C), 0, st>>>(static_cast<const T*>(c.in[0].ptr), lse, C);
      SAT_CUDA_LAUNCH_CHECK();
    });
    works_.keep(g.all_reduce(lse, size_t(rows), DType::f32, dist::ReduceOp::max), *c.cuda);
    cuda::dispatch_float(c.in[0].dtype, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      ce_tp_sums<T><<<unsigned(rows), cuda::row_threads(C), 0, st>>>(static_cast<const T*>(c.in[0].ptr), labels, lse,
                                                                     sums, tgt, C, lo);
      SAT_CUDA_LAUNCH_CHECK();
    });
    works_.keep(g.all_reduce(sums, size_t(2 * rows), DType::f32, dist::ReduceOp::sum), *c.cuda);
    ce_tp_rows<<<cuda::grid_stride_blocks(rows), 256, 0, st>>>(labels, sums, tgt, lse, loss, rows, C * tp_.parts);
    SAT_CUDA_LAUNCH_CHECK();
  }
  ce_fwd_final<<<1, kFinalThreads, 0, st>>>(loss, labels, rows, c.out.f32(), c.saved[1].i32());
  SAT_CUDA_LAUNCH_CHECK();
}

void CrossEntropy::backward_cuda(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  const int64_t C = classes_, rows = c.in[1].numel();
  if (rows == 0) return;
  SAT_ASSERT(c.dout.dtype == DType::f32);
  cuda::dispatch_float(c.din[0].dtype, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    ce_bwd<T><<<unsigned(rows), cuda::row_threads(C), 0, c.cuda->stream>>>(
        static_cast<const T*>(c.in[0].ptr), c.in[1].i32(), c.saved[0].f32(), c.dout.f32(), c.saved[1].i32(),
        static_cast<T*>(c.din[0].ptr), C, C * tp_.index, C * tp_.parts);
    SAT_CUDA_LAUNCH_CHECK();
  });
}

}  // namespace sat
