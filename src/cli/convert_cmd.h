// `saturate convert --from gpt2|llama IN [--out W.safetensors]`: a Hugging Face checkpoint
// (model.safetensors and config.json) into saturate's weights (nn/hf_convert.h), with the
// --model spec they fit and the commands that load them.
#pragma once
#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace sat::cli {

struct ConvertArgs {
  std::string from, input, out;
  int64_t heads = 0, context = 0;
};

// Adds the command and its flags to app; returns it.
CLI::App* add_convert_command(CLI::App& app, ConvertArgs& a);
int run_convert(const ConvertArgs& a);

}  // namespace sat::cli
