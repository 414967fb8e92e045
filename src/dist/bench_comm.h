// All-reduce bandwidth sweep, in the manner of nccl-tests' all_reduce_perf: for each
// message size, warm-up then timed in-place all-reduces (sum, f32), the time of the
// slowest rank, algorithm and bus bandwidth, and a correctness check. The table is printed
// on rank 0 only; every rank returns the rows. A point-to-point sweep (ping-pong between
// ranks 0 and 1) beside it, and the latency/bandwidth fits of both that the layout
// planner's hardware description of `this` machine uses (plan/hardware.h).
#pragma once
#include <cstddef>
#include <functional>
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
  // Work the calling thread does while each size's timed all-reduces are in flight, called
  // until the last of them completes: a training step's backward, beside which data
  // parallelism reduces its gradients (on a CPU host the two share the cores).
  std::function<void()> busy;
};

struct BenchCommRow {
  size_t bytes = 0;
  size_t count = 0;       // f32 elements
  double time_us = 0;     // one all-reduce, slowest rank, average over the timed iterations
  double algbw_gbs = 0;   // bytes / time
  double busbw_gbs = 0;   // algbw * 2(n-1)/n: the traffic of each link in a ring all-reduce
  bool ok = true;         // the check passed (true when not checked)
};

// Collective: every rank of c must call it with the same options. With 2 ranks or more the
// table ends with the ring model's fit (fit_ring_all_reduce).
std::vector<BenchCommRow> bench_comm(Comm& c, const BenchCommOptions& o, std::ostream& os);

struct BenchP2PRow {
  size_t bytes = 0;
  double time_us = 0;  // one way: half the round trip, averaged over the timed iterations
  double bw_gbs = 0;   // bytes / time
  bool ok = true;      // the message arrived intact both ways (true when not checked)
};

// Ping-pong between ranks 0 and 1 for each message size of o (the other ranks only wait);
// the times are rank 0's, returned on every rank. The table, ending with the fit
// (fit_p2p), is printed on rank 0. Collective; needs 2 ranks or more.
std::vector<BenchP2PRow> bench_p2p(Comm& c, const BenchCommOptions& o, std::ostream& os);

// A link's latency alpha (s) and bandwidth beta (bytes/s).
struct AlphaBeta {
  double alpha = 0, beta = 0;
};

// The ring all-reduce model over n ranks, t = 2(n-1) alpha + 2(n-1)/n S / beta, fitted by
// least squares (relative errors) to the rows (at least two sizes, n >= 2). alpha is 0 when
// the fit's latency is not positive (then beta is fitted with none).
AlphaBeta fit_ring_all_reduce(const std::vector<BenchCommRow>& rows, int n);
// t = alpha + S / beta, fitted to the rows of bench_p2p in the same way.
AlphaBeta fit_p2p(const std::vector<BenchP2PRow>& rows);

}  // namespace sat::dist
