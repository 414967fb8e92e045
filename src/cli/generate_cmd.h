// `saturate generate`: text from a trained language model (gpt:, llama:). The prompt goes
// through the model's tokenizer (--tokenizer, or the tokenizer.model its training shards had
// beside them, which the weights record), the model runs with a KV cache (--no-cache: its
// ordinary forward over the whole prefix at every token), and the tokens drawn as Hugging
// Face and nanoGPT draw them (infer/sampling.h) are printed as they come.
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace sat::cli {

struct GenerateArgs {
  std::string model, init_weights, prompt, tokenizer;
  int64_t max_new_tokens = 100, top_k = 0, vocab = 0;
  double temperature = 1.0, top_p = 1.0;
  uint64_t seed = 0;
  bool no_cache = false;
  int threads = 0;
};

// Adds the command and its flags to app; returns it.
CLI::App* add_generate_command(CLI::App& app, GenerateArgs& a);
int run_generate(const GenerateArgs& a);

}  // namespace sat::cli
