// `--gpu this`: the machine saturate runs on, measured with the engine's own kernels and
// communicators, so that the cost model can be checked against what it predicts here.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <sstream>
#include <string>

#include "backend/cpu/blas.h"
#include "backend/device.h"
#include "core/fit.h"
#include "core/timer.h"
#include "dist/bench_comm.h"
#include "dist/comm.h"
#include "plan/hardware.h"

namespace sat {

namespace {

// GEMM shapes (M, N, K): square ones as in wide layers, and skinny ones: few rows (a small
// micro-batch), a short inner dimension (attention's heads), a tall narrow product.
struct GemmShape {
  int64_t m, n, k;
};
constexpr GemmShape kShapes[] = {{256, 256, 256},   {512, 512, 512},   {1024, 1024, 1024}, {2048, 2048, 2048},
                                 {64, 1024, 1024},  {1024, 1024, 64},  {4096, 256, 512}};
constexpr size_t kGemmElems = size_t(2048) * 2048;  // the largest operand above
constexpr double kTimedFlops = 2e9;                  // per shape (2 runs at least): ~1.5 s in all on 2 cores

// The GEMM a rank runs while the all-reduces are timed beside compute (4 MFLOP: tens of
// microseconds, the granularity of that timing).
constexpr int64_t kBusyGemm = 128;

// A message between two processes of one host through shared memory (one process: no link
// to measure).
constexpr double kSharedMemoryAlpha = 1e-6;

void barrier(dist::Comm* w) {
  if (w) w->barrier();
}

// The best of the runs: the machine's rate without the noise of other work.
GemmSample time_gemm(const GemmShape& s, const float* a, const float* b, float* c) {
  const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
  const int runs = std::clamp(int(kTimedFlops / flops), 2, 50);
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < runs; ++r) {
    const double t0 = now_seconds();
    cpu::gemm(false, false, s.m, s.n, s.k, 1.0f, a, s.k, b, s.n, 0.0f, c, s.n);
    best = std::min(best, now_seconds() - t0);
  }
  return {flops, std::max(best, 1e-9)};
}

std::vector<GemmSample> measure_gemm(dist::Comm* w) {
  std::vector<float> a(kGemmElems), b(kGemmElems), c(kGemmElems);
  for (size_t i = 0; i < kGemmElems; ++i) a[i] = b[i] = 1.0f / float(1 + i % 7);
  time_gemm({512, 512, 512}, a.data(), b.data(), c.data());  // threads up, pages touched
  std::vector<GemmSample> out;
  for (const auto& s : kShapes) {
    barrier(w);  // every rank on the same shape: they share the cores as in training
    out.push_back(time_gemm(s, a.data(), b.data(), c.data()));
  }
  return out;
}

// The cost of the engine's smallest parallel kernel: an OpenMP loop over a few elements
// (thread wake-up and join), the median of many.
double measure_kernel_overhead() {
  std::vector<float> x(1024, 1.0f);
  std::vector<double> t(201);
  const int n = int(x.size());
  for (auto& ti : t) {
    const double t0 = now_seconds();
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) x[size_t(i)] = x[size_t(i)] * 0.5f + 1.0f;
    ti = now_seconds() - t0;
  }
  std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
  return t[t.size() / 2];
}

// STREAM's triad a = b + s c over three arrays of n floats, `passes` at a time, on the
// engine's threads; bytes counted as STREAM does (two reads and a write per element), the
// best of 6 rounds. Every rank runs it at once, so each gets its share of the host.
double triad_bandwidth(size_t n, int passes) {
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  const int64_t len = int64_t(n);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < len; ++i) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;  // pages near their threads
  double best = std::numeric_limits<double>::infinity();
  for (int r = 0; r < 6; ++r) {
    const double t0 = now_seconds();
#pragma omp parallel
    for (int p = 0; p < passes; ++p) {  // one region: every thread keeps its static share
#pragma omp for simd schedule(static) nowait
      for (int64_t i = 0; i < len; ++i) a[i] = b[i] + 3.0f * c[i];
    }
    best = std::min(best, now_seconds() - t0);
  }
  return 3.0 * 4.0 * double(n) * passes / std::max(best, 1e-9);
}

