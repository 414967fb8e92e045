#include "dist/bench_comm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"

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
    if (dev_ == Device::cuda && bytes) SAT_CUDA_CHECK(cudaMemcpy(dev_ptr_, host_.data(), bytes, cudaMemcpyHostToDevice));
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

}  // namespace

std::vector<BenchCommRow> bench_comm(Comm& c, const BenchCommOptions& o, std::ostream& os) {
  SAT_CHECK(o.min_bytes >= 4 && o.min_bytes <= o.max_bytes, "bench comm: need 4 <= min bytes (", o.min_bytes,
            ") <= max bytes (", o.max_bytes, ")");
  SAT_CHECK(o.step >= 2, "bench comm: the size step must be at least 2 (got ", o.step, ")");
  SAT_CHECK(o.iters >= 1 && o.warmup >= 0, "bench comm: need at least one timed iteration");
  const int n = c.size(), rank = c.rank();
  const bool root = rank == 0;
  std::vector<size_t> sizes;
  for (size_t b = o.min_bytes; b <= o.max_bytes; b *= size_t(o.step)) {
    sizes.push_back(b / 4 * 4);
    if (b > o.max_bytes / size_t(o.step)) break;  // the next step would overflow or pass max
  }

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
    os.flush();
  }
  return rows;
}

}  // namespace sat::dist
