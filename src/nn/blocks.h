// The composite pieces of the built-in models (GPT-2's embedding and transformer layer,
// ResNet's BasicBlock), shared by the model builders (models.cpp) and model files
// (model_file.h), so a file that names them builds the very same nodes.
#pragma once
#include <string>
#include <vector>

#include "nn/graph.h"
#include "nn/layers/elementwise.h"
#include "nn/models.h"

namespace sat {

// The entry and exit of a tensor-parallel region of a token model (Megatron's conjugate
// operators): with sequence parallelism the residual stream is this rank's rows, gathered
// on entry and reduce-scattered on exit; without it the stream is whole on every rank,
// copied on entry (all-reduce of its gradient) and all-reduced on exit.
struct TokenRegions {
  Graph& g;
  TPRank tp;
  bool sp;
  Shape tokens;  // the model's token input [B, T]
  // Context parallelism (--cp): the input holds this rank's two chunks of each sequence
  // (nn/ring_attention.h); attention runs as a ring over the cp group.
  int cp = 1, cp_rank = 0;
  int enter(const std::string& name, int x);
  int leave(const std::string& name, int x);
  TPRank rows() const { return sp ? tp : TPRank{}; }  // dropout over this rank's rows
  CpRows cp_rows() const { return {cp, cp_rank, tokens[1]}; }  // --cp: and of its chunks
};
TokenRegions token_regions(Graph& g, const ModelConfig& c, const Shape& x_shape);

// GPT-2's token and position embedding `name` (wte, wpe; vocabulary-parallel under tensor
// parallelism), leaving the region, then dropout when it is > 0.
int add_gpt_embedding(Graph& g, TokenRegions& r, const std::string& name, int x, int64_t vocab, int64_t context,
                      int64_t width, float dropout);

// One GPT-2 transformer layer `prefix`.{ln_1, attn.c_attn, attn.attn, attn.c_proj, add1,
// ln_2, mlp.c_fc, mlp.gelu, mlp.c_proj, add2} (+ dropouts), a recompute unit. Its width is
// its input's last dimension.
struct TransformerBlock {
  int64_t heads = 0;       // the whole layer's (each rank computes heads / tp)
  float dropout = 0;
  int64_t depth = 1;       // the model's layer count: the residual projections' init is N(0, 0.02 / sqrt(2 depth))
  bool selective = false;  // --recompute selective: attention recomputes its probabilities
};
int add_transformer_block(Graph& g, TokenRegions& r, const std::string& prefix, int x, const TransformerBlock& b);

// A mixture-of-experts feed-forward layer (Qwen-MoE's names): the router `name`.gate (a Linear
// from width to the experts' logits, no bias), the experts (nn/layers/moe.h) under `name`,
// their load-balancing loss `name`.aux added to the running sum aux_losses[0] (`name`.aux_sum;
// it starts the sum when aux_losses is empty; none at coefficient 0), and
// the shared experts as one SwiGLU MLP of width shared * ffn, `name`.shared_expert.*, added
// to the experts' output ungated (DeepSeek-MoE's shared experts). Returns the output.
struct MoeBlock {
  int64_t width = 0, experts = 0, top_k = 0, ffn = 0, shared = 0;
  double capacity = 0;   // capacity factor (0: no drops)
  float aux_coef = 0;    // load-balancing coefficient
  int ep = 1;            // expert-parallel ranks (Moe)
  int ep_rank = 0;       // this rank's place among them: the experts it holds
};
int add_moe_block(Graph& g, const std::string& name, int x, const MoeBlock& b, std::vector<int>& aux_losses);
// The objective: the loss plus each load-balancing loss (Add nodes loss.plus_aux.I); the loss when none.
int add_aux_losses(Graph& g, int loss, const std::vector<int>& aux_losses);


// torchvision's BasicBlock `prefix`.{conv1, bn1, relu1, conv2, bn2, [downsample.0, .1],
// add, relu2} from cin to `width` channels, a recompute unit; the shortcut is a 1x1
// convolution and BatchNorm when the stride or the width changes.
int add_basic_block(Graph& g, const std::string& prefix, int x, int64_t cin, int64_t width, int64_t stride);
// A convolution without bias followed by BatchNorm (torchvision's ResNet init).
int add_conv_bn(Graph& g, const std::string& conv, const std::string& bn, int x, int64_t cin, int64_t cout, int64_t k,
                int64_t stride, int64_t pad);

}  // namespace sat