// The triad over arrays far larger than the caches: the memory's bandwidth.
double measure_memory_bandwidth() {
  size_t n = size_t(16) << 20;  // 3 x 64 MiB
  const size_t avail = host_available_memory();
  if (avail) n = std::clamp(avail / 64, size_t(1) << 20, n);
  return triad_bandwidth(n, 1);
}

// The last-level cache of the host's first CPU (sysfs: the highest level of a data or
// unified cache), 0 where the system does not say.
double last_level_cache_bytes() {
  double best = 0;
  int top = 0;
  for (int i = 0; i < 16; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), type(dir + "type"), size(dir + "size");
    int lv = 0;
    std::string ty, sz;
    if (!(level >> lv) || !(type >> ty) || !(size >> sz) || ty == "Instruction") continue;
    double bytes = std::atof(sz.c_str());
    if (sz.ends_with('K')) bytes *= 1024;
    if (sz.ends_with('M')) bytes *= 1048576;
    if (lv > top && bytes > 0) top = lv, best = bytes;
  }
  if (best == 0) best = double(std::max(0L, sysconf(_SC_LEVEL3_CACHE_SIZE)));
  return best;
}

// This rank's share of the last-level cache and the triad's rate in a quarter of it (the rest
// is what a stage's activations and the other ranks' lines leave), every rank at once.
Cache measure_cache(int ranks_on_host) {
  Cache c;
  c.bytes = last_level_cache_bytes() / ranks_on_host;
  if (c.bytes < 1048576) return {};  // unknown, or too small to hold a stage worth modelling
  const size_t n = size_t(c.bytes / 4 / 12);
  c.bandwidth = triad_bandwidth(n, int(std::clamp(double(256 << 20) / (12.0 * double(n)), 1.0, 4096.0)));
  return c;
}

Link link_of(const dist::AlphaBeta& ab) { return {ab.alpha, ab.beta}; }

// The all-reduce (ring model) and point-to-point links among the ranks of w (>= 2).
void measure_links(dist::Comm& w, Hardware& h) {
  dist::BenchCommOptions o;
  o.min_bytes = 64;
  o.max_bytes = size_t(16) << 20;  // the sizes of gradient buckets (above 16 MiB MPI's rate here falls tenfold)
  o.step = 4;
  o.warmup = 2;
  o.iters = 10;
  o.check = false;
  std::ostringstream quiet;
  h.intra = link_of(dist::fit_ring_all_reduce(dist::bench_comm(w, o, quiet), w.size()));
  h.p2p_intra = link_of(dist::fit_p2p(dist::bench_p2p(w, o, quiet)));
  // Again while every rank's threads run GEMMs, as backward runs beside the gradient
  // buckets' all-reduces: on a host whose cores the ranks fill, the communication thread
  // gets a share of a core and a peer that is not running delays the whole ring.
  std::vector<float> a(kBusyGemm * kBusyGemm, 0.5f), b(a.size(), 0.25f), c(a.size());
  o.min_bytes = size_t(4) << 10;
  o.busy = [&] {
    cpu::gemm(false, false, kBusyGemm, kBusyGemm, kBusyGemm, 1.0f, a.data(), kBusyGemm, b.data(), kBusyGemm, 0.0f,
              c.data(), kBusyGemm);
  };
  h.intra_busy = link_of(dist::fit_ring_all_reduce(dist::bench_comm(w, o, quiet), w.size()));
}

// Rank 0's figures to every rank.
void share_rank0(dist::Comm& w, Hardware& h) {
  double v[] = {h.peak_fp32,       h.memory_bytes,       h.memory_bandwidth,   double(h.gpus_per_node),
                h.intra.alpha,     h.intra.bandwidth,    h.p2p_intra.alpha,    h.p2p_intra.bandwidth,
                h.eff.gemm_max,    h.eff.gemm_half_flops, h.eff.kernel_overhead, h.intra_busy.alpha,
                h.intra_busy.bandwidth, h.cache.bytes,         h.cache.bandwidth};
  w.broadcast_sync(v, std::size(v), DType::f64, 0);
  h.peak_fp32 = h.peak_bf16 = v[0], h.memory_bytes = v[1], h.memory_bandwidth = v[2], h.gpus_per_node = int(v[3]);
  h.intra = {v[4], v[5]}, h.p2p_intra = {v[6], v[7]}, h.intra_busy = {v[11], v[12]};
  h.cache = {v[13], v[14]};
  h.eff.gemm_max = v[8], h.eff.gemm_half_flops = v[9], h.eff.kernel_overhead = v[10];
}

