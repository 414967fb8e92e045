// A command plans its job once: `saturate info` renders one JobPlan (and a second one for the
// model without recomputation), and every rank of `saturate train` builds its graphs before
// MPI starts and trains with them, --save-weights's gather included. With
// SAT_REPORT_GRAPH_BUILDS=1 every process lists the graphs it built ("graph built N time(s):
// KEY", nn/models.h): no key may be built twice.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>

#include "run_command.h"

namespace fs = std::filesystem;

namespace {

// The "graph built N time(s): KEY" lines of a command's output, by process: rank -> KEY -> N.
// Under mpirun --tag-output every line starts with "[JOB,RANK]<stderr>:"; a lone process
// is rank 0.
std::map<int, std::map<std::string, int>> graph_builds(const std::string& out) {
  std::map<int, std::map<std::string, int>> ranks;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    int job = 0, rank = 0;
    if (line.rfind("[", 0) == 0) {
      if (std::sscanf(line.c_str(), "[%d,%d]", &job, &rank) != 2) continue;
      line = line.substr(line.find(':') + 1);
    }
    int n = 0;
    char key[512] = {0};
    if (std::sscanf(line.c_str(), "graph built %d time(s): %511[^\n]", &n, key) != 2) continue;
    ranks[rank][key] += n;
  }
  return ranks;
}

int total(const std::map<std::string, int>& builds) {
  int n = 0;
  for (auto& [key, k] : builds) n += k;
  return n;
}

void expect_each_built_once(const std::map<std::string, int>& builds, const std::string& what) {
  for (auto& [key, n] : builds) EXPECT_EQ(n, 1) << what << " built '" << key << "' " << n << " times";
}

using sat::test::mpirun;

}  // namespace

// info with tensor and pipeline parallelism and recomputation: the job's whole model, its
// unsplit model, both stages, and the model without recomputation (for the comparison), each
// built once.
TEST(PlanOnce, InfoBuildsEachGraphOnce) {
  const auto r = sat::test::run_command("SAT_REPORT_GRAPH_BUILDS=1 OMP_WAIT_POLICY=passive " SAT_BINARY
                                        " info --model gpt-mini --pp 2 --tp 2 --recompute full");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("stage 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recompute full:"), std::string::npos) << r.out;
  const auto procs = graph_builds(r.out);
  ASSERT_EQ(procs.size(), 1u) << r.out;
  const auto& builds = procs.begin()->second;
  expect_each_built_once(builds, "info");
  std::printf("[ plan once ] info --pp 2 --tp 2 --recompute full: %d graph(s) built\n", total(builds));
}

// A 2-rank pipeline: each rank builds the whole model (the cut, the names) and its stage
// once; rank 0 gathers the weights for --save-weights without building any graph again.
TEST(PlanOnce, PipelineTrainingBuildsEachGraphOncePerRank) {
  const std::string mpi = mpirun();
  if (mpi.empty()) GTEST_SKIP() << "no mpirun";
  const fs::path d = fs::temp_directory_path() / ("sat_plan_once_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const auto r = sat::test::run_command(
      "env -i PATH=/usr/bin:/bin HOME=/tmp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
      "OMP_WAIT_POLICY=passive SAT_COMM_TIMEOUT=60 SAT_REPORT_GRAPH_BUILDS=1 timeout -k 5 180 " + mpi +
      " --oversubscribe --bind-to none --tag-output -np 2 " SAT_BINARY " train --model gpt-mini --pp 2 --steps 2 --batch 2 "
      "--accum 2 --data synthetic --eval off --threads 1 --save-weights " + (d / "w.safetensors").string());
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(fs::exists(d / "w.safetensors"));
  const auto procs = graph_builds(r.out);
  ASSERT_EQ(procs.size(), 2u) << "expected the builds of 2 ranks:\n" << r.out;
  for (const auto& [rank, builds] : procs) {
    expect_each_built_once(builds, "rank " + std::to_string(rank) + " of train --pp 2");
    std::printf("[ plan once ] train --pp 2, rank %d: %d graph(s) built\n", rank, total(builds));
  }
  fs::remove_all(d);
}
