// The conjugate operators of tensor parallelism (Megatron-LM's mappings), as layers, so
// that every collective of a tensor-parallel model is a node of its graph: the plan lays
// out its buffers, the executor runs it in order, the profiler times it and the cost
// model counts its bytes (LayerSetup::comm_fwd / comm_bwd). Each runs over the layer
// context's group (LayerCtx::group, of TPRank::parts ranks).
//
//   TPCopy           forward: identity;  backward: all-reduce (sum) of the gradient.
//                    Megatron's f (copy_to_tensor_model_parallel_region): before a
//                    column-parallel layer whose input is the same on every rank.
//   TPAllReduce      forward: all-reduce (sum);  backward: identity.
//                    Megatron's g (reduce_from_tensor_model_parallel_region): after a
//                    row-parallel layer, whose ranks hold partial sums.
//   TPAllGather      forward: all-gather of the rows;  backward: reduce-scatter.
//                    Sequence parallelism's entry to a tensor-parallel region: in [R/T, C]
//                    (this rank's rows of the [R, C] activations, R = B * seq) -> out, the
//                    given full shape (numel R * C).
//   TPReduceScatter  forward: reduce-scatter of the rows;  backward: all-gather.
//                    Sequence parallelism's exit: in [..., C] partial sums -> out [R/T, C],
//                    the sum's rows [index * R/T, (index + 1) * R/T).
// Rows are those of the activations flattened to [B * seq, C]: LayerNorm, dropout and the
// residual adds between the regions treat rows alone, so a contiguous block of rows is a
// valid slice (the same tokens as Megatron's sequence slice in its [seq, B, C] layout).
// Buffers are f32 on the CPU (the activation dtype on the GPU); no parameters.
// On the GPU (tensor_parallel.cu) the group is NCCL on the step's stream: every op is only
// enqueued there, after the copies it needs, and its Work is kept in a StreamWorks (below).
#pragma once
#include <vector>

#include "dist/comm.h"
#include "nn/layer.h"

namespace sat {

// The Works of the collectives a GPU layer enqueued on the step's stream. The layer never
// waits for them: the stream orders everything after them, and a step may be captured
// into a CUDA graph. Nor may it drop one that has not completed, since destroying such a
// Work waits for it on the host (dist/comm.h). So each is kept here until it is seen
// complete: keep() first forgets the kept Works whose done() (which never blocks) is true,
// waiting for them only to rethrow a failure (they are complete: it returns at once).
//  * While the stream is being captured, NCCL's Work is complete at once, and no kept Work
//    is asked (done() queries a CUDA event, which capture forbids): nothing is kept then.
//  * At destruction the Works left are destroyed, which waits for any not complete (with the
//    communication watchdog): the trainer destroys the graph's layers after its engine has
//    waited for the streams and before its NCCL groups.
class StreamWorks {
 public:
  StreamWorks() = default;
  StreamWorks(const StreamWorks&) = delete;
  StreamWorks& operator=(const StreamWorks&) = delete;
#if SAT_HAVE_CUDA
  // w: an op just enqueued on cuda.stream (tensor_parallel.cu).
  void keep(dist::WorkPtr w, const CudaCtx& cuda);
#endif

 private:
  std::vector<dist::WorkPtr> works_;
};

// What the four operators share: their place in the group and, on the GPU, the Works of
// their collectives in flight.
class TPCollective : public Layer {
 public:
  explicit TPCollective(TPRank tp) : tp_(tp) {}
  bool backward_reads_inputs() const override { return false; }  // dout to din, over the group
  bool backward_reads_output() const override { return false; }

 protected:
  TPRank tp_;
  StreamWorks works_;  // GPU
};

#define SAT_TP_COLLECTIVE(Name)                          \
  const char* kind() const override { return #Name; }    \
  void setup(LayerSetup& s) override;                    \
  void forward(LayerCtx& c) override;                    \
  void backward(LayerCtx& c) override;                   \
  SAT_CUDA_LAYER

class TPCopy : public TPCollective {
 public:
  using TPCollective::TPCollective;
  SAT_TP_COLLECTIVE(TPCopy)
};

class TPAllReduce : public TPCollective {
 public:
  using TPCollective::TPCollective;
  SAT_TP_COLLECTIVE(TPAllReduce)
};

class TPAllGather : public TPCollective {
 public:
  TPAllGather(TPRank tp, Shape full) : TPCollective(tp), full_(full) {}
  SAT_TP_COLLECTIVE(TPAllGather)

 private:
  Shape full_;
};

class TPReduceScatter : public TPCollective {
 public:
  using TPCollective::TPCollective;
  SAT_TP_COLLECTIVE(TPReduceScatter)
};

#undef SAT_TP_COLLECTIVE

}  // namespace sat
