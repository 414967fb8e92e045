// The job's communicator for the tests that run both alone and under mpirun (CMake runs
// them as NAME_npN): world() is every rank of the job, or this process alone.
// A test that runs only under mpirun (it skips in one process) belongs to a suite whose name
// ends in "Ranks" (PipelineRanks, ZeroRanks, ...): CMake registers no single-process entry
// for it, and the NAME_npN entries run it.
#pragma once
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "dist/comm.h"

namespace sat::test {

inline dist::Comm& world() {
  static std::unique_ptr<dist::Comm> c = dist::make_world_comm();
  return *c;
}

inline bool distributed() { return dist::detect_process().distributed(); }

// Under mpirun with n ranks (a test for another size skips).
inline bool world_is(int n) { return distributed() && world().size() == n; }

// The one-process run a layout is compared with, run once per key: several layouts (the
// schedules of a pipeline, ZeRO-2 and ZeRO-3, tensor parallelism with and without sequence
// parallelism) share the same one-process run, and rank 0 runs it while the others wait.
// KEY must name everything the run depends on.
template <class Out, class Run>
const Out& one_process_run(const std::string& key, Run run) {
  static std::map<std::string, Out> runs;
  auto it = runs.find(key);
  if (it == runs.end()) it = runs.emplace(key, run()).first;
  return it->second;
}

// A float in a key, every bit of it.
inline std::string key_of(double x) {
  char b[40];
  std::snprintf(b, sizeof b, "%a", x);
  return b;
}

}  // namespace sat::test
