// Embedding lookups (i32 indices in, f32 vectors out).
//   Embedding(num, dim): input idx i32 [...] -> output [..., dim], out[i] = weight[idx[i]];
//     param "weight" [num, dim], init N(0, 1) like PyTorch. Backward scatter-adds dout rows into
//     the weight gradient (repeated indices add up); indices get no gradient.
//     With tp.parts > 1 (Llama's vocabulary-parallel embed_tokens) it splits as
//     GPTEmbedding's wte below: rank `index` holds rows [index * num/parts, ...) and outputs
//     zero rows for the tokens outside them, a partial sum completed by a TPAllReduce.
//   GPTEmbedding(vocab, max_t, dim, std): input tokens i32 [B, T] (T <= max_t) -> [B, T, dim],
//     out[b, t] = wte[tok[b, t]] + wpe[t]; params "wte.weight" [vocab, dim], "wpe.weight"
//     [max_t, dim], init N(0, std^2). Named "transformer" by the GPT builder, so the full names
//     are transformer.wte.weight (tied to lm_head) and transformer.wpe.weight.
// An index outside [0, num) throws sat::Error naming it and the vocabulary size (CPU).
// On the GPU a kernel cannot throw and the step must not synchronise to check: the token
// datasets validate every id against the vocabulary when they are opened (data/readers.cpp,
// data/dataset.cpp), and the kernels guard the index anyway: an out-of-range id gives a row
// of NaN (visible in the loss, never an out-of-bounds read) and no gradient.
// Vocabulary parallelism (GPTEmbedding with tp.parts > 1, Megatron's VocabParallelEmbedding):
// rank `index` holds wte rows [index * V/parts, (index + 1) * V/parts) and outputs the
// embeddings of the tokens in its range (zero rows for the others) plus, on part 0 only,
// the positions: a partial sum that a TPAllReduce (or TPReduceScatter) node completes.
// Its gradient is that node's whole output gradient; wpe is whole on every rank.
// Context parallelism (GPTEmbedding with cp > 1, CPU only): the input is rank cp_rank's two
// chunks of a sequence of T * cp tokens (nn/ring_attention.h), and row t adds the position
// embedding of its true position in that sequence (whose gradient it receives).
// Outputs have the activation dtype (f32 on the CPU); parameters and gradients are f32.
#pragma once
#include "nn/layer.h"

namespace sat {

class Embedding : public Layer {
 public:
  Embedding(int64_t num, int64_t dim, ParamInit init = ParamInit::normal(1.0f), TPRank tp = {});
  const char* kind() const override { return "Embedding"; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

 private:
  int64_t num_, dim_;
  ParamInit init_;
  TPRank tp_;
  int64_t lo_ = 0, rows_ = 0;  // this rank's rows [lo_, lo_ + rows_)
  std::string name_;
};

class GPTEmbedding : public Layer {
 public:
  GPTEmbedding(int64_t vocab, int64_t max_t, int64_t dim, float std = 0.02f, TPRank tp = {}, int cp = 1,
               int cp_rank = 0);
  const char* kind() const override { return "GPTEmbedding"; }
  bool backward_reads_output() const override { return false; }
  void setup(LayerSetup& s) override;
  void forward(LayerCtx& c) override;
  void backward(LayerCtx& c) override;
  SAT_CUDA_LAYER

 private:
  int64_t vocab_, max_t_, dim_;
  float std_;
  TPRank tp_;
  int64_t lo_ = 0, rows_ = 0;  // this rank's wte rows [lo_, lo_ + rows_)
  int cp_ = 1, cp_rank_ = 0;
  int64_t position(int64_t t, int64_t T) const;  // of local row t of T
  std::string name_;
};

}  // namespace sat
