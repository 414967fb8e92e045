// The NCCL backend (see nccl_comm.h). Compiled with the CUDA backend and NCCL; it needs no
// MPI itself (any host communicator bootstraps it), so a world of one also runs on a GPU
// machine without MPI.
#include "dist/nccl_comm.h"

#include "backend/device.h"
#include "core/error.h"

namespace sat::dist {

int local_rank_gpu(const std::string& flag) {
  const int ngpu = cuda_device_count();
  SAT_CHECK(ngpu > 0, flag, ": no usable GPU (", cuda_unavailable_reason(), ")");
  const ProcessInfo pi = detect_process();
  SAT_CHECK(pi.local_world <= ngpu, flag, ": ", pi.local_world, " ranks on this node but ", ngpu,
            " GPU(s); NCCL needs a GPU of its own for every rank");
  return pi.local_rank;
}

}  // namespace sat::dist

#if SAT_HAVE_CUDA && SAT_HAVE_NCCL
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "backend/cuda/context.h"

namespace sat::dist {

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void nccl_fail(ncclResult_t r, const char* call, const char* file, int line, int rank,
                            const char* last = nullptr) {
  std::string detail = last && *last ? str_cat(": ", last) : std::string();
  throw Error(str_cat("NCCL error", rank >= 0 ? str_cat(" on rank ", rank) : std::string(), ": ",
                      ncclGetErrorString(r), detail, " (", call, " at ", file, ":", line, ")"));
}

// For NCCL calls that take no communicator (or before it exists).
#define SAT_NCCL_CHECK(call)                                                                   \
  do {                                                                                         \
    ncclResult_t sat_r_ = (call);                                                              \
    if (sat_r_ != ncclSuccess) ::sat::dist::nccl_fail(sat_r_, #call, __FILE__, __LINE__, -1); \
  } while (0)

// For calls on the communicator: ncclInProgress is polled to completion, errors abort the
// communicator (when fatal) and throw naming call, file and line.
#define SAT_NCCL_CALL(call, op, bytes) finish((call), #call, __FILE__, __LINE__, (op), (bytes))

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32: return ncclFloat32;
    case DType::f64: return ncclFloat64;
    case DType::i32: return ncclInt32;
    case DType::i64: return ncclInt64;
    case DType::u8: return ncclUint8;
    case DType::bf16: return ncclBfloat16;
    case DType::f16: return ncclFloat16;
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
  }
  return ncclSum;
}

void check_nccl_dtype(const char* op, DType t, bool reduction) {
  if (!reduction) return;
  SAT_CHECK(t != DType::u8, op, ": dtype u8 cannot be reduced");
}

// Makes `dev` current for the scope.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    SAT_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != dev) SAT_CUDA_CHECK(cudaSetDevice(dev));
    else prev_ = -1;
  }
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
};

// Polling with back-off: yields first, then sleeps up to 100 us.
class Backoff {
 public:
  void pause() {
    if (n_++ < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(n_ < 1000 ? 10 : 100));
    }
  }

 private:
  int n_ = 0;
};

// The stream of the ops, shared by a communicator and those split from it: the deleter
// destroys a stream that the communicator created (make_nccl_comm(boot, dev)) once the last
// of them is gone, and leaves the caller's stream alone.
using SharedStream = std::shared_ptr<CUstream_st>;

SharedStream borrowed_stream(cudaStream_t s) { return SharedStream(s, [](cudaStream_t) {}); }

SharedStream owned_stream(cudaStream_t s, int dev) {
  return SharedStream(s, [dev](cudaStream_t st) {
    try {
      DeviceGuard g(dev);
      cudaStreamDestroy(st);
    } catch (...) {
    }
  });
}

