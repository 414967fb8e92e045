// --config FILE.toml (cli/config_file.h) as users run it: a run's --out has its resolved
// configuration in config.toml, which --config reads back to repeat the run bit for bit;
// the command line overrides the file; each mistake in a file is one line naming the file,
// the line and the key, with exit status 2 and nothing already in --out lost.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_command.h"

namespace fs = std::filesystem;

namespace {

using sat::test::CmdResult;

CmdResult saturate(const std::string& args, const std::string& env = "") {
  return sat::test::run_command(env + "OMP_WAIT_POLICY=passive " + SAT_BINARY + " " + args);
}

fs::path tmpdir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sat_config_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

// The losses of metrics.jsonl, step by step.
std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  std::ifstream f(metrics);
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) out.push_back(j["loss"].get<double>());
  }
  return out;
}

// config.toml's line for `key` as "VALUE  # WHY" (spaces between them squeezed to two);
// `commented`: the line that writes it commented out. "" when there is none.
std::string entry(const std::string& toml, const std::string& key, bool commented = false) {
  std::istringstream in(toml);
  const std::string start = (commented ? "# " : "") + key + " = ";
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(start, 0) != 0) continue;
    std::string rest = line.substr(start.size());
    const size_t hash = rest.find("  #"), text = rest.find_last_not_of(' ', hash);
    return hash == std::string::npos ? rest : rest.substr(0, text + 1) + "  #" + rest.substr(hash + 3);
  }
  return "";
}

void expect_config_error(const CmdResult& r, const std::string& must_mention) {
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_NE(r.out.find("saturate: error: " + must_mention), std::string::npos)
      << "message should say '" << must_mention << "': " << r.out;
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line: " << r.out;
}

const char* const kRun = "train --model mlp --data synthetic --threads 1 --eval off ";

}  // namespace

