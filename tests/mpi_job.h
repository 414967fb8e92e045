// Real `saturate` jobs under mpirun, started from a test that is not itself under mpirun:
// for what only a whole job shows (bad input on every rank, a rank killed or stopped).
// Needs SAT_MPIEXEC and SAT_BINARY (CMake defines them for the tests run under mpirun).
#pragma once
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace sat::test {

// A job: `np` ranks of `saturate ARGS`, in a clean environment carrying a marker (so that
// its processes can be found) and a timeout (so that a hang fails the test, not the suite).
struct Job {
  pid_t shell = -1;
  std::string marker, log;
  std::chrono::steady_clock::time_point started;
};

inline Job start_job(int np, const std::string& args, int timeout_s = 90, const std::string& env = "") {
  Job j;
  static int n = 0;
  const std::string id = std::to_string(getpid()) + "_" + std::to_string(++n);
  j.marker = "SAT_TEST_JOB=" + id;
  j.log = std::filesystem::temp_directory_path() / ("sat_job_" + id + ".log");
  const std::string cmd = "env -i PATH=/usr/bin:/bin HOME=/tmp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                          "OMP_WAIT_POLICY=passive " + env + " " + j.marker + " timeout -k 5 " +
                          std::to_string(timeout_s) + " " SAT_MPIEXEC " -np " + std::to_string(np) + " " SAT_BINARY " " +
                          args + " > " + j.log + " 2>&1";
  j.started = std::chrono::steady_clock::now();
  j.shell = fork();
  if (j.shell == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return j;
}

struct JobEnd {
  int status = -1;  // exit status (128 + signal when killed)
  double seconds = 0;
  std::string out;  // every rank's output
};

inline JobEnd wait_job(const Job& j) {
  JobEnd e;
  int st = 0;
  if (waitpid(j.shell, &st, 0) != j.shell) return e;
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - j.started).count();
  e.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  std::ifstream f(j.log);
  e.out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  std::filesystem::remove(j.log);
  return e;
}

inline JobEnd run_job(int np, const std::string& args, int timeout_s = 90) { return wait_job(start_job(np, args, timeout_s)); }

// The pid of the saturate process of rank `rank` of job j (-1 while it does not exist).
inline pid_t find_rank(const Job& j, int rank) {
  const std::string want_rank = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (env.find(j.marker) == std::string::npos) continue;
    bool rank_ok = false;
    for (size_t pos = 0; pos < env.size();) {
      size_t end = env.find('\0', pos);
      if (end == std::string::npos) end = env.size();
      if (env.compare(pos, end - pos, want_rank) == 0) rank_ok = true;
      pos = end + 1;
    }
    std::ifstream c(e.path() / "comm");
    std::string comm;
    std::getline(c, comm);
    if (rank_ok && comm == "saturate") return pid_t(std::stol(name));
  }
  return -1;
}

// Waits (up to `seconds`) for rank `rank` of job j to exist.
inline pid_t wait_for_rank(const Job& j, int rank, double seconds = 30) {
  const auto t0 = std::chrono::steady_clock::now();
  pid_t p = -1;
  while (p < 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
    usleep(100000);
    p = find_rank(j, rank);
  }
  return p;
}

// Bad input given to every rank of an np-rank job: each rank prints the error line naming
// `flag` itself, and the job ends with status 2 at once (no hang, no crash).
inline void expect_refused_by_every_rank(int np, const std::string& args, const std::string& flag, const JobEnd& e) {
  EXPECT_EQ(e.status, 2) << args << "\n" << e.out;
  EXPECT_LT(e.seconds, 30) << args;
  for (int r = 0; r < np; ++r)
    EXPECT_NE(e.out.find("saturate: error on rank " + std::to_string(r) + ": " + flag), std::string::npos)
        << "rank " << r << " did not name " << flag << " for: " << args << "\n" << e.out;
  EXPECT_EQ(e.out.find("Segmentation"), std::string::npos) << e.out;
  EXPECT_EQ(e.out.find("terminate called"), std::string::npos) << e.out;
}

inline const char* kRefusedJob = "train --data synthetic --steps 2 --threads 1 --eval off ";

inline void expect_every_rank_refuses(int np, const std::string& args, const std::string& flag) {
  expect_refused_by_every_rank(np, args, flag, run_job(np, kRefusedJob + args, 60));
}

// Several such jobs, up to four at a time: a refused job spends most of its two seconds in
// mpirun's shutdown, not on the CPU.
struct Refusal {
  int np;
  std::string args, flag;
};

inline void expect_every_rank_refuses(const std::vector<Refusal>& cases) {
  constexpr size_t kAtOnce = 4;
  for (size_t first = 0; first < cases.size(); first += kAtOnce) {
    std::vector<Job> jobs;
    const size_t end = std::min(cases.size(), first + kAtOnce);
    for (size_t k = first; k < end; ++k) jobs.push_back(start_job(cases[k].np, kRefusedJob + cases[k].args, 60));
    for (size_t k = first; k < end; ++k)
      expect_refused_by_every_rank(cases[k].np, cases[k].args, cases[k].flag, wait_job(jobs[k - first]));
  }
}

}  // namespace sat::test
