// Learning on real data with the defaults: `saturate train --model M` with no optimizer
// flags (AdamW, 5% warm-up, cosine decay: README "Defaults"), one epoch of Fashion-MNIST
// (Debian's dataset-fashion-mnist, installed by scripts/test), must reach mlp >= 85% and
// convnet >= 88% test accuracy, and convnet >= 89% in bf16.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "run_command.h"

namespace {

namespace fs = std::filesystem;

double one_epoch(const std::string& model, const std::string& flags = "") {
  const fs::path out = fs::temp_directory_path() / ("sat_learning_" + model + "_" + std::to_string(getpid()));
  fs::remove_all(out);
  const auto r = sat::test::run_command(std::string(SAT_BINARY) + " train --model " + model + " --threads 2 --out " +
                                        out.string() + (flags.empty() ? "" : " " + flags));
  EXPECT_EQ(r.status, 0) << r.out;
  std::ifstream f(out / "summary.json");
  if (!f) return 0;
  const auto s = nlohmann::json::parse(f);
  fs::remove_all(out);
  EXPECT_EQ(s["optimizer"]["name"], "adamw");
  EXPECT_EQ(s["test_samples"], 10000);
  const double acc = s["test_accuracy"].get<double>();
  std::printf("[ learning ] %-8s 1 epoch of Fashion-MNIST with the defaults%s: test accuracy %.2f%%, test loss %.4f\n",
              model.c_str(), flags.empty() ? "" : (" and " + flags).c_str(), 100 * acc, s["test_loss"].get<double>());
  return acc;
}

bool have_data() {
  return fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz");
}

}  // namespace

TEST(Learning, MlpReaches85PercentInOneEpochWithTheDefaults) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  EXPECT_GE(one_epoch("mlp"), 0.85);
}

TEST(Learning, ConvnetReaches88PercentInOneEpochWithTheDefaults) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  EXPECT_GE(one_epoch("convnet"), 0.88);
}

// bf16 on the CPU (nn/bf16_cpu.h): the same epoch with --precision bf16 reaches 89%.
TEST(Learning, ConvnetReaches89PercentInOneEpochInBf16) {
  if (!have_data()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  EXPECT_GE(one_epoch("convnet", "--precision bf16"), 0.89);
}
