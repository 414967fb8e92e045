// Text from a language model (saturate generate), below the command line: the model's
// parameters loaded for inference, its tokenizer, the prompt as tokens, and the loop that
// samples from a Decoder (infer/decoder.h) with infer/sampling.h's rules.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "infer/decoder.h"
#include "infer/sampling.h"
#include "nn/models.h"
#include "nn/params.h"

namespace sat {

// A language model's whole parameters on the host, loaded from --init-weights (a safetensors
// file or a checkpoint directory), declared by its graph (batch 1, the context).
struct LanguageModel {
  ModelConfig config;
  std::unique_ptr<ParamStore> params;
};
// sat::Error naming --model for a model that does not take tokens, and --init-weights (or
// the file) for weights that are not the model's.
LanguageModel load_language_model(const ModelConfig& mc, const std::string& weights);

// The tokenizer to read and write the model's text: --tokenizer's file when given, else the
// tokenizer.model that was beside the shards the weights were trained on (recorded with them:
// data/token_shards.h's schema). sat::Error naming the flag or file when there is neither,
// when the recorded file is gone, or when its vocabulary is not the model's.
Tokenizer language_model_tokenizer(const std::string& tokenizer_flag, const std::string& weights, int64_t vocab);

// The prompt's tokens as the model saw its documents: the tokenizer's <s> first (each
// document of `saturate tokenize`'s shards begins with it), then the text's. sat::Error
// naming `flag` when that is more than `context` tokens, or when it is empty.
std::vector<int32_t> prompt_tokens(const Tokenizer& tok, const std::string& text, int64_t context,
                                   const std::string& flag = "--prompt");

struct GenerateOptions {
  Sampling sampling;
  int64_t max_new_tokens = 100;
  uint64_t seed = 0;
  std::vector<int32_t> stop;  // tokens that end the text (sampled, shown, not fed back)
};

enum class StopReason { max_new_tokens, stop_token, context };

struct GenerateResult {
  std::vector<int32_t> tokens;  // the new ones, a stop token included
  StopReason reason = StopReason::max_new_tokens;
  double prompt_seconds = 0;  // the prompt's block through the decoder
  double decode_seconds = 0;  // every later token's step (sampling included)
  int64_t decode_steps = 0;   // tokens fed back one at a time
};

// Feeds the prompt, then samples tokens until max_new_tokens of them, a stop token, or the
// text (prompt and new tokens) filling the model's context. on_token (may be empty) sees each
// new token as it is drawn.
GenerateResult generate(Decoder& d, const std::vector<int32_t>& prompt, const GenerateOptions& o,
                        const std::function<void(int32_t)>& on_token = {});

// Prints text as it grows, for tokens decoded one at a time: each call decodes the tokens so
// far and writes what is new, holding back a trailing partial UTF-8 character (SentencePiece's
// byte fall-back spells one character over several tokens).
class TextStream {
 public:
  TextStream(const Tokenizer& tok, std::vector<int32_t> ids, std::function<void(const std::string&)> write);
  void add(int32_t id);
  void finish();  // writes whatever is held back
  const std::string& text() const { return shown_; }

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
  std::function<void(const std::string&)> write_;
  std::string shown_;
  void flush(bool all);
};

}  // namespace sat
