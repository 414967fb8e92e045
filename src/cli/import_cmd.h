// `saturate import MODULE:FACTORY --input SHAPE [--out NET.json] [--weights W.safetensors]`:
// a PyTorch module as a saturate model file and its weights, by python/saturate_torch.py
// (found beside the executable, else in EXE/../lib/python3/dist-packages) run with
// /usr/bin/python3, or $SATURATE_PYTHON when set; the script's exit status is the command's.
#pragma once
#include <string>

namespace CLI {
class App;
}

namespace sat::cli {

struct ImportArgs {
  std::string factory;  // MODULE:FACTORY or MODULE:FACTORY(k=v, ...)
  std::string input;    // the per-sample shape (3x32x32, 784) or tokens:T
  std::string out;      // default FACTORY.json
  std::string weights;  // default NET.safetensors beside --out
};

// Adds the command and its flags to app; returns it.
CLI::App* add_import_command(CLI::App& app, ImportArgs& a);
int run_import(const ImportArgs& a);

// saturate_torch.py beside the executable exe, else under exe's ../lib/python3/dist-packages;
// sat::Error naming both places when neither has it.
std::string find_importer(const std::string& exe);

}  // namespace sat::cli
