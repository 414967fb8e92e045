// `saturate tokenize`: text files into llm.c token shards (data/tokenize.h) with a
// SentencePiece tokenizer trained on them (--model-type, --vocab-size) or given
// (--tokenizer FILE.model), saved beside the shards as tokenizer.model.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace sat::cli {

struct TokenizeArgs {
  std::vector<std::string> inputs;  // files or globs
  std::string tokenizer;            // an existing .model; empty: train one
  std::string model_type = "bpe";
  int64_t vocab_size = 8000;
  int64_t sample_lines = 2000000;
  std::string out;
  std::string name = "text";
  int64_t shard_tokens = 100000000;
  int64_t val_tokens = -1;  // -1: the first shard
  int threads = 0;          // 0: every core
};

// Adds the command and its flags to app; returns it.
CLI::App* add_tokenize_command(CLI::App& app, TokenizeArgs& a);
int run_tokenize(const TokenizeArgs& a);

// The files --input's values name: each a file or a glob (its matches in name order,
// directories among them left out). sat::Error naming --input and the value otherwise.
std::vector<std::string> expand_inputs(const std::vector<std::string>& values);

}  // namespace sat::cli