// A run with --out writes config.toml; --config of it, with another --out, repeats the run:
// the same losses, the same weights to the byte, and the same configuration (its values now
// from the file).
TEST(ConfigFile, RoundTripRepeatsTheRun) {
  const fs::path a = tmpdir("first"), b = tmpdir("again");
  CmdResult r = saturate(std::string(kRun) + "--batch 8 --accum 2 --steps 4 --lr 0.003 --seed 7 --momentum 0.5 "
                         "--optimizer sgd --nesterov --schedule step --normalize 0.5,0.25 --save-weights " +
                         (a / "w.safetensors").string() + " --out " + a.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string first = read(a / "config.toml");
  EXPECT_EQ(entry(first, "lr"), "0.003  # command line") << first;
  EXPECT_EQ(entry(first, "batch"), "8  # command line") << first;
  EXPECT_EQ(entry(first, "nesterov"), "true  # command line") << first;
  EXPECT_EQ(entry(first, "sync-bn"), "false  # default") << first;
  EXPECT_EQ(entry(first, "normalize"), "\"0.5,0.25\"  # command line") << first;
  EXPECT_NE(first.find("\n# weight-decay: not given: 0.0 here, sgd's default\n"), std::string::npos) << first;
  std::string out = a.string();
  out.insert(0, 1, '"');
  out += "\"  # command line; where the run wrote or resumed from: give it anew";
  EXPECT_EQ(entry(first, "out", true), out) << first;
  EXPECT_EQ(entry(first, "epochs", true), "1  # default; not with steps") << first;
  EXPECT_NE(first.find("\n# warmup: not given (default: 5% of the run's steps)\n"), std::string::npos) << first;
  EXPECT_EQ(first.find("config ="), std::string::npos) << first;

  r = saturate("train --config " + (a / "config.toml").string() + " --save-weights " + (b / "w.safetensors").string() +
               " --out " + b.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const std::vector<double> la = losses(a / "metrics.jsonl"), lb = losses(b / "metrics.jsonl");
  ASSERT_EQ(la.size(), 4u);
  EXPECT_EQ(la, lb);
  EXPECT_EQ(read(a / "w.safetensors"), read(b / "w.safetensors"));
  const std::string again = read(b / "config.toml");
  EXPECT_NE(entry(again, "lr").find("0.003  # from " + (a / "config.toml").string() + ":"), std::string::npos) << again;
  // The same values: only where they came from differs (and the outputs' paths).
  for (const char* key : {"model", "data", "batch", "accum", "steps", "lr", "seed", "momentum", "nesterov", "optimizer",
                          "schedule", "normalize", "threads", "device"}) {
    const std::string x = entry(first, key), y = entry(again, key);
    EXPECT_FALSE(x.empty()) << key;
    EXPECT_EQ(x.substr(0, x.find('#')), y.substr(0, y.find('#'))) << key;
  }
}

// --batch auto: config.toml holds the micro-batch, accumulation and learning rate it chose,
// and --config of it trains with them, without tuning, to the same losses.
TEST(ConfigFile, BatchAutoIsWrittenAsItsChoice) {
  const fs::path a = tmpdir("auto"), b = tmpdir("auto_again"), cache = tmpdir("auto_cache");
  const std::string env = "XDG_CACHE_HOME=" + cache.string() + " ";
  CmdResult r = saturate("train --model mlp:784-16-10 --data synthetic --threads 1 --eval off --batch auto "
                         "--memory-budget 1MiB --global-batch 64 --lr-batch 32 --steps 3 --out " + a.string(), env);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto summary = nlohmann::json::parse(std::ifstream(a / "summary.json"));
  const std::string toml = read(a / "config.toml");
  EXPECT_EQ(entry(toml, "batch"), std::to_string(summary["batch"].get<int>()) + "  # chosen by --batch auto") << toml;
  EXPECT_EQ(entry(toml, "accum"), std::to_string(summary["accum"].get<int>()) + "  # chosen by --batch auto") << toml;
  // 0.001 at batch 32 is sqrt(2) x 0.001 at 64 (AdamW's rule), written to the float's last bit.
  EXPECT_EQ(entry(toml, "lr"), "0.0014142137  # --batch auto scaled it to its global batch (--lr-batch)") << toml;
  EXPECT_EQ(entry(toml, "global-batch", true), "64  # command line; the batch and accumulation above give it") << toml;
  r = saturate("train --config " + (a / "config.toml").string() + " --out " + b.string(), env);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("tune:"), std::string::npos) << r.out;
  EXPECT_EQ(losses(a / "metrics.jsonl"), losses(b / "metrics.jsonl"));
  const auto again = nlohmann::json::parse(std::ifstream(b / "summary.json"));
  EXPECT_EQ(again["batch"], summary["batch"]);
  EXPECT_EQ(again["accum"], summary["accum"]);
  EXPECT_EQ(again["optimizer"]["lr"], summary["optimizer"]["lr"]);
}

// saturate tune --out writes its choice as train's config.toml: --config of it trains with
// the micro-batch, accumulation and learning rate tune.json records, without tuning again.
TEST(ConfigFile, TuneWritesItsChoiceForTrain) {
  const fs::path a = tmpdir("tuned"), b = tmpdir("tuned_train"), cache = tmpdir("tuned_cache");
  const std::string env = "XDG_CACHE_HOME=" + cache.string() + " ";
  CmdResult r = saturate("tune --model mlp:784-16-10 --data synthetic --threads 1 --eval off --memory-budget 1MiB "
                         "--global-batch 64 --lr-batch 32 --out " + a.string(), env);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto choice = nlohmann::json::parse(std::ifstream(a / "tune.json"))["choice"];
  const std::string toml = read(a / "config.toml");
  EXPECT_EQ(entry(toml, "batch"), std::to_string(choice["micro_batch"].get<int>()) + "  # chosen by --batch auto")
      << toml;
  r = saturate("train --config " + (a / "config.toml").string() + " --steps 2 --out " + b.string(), env);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("tune:"), std::string::npos) << r.out;
  const auto s = nlohmann::json::parse(std::ifstream(b / "summary.json"));
  EXPECT_EQ(s["batch"], choice["micro_batch"]);
  EXPECT_EQ(s["accum"], choice["accum"]);
  EXPECT_FLOAT_EQ(s["optimizer"]["lr"].get<float>(), choice["lr"].get<float>());
}

