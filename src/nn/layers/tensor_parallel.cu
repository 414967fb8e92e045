// GPU TPCopy, TPAllReduce, TPAllGather and TPReduceScatter (see tensor_parallel.h and the CPU
// in tensor_parallel.cpp). The group is an NCCL communicator whose ops are enqueued on the
// step's stream (c.cuda->stream), so a collective is ordered after the device-to-device copy
// before it and before every later kernel without any host synchronisation; nothing here
// waits, allocates or copies to the host, and all of it can be captured into a CUDA graph.
// Buffers have the activation dtype (f32, bf16 or f16), which NCCL reduces natively.
#include "backend/cuda/context.h"
#include "nn/layers/tensor_parallel.h"

namespace sat {

void StreamWorks::keep(dist::WorkPtr w, const CudaCtx& cuda) {
  cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
  SAT_CUDA_CHECK(cudaStreamIsCapturing(cuda.stream, &cs));
  if (cs != cudaStreamCaptureStatusNone) return;  // w is complete (captured); kept ones are not asked
  for (size_t i = 0; i < works_.size();) {
    if (!works_[i]->done()) {
      ++i;
      continue;
    }
    dist::WorkPtr d = std::move(works_[i]);
    works_.erase(works_.begin() + std::ptrdiff_t(i));
    d->wait();  // complete: returns at once, or throws the op's failure
  }
  works_.push_back(std::move(w));
}

namespace {

// The layer's group, on the device: an NCCL communicator of tp.parts ranks, this one
// tp.index.
dist::Comm& group_of(const LayerCtx& c, const TPRank& tp, const char* kind) {
  SAT_CHECK(c.group && c.group->size() == tp.parts && c.group->rank() == tp.index, "internal error: ", kind,
            " runs without its tensor-parallel group of ", tp.parts, " ranks");
  SAT_CHECK(c.group->device() == Device::cuda, kind, " on the GPU needs a tensor-parallel group on device memory ",
            "(NCCL); the group given is ", c.group->backend_name(),
            " (this saturate may have been built without NCCL)");
  return *c.group;
}

// The dtypes the layers reduce: the activation dtypes, all of which NCCL sums.
void check_reducible(const Tensor& t, const char* kind) {
  SAT_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16, kind,
            ": cannot reduce dtype ", dtype_name(t.dtype), " over the tensor-parallel group (f32, bf16, f16)");
}

void copy_d2d(const Tensor& dst, const Tensor& src, cudaStream_t st) {
  SAT_ASSERT(dst.bytes() == src.bytes());
  if (dst.bytes() == 0 || dst.ptr == src.ptr) return;
  SAT_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, dst.bytes(), cudaMemcpyDeviceToDevice, st));
}

// t (already holding this rank's part) becomes the sum over the group, in place.
dist::WorkPtr all_reduce_sum(dist::Comm& g, const Tensor& t, const char* kind) {
  check_reducible(t, kind);
  return g.all_reduce(t.ptr, size_t(t.numel()), t.dtype, dist::ReduceOp::sum);
}

}  // namespace

void TPCopy::forward_cuda(LayerCtx& c) { copy_d2d(c.out, c.in[0], c.cuda->stream); }

void TPCopy::backward_cuda(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  dist::Comm& g = group_of(c, tp_, kind());
  copy_d2d(c.din[0], c.dout, c.cuda->stream);
  works_.keep(all_reduce_sum(g, c.din[0], kind()), *c.cuda);
}

void TPAllReduce::forward_cuda(LayerCtx& c) {
  dist::Comm& g = group_of(c, tp_, kind());
  copy_d2d(c.out, c.in[0], c.cuda->stream);
  works_.keep(all_reduce_sum(g, c.out, kind()), *c.cuda);
}

void TPAllReduce::backward_cuda(LayerCtx& c) {
  if (c.din[0].defined()) copy_d2d(c.din[0], c.dout, c.cuda->stream);
}

// in [R/T, C] -> out [R, C]: rank r's rows land at block r.
void TPAllGather::forward_cuda(LayerCtx& c) {
  dist::Comm& g = group_of(c, tp_, kind());
  SAT_ASSERT(c.out.dtype == c.in[0].dtype && c.out.numel() == c.in[0].numel() * tp_.parts);
  works_.keep(g.all_gather(c.in[0].ptr, c.out.ptr, size_t(c.in[0].numel()), c.out.dtype), *c.cuda);
}

// dout [R, C] -> din [R/T, C]: this rank's block of the sum over the group.
void TPAllGather::backward_cuda(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  dist::Comm& g = group_of(c, tp_, kind());
  SAT_ASSERT(c.din[0].dtype == c.dout.dtype && c.dout.numel() == c.din[0].numel() * tp_.parts);
  check_reducible(c.dout, kind());
  works_.keep(g.reduce_scatter(c.dout.ptr, c.din[0].ptr, size_t(c.din[0].numel()), c.dout.dtype, dist::ReduceOp::sum),
              *c.cuda);
}

// in [R, C] partial sums -> out [R/T, C]: this rank's block of the sum.
void TPReduceScatter::forward_cuda(LayerCtx& c) {
  dist::Comm& g = group_of(c, tp_, kind());
  SAT_ASSERT(c.out.dtype == c.in[0].dtype && c.in[0].numel() == c.out.numel() * tp_.parts);
  check_reducible(c.in[0], kind());
  works_.keep(g.reduce_scatter(c.in[0].ptr, c.out.ptr, size_t(c.out.numel()), c.out.dtype, dist::ReduceOp::sum),
              *c.cuda);
}

// dout [R/T, C] -> din [R, C]: every rank's block, in rank order.
void TPReduceScatter::backward_cuda(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  dist::Comm& g = group_of(c, tp_, kind());
  SAT_ASSERT(c.din[0].dtype == c.dout.dtype && c.din[0].numel() == c.dout.numel() * tp_.parts);
  works_.keep(g.all_gather(c.dout.ptr, c.din[0].ptr, size_t(c.dout.numel()), c.dout.dtype), *c.cuda);
}

}  // namespace sat
