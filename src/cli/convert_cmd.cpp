#include "cli/convert_cmd.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/io.h"
#include "core/text.h"
#include "nn/hf_convert.h"

namespace sat::cli {

namespace fs = std::filesystem;

CLI::App* add_convert_command(CLI::App& app, ConvertArgs& a) {
  auto* c = app.add_subcommand("convert", "a Hugging Face checkpoint (GPT-2, Llama; safetensors) into saturate's "
                               "weights, with the --model they fit");
  c->add_option("--from", a.from, "gpt2 | llama: the checkpoint's family (GPT2LMHeadModel, LlamaForCausalLM)")
      ->required();
  c->add_option("IN", a.input, "a model.safetensors file (or a sharded checkpoint's index), or the checkpoint's "
                "directory (model.safetensors and config.json)")->required();
  c->add_option("--out", a.out, "the weights written (default: NAME.safetensors here, NAME the checkpoint's "
                "directory)");
  c->add_option("--heads", a.heads, "without config.json: the attention heads (the shapes do not give them)");
  c->add_option("--context", a.context, "llama without config.json: the context (max_position_embeddings)");
  return c;
}

namespace {

// NAME.safetensors in the working directory, NAME the checkpoint directory's.
std::string default_out(const std::string& input) {
  fs::path p = fs::absolute(input).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  if (!fs::is_directory(p)) p = p.parent_path();
  const std::string name = p.filename().string();
  return (name.empty() || name == "." || name == ".." ? std::string("converted") : name) + ".safetensors";
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return fs::exists(a, ec) && fs::exists(b, ec) && fs::equivalent(a, b, ec);
}

}  // namespace

int run_convert(const ConvertArgs& a) {
  SAT_CHECK(a.heads >= 0, "--heads: expected a positive number of heads, got ", a.heads);
  SAT_CHECK(a.context >= 0, "--context: expected a positive number of positions, got ", a.context);
  HfConvertOptions o;
  o.from = a.from;
  o.input = a.input;
  o.heads = a.heads;
  o.context = a.context;
  const std::string out = a.out.empty() ? default_out(a.input) : a.out;
  check_output_file("--out", out);
  const HfConversion c = convert_hf_checkpoint(o);
  SAT_CHECK(!same_file(out, c.weights_file), "--out ", out, ": that is the checkpoint being read; expected "
            "another file");
  save_hf_conversion(out, c);
  std::printf("read %s%s: %zu tensors, %lld parameters\n", c.weights_file.c_str(),
              c.config_file.empty() ? " (no config.json)" : (" and " + c.config_file).c_str(), c.tensors.size(),
              (long long)c.parameters);
  for (const std::string& n : c.notes) std::printf("  %s\n", n.c_str());
  std::printf("wrote %s\nmodel: %s\n", out.c_str(), c.spec.c_str());
  std::printf("  saturate eval --model %s --init-weights %s --data tokens:DIR\n", c.spec.c_str(), out.c_str());
  std::printf("  saturate train --model %s --init-weights %s --data tokens:DIR ...\n", c.spec.c_str(), out.c_str());
  return 0;
}

}  // namespace sat::cli
