// What a device and its links can do, for the cost model (plan/cost.h): the built-in GPU
// kinds (one GPU of a typical node of its kind: docs/hardware-files.md), a JSON file describing the user's own cluster, and `this`,
// the machine saturate runs on, measured (GEMM rate over shapes, memory bandwidth, and the
// all-reduce and point-to-point latency and bandwidth of the job's MPI ranks).
//
// Units are SI throughout: FLOP/s, bytes, bytes/s, seconds.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sat {

namespace dist { class Comm; }

// One kind of link a collective can cross: alpha the latency of one message (s), bandwidth
// the bytes per second one device can push through it in one direction.
struct Link {
  double alpha = 0;
  double bandwidth = 0;
};

// The fitted efficiency of the device's kernels (see plan/cost.h for how each is used):
// a kernel of f FLOPs runs at peak * gemm_max * f / (f + gemm_half_flops), a memory-bound
// one at memory_bandwidth * memory_eff, and every kernel costs kernel_overhead seconds more;
// a collective reaches link.bandwidth * comm_eff.
struct Efficiency {
  double gemm_max = 0.8;
  double gemm_half_flops = 1e9;
  double memory_eff = 0.8;
  double kernel_overhead = 5e-6;
  double comm_eff = 0.8;
  // The GEMM's shape: a product of m x k by k x n runs at d / (d + gemm_half_dim) of the rate
  // for each of its dimensions d (tiles that a dimension does not fill; attention's products
  // over a head's 64-128 channels fill least). 0: by its FLOPs only.
  double gemm_half_dim = 0;
};

// The cache in which a stage's parameters and their gradients stay from one micro-batch to
// the next of a step when they fit (bytes 0: not modelled). `this` measures its share of the
// host's last-level cache per rank and a STREAM triad's rate inside a quarter of it; the
// built-in GPUs leave it out (their L2, 40-50 MiB, holds a sliver of any stage planned there).
struct Cache {
  double bytes = 0;
  double bandwidth = 0;
};

struct Hardware {
  std::string name;    // "a100-80gb", "this", or the file's "name"
  std::string source;  // "built-in", the JSON file's path, or "measured here"
  bool gpu = true;     // GPUs: fp32 master weights and optimizer state beside bf16/fp16 copies
  // Peak dense FLOP/s per precision (0 where the device has none), without structured
  // sparsity. peak_fp8 is the fp8 tensor rate (E4M3/E5M2 with fp32 accumulation): shown and
  // written, not yet used by the cost model, which plans fp32, bf16 and fp16.
  double peak_fp32 = 0, peak_tf32 = 0, peak_bf16 = 0, peak_fp16 = 0, peak_fp8 = 0;
  double memory_bytes = 0;      // per device
  double memory_bandwidth = 0;  // bytes/s per device
  int gpus_per_node = 8;        // devices that share the intra-node link
  Link intra;                   // NVLink/NVSwitch, Infinity Fabric or PCIe per GPU (this: MPI ranks on one host)
  Link inter;                   // the network per GPU (the node's NICs shared by its GPUs)
  Link p2p_intra, p2p_inter;    // point-to-point (pipeline sends); equal to intra/inter unless measured
  // The intra-node all-reduce while the ranks compute, as gradient buckets are reduced beside
  // backward: on a CPU host the reduction shares the cores with it (measured for `this`;
  // equal to intra otherwise).
  Link intra_busy;
  Cache cache;
  Efficiency eff;
  // The peak for a precision: fp32, bf16, fp16 (tf32 is used for fp32 matmuls on GPUs that
  // have it only when the description says so: tf32_matmul).
  bool tf32_matmul = false;
  double peak(DType precision) const;
};

// The names `--gpu` accepts besides a file path and `this`.
const std::vector<std::string>& hardware_names();
// A built-in kind, a path to a JSON file (see the README, "Hardware descriptions"), or "this"
// (measured: pass the job's world communicator, which every rank must call it with; one
// process measures no links and gets the intra-node link of shared memory). Errors:
// sat::Error naming --gpu and the kinds, or the file and the key that is missing or wrong.
Hardware hardware(const std::string& kind_or_file, dist::Comm* world = nullptr);
// The description as JSON in the file format (round-trips through hardware()).
std::string hardware_json(const Hardware& h);
// The description as a table for people (saturate hardware).
std::string hardware_table(const Hardware& h);

// `this`, measured (what hardware("this", world) returns): GEMM rate over shapes with the
// engine's BLAS and threads, memory bandwidth (a STREAM triad), and with a world of 2 ranks
// or more the all-reduce and point-to-point latency and bandwidth (dist/bench_comm.h).
// Every rank of world must call it; all of them measure at once (as they would train) and
// return rank 0's figures. 1 to 3 seconds on a 2-core machine; prints nothing.
Hardware measure_this(dist::Comm* world);
// The engine's best GEMM rate here (FLOP/s; the largest square shape of measure_this, best
// of its runs), for the share of it a layer reaches (--profile). About 0.3 s.
double gemm_peak_flops();

// The GEMM curve of `this`: samples of (FLOPs, best seconds) fitted to the cost model's
// t = (f + gemm_half_flops) / (peak * gemm_max) + kernel_overhead, with peak the best rate
// measured. gemm_max is at most 1 (a fit above 1 raises the peak instead: the same curve).
struct GemmSample {
  double flops = 0, seconds = 0;
};
struct GemmFit {
  double peak = 0, gemm_max = 1, half_flops = 0;
};
GemmFit fit_gemm(const std::vector<GemmSample>& samples, double kernel_overhead);

}  // namespace sat
