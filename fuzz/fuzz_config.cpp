// --config FILE.toml through apply_config_file (src/cli/config_file.cpp, toml11) into train's
// flags: any bytes give the flags' values or one sat::Error, never a crash. An accepted
// file's flags, written as config.toml (config_toml) and read into fresh flags, are
// accepted again and give the same values.
#include <CLI/CLI.hpp>

#include "cli/args.h"
#include "cli/config_file.h"
#include "fuzz_util.h"

namespace {

// train's flags after `saturate train` and the file; nullopt-like false when it is refused.
bool read_flags(const std::string& file, std::vector<sat::cli::FlagValue>& out) {
  sat::cli::RunArgs a;
  CLI::App app{"saturate"};
  CLI::App* train = app.add_subcommand("train");
  sat::cli::add_train_options(train, a, false);
  const char* argv[] = {"saturate", "train"};
  app.parse(2, argv);
  return sat::fuzz::accepts([&] {
    sat::cli::apply_config_file(train, file);
    out = sat::cli::flag_values(train);
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  sat::fuzz::TempDir dir;
  const std::string path = dir.file("run.toml");
  sat::fuzz::write_file(path, data, size);
  std::vector<sat::cli::FlagValue> first, second;
  if (!read_flags(path, first)) return 0;
  const std::string again = dir.file("config.toml");
  sat::fuzz::write_file(again, sat::cli::config_toml("train", first, {}));
  sat::fuzz::require(read_flags(again, second), "config.toml of an accepted file reads back");
  sat::fuzz::require(first.size() == second.size(), "the same flags read back");
  for (size_t i = 0; i < first.size(); ++i) {
    // The flags of where a run writes (--out, ...) are written commented out: not compared.
    const bool written = second[i].origin != "default" || first[i].origin == "default";
    sat::fuzz::require(!written || first[i].value == second[i].value, "every flag's value reads back");
  }
  return 0;
}
