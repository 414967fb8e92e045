// The job's communicator for the tests that run both alone and under mpirun (CMake runs
// them as NAME_npN): world() is every rank of the job, or this process alone.
// A test that runs only under mpirun (it skips in one process) belongs to a suite whose name
// ends in "Ranks" (PipelineRanks, ZeroRanks, ...): CMake registers no single-process entry
// for it, and the NAME_npN entries run it.
#pragma once
#include <memory>

#include "dist/comm.h"

namespace sat::test {

inline dist::Comm& world() {
  static std::unique_ptr<dist::Comm> c = dist::make_world_comm();
  return *c;
}

inline bool distributed() { return dist::detect_process().distributed(); }

// Under mpirun with n ranks (a test for another size skips).
inline bool world_is(int n) { return distributed() && world().size() == n; }

}  // namespace sat::test
