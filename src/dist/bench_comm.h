// All-reduce bandwidth sweep, in the manner of nccl-tests' all_reduce_perf: for each
// message size, warm-up then timed in-place all-reduces (sum, f32), the time of the
// slowest rank, algorithm and bus bandwidth, and a correctness check. The table is printed
// on rank 0 only; every rank returns the rows.
#pragma once
#include <cstddef>
#include <ostream>
#include <vector>

#include "dist/comm.h"

namespace sat::dist {

struct BenchCommOptions {
  size_t min_bytes = size_t(4) << 10;   // 4 KiB
  size_t max_bytes = size_t(64) << 20;  // 64 MiB
  int step = 2;                         // size factor between rows (2 or 4)
  int warmup = 5;                       // untimed all-reduces per size
  int iters = 20;                       // timed all-reduces per size
  bool check = true;                    // verify the sum (one extra all-reduce per size)
};

struct BenchCommRow {
  size_t bytes = 0;
  size_t count = 0;       // f32 elements
  double time_us = 0;     // one all-reduce, slowest rank, average over the timed iterations
  double algbw_gbs = 0;   // bytes / time
  double busbw_gbs = 0;   // algbw * 2(n-1)/n: the traffic of each link in a ring all-reduce
  bool ok = true;         // the check passed (true when not checked)
};

// Collective: every rank of c must call it with the same options.
std::vector<BenchCommRow> bench_comm(Comm& c, const BenchCommOptions& o, std::ostream& os);

}  // namespace sat::dist