// MemAvailable, or all of the memory where the kernel does not say.
double available_memory() {
  if (const size_t m = host_available_memory()) return double(m);
  return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
}

// The ranks of the job on this host (a world of one: 1).
int ranks_on_host(const dist::Comm* w) {
  if (!w || w->size() < 2) return 1;
  return std::clamp(dist::detect_process().local_world, 1, w->size());
}

}  // namespace

double gemm_peak_flops() {
  const GemmShape s{1024, 1024, 1024};
  std::vector<float> a(size_t(s.m * s.k), 0.5f), b(size_t(s.k * s.n), 0.25f), c(size_t(s.m * s.n));
  time_gemm(s, a.data(), b.data(), c.data());  // threads up, pages touched
  const GemmSample g = time_gemm(s, a.data(), b.data(), c.data());
  return g.flops / g.seconds;
}

GemmFit fit_gemm(const std::vector<GemmSample>& samples, double kernel_overhead) {
  SAT_CHECK(samples.size() >= 2, "fit_gemm: need at least two GEMM shapes, got ", samples.size());
  std::vector<double> f, t;
  GemmFit g;
  for (const auto& s : samples) {
    f.push_back(s.flops), t.push_back(s.seconds);
    g.peak = std::max(g.peak, s.flops / s.seconds);
  }
  // t = f / (peak gemm_max) + (gemm_half_flops / (peak gemm_max) + kernel_overhead)
  const LineFit line = fit_line_relative(f, t);
  if (line.slope <= 0) return g;  // no growth with size: the best rate everywhere
  g.gemm_max = 1.0 / (line.slope * g.peak);
  g.half_flops = std::max(0.0, (line.intercept - kernel_overhead) / line.slope);
  if (g.gemm_max > 1) {
    g.peak *= g.gemm_max;
    g.gemm_max = 1;
  }
  return g;
}

Hardware measure_this(dist::Comm* world) {
  SAT_CHECK(!world || world->device() == Device::cpu, "--gpu this: measure over the job's host communicator, not ",
            world->backend_name());
  const bool many = world && world->size() > 1;
  Hardware h;
  h.name = "this";
  h.source = "measured here";
  h.gpu = false;
  h.gpus_per_node = ranks_on_host(world);
  barrier(world);
  h.eff.kernel_overhead = measure_kernel_overhead();
  const GemmFit g = fit_gemm(measure_gemm(world), h.eff.kernel_overhead);
  h.peak_fp32 = g.peak;
  h.peak_bf16 = g.peak;  // the CPU engine computes bf16 products in float32 (nn/bf16_cpu.h)
  h.eff.gemm_max = g.gemm_max;
  h.eff.gemm_half_flops = g.half_flops;
  barrier(world);
  h.memory_bandwidth = measure_memory_bandwidth();
  barrier(world);
  h.cache = measure_cache(h.gpus_per_node);
  h.memory_bytes = available_memory() / h.gpus_per_node;
  // The figures are what the kernels and links reach: nothing more to discount.
  h.eff.memory_eff = 1;
  h.eff.comm_eff = 1;
  if (many) {
    measure_links(*world, h);
    share_rank0(*world, h);
  } else {
    h.intra = {kSharedMemoryAlpha, h.memory_bandwidth};
    h.p2p_intra = h.intra_busy = h.intra;
  }
  // The links measured are the job's: on one host nothing crosses a network, and across
  // hosts the ring is as slow as its slowest link. Either way inter-node = intra-node.
  h.inter = h.intra;
  h.p2p_inter = h.p2p_intra;
  return h;
}

}  // namespace sat
