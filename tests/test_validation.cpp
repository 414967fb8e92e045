// Validation during training (train/validation.h) through the real binary: --eval-every logs
// val_loss at its steps with the figures `saturate eval` gives for the checkpoint of that step
// (and the final evaluation at the last step); a 2-rank data-parallel job and a 2-stage
// pipeline log the one process's figures; --keep-best keeps the step whose val_loss is the
// least, as a checkpoint that eval and --resume read, and a resumed run keeps a better best;
// bad flags are one line naming the flag, status 2.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "run_command.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

#ifndef SAT_MPIEXEC
#define SAT_MPIEXEC "mpirun --oversubscribe"
#endif

namespace {

using Cmd = sat::test::CmdResult;

// `saturate ARGS` (np > 1: under mpirun), waited for.
Cmd saturate(const std::string& args, int np = 1) {
  std::string launcher;
  if (np > 1)
    launcher = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout -k 5 300 " SAT_MPIEXEC " -np " +
               std::to_string(np) + " ";
  return sat::test::run_command("OMP_WAIT_POLICY=passive " + launcher + SAT_BINARY + " " + args);
}

fs::path tmpdir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("sat_val_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// metrics.jsonl's step lines.
std::vector<json> lines_of(const fs::path& out) {
  std::vector<json> v;
  std::ifstream f(out / "metrics.jsonl");
  for (std::string line; std::getline(f, line);) {
    json j = json::parse(line);
    if (j.contains("step")) v.push_back(j);
  }
  return v;
}

// step -> val_loss of the lines that have one.
std::map<int64_t, double> val_losses(const fs::path& out) {
  std::map<int64_t, double> m;
  for (const json& j : lines_of(out))
    if (j.contains("val_loss")) m[j["step"].get<int64_t>()] = j["val_loss"].get<double>();
  return m;
}

json read_json(const fs::path& p) {
  std::ifstream f(p);
  return json::parse(f);
}

// `saturate eval` of weights (a checkpoint directory): its test loss.
double eval_loss(const std::string& flags, const fs::path& weights, const fs::path& scratch) {
  const Cmd c = saturate("eval " + flags + " --threads 1 --init-weights " + weights.string() + " --json " +
                         (scratch / "eval.json").string());
  EXPECT_EQ(c.status, 0) << c.out;
  return c.status == 0 ? read_json(scratch / "eval.json")["test_loss"].get<double>() : NAN;
}

const std::string kMlp = "--model mlp --data synthetic --seed 3";

bool near(double a, double b, double rel) { return std::fabs(a - b) <= rel * std::max(1.0, std::fabs(b)); }

}  // namespace

// The steps --eval-every names, each with the figures `saturate eval` gives for that step's
// checkpoint; the last one is the final evaluation's. Training itself is unchanged.
TEST(Validation, EveryNStepsMatchesEvalOfTheCheckpoint) {
  const fs::path d = tmpdir("every");
  const std::string run = "train " + kMlp + " --threads 1 --batch 32 --steps 6 ";
  const Cmd plain = saturate(run + "--out " + (d / "plain").string());
  ASSERT_EQ(plain.status, 0) << plain.out;
  const Cmd c = saturate(run + "--eval-every 2 --checkpoint-dir " + (d / "ck").string() +
                         " --checkpoint-every 2 --out " + (d / "o").string());
  ASSERT_EQ(c.status, 0) << c.out;
  EXPECT_NE(c.out.find("validation at step 4/6: loss "), std::string::npos) << c.out;
  const std::vector<json> with = lines_of(d / "o"), without = lines_of(d / "plain");
  ASSERT_EQ(with.size(), 6u);
  ASSERT_EQ(without.size(), 6u);
  for (size_t k = 0; k < with.size(); ++k) {
    EXPECT_EQ(with[k]["loss"], without[k]["loss"]) << "step " << k + 1 << ": validation changed training";
    EXPECT_EQ(with[k].contains("val_loss"), (k + 1) % 2 == 0) << with[k].dump();
    if (with[k].contains("val_loss")) {
      EXPECT_TRUE(with[k].contains("val_accuracy")) << with[k].dump();
      EXPECT_EQ(with[k]["val_samples"], 2000) << with[k].dump();
    }
  }
  const std::map<int64_t, double> val = val_losses(d / "o");
  for (int step : {2, 4})
    EXPECT_TRUE(near(val.at(step), eval_loss(kMlp + " --batch 32", d / "ck" / ("step-0000000" + std::to_string(step)), d),
                     1e-6)) << "step " << step;
  const json s = read_json(d / "o" / "summary.json");
  EXPECT_TRUE(near(val.at(6), s["test_loss"].get<double>(), 1e-6)) << s.dump();
  EXPECT_EQ(s["validation"]["every"], 2);
  EXPECT_EQ(s["validation"]["evaluations"], 3);
  EXPECT_EQ(s["validation"]["last"]["step"], 6);
  // --eval-batches K: the first K x --batch samples.
  const Cmd k = saturate(run + "--eval-every 3 --eval-batches 2 --out " + (d / "k").string());
  ASSERT_EQ(k.status, 0) << k.out;
  for (const json& j : lines_of(d / "k")) {
    if (j.contains("val_loss")) {
      EXPECT_EQ(j["val_samples"], 64) << j.dump();
    }
  }
  EXPECT_EQ(val_losses(d / "k").size(), 2u);
  fs::remove_all(d);
}

// The same figures from 2 data-parallel ranks (the same global batch; the whole test split),
// and from a 2-stage pipeline and ZeRO-3 (--eval-batches: the same 128 samples) as from one
// process.
TEST(Validation, LayoutsLogTheOneProcessFigures) {
  if (sat::test::mpirun().empty()) GTEST_SKIP() << "no mpirun";
  const fs::path d = tmpdir("layouts");
  const std::string run = "train " + kMlp + " --threads 1 --steps 2 --eval-every 1 --accum 2 ";
  auto job = [&](const std::string& name, const std::string& flags, int np) {
    const Cmd c = saturate(run + flags + " --out " + (d / name).string(), np);
    EXPECT_EQ(c.status, 0) << c.out;
    return val_losses(d / name);
  };
  const std::map<int64_t, double> whole = job("one", "--batch 16", 1), prefix = job("one128", "--batch 16 --eval-batches 8", 1);
  ASSERT_EQ(whole.size(), 2u);
  ASSERT_EQ(prefix.size(), 2u);
  const std::vector<std::tuple<std::string, std::string, const std::map<int64_t, double>*>> layouts = {
      {"dp", "--batch 8", &whole}, {"pp", "--batch 16 --pp 2 --eval-batches 8", &prefix},
      {"z3", "--batch 8 --zero 3 --eval-batches 16", &prefix}};
  for (const auto& [name, flags, ref] : layouts) {
    const std::map<int64_t, double> got = job(name, flags, 2);
    ASSERT_EQ(got.size(), ref->size()) << name;
    for (const auto& [step, v] : *ref) EXPECT_NEAR(got.at(step), v, 1e-5) << name << " step " << step;
  }
  fs::remove_all(d);
}

// --keep-best val_loss keeps the step of the least logged val_loss (here not the last: a
// learning rate too high for the mlp makes it worse later), a checkpoint whose evaluation
// gives that value; a run resumed after it keeps it against its own worse evaluations.
TEST(Validation, KeepBestKeepsTheLeastValLossAndResumeKeepsIt) {
  const fs::path d = tmpdir("best");
  const std::string run = "train " + kMlp + " --threads 1 --batch 32 --steps 12 --optimizer sgd --lr 0.5 "
                          "--schedule constant --eval-every 2 --eval-batches 4 --keep-best val_loss ";
  const Cmd c = saturate(run + "--checkpoint-dir " + (d / "ck").string() + " --checkpoint-every 4 --out " +
                         (d / "o").string());
  ASSERT_EQ(c.status, 0) << c.out;
  const std::map<int64_t, double> val = val_losses(d / "o");
  ASSERT_EQ(val.size(), 6u);
  const auto best = std::min_element(val.begin(), val.end(), [](auto& a, auto& b) { return a.second < b.second; });
  ASSERT_LT(best->first, 8) << "the case was meant to have its best evaluation before the checkpoint of step 8";
  const json man = read_json(d / "o" / "best" / "manifest.json");
  EXPECT_EQ(man["step"], best->first);
  EXPECT_EQ(man["best"]["metric"], "val_loss");
  EXPECT_EQ(man["best"]["step"], best->first);
  EXPECT_TRUE(near(man["best"]["value"].get<double>(), best->second, 1e-9));
  const json s = read_json(d / "o" / "summary.json");
  EXPECT_EQ(s["validation"]["best"]["step"], best->first) << s.dump();
  EXPECT_NE(c.out.find("the best so far: saved to"), std::string::npos) << c.out;
  const auto best_bytes = [&] {
    std::ifstream f(d / "o" / "best" / "rank-00000.safetensors", std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  const std::string bytes_before = best_bytes();
  ASSERT_FALSE(bytes_before.empty());
  // Resumed from step 8, after the best: its evaluations at 10 and 12 are worse and replace nothing.
  fs::remove_all(d / "ck" / "step-00000012");
  const Cmd r = saturate(run + "--checkpoint-dir " + (d / "ck").string() + " --resume auto --out " +
                         (d / "o").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out.find("the best so far"), std::string::npos) << r.out;
  EXPECT_EQ(read_json(d / "o" / "best" / "manifest.json")["step"], best->first);
  EXPECT_EQ(best_bytes(), bytes_before);
  EXPECT_EQ(read_json(d / "o" / "summary.json")["validation"]["best"]["step"], best->first);
  // best/ is a whole checkpoint: a run resumes from it.
  const Cmd again = saturate(run + "--resume " + (d / "o" / "best").string() + " --out " + (d / "again").string());
  ASSERT_EQ(again.status, 0) << again.out;
  fs::remove_all(d);
}

// best/ evaluated by saturate eval gives the val_loss logged for its step (a full evaluation).
TEST(Validation, EvalOfBestGivesItsLoggedValue) {
  const fs::path d = tmpdir("evalbest");
  const Cmd c = saturate("train " + kMlp + " --threads 1 --batch 32 --steps 6 --lr 0.02 --eval-every 2 --keep-best "
                         "val_accuracy --out " + (d / "o").string());
  ASSERT_EQ(c.status, 0) << c.out;
  const json man = read_json(d / "o" / "best" / "manifest.json");
  EXPECT_EQ(man["best"]["metric"], "val_accuracy");
  double best_acc = -1;
  int64_t best_step = 0;
  for (const json& j : lines_of(d / "o"))
    if (j.contains("val_accuracy") && j["val_accuracy"].get<double>() > best_acc)
      best_acc = j["val_accuracy"].get<double>(), best_step = j["step"].get<int64_t>();
  EXPECT_EQ(man["step"], best_step);
  EXPECT_TRUE(near(eval_loss(kMlp + " --batch 32", d / "o" / "best", d), val_losses(d / "o").at(best_step), 1e-6));
  fs::remove_all(d);
}

// Bad input: one line naming the flag, status 2, nothing written.
TEST(Validation, BadFlagsAreRefused) {
  const fs::path d = tmpdir("bad");
  const std::string run = "train " + kMlp + " --threads 1 --batch 32 --steps 4 ";
  auto refused = [&](const std::string& flags, const std::string& words) {
    const Cmd c = saturate(run + flags);
    EXPECT_EQ(c.status, 2) << flags << "\n" << c.out;
    EXPECT_NE(c.out.find(words), std::string::npos) << flags << "\n" << c.out;
    EXPECT_EQ(c.out.find("terminate"), std::string::npos) << c.out;
    EXPECT_EQ(c.out.find("step 1/"), std::string::npos) << "trained before refusing:\n" << c.out;
  };
  refused("--eval-every 5", "--eval-every 5 is more than the run's 4 optimizer steps");
  refused("--eval-every 0", "--eval-every");
  refused("--eval-every -2", "--eval-every");
  refused("--eval-every 2 --eval off", "--eval-every needs the test split");
  refused("--eval-batches 2", "--eval-batches needs --eval-every");
  refused("--eval-every 2 --keep-best val_los --out " + (d / "o").string(), "--keep-best: expected val_loss");
  refused("--keep-best val_loss --out " + (d / "o").string(), "--keep-best needs --eval-every");
  refused("--eval-every 2 --keep-best val_loss", "--keep-best needs --out DIR");
  {
    std::ofstream csv(d / "t.csv");
    csv << "a,b,label\n";
    for (int i = 0; i < 64; ++i) csv << i % 7 << "," << i % 5 << "," << i % 2 << "\n";
  }
  const Cmd t = saturate("train --model mlp:2-8-2 --data csv:" + (d / "t.csv").string() +
                         " --label label --threads 1 --batch 8 --steps 4 --eval-every 2");
  EXPECT_EQ(t.status, 2) << t.out;
  EXPECT_NE(t.out.find("--eval-every: the data has no validation split"), std::string::npos) << t.out;
  const Cmd g = saturate("train --model gpt-mini --data synthetic --threads 1 --batch 2 --steps 2 --eval-every 1 "
                         "--keep-best val_accuracy --out " + (d / "g").string());
  EXPECT_EQ(g.status, 2) << g.out;
  EXPECT_NE(g.out.find("--keep-best val_accuracy: --model gpt-mini is a language model"), std::string::npos) << g.out;
  EXPECT_FALSE(fs::exists(d / "o" / "metrics.jsonl"));
  fs::remove_all(d);
}
