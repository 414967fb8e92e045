// The parsers through the `saturate` binary, as users meet them: `plan --memory-limit`
// takes every unit `train --memory-budget` takes (20G, 20GiB, 20GB), and gives the bytes
// they mean.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_command.h"

namespace fs = std::filesystem;

namespace {

sat::test::CmdResult saturate(const std::string& args) {
  return sat::test::run_command(std::string("OMP_WAIT_POLICY=passive ") + SAT_BINARY + " " + args);
}

}  // namespace

TEST(Parsers, PlanMemoryLimitTakesEverySizeUnit) {
  const fs::path d = fs::temp_directory_path() / ("sat_parsers_" + std::to_string(getpid()));
  fs::create_directories(d);
  const double Gi = 1024.0 * 1024 * 1024;
  for (const auto& [limit, bytes] : {std::pair{"20G", 20 * Gi}, {"20GiB", 20 * Gi}, {"20GB", 20e9}}) {
    const std::string json = (d / "plan.json").string();
    const auto r = saturate(std::string("plan --model mlp --gpus 1 --gpu a100-80gb --global-batch 8 --top 1 --memory-limit ") +
                            limit + " --json " + json);
    ASSERT_EQ(r.status, 0) << limit << ": " << r.out;
    const auto j = nlohmann::json::parse(std::ifstream(json));
    EXPECT_EQ(j.at("memory_limit_bytes").get<double>(), bytes) << limit;
  }
  const auto bad = saturate("plan --model mlp --gpus 1 --gpu a100-80gb --global-batch 8 --memory-limit 20Gb");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("--memory-limit: expected a size such as"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("got '20Gb'"), std::string::npos) << bad.out;
  fs::remove_all(d);
}