// --layout auto: config.toml holds the layout it chose as the layout's flags (--layout and
// --global-batch commented out), and --config of it trains that layout to the same losses.
TEST(ConfigFile, LayoutAutoIsWrittenAsItsFlags) {
  const fs::path a = tmpdir("layout"), b = tmpdir("layout_again"), cache = tmpdir("layout_cache");
  const std::string env = "XDG_CACHE_HOME=" + cache.string() + " ";
  CmdResult r = saturate("train --model mlp:784-16-10 --data synthetic --threads 1 --eval off --layout auto "
                         "--global-batch 32 --layout-candidates 2 --memory-budget 4MiB --steps 3 --out " + a.string(), env);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto summary = nlohmann::json::parse(std::ifstream(a / "summary.json"));
  const std::string toml = read(a / "config.toml");
  EXPECT_EQ(entry(toml, "batch"), std::to_string(summary["batch"].get<int>()) + "  # chosen by --layout") << toml;
  for (const char* key : {"tp", "pp", "zero", "recompute", "pp-schedule", "sequence-parallel"})
    EXPECT_NE(entry(toml, key).find("  # chosen by --layout"), std::string::npos) << key << "\n" << toml;
  EXPECT_EQ(entry(toml, "layout", true), "\"auto\"  # command line; its choice is written in the layout's flags") << toml;
  EXPECT_EQ(entry(toml, "global-batch", true), "32  # command line; the batch and accumulation above give it") << toml;
  r = saturate("train --config " + (a / "config.toml").string() + " --out " + b.string(), env);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("layout auto"), std::string::npos) << r.out;
  EXPECT_EQ(losses(a / "metrics.jsonl"), losses(b / "metrics.jsonl"));
}

// saturate tune --layout auto --out: config.toml holds the layout it chose, as train's flags.
TEST(ConfigFile, TuneLayoutWritesItsChoice) {
  const fs::path a = tmpdir("tune_layout"), cache = tmpdir("tune_layout_cache");
  const std::string env = "XDG_CACHE_HOME=" + cache.string() + " ";
  CmdResult r = saturate("tune --model mlp:784-16-10 --data synthetic --threads 1 --layout auto --global-batch 32 "
                         "--layout-candidates 2 --memory-budget 4MiB --out " + a.string(), env);
  ASSERT_EQ(r.status, 0) << r.out;
  const auto choice = nlohmann::json::parse(std::ifstream(a / "tune.json"))["layout_choice"];
  const std::string toml = read(a / "config.toml");
  EXPECT_EQ(entry(toml, "batch"), std::to_string(choice["micro_batch"].get<int>()) + "  # chosen by --layout") << toml;
  EXPECT_EQ(entry(toml, "accum"), std::to_string(choice["accum"].get<int>()) + "  # chosen by --layout") << toml;
}