class NcclComm final : public Comm {
 public:
  // Bootstraps over `boot`, which split() splits again later: it must outlive this
  // communicator, or be owned by it (own_boot, the host group of a split).
  NcclComm(Comm& boot, std::unique_ptr<Comm> own_boot, int dev, SharedStream stream)
      : boot_(&boot), own_boot_(std::move(own_boot)), rank_(boot.rank()), size_(boot.size()), dev_(dev),
        stream_owner_(std::move(stream)), stream_(stream_owner_.get()) {
    SAT_CHECK(boot.device() == Device::cpu, "make_nccl_comm: the bootstrap communicator must work on host memory (",
              boot.backend_name(), " does not)");
    int ndev = 0;
    SAT_CUDA_CHECK(cudaGetDeviceCount(&ndev));
    SAT_CHECK(dev >= 0 && dev < ndev, "make_nccl_comm: CUDA device ", dev, " does not exist (", ndev, " devices)");
    DeviceGuard g(dev_);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) SAT_NCCL_CHECK(ncclGetUniqueId(&id));
    boot.broadcast_sync(&id, sizeof id, DType::u8, 0);

    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // no call may hang the host beyond the timeout
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
      const char* last = comm_ ? ncclGetLastError(comm_) : nullptr;
      if (comm_) ncclCommAbort(comm_);
      comm_ = nullptr;
      nccl_fail(r, "ncclCommInitRankConfig", __FILE__, __LINE__, rank_, last);
    }
    finish(r, "ncclCommInitRankConfig", __FILE__, __LINE__, "ncclCommInitRank", 0);
    SAT_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(int32_t)));
    SAT_CUDA_CHECK(cudaMemset(scratch_, 0, sizeof(int32_t)));
  }

  ~NcclComm() override {
    try {
      DeviceGuard g(dev_);
      if (comm_) {
        // Flush the communicator's work, then free it; on any failure abort instead.
        bool ok = true;
        try {
          SAT_NCCL_CALL(ncclCommFinalize(comm_), "ncclCommFinalize", 0);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "saturate: rank %d: %s\n", rank_, e.what());
          ok = false;
        }
        if (comm_) {
          if (ok)
            ncclCommDestroy(comm_);
          else
            ncclCommAbort(comm_);
        }
        comm_ = nullptr;
      }
      if (scratch_) cudaFree(scratch_);
    } catch (...) {
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend_name() const override { return "nccl"; }
  Device device() const override { return Device::cuda; }
  bool stream_ordered() const override { return true; }

  WorkPtr all_reduce(void* data, size_t count, DType t, ReduceOp op) override {
    check_nccl_dtype("all_reduce", t, true);
    std::string name = str_cat("all_reduce (", reduce_op_name(op), ")");
    size_t bytes = count * dtype_size(t);
    if (count == 0) return completed_work();
    start(name);
    DeviceGuard g(dev_);
    SAT_NCCL_CALL(ncclAllReduce(data, data, count, nccl_type(t), nccl_op(op), comm_, stream_), name, bytes);
    return record(std::move(name), bytes);
  }

  WorkPtr reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) override {
    check_nccl_dtype("reduce_scatter", t, true);
    std::string name = str_cat("reduce_scatter (", reduce_op_name(op), ")");
    size_t bytes = recv_count * dtype_size(t) * size_t(size_);
    if (recv_count == 0) return completed_work();
    start(name);
    DeviceGuard g(dev_);
    SAT_NCCL_CALL(ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op(op), comm_, stream_), name, bytes);
    return record(std::move(name), bytes);
  }

  WorkPtr all_gather(const void* send, void* recv, size_t send_count, DType t) override {
    size_t bytes = send_count * dtype_size(t) * size_t(size_);
    if (send_count == 0) return completed_work();
    start("all_gather");
    DeviceGuard g(dev_);
    // In place when send == recv + rank * send_count, NCCL's own convention.
    SAT_NCCL_CALL(ncclAllGather(send, recv, send_count, nccl_type(t), comm_, stream_), "all_gather", bytes);
    return record("all_gather", bytes);
  }

  WorkPtr broadcast(void* data, size_t count, DType t, int root) override {
    check_rank("broadcast", "root", root, size_);
    std::string name = str_cat("broadcast from rank ", root);
    size_t bytes = count * dtype_size(t);
    if (count == 0) return completed_work();
    start(name);
    DeviceGuard g(dev_);
    SAT_NCCL_CALL(ncclBroadcast(data, data, count, nccl_type(t), root, comm_, stream_), name, bytes);
    return record(std::move(name), bytes);
  }

  WorkPtr send(const void* data, size_t count, DType t, int peer, int tag) override {
    check_tag("send", tag);
    return post("send", str_cat("send to rank ", peer), {{true, const_cast<void*>(data), count, peer}}, t);
  }

  WorkPtr recv(void* data, size_t count, DType t, int peer, int tag) override {
    check_tag("recv", tag);
    return post("recv", str_cat("recv from rank ", peer), {{false, data, count, peer}}, t);
  }

  WorkPtr send_recv(const void* send_data, size_t send_count, int dst, void* recv_data, size_t recv_count, int src,
                    DType t, int tag) override {
    check_tag("send_recv", tag);
    return post("send_recv", str_cat("send_recv (to rank ", dst, ", from rank ", src, ")"),
                {{true, const_cast<void*>(send_data), send_count, dst}, {false, recv_data, recv_count, src}}, t);
  }

  WorkPtr p2p(const std::vector<P2POp>& ops, DType t) override {
    return post("p2p", str_cat("p2p (", describe_p2p_ops(ops), ")"), ops, t);
  }

  void barrier() override {
    start("barrier");
    {
      DeviceGuard g(dev_);
      SAT_NCCL_CALL(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "barrier", 0);
    }
    record("barrier", 0)->wait();
  }

  // The host communicator is split with the same color and key (so its ranks are this
  // communicator's), and a new NCCL communicator is bootstrapped over it on the same device
  // and stream. It owns that host communicator, and shares the stream.
  std::unique_ptr<Comm> split(int color, int key) override {
    std::unique_ptr<Comm> host = boot_->split(color, key);
    if (!host) return nullptr;
    Comm& h = *host;
    return std::make_unique<NcclComm>(h, std::move(host), dev_, stream_owner_);
  }

  // --- used by NcclWork ---

  // Waits for ev: polls it, NCCL's asynchronous errors and the deadline.
  void wait_event(cudaEvent_t ev, const std::string& op, size_t bytes) {
    auto deadline = deadline_from_now();
    Backoff b;
    for (;;) {
      cudaError_t e = cudaEventQuery(ev);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) SAT_CUDA_CHECK(e);
      check_async(op, bytes);
      if (Clock::now() > deadline) timeout(op, bytes);
      b.pause();
    }
  }
  // Never blocks and never throws: a failure counts as done (wait() reports it).
  bool event_done(cudaEvent_t ev) {
    cudaError_t e = cudaEventQuery(ev);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) return true;
    if (!comm_) return true;
    ncclResult_t s = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &s) != ncclSuccess) return true;
    return s != ncclSuccess && s != ncclInProgress;
  }

 private:
  class NcclWork final : public Work {
   public:
    NcclWork(NcclComm* c, cudaEvent_t ev, std::string op, size_t bytes)
        : c_(c), ev_(ev), op_(std::move(op)), bytes_(bytes) {}
    ~NcclWork() override {
      if (!done_) {
        try {
          wait();
        } catch (...) {
        }
      }
      cudaEventDestroy(ev_);
    }
    void wait() override {
      if (done_) return;
      c_->wait_event(ev_, op_, bytes_);
      done_ = true;
    }
    bool done() override { return done_ || c_->event_done(ev_); }

   private:
    NcclComm* c_;
    cudaEvent_t ev_;
    std::string op_;
    size_t bytes_;
    bool done_ = false;
  };

  static void check_tag(const char* op, int tag) {
    SAT_CHECK(tag == 0, op, ": the NCCL backend has no message tags (got tag ", tag, ")");
  }

  // Every op in one NCCL group, so that NCCL runs them together (two ranks sending to each
  // other at once cannot deadlock); ops of count 0 are left out on both sides. The group is
  // always closed, whatever the calls inside it answer; the first failure is reported.
  WorkPtr post(const char* op, std::string name, const std::vector<P2POp>& ops, DType t) {
    check_p2p_ops(op, ops, size_);
    size_t bytes = 0;
    for (const P2POp& o : ops) bytes += o.count * dtype_size(t);
    if (bytes == 0) return completed_work();
    start(name);
    DeviceGuard g(dev_);
    ncclResult_t r0 = ncclGroupStart(), r1 = ncclSuccess;
    const char* failed = "";
    for (const P2POp& o : ops) {
      if (o.count == 0 || r0 != ncclSuccess || r1 != ncclSuccess) continue;
      if (o.send) {
        r1 = ncclSend(o.data, o.count, nccl_type(t), o.peer, comm_, stream_);
        failed = "ncclSend(o.data, o.count, nccl_type(t), o.peer, comm_, stream_)";
      } else {
        r1 = ncclRecv(o.data, o.count, nccl_type(t), o.peer, comm_, stream_);
        failed = "ncclRecv(o.data, o.count, nccl_type(t), o.peer, comm_, stream_)";
      }
    }
    ncclResult_t r2 = r0 == ncclSuccess ? ncclGroupEnd() : ncclSuccess;
    finish(r0, "ncclGroupStart()", __FILE__, __LINE__, name, bytes);
    finish(r1, failed, __FILE__, __LINE__, name, bytes);
    finish(r2, "ncclGroupEnd()", __FILE__, __LINE__, name, bytes);
    return record(std::move(name), bytes);
  }

  void start(const std::string& op) const {
    SAT_CHECK(comm_, "rank ", rank_, ": ", op, ": the NCCL communicator was aborted after an earlier failure");
  }

  Clock::time_point deadline_from_now() const {
    double t = comm_timeout_seconds();
    if (t <= 0) return Clock::time_point::max();
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(t));
  }

  // The Work of the op just enqueued: an event recorded after it on the stream.
  WorkPtr record(std::string op, size_t bytes) {
    DeviceGuard g(dev_);
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    SAT_CUDA_CHECK(cudaStreamIsCapturing(stream_, &cs));
    if (cs != cudaStreamCaptureStatusNone) return completed_work();  // runs with the graph
    cudaEvent_t ev = nullptr;
    SAT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(ev, stream_);
    if (e != cudaSuccess) {
      cudaEventDestroy(ev);
      SAT_CUDA_CHECK(e);
    }
    return std::make_unique<NcclWork>(this, ev, std::move(op), bytes);
  }

  // The result of an NCCL call on the communicator: ncclInProgress is polled to completion
  // (with the deadline); an error aborts the communicator when it is fatal and throws.
  void finish(ncclResult_t r, const char* call, const char* file, int line, const std::string& op, size_t bytes) {
    if (r == ncclInProgress) {
      auto deadline = deadline_from_now();
      Backoff b;
      for (;;) {
        ncclResult_t s = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(comm_, &s);
        if (q != ncclSuccess) {
          r = q;
          break;
        }
        if (s != ncclInProgress) {
          r = s;
          break;
        }
        if (Clock::now() > deadline) timeout(op, bytes);
        b.pause();
      }
    }
    if (r == ncclSuccess) return;
    std::string last = last_error();
    // A bad argument or usage leaves the communicator intact; anything else (system,
    // network, remote, internal, CUDA errors) does not.
    if (r != ncclInvalidArgument && r != ncclInvalidUsage) abort_comm();
    nccl_fail(r, call, file, line, rank_, str_cat(op, last.empty() ? "" : ": ", last).c_str());
  }

  // An asynchronous error (a peer died, the network failed) while waiting.
  void check_async(const std::string& op, size_t bytes) {
    start(op);
    ncclResult_t s = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(comm_, &s);
    if (q != ncclSuccess) s = q;
    if (s == ncclSuccess || s == ncclInProgress) return;
    std::string last = last_error();
    abort_comm();
    fail("saturate: rank ", rank_, ": ", op, " of ", bytes, " bytes failed: ", ncclGetErrorString(s),
         last.empty() ? "" : ": ", last, " (NCCL communicator aborted)");
  }

  [[noreturn]] void timeout(const std::string& op, size_t bytes) {
    std::string msg = str_cat("saturate: rank ", rank_, ": ", op, " of ", bytes, " bytes did not complete within ",
                              comm_timeout_seconds(),
                              " s; a peer rank has probably failed (SAT_COMM_TIMEOUT sets the limit)");
    std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
    abort_comm();
    throw Error(msg + " (NCCL communicator aborted)");
  }

  std::string last_error() const {
    const char* l = comm_ ? ncclGetLastError(comm_) : nullptr;
    return l ? l : "";
  }

  void abort_comm() {
    if (!comm_) return;
    ncclCommAbort(comm_);  // the stuck kernels exit; the communicator is gone
    comm_ = nullptr;
  }

  Comm* boot_;                  // the host communicator split() splits
  std::unique_ptr<Comm> own_boot_;  // it, when this communicator was made by split()
  int rank_, size_, dev_;
  SharedStream stream_owner_;
  cudaStream_t stream_;
  ncclComm_t comm_ = nullptr;
  int32_t* scratch_ = nullptr;  // the barrier's all-reduce
};

}  // namespace

