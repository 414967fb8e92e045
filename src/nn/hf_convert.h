// Hugging Face checkpoints into saturate's weights (`saturate convert`): a GPT2LMHeadModel
// into the gpt family, a LlamaForCausalLM into the llama family, checked tensor by tensor
// against the graph saturate builds for the configuration it reads.
//
//   gpt2   names without the `transformer.` prefix (h.0.attn.c_attn.weight, wte.weight, as
//          the hub's files; a file with the prefix is read too) take it; the Conv1D weights
//          (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj), stored [in, out], are transposed
//          to nn.Linear's [out, in]; the causal-mask buffers attn.bias and attn.masked_bias are
//          dropped; lm_head is tied to wte (a saved lm_head.weight must equal wte.weight).
//          config.json: n_layer, n_head, n_embd, n_positions (or n_ctx), vocab_size; refused
//          when saturate's gpt cannot express it: activation_function other than gelu_new
//          (or gelu_pytorch_tanh, the same function), layer_norm_epsilon other than 1e-5,
//          n_inner other than 4 n_embd, scale_attn_weights off, scale_attn_by_inverse_layer_idx,
//          cross-attention.
//   llama  HF's names are saturate's; rotary_emb.inv_freq buffers are dropped (saturate's
//          Rotary is HF's rotate_half convention and computes them itself);
//          tie_word_embeddings copies embed_tokens to lm_head (saturate's llama is untied).
//          config.json: num_hidden_layers, num_attention_heads, num_key_value_heads,
//          hidden_size, intermediate_size, max_position_embeddings, vocab_size, and
//          rms_norm_eps (1e-6 when absent, as Hugging Face's LlamaConfig) and rope_theta
//          (10000 when absent) as the spec's norm_eps= and rope_theta= (left out where they
//          are llama's defaults, 1e-5 and 10000); refused: rope_scaling, hidden_act other
//          than silu, attention or MLP biases, head_dim other than hidden_size / heads.
// The weights: one model.safetensors, or the shards model.safetensors.index.json names.
// Without config.json the shapes give layers, width, vocabulary, the MLP width and GPT-2's
// context; the heads (and Llama's context) come from the options. Tensors may be F32, F16,
// BF16 or F64; the weights written are float32. Every problem is a sat::Error naming the file
// (and the tensor or key) and what was expected: a PyTorch pickle (.bin, .pt) with how to
// re-save it as safetensors, a missing or unexpected tensor, a wrong shape.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sat {

struct HfConvertOptions {
  std::string from;      // "gpt2" | "llama"
  std::string input;     // a safetensors file (or index), or a directory holding them (and config.json)
  int64_t heads = 0;     // without config.json: the attention heads (0: not given)
  int64_t context = 0;   // llama without config.json: the context (positions)
};

struct HfTensor {
  std::string name;            // saturate's
  std::vector<int64_t> shape;  // saturate's layout
  std::vector<float> data;
};

struct HfConversion {
  std::string weights_file, config_file;  // what was read: the file or the shards' index; config_file empty: none
  std::string spec;                       // the --model the weights fit: "gpt:layers=..."
  std::vector<HfTensor> tensors;          // saturate's parameters, in the model's order
  std::vector<std::string> notes;         // what was done beside copying: dropped, transposed, tied
  int64_t parameters = 0;
};

// The families --from takes: "gpt2", "llama".
const std::vector<std::string>& hf_families();
// Reads and checks the checkpoint; nothing is written.
HfConversion convert_hf_checkpoint(const HfConvertOptions& o);
// Writes the weights atomically (core/io.h), with the spec in the metadata's "model".
void save_hf_conversion(const std::string& path, const HfConversion& c);

}  // namespace sat
