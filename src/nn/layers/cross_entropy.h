// Softmax cross-entropy loss with PyTorch's ignore_index semantics (reduction = 'mean').
//   inputs  logits f32 [..., C] (rows = numel / C), labels i32 [...] (the same leading shape)
//   output  loss f32 [1] = mean over rows with label >= 0 of (logsumexp(logits[r]) - logits[r, label])
//           (labels < 0 are ignored; when every label is ignored the loss and gradient are 0,
//           where PyTorch gives NaN); a label >= C throws sat::Error naming it.
//   backward din[0] [rows, C] = dout[0] * (softmax(logits[r]) - onehot(label)) / count_valid,
//           zero rows for ignored labels; labels get no gradient (din[1] is null).
//   saved   lse [rows]: the per-row log-sum-exp, so backward needs one exp per logit and no
//           second reduction. scratch_fwd: per-row losses [rows], summed serially in double so
//           that the loss does not depend on the thread count.
// Logits and din have the activation dtype (f32 on the CPU; f32, bf16 or f16 on the GPU); the
// loss, lse and per-row losses are f32 on both devices.
// On the GPU, labels are not checked on the host (no synchronisation in a step): a label >= C
// gives a NaN loss and a NaN gradient row, and the count of valid labels is computed on the
// device and kept in a GPU-only saved 1: i32 [1], read back by backward.
// Built for GPT's [B, T, V] logits with V up to 50257: one pass for the row max, one for the
// sum of exps (a vectorised exp), rows split over threads.
// Vocabulary parallelism (tp.parts > 1, Megatron's vocab_parallel_cross_entropy): the logits
// are this rank's classes [index * C, (index + 1) * C) of C * parts (the output of a
// column-parallel head); labels are whole-vocabulary ids. The full logits are never
// gathered: the row maxima are all-reduced (max) over the group, then the rows' sums of
// exps and target logits (one all-reduce of 2 * rows floats), so every rank has the
// loss; backward needs no communication (softmax of its own classes minus the one-hot).
// scratch_fwd 1: [2, rows] for the sums and the target logits.
// On the GPU the same steps run on the step's stream with the group's NCCL all-reduces
// enqueued between the kernels (their Works kept in works_, see StreamWorks); the count of
// valid labels stays in saved 1, and a label >= C * parts gives a NaN loss and gradient row.
#pragma once
#include "nn/layer.h"
#include "nn/layers/tensor_parallel.h"  // StreamWorks

namespace sat {

class CrossEntropy : public Layer {
 public:
  explicit CrossEntropy(TPRank tp = {}) : tp_(tp) {}
  const char* kind() const override { return "CrossEntropy"; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

 private:
  void forward_vocab_parallel(LayerCtx& c);
#if SAT_HAVE_CUDA
  void forward_vocab_parallel_cuda(LayerCtx& c);
#endif
  int64_t classes_ = 0;  // this rank's
  TPRank tp_;
  std::string name_;
  StreamWorks works_;  // GPU, vocabulary parallel: the all-reduces in flight
};

}  // namespace sat
