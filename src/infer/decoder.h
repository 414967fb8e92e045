// Language models one token at a time (saturate generate): a Decoder is given the tokens of a
// text in order and returns, after each block of them, the logits of the next token. Two
// implementations of the one interface, so that the sampling loop (infer/generate.h) never
// knows which runs:
//
//  * the cached decoder (make_cached_decoder), an inference path of its own for the gpt and
//    llama families. It reads the model's parameters by name from the store the model's
//    graph declared (so the weights are the very tensors training wrote) and keeps every
//    layer's keys and values (a KV cache: 2 x layers x context x key/value width floats), so
//    that a new token costs one position's work: its projections and MLP (matrix-vector
//    products through the CPU backend's GEMM) and its attention over the cached positions.
//    A block of tokens (a prompt) runs as one set of GEMMs. GPT: learned positions (wpe),
//    LayerNorm, multi-head attention, GELU (tanh), the head tied to wte. Llama: RMSNorm,
//    rotary positions (the Rotary layer's float32 table: the same angles), grouped-query
//    attention (query head h reads key/value head h / (heads / kv_heads)), SwiGLU.
//  * the reference (make_full_decoder, --no-cache): every call runs the model's ordinary
//    forward (the engine, an inference graph of batch 1) over the whole prefix. Causal
//    attention makes positions after the prefix irrelevant to it, so the prefix is padded
//    to a graph of the next power of two tokens (at least 16, at most the context): at
//    most log2(context) + 1 graphs, each built on first use. Any token model's graph runs.
//
// CPU only; float32. The store must hold the whole model (no tensor or pipeline split).
#pragma once
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "nn/models.h"
#include "nn/params.h"

namespace sat {

class Decoder {
 public:
  virtual ~Decoder() = default;
  // Appends `tokens` (at least one; each < the vocabulary) at positions length() onwards
  // and returns the logits of the token after the last of them, [vocab], valid until the
  // next call. sat::Error when they would pass the model's context (nothing is appended).
  const std::vector<float>& append(std::span<const int32_t> tokens);
  // Forgets every token (a new text), or those after the first n (n <= length()): the next
  // append goes on from there.
  void reset() { length_ = 0; }
  void truncate(int64_t n) { length_ = std::min(length_, std::max<int64_t>(n, 0)); }
  int64_t length() const { return length_; }
  int64_t context() const { return context_; }
  int64_t vocab() const { return vocab_; }

 protected:
  Decoder(int64_t context, int64_t vocab) : context_(context), vocab_(vocab) {}
  // Runs tokens at positions [first, first + n) with the earlier ones known; fills logits_.
  virtual void run(const int32_t* tokens, int64_t n, int64_t first) = 0;
  std::vector<float> logits_;
  int64_t length_ = 0;

 private:
  int64_t context_, vocab_;
};

// The KV-cached decoder of a gpt or llama model (sat::Error naming --model otherwise).
// `params` must outlive it.
std::unique_ptr<Decoder> make_cached_decoder(const ModelConfig& mc, const ParamStore& params);
// The reference: the model's forward over the whole prefix at every call. `params` (the
// declarations of mc's graph, on the host) must outlive it.
std::unique_ptr<Decoder> make_full_decoder(const ModelConfig& mc, ParamStore& params);

}  // namespace sat
