#include "dist/bench_comm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/fit.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#endif

namespace sat::dist {

namespace {

// The message buffer: host memory, or device memory for a communicator on the GPU (filled
// and checked through a host copy).
class BenchBuffer {
 public:
  BenchBuffer(Device dev, size_t bytes) : dev_(dev), host_(bytes) {
    if (dev_ == Device::cuda) {
#if SAT_HAVE_CUDA
      if (bytes) SAT_CUDA_CHECK(cudaMalloc(&dev_ptr_, bytes));
#else
      fail("bench comm: the communicator works on GPU memory but this saturate has no CUDA backend");
#endif
    }
  }
  ~BenchBuffer() {
#if SAT_HAVE_CUDA
    if (dev_ptr_) cudaFree(dev_ptr_);
#endif
  }
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;

  void* data() { return dev_ == Device::cuda ? dev_ptr_ : static_cast<void*>(host_.data()); }
  char* host() { return host_.data(); }
  // host -> data (a no-op on the CPU)
  void upload(size_t bytes) {
#if SAT_HAVE_CUDA
    if (dev_ == Device::cuda && bytes) {
      SAT_CUDA_CHECK(cudaMemcpy(dev_ptr_, host_.data(), bytes, cudaMemcpyHostToDevice));
      SAT_CUDA_CHECK(cudaDeviceSynchronize());  // from pageable memory the DMA may still be under way
    }
#else
    (void)bytes;
#endif
  }
  void download(size_t bytes) {
#if SAT_HAVE_CUDA
    if (dev_ == Device::cuda && bytes) SAT_CUDA_CHECK(cudaMemcpy(host_.data(), dev_ptr_, bytes, cudaMemcpyDeviceToHost));
#else
    (void)bytes;
#endif
  }