// Flags on the command line win over the file's; a flag given there replaces the file's
// flag it cannot go with (--steps, the file's epochs). Tables group keys; seq_len = seq-len.
TEST(ConfigFile, CommandLineOverridesTheFile) {
  const fs::path d = tmpdir("override"), out = tmpdir("override_out");
  write(d / "run.toml", "model = \"mlp\"\n[data]\ndata = \"synthetic\"\nshuffle = \"off\"\n[training]\nbatch = 4\n"
                        "epochs = 1\nlr = 0.01\nsync_bn = true\nthreads = 1\neval = \"off\"\n");
  CmdResult r = saturate("train --config " + (d / "run.toml").string() + " --batch 8 --steps 2 --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const auto s = nlohmann::json::parse(std::ifstream(out / "summary.json"));
  EXPECT_EQ(s["batch"], 8);
  EXPECT_EQ(s["steps"], 2);
  const std::string toml = read(out / "config.toml");
  const std::string file = (d / "run.toml").string();
  EXPECT_EQ(entry(toml, "batch"), "8  # command line") << toml;
  EXPECT_EQ(entry(toml, "lr"), "0.01  # from " + file + ":8") << toml;
  EXPECT_EQ(entry(toml, "sync-bn"), "true  # from " + file + ":9") << toml;
  EXPECT_EQ(entry(toml, "shuffle"), "\"off\"  # from " + file + ":4") << toml;
  EXPECT_EQ(entry(toml, "epochs"), "") << toml;  // --steps replaced it
  EXPECT_EQ(entry(toml, "steps"), "2  # command line") << toml;
  // A switch given on the command line wins over the file's false.
  write(d / "off.toml", "sync-bn = false\nseed = \"18446744073709551615\"  # beyond TOML's integers\n");
  r = saturate(std::string(kRun) + "--config " + (d / "off.toml").string() + " --sync-bn --batch 8 --steps 1 --out " +
               out.string() + " --overwrite");
  ASSERT_EQ(r.status, 0) << r.out;
  const std::string written = read(out / "config.toml");
  EXPECT_EQ(entry(written, "sync-bn"), "true  # command line");
  EXPECT_EQ(entry(written, "seed"), "\"18446744073709551615\"  # from " + (d / "off.toml").string() + ":2");
}

// Every mistake in a file: one line naming the file, the line and the key, exit status 2,
// and the run already in --out untouched.
TEST(ConfigFile, MistakesNameTheFileLineAndKey) {
  const fs::path d = tmpdir("mistakes"), out = tmpdir("mistakes_out");
  ASSERT_EQ(saturate(std::string(kRun) + "--batch 8 --steps 2 --out " + out.string()).status, 0);
  const std::string summary = read(out / "summary.json"), metrics = read(out / "metrics.jsonl");
  const std::string config = read(out / "config.toml");
  const fs::path f = d / "run.toml";
  const std::string at = f.string() + ":";
  struct Case {
    std::string text, message;
  };
  const std::vector<Case> cases = {
      {"steps = 2\nbacth = 8\n", at + "2: bacth: not a flag of saturate train (did you mean batch?)"},
      {"steps = 2\nlr = \"3e-4\"\n", at + "2: lr: expected a number, got a string (\"3e-4\")"},
      {"steps = 2.5\n", at + "1: steps: expected an integer, got a number (2.5)"},
      {"sync-bn = \"yes\"\n", at + "1: sync-bn: expected true or false, got a string (\"yes\")"},
      {"model = 3.5\n", at + "1: model: expected a string, got a number (3.5)"},  // though --model overrides it
      {"label = true\n", at + "1: label: expected a string, got a boolean (true)"},
      {"normalize = [0.5, true]\n", at + "1: normalize: expected an array of strings or numbers, got a boolean"},
      {"steps = 2\nbatch =\n", at + "2: TOML: missing value after key-value separator '='"},
      {"batch = 8\nsteps = 2\nbatch = 4\n", at + "3: batch: given twice (first on line 1)"},
      {"[data]\nseq_len = 8\n[model]\nseq-len = 8\n", at + "4: seq-len: given twice (first on line 2)"},
      {"epochs = 2\nsteps = 3\n", at + "2: steps: not with epochs (line 1): give one of them"},
      {"seed = 18446744073709551616\n", at + "1: seed: expected an integer TOML can hold (-2^63 to 2^63 - 1), got "
                                              "18446744073709551616 (write a larger one as a string of digits)"},
      {"seed = \"18446744073709551616\"\n", at + "1: seed: expected an integer from 0 to 18446744073709551615, got "
                                                "'18446744073709551616'"},
      {"accum = 0\n", at + "1: accum: expected an integer from 1 to 1048576, got '0'"},  // CLI11's check
      {"steps = 2\nbatch = 0\n", at + "2: batch: expected a micro-batch size from 1 to"},    // train's check
      {"steps = 2\nshuffle = \"maybe\"\n", at + "2: shuffle: expected on or off, got 'maybe'"},
      {"config = \"other.toml\"\n", at + "1: config: a config file cannot name another"},
      {"[a]\n[a.b]\nsteps = 1\n", at + "2: a.b: a table groups flags (its name is ignored); tables do not nest"},
  };
  for (const Case& c : cases) {
    write(f, c.text);
    const CmdResult r = saturate(std::string(kRun) + "--config " + f.string() + " --out " + out.string() + " --overwrite");
    SCOPED_TRACE(c.text);
    expect_config_error(r, c.message);
  }
  const std::string missing = (d / "missing.toml").string();
  expect_config_error(saturate("train --config " + missing), "--config: " + missing + ": cannot read the file");
  EXPECT_EQ(read(out / "summary.json"), summary);
  EXPECT_EQ(read(out / "metrics.jsonl"), metrics);
  EXPECT_EQ(read(out / "config.toml"), config);
}

// tune reads a file too; its flags are tune's (no --noise-scale).
TEST(ConfigFile, TuneReadsItsOwnFlags) {
  const fs::path d = tmpdir("tune");
  write(d / "run.toml", "noise-scale = true\n");
  expect_config_error(saturate("tune --config " + (d / "run.toml").string()),
                      (d / "run.toml").string() + ":1: noise-scale: not a flag of saturate tune");
}
