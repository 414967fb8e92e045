// The commands around training: `saturate hardware`, `saturate launch`, `saturate bench
// comm`. Each returns the exit status; user mistakes are sat::Error naming the flag.
#pragma once
#include <string>

#include "dist/bench_comm.h"

namespace sat::cli {

struct HardwareArgs {
  std::string gpu = "this";  // a kind, FILE.json or this (measured)
  bool json = false;
  int threads = 0;
};
// A kind, a cluster's file or this machine (measured by every rank of the job at once), as
// a table or in the file format; rank 0 prints.
int run_hardware(const HardwareArgs& a);

struct BenchCommArgs {
  dist::BenchCommOptions options;
  std::string backend = "mpi";  // mpi | nccl
};
int run_bench_comm(const BenchCommArgs& a);

// `saturate launch -n N -- ARGS...`, parsed by hand: everything after -- belongs to the
// launched command. Replaces this process with mpirun on success.
int run_launch(int argc, char** argv);

}  // namespace sat::cli