 private:
  Device dev_;
  std::vector<char> host_;
  void* dev_ptr_ = nullptr;
};

// One double reduced over the ranks (through the communicator's own memory kind).
double reduce_scalar(Comm& c, BenchBuffer& scratch, double v, ReduceOp op) {
  std::memcpy(scratch.host(), &v, sizeof v);
  scratch.upload(sizeof v);
  c.all_reduce_sync(scratch.data(), 1, DType::f64, op);
  scratch.download(sizeof v);
  std::memcpy(&v, scratch.host(), sizeof v);
  return v;
}

// Rank-dependent small integers: every partial sum is exact in float32.
inline float bench_value(int rank, size_t i) { return static_cast<float>(int((i * 7 + size_t(rank) * 31) % 64) - 16); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void check_options(const BenchCommOptions& o) {
  SAT_CHECK(o.min_bytes >= 4 && o.min_bytes <= o.max_bytes && o.min_bytes % 4 == 0 && o.max_bytes % 4 == 0,
            "bench comm: need 4 <= min bytes (", o.min_bytes, ") <= max bytes (", o.max_bytes,
            "), both multiples of 4 (float32 elements)");
  SAT_CHECK(o.step >= 2, "bench comm: the size step must be at least 2 (got ", o.step, ")");
  SAT_CHECK(o.iters >= 1 && o.warmup >= 0, "bench comm: need at least one timed iteration");
}

// min_bytes, min_bytes * step, ... up to max_bytes (multiples of 4: f32 elements).
std::vector<size_t> sweep_sizes(const BenchCommOptions& o) {
  std::vector<size_t> sizes;
  for (size_t b = o.min_bytes; b <= o.max_bytes; b *= size_t(o.step)) {
    sizes.push_back(b / 4 * 4);
    if (b > o.max_bytes / size_t(o.step)) break;  // the next step would overflow or pass max
  }
  return sizes;
}

// t = steps * alpha + bytes_factor * S / beta over points (S, t in seconds).
AlphaBeta fit_alpha_beta(const std::vector<double>& bytes, const std::vector<double>& sec, double steps,
                         double bytes_factor) {
  SAT_CHECK(bytes.size() >= 2, "bench comm: fitting a latency and a bandwidth needs at least two message sizes");
  const LineFit f = fit_line_relative(bytes, sec);
  AlphaBeta ab;
  double slope = f.slope;
  if (f.intercept > 0) {
    ab.alpha = f.intercept / steps;
  } else {
    slope = fit_slope_relative(bytes, sec);
  }
  if (slope > 0) {
    ab.beta = bytes_factor / slope;
  } else {
    // Noise hid the slope (times that do not grow with size, as on an oversubscribed
    // host): since t >= bytes_factor * S / beta, the best rate seen is a lower bound.
    for (size_t i = 0; i < bytes.size(); ++i)
      if (sec[i] > 0) ab.beta = std::max(ab.beta, bytes_factor * bytes[i] / sec[i]);
  }
  return ab;
}

// One round trip of count floats: rank 0 sends and receives the answer, rank 1 receives
// and sends it back unchanged, the other ranks do nothing.
void round_trip(Comm& c, BenchBuffer& buf, size_t count) {
  if (c.rank() == 0) {
    c.send(buf.data(), count, DType::f32, 1)->wait();
    c.recv(buf.data(), count, DType::f32, 1)->wait();
  } else if (c.rank() == 1) {
    c.recv(buf.data(), count, DType::f32, 0)->wait();
    c.send(buf.data(), count, DType::f32, 0)->wait();
  }
}

// Rank 0's values go to rank 1 and back: both check what they hold afterwards.
bool check_round_trip(Comm& c, BenchBuffer& buf, BenchBuffer& scratch, size_t count) {
  float* h = reinterpret_cast<float*>(buf.host());
  for (size_t i = 0; i < count; ++i) h[i] = c.rank() == 0 ? bench_value(0, i) : 0.0f;
  buf.upload(count * 4);
  round_trip(c, buf, count);
  buf.download(count * 4);
  size_t bad = 0;
  if (c.rank() <= 1)
    for (size_t i = 0; i < count; ++i) bad += h[i] != bench_value(0, i);
  return reduce_scalar(c, scratch, bad ? 1.0 : 0.0, ReduceOp::max) == 0.0;
}

void print_fit(std::ostream& os, const char* model, const AlphaBeta& ab) {
  os << "# fit " << model << ": alpha " << fmt("%.2f", ab.alpha * 1e6) << " us, beta " << fmt("%.3f", ab.beta / 1e9)
     << " GB/s\n";
  os.flush();
}

}  // namespace

AlphaBeta fit_ring_all_reduce(const std::vector<BenchCommRow>& rows, int n) {
  SAT_CHECK(n >= 2, "bench comm: the ring model needs 2 ranks or more (got ", n, ")");
  std::vector<double> bytes, sec;
  for (const auto& r : rows) bytes.push_back(double(r.bytes)), sec.push_back(r.time_us * 1e-6);
  return fit_alpha_beta(bytes, sec, 2.0 * (n - 1), 2.0 * (n - 1) / n);
}

AlphaBeta fit_p2p(const std::vector<BenchP2PRow>& rows) {
  std::vector<double> bytes, sec;
  for (const auto& r : rows) bytes.push_back(double(r.bytes)), sec.push_back(r.time_us * 1e-6);
  return fit_alpha_beta(bytes, sec, 1.0, 1.0);
}

std::vector<BenchCommRow> bench_comm(Comm& c, const BenchCommOptions& o, std::ostream& os) {
  check_options(o);
  const int n = c.size(), rank = c.rank();
  const bool root = rank == 0;
  const std::vector<size_t> sizes = sweep_sizes(o);

  BenchBuffer buf(c.device(), sizes.back());
  BenchBuffer scratch(c.device(), sizeof(double));
  if (root) {
    os << "# bench comm: all_reduce sum f32 in place, backend " << c.backend_name() << ", " << n << " rank"
       << (n == 1 ? "" : "s") << ", " << o.warmup << " warm-up + " << o.iters << " timed iterations per size\n"
       << "#\n"
       << "#        size        count    time(us)  algbw(GB/s)  busbw(GB/s)  check\n";
    os.flush();
  }

  std::vector<BenchCommRow> rows;
  double busbw_total = 0;
  for (size_t bytes : sizes) {
    BenchCommRow r;
    r.bytes = bytes;
    r.count = bytes / 4;
    float* h = reinterpret_cast<float*>(buf.host());
    if (o.check) {
      for (size_t i = 0; i < r.count; ++i) h[i] = bench_value(rank, i);
      buf.upload(bytes);
      c.all_reduce_sync(buf.data(), r.count, DType::f32, ReduceOp::sum);
      buf.download(bytes);
      size_t bad = 0;
      for (size_t i = 0; i < r.count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += bench_value(q, i);
        bad += h[i] != want;
      }
      r.ok = reduce_scalar(c, scratch, bad ? 1.0 : 0.0, ReduceOp::max) == 0.0;
    }
    // Timed on zeros: repeated in-place sums of the check values would grow without bound.
    std::memset(h, 0, bytes);
    buf.upload(bytes);
    for (int i = 0; i < o.warmup; ++i) c.all_reduce(buf.data(), r.count, DType::f32, ReduceOp::sum)->wait();
    c.barrier();
    // Back to back, as nccl-tests: ops of one communicator complete in order, so the last
    // one's completion is everyone's.
    std::vector<WorkPtr> works;
    works.reserve(size_t(o.iters));
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) works.push_back(c.all_reduce(buf.data(), r.count, DType::f32, ReduceOp::sum));
    if (o.busy)
      while (!works.back()->done()) o.busy();
    for (auto& w : works) w->wait();
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
    sec = reduce_scalar(c, scratch, sec, ReduceOp::max);
    r.time_us = sec * 1e6;
    r.algbw_gbs = sec > 0 ? double(bytes) / sec / 1e9 : 0;
    r.busbw_gbs = r.algbw_gbs * 2.0 * (n - 1) / n;
    busbw_total += r.busbw_gbs;
    rows.push_back(r);
    if (root) {
      char line[160];
      std::snprintf(line, sizeof line, "%13zu %12zu %11s %12s %12s  %5s\n", r.bytes, r.count,
                    fmt("%.2f", r.time_us).c_str(), fmt("%.3f", r.algbw_gbs).c_str(), fmt("%.3f", r.busbw_gbs).c_str(),
                    !o.check ? "-" : r.ok ? "ok" : "WRONG");
      os << line;
      os.flush();
    }
  }
  if (root) {
    bool all_ok = std::all_of(rows.begin(), rows.end(), [](const BenchCommRow& r) { return r.ok; });
    os << "# average bus bandwidth: " << fmt("%.3f", busbw_total / double(rows.size())) << " GB/s"
       << (o.check ? (all_ok ? ", all sums correct" : ", SOME SUMS WRONG") : "") << "\n";
    if (n >= 2 && rows.size() >= 2) print_fit(os, "t = 2(n-1) alpha + 2(n-1)/n S/beta", fit_ring_all_reduce(rows, n));
    os.flush();
  }
  return rows;
}

std::vector<BenchP2PRow> bench_p2p(Comm& c, const BenchCommOptions& o, std::ostream& os) {
  check_options(o);
  SAT_CHECK(c.size() >= 2, "bench comm: point-to-point needs 2 ranks or more (got ", c.size(), ")");
  const bool root = c.rank() == 0;
  const std::vector<size_t> sizes = sweep_sizes(o);
  BenchBuffer buf(c.device(), sizes.back());
  BenchBuffer scratch(c.device(), sizeof(double));
  if (root) {
    os << "# bench comm: point-to-point ping-pong between ranks 0 and 1, f32, backend " << c.backend_name() << ", "
       << o.warmup << " warm-up + " << o.iters << " timed round trips per size; time = half a round trip\n"
       << "#\n"
       << "#        size    time(us)     bw(GB/s)  check\n";
    os.flush();
  }
  std::vector<BenchP2PRow> rows;
  for (size_t bytes : sizes) {
    BenchP2PRow r;
    r.bytes = bytes;
    const size_t count = bytes / 4;
    if (o.check) r.ok = check_round_trip(c, buf, scratch, count);
    for (int i = 0; i < o.warmup; ++i) round_trip(c, buf, count);
    c.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i) round_trip(c, buf, count);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / (2.0 * o.iters);
    sec = reduce_scalar(c, scratch, root ? sec : 0.0, ReduceOp::max);  // rank 0's time on every rank
    r.time_us = sec * 1e6;
    r.bw_gbs = sec > 0 ? double(bytes) / sec / 1e9 : 0;
    rows.push_back(r);
    if (root) {
      char line[128];
      std::snprintf(line, sizeof line, "%13zu %11s %12s  %5s\n", r.bytes, fmt("%.2f", r.time_us).c_str(),
                    fmt("%.3f", r.bw_gbs).c_str(), !o.check ? "-" : r.ok ? "ok" : "WRONG");
      os << line;
      os.flush();
    }
  }
  if (root && rows.size() >= 2) print_fit(os, "t = alpha + S/beta", fit_p2p(rows));
  return rows;
}

}  // namespace sat::dist
