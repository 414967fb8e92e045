#include "cli/import_cmd.h"

#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "dist/launch.h"

namespace sat::cli {

namespace fs = std::filesystem;

CLI::App* add_import_command(CLI::App& app, ImportArgs& a) {
  auto* c = app.add_subcommand("import", "a PyTorch module (torch.nn.Module) as a model file and its weights: "
                               "saturate train --model file:NET.json --init-weights W.safetensors");
  c->add_option("MODULE:FACTORY", a.factory, "a Python module (on the Python path or in the current directory) and "
                "a callable in it that returns the torch.nn.Module, optionally with literal keyword arguments, "
                "e.g. torchvision.models:resnet18(num_classes=10)")->required();
  c->add_option("--input", a.input, "the shape of one sample: 3x32x32, 784, or tokens:T (token ids of length T)")
      ->required();
  c->add_option("--out", a.out, "the model file to write (default FACTORY.json)");
  c->add_option("--weights", a.weights, "the weights to write (default: --out's name with .safetensors)");
  return c;
}

std::string find_importer(const std::string& exe) {
  const fs::path dir = fs::path(exe).parent_path();
  const fs::path here = dir / "saturate_torch.py", installed = dir / ".." / "lib" / "python3" / "dist-packages" /
                                                                  "saturate_torch.py";
  if (fs::is_regular_file(here)) return here.string();
  if (fs::is_regular_file(installed)) return fs::weakly_canonical(installed).string();
  fail("import: cannot find saturate_torch.py beside ", exe, " or in ", installed.parent_path().lexically_normal().string(),
       " (build the saturate target, or cmake --install)");
}

int run_import(const ImportArgs& a) {
  // Debian's python3 by default (a python3 earlier on PATH may lack torch); SATURATE_PYTHON
  // names another, such as a virtual environment's.
  const char* env = std::getenv("SATURATE_PYTHON");
  const bool chosen = env != nullptr && *env != '\0';
  const std::string python = chosen ? env : "/usr/bin/python3";
  SAT_CHECK(access(python.c_str(), X_OK) == 0, "import: ", chosen ? "SATURATE_PYTHON=" : "", python,
            chosen ? " is not an executable file (a python3 with torch expected)" : " is missing (apt-get install python3-torch, or set SATURATE_PYTHON)");
  const std::string script = find_importer(dist::self_executable());
  std::vector<std::string> args{python, script, a.factory, "--input", a.input};
  if (!a.out.empty()) args.insert(args.end(), {"--out", a.out});
  if (!a.weights.empty()) args.insert(args.end(), {"--weights", a.weights});
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = fork();
  SAT_CHECK(pid >= 0, "import: cannot start ", python, ": ", std::strerror(errno));
  if (pid == 0) {
    execv(python.c_str(), argv.data());
    std::fprintf(stderr, "saturate: error: import: cannot run %s: %s\n", python.c_str(), std::strerror(errno));
    _exit(2);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 2;
}

}  // namespace sat::cli