bool have_nccl() { return true; }

std::unique_ptr<Comm> make_nccl_comm(Comm& boot, int cuda_device, CUstream_st* stream) {
  return std::make_unique<NcclComm>(boot, nullptr, cuda_device, borrowed_stream(stream));
}

std::unique_ptr<Comm> make_nccl_comm(Comm& boot, int cuda_device) {
  int ndev = 0;
  SAT_CUDA_CHECK(cudaGetDeviceCount(&ndev));
  SAT_CHECK(cuda_device >= 0 && cuda_device < ndev, "make_nccl_comm: CUDA device ", cuda_device, " does not exist (", ndev,
            " devices)");
  cudaStream_t stream = nullptr;
  {
    DeviceGuard g(cuda_device);
    SAT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  // Owned from here on: destroyed with the communicator, or when its construction fails.
  return std::make_unique<NcclComm>(boot, nullptr, cuda_device, owned_stream(stream, cuda_device));
}

}  // namespace sat::dist

#else  // no NCCL in this build

namespace sat::dist {

bool have_nccl() { return false; }

std::unique_ptr<Comm> make_nccl_comm(Comm&, int, CUstream_st*) {
#if SAT_HAVE_CUDA
  throw Error("this saturate was built without NCCL (set SAT_NCCL_ROOT to an NCCL install and rebuild)");
#else
  throw Error("this saturate was built without the CUDA backend, so without NCCL");
#endif
}

std::unique_ptr<Comm> make_nccl_comm(Comm& boot, int cuda_device) { return make_nccl_comm(boot, cuda_device, nullptr); }

}  // namespace sat::dist

#endif
