// A network that is none of the built-ins, written only as a model file
// (models/examples/branchnet.json: a convolution branch and a 1x1 shortcut merged by add,
// a tensor-parallel head), used the way a user would: it trains on Fashion-MNIST, runs
// under --tp 2 and --pp 2 following its one-process trajectory, tunes and plans. Its
// parity with the PyTorch module of the same file is test_parity's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "mpi_job.h"
#include "run_command.h"
#include "trajectory.h"

#ifndef SAT_MPIEXEC
#define SAT_MPIEXEC "mpirun --oversubscribe"
#endif

namespace {

namespace fs = std::filesystem;

const std::string kNet = "file:" + std::string(SAT_SOURCE_DIR) + "/models/examples/branchnet.json";

fs::path tmpdir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("sat_model_file_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  return d;
}

sat::test::CmdResult saturate(const std::string& args) {
  return sat::test::run_command(std::string(SAT_BINARY) + " " + args);
}

nlohmann::json summary(const fs::path& out) { return nlohmann::json::parse(std::ifstream(out / "summary.json")); }

}  // namespace

TEST(ModelFileNetwork, TrainsOnFashionMnist) {
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const fs::path out = tmpdir("fmnist");
  const auto r = saturate("train --model " + kNet + " --steps 300 --threads 2 --out " + out.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const auto s = summary(out);
  std::printf("[ model file ] branchnet, 300 steps of Fashion-MNIST at batch 64: test accuracy %.2f%%\n",
              100 * s["test_accuracy"].get<double>());
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.60);  // 66.8% measured; chance is 10%
  EXPECT_EQ(s["parameters"], 12538);
  fs::remove_all(out);
}

// Its "tp": "column" / "row" head splits over 2 ranks, and its blocks cut into 2 pipeline
// stages: each follows the one-process trajectory of the same global batch within 1e-5.
TEST(ModelFileNetwork, RunsUnderTensorAndPipelineParallelism) {
  const std::string run = "train --model " + kNet + " --data synthetic --batch 8 --accum 2 --steps 12 --threads 1 "
                          "--eval off --out ";
  const fs::path one = tmpdir("one"), tp = tmpdir("tp"), pp = tmpdir("pp");
  const auto r = saturate(run + one.string());
  ASSERT_EQ(r.status, 0) << r.out;
  const auto t = sat::test::run_job(2, run + tp.string() + " --tp 2", 180);
  ASSERT_EQ(t.status, 0) << t.out;
  const auto p = sat::test::run_job(2, run + pp.string() + " --pp 2", 180);
  ASSERT_EQ(p.status, 0) << p.out;
  const std::vector<double> ref = sat::test::metrics_losses(one);
  ASSERT_EQ(ref.size(), 12u);
  const double e_tp = sat::test::max_rel(sat::test::metrics_losses(tp), ref), e_pp = sat::test::max_rel(sat::test::metrics_losses(pp), ref);
  std::printf("[ model file ] branchnet 12 steps: --tp 2 worst relative loss difference %.2e, --pp 2 %.2e\n", e_tp, e_pp);
  EXPECT_LT(e_tp, 1e-5);
  EXPECT_LT(e_pp, 1e-5);
  EXPECT_EQ(summary(tp)["layout"]["tp"], 2);
  EXPECT_EQ(summary(pp)["layout"]["pp"], 2);
  for (auto& d : {one, tp, pp}) fs::remove_all(d);
}

TEST(ModelFileNetwork, TunesAndPlans) {
  const fs::path out = tmpdir("tune");
  const auto t = saturate("tune --model " + kNet + " --data synthetic --memory-budget 64MiB --threads 1 --out " + out.string());
  ASSERT_EQ(t.status, 0) << t.out;
  EXPECT_NE(t.out.find("tune: micro-batch"), std::string::npos) << t.out;
  const auto j = nlohmann::json::parse(std::ifstream(out / "tune.json"));
  EXPECT_GT(j["candidates"].size(), 1u);
  const auto p = saturate("plan --model " + kNet + " --gpus 8 --gpu a100-80gb --global-batch 256 --top 3 --json " +
                          (out / "plan.json").string());
  ASSERT_EQ(p.status, 0) << p.out;
  const auto plan = nlohmann::json::parse(std::ifstream(out / "plan.json"));
  EXPECT_EQ(plan["best"]["dp"].get<int>() * plan["best"]["tp"].get<int>() * plan["best"]["pp"].get<int>(), 8);
  EXPECT_GT(plan["best"]["samples_per_second"].get<double>(), 0);
  const auto i = saturate("info --model " + kNet + " --batch 32 --tp 2");
  ASSERT_EQ(i.status, 0) << i.out;
  EXPECT_NE(i.out.find("tensor      2-way: each rank holds 11162 of the parameters"), std::string::npos) << i.out;
  fs::remove_all(out);
}
