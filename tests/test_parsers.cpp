// The parsers through the `saturate` binary, as users meet them: `plan --memory-budget`
// takes every unit `train --memory-budget` takes (20G, 20GiB, 20GB), and gives the bytes
// they mean; `--memory-limit`, its old name, still gives the same.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>

#include "run_command.h"

namespace fs = std::filesystem;

namespace {

sat::test::CmdResult saturate(const std::string& args) {
  return sat::test::run_command(std::string("OMP_WAIT_POLICY=passive ") + SAT_BINARY + " " + args);
}

}  // namespace

TEST(Parsers, PlanMemoryBudgetTakesEverySizeUnit) {
  const fs::path d = fs::temp_directory_path() / ("sat_parsers_" + std::to_string(getpid()));
  fs::create_directories(d);
  const double Gi = 1024.0 * 1024 * 1024;
  const std::string plan = "plan --model mlp --gpus 1 --gpu a100-80gb --global-batch 8 --top 1 ";
  for (const auto& [flag, limit, bytes] : {std::tuple{"--memory-budget", "20G", 20 * Gi}, {"--memory-budget", "20GiB", 20 * Gi},
                                           {"--memory-budget", "20GB", 20e9}, {"--memory-limit", "20GB", 20e9}}) {
    const std::string json = (d / "plan.json").string();
    const auto r = saturate(plan + flag + " " + limit + " --json " + json);
    ASSERT_EQ(r.status, 0) << flag << " " << limit << ": " << r.out;
    const auto j = nlohmann::json::parse(std::ifstream(json));
    EXPECT_EQ(j.at("memory_limit_bytes").get<double>(), bytes) << flag << " " << limit;
  }
  const auto bad = saturate(plan + "--memory-budget 20Gb");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("--memory-budget: expected a size such as"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("got '20Gb'"), std::string::npos) << bad.out;
  const auto old_bad = saturate(plan + "--memory-limit 20Gb");  // the old name, named as given
  EXPECT_EQ(old_bad.status, 2) << old_bad.out;
  EXPECT_NE(old_bad.out.find("--memory-limit: expected a size such as"), std::string::npos) << old_bad.out;
  const auto both = saturate(plan + "--memory-budget 20GiB --memory-limit 20GiB");
  EXPECT_EQ(both.status, 2) << both.out;
  EXPECT_NE(both.out.find("--memory-budget and --memory-limit: give one"), std::string::npos) << both.out;
  // The help shows the one name; the old one is hidden.
  const auto help = saturate("plan --help");
  EXPECT_NE(help.out.find("--memory-budget"), std::string::npos) << help.out;
  EXPECT_EQ(help.out.find("--memory-limit"), std::string::npos) << help.out;
  fs::remove_all(d);
}
