// The MPI backend: MPI_COMM_WORLD on host memory, and the communicators split from it
// (Comm::split: MPI_Comm_split), which share its communication thread and watchdog.
//
// Progress. OpenMPI (like most MPI libraries) progresses a nonblocking collective only
// while the process is inside an MPI call, so an MPI_Iallreduce started before backward
// would sit idle until its MPI_Wait. Instead, every MPI call of the process runs on one
// dedicated communication thread, which executes a FIFO queue of operations: collectives
// as blocking calls (MPI_Allreduce, ...), point-to-point as MPI_Isend/MPI_Irecv that the
// thread polls between operations (so that a ring of sends and recvs cannot deadlock on
// one thread). The caller's thread only enqueues and waits on a condition variable. While
// a caller waits, the thread polls those requests without sleeping between tests (when the
// node has no more ranks than cores): a pipeline stage's wait for its neighbour is the
// round trip of each message, and sleeping polls made it about 300 us on 2 ranks here.
// MPI is initialised on that thread (MPI_Init_thread asking for MPI_THREAD_SERIALIZED; the
// thread is MPI's "main" thread, so FUNNELED is enough) and finalised on it at exit; no
// other thread calls MPI — except MPI_Abort from the watchdog below.
//
// Failure. MPI_ERRORS_ARE_FATAL: an MPI error aborts the job. A peer that dies does not
// raise an error on the others (they just wait in the collective); mpirun notices the
// death and kills the job itself, and for everything else (a peer stuck, a launcher that
// does not watch its processes) Work::wait() has a deadline (comm_timeout_seconds()):
// past it the waiting thread prints which rank, op and size hung and calls
// MPI_Abort(MPI_COMM_WORLD, 1). That call comes from a thread other than the
// communication thread, possibly while that thread is blocked inside MPI: outside what
// MPI_THREAD_SERIALIZED allows, and acceptable for an abort (OpenMPI's MPI_Abort only
// tells the launcher to kill the job and exits); should it hang anyway, a last-resort
// timer _exit()s the process 10 s later.
//
// Exit. MPI is finalised on the communication thread when the process exits normally.
// MPI_Finalize waits for every rank, so a rank that exits early because of an error would
// sit in it while the others wait for that rank in a collective, until their watchdog
// fires. An exit with a non-zero status (glibc's on_exit sees it) therefore calls
// MPI_Abort instead: the launcher ends the job at once and names the rank.
#include "dist/comm.h"
#include "dist/verdict.h"

#include <cstdio>
#include <cstdlib>

#include "core/error.h"
#include "core/timer.h"

#if SAT_HAVE_MPI
// The C API only (OpenMPI's and MPICH's mpi.h otherwise pull in the deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sat::dist {

namespace {

using Clock = std::chrono::steady_clock;

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: return MPI_BYTE;  // data movement only (check_dtype rejects reductions)
  }
}
// Elements of MPI type for `count` elements of t (non-reducible dtypes travel as bytes).
size_t mpi_count(DType t, size_t count) {
  return mpi_type(t) == MPI_BYTE ? count * dtype_size(t) : count;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_SUM;
}

template <typename T>
void divide(void* data, size_t count, int n) {
  T* p = static_cast<T*>(data);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(n));
}
void divide(void* data, size_t count, DType t, int n) {
  switch (t) {
    case DType::f32: divide<float>(data, count, n); break;
    case DType::f64: divide<double>(data, count, n); break;
    case DType::i32: divide<int32_t>(data, count, n); break;
    case DType::i64: divide<int64_t>(data, count, n); break;
    default: break;
  }
}

// Largest count of one MPI call (MPI counts are int).
constexpr size_t kMaxChunk = size_t(1) << 30;

int to_int(const char* op, size_t count) {
  SAT_CHECK(count <= size_t(INT_MAX), op, ": ", count, " elements per rank exceed the 2^31 - 1 of one MPI call");
  return static_cast<int>(count);
}

// The completion state of one operation, shared by its Work and the queue.
struct OpState {
  std::string name;
  size_t bytes = 0;
  int rank = 0;
  std::vector<int> peers;  // the world ranks this op waits on (named when it times out)
  double started = 0, finished = 0;  // on the communication thread (now_seconds())
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::string error;
  int outstanding = 0;  // point-to-point requests in flight (communication thread only)

  void complete(std::string err = {}) {
    {
      std::lock_guard<std::mutex> lk(m);
      finished = now_seconds();
      done = true;
      error = std::move(err);
    }
    cv.notify_all();
  }
};

// Why an op did not complete: the ranks it waited on, by their world rank.
std::string suspects(const OpState& st) {
  if (st.name == "MPI_Finalize")
    return "other ranks are probably still waiting for this one (a rank that fails should end the job with abort_job)";
  if (st.peers.empty()) return "a peer rank has probably failed";
  std::string ranks;
  for (int r : st.peers) ranks += str_cat(ranks.empty() ? "" : ", ", r);
  return st.peers.size() == 1 ? str_cat("rank ", ranks, ", which it waits on, has probably failed or stopped")
                              : str_cat("one of ranks ", ranks, ", which it waits on, has probably failed or stopped");
}

[[noreturn]] void watchdog_abort(const OpState& st, double timeout) {
  std::string what = st.name;
  if (st.bytes) what += str_cat(" of ", st.bytes, " bytes");
  const std::string why = suspects(st);
  std::fprintf(stderr, "saturate: rank %d: %s did not complete within %g s; %s (SAT_COMM_TIMEOUT sets the limit)\n",
               st.rank, what.c_str(), timeout, why.c_str());
  std::fflush(stderr);
  // Last resort, should MPI_Abort hang (it is called from outside the communication thread).
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(1);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

// Threads blocked in wait_state: while one is, the communication thread polls its
// point-to-point requests without sleeping (the waiter's core has nothing else to do),
// unless the node has more ranks than cores.
std::atomic<int> waiting_callers{0};

// Waits for st with the watchdog; throws its error.
void wait_state(OpState& st) {
  std::unique_lock<std::mutex> lk(st.m);
  if (!st.done) ++waiting_callers;
  struct Leave {
    bool counted;
    ~Leave() {
      if (counted) --waiting_callers;
    }
  } leave{!st.done};
  double timeout = comm_timeout_seconds();
  if (timeout > 0) {
    auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout));
    if (!st.cv.wait_until(lk, deadline, [&] { return st.done; })) {
      lk.unlock();
      watchdog_abort(st, timeout);
    }
  } else {
    st.cv.wait(lk, [&] { return st.done; });
  }
  if (!st.error.empty()) throw Error(str_cat("rank ", st.rank, ": ", st.name, " failed: ", st.error));
}

class MpiWork final : public Work {
 public:
  explicit MpiWork(std::shared_ptr<OpState> st) : st_(std::move(st)) {}
  ~MpiWork() override {
    if (!done()) {
      try {
        wait_state(*st_);
      } catch (...) {
      }
    }
  }
  void wait() override { wait_state(*st_); }
  bool done() override {
    std::lock_guard<std::mutex> lk(st_->m);
    return st_->done;
  }
  bool ran(double& t0, double& t1) const override {
    std::lock_guard<std::mutex> lk(st_->m);
    if (!st_->done) return false;
    t0 = st_->started, t1 = st_->finished;
    return true;
  }

 private:
  std::shared_ptr<OpState> st_;
};

// The process's one communication thread: initialises MPI, runs queued operations in
// order, polls point-to-point requests, finalises MPI at exit.
class MpiRuntime {
 public:
  using Task = std::function<void(const std::shared_ptr<OpState>&)>;

  static MpiRuntime& instance() {
    static MpiRuntime rt;  // finalises MPI when the process exits
#ifdef __GLIBC__
    // Registered after rt's destructor, so it runs before it: an exit with a non-zero
    // status (an error on this rank) aborts the job instead of entering MPI_Finalize,
    // which would wait for ranks that are themselves waiting for this one.
    static const bool on_error_exit = (on_exit(abort_on_error_exit, nullptr), true);
    (void)on_error_exit;
#endif
    return rt;
  }

  int world_rank() const { return world_rank_; }
  int world_size() const { return world_size_; }
  bool finalized() const { return finalized_; }

  // Queues task; it runs on the communication thread after every earlier one. The op
  // completes when the task returns, or, when it started point-to-point requests
  // (track()), when the last of them completes.
  std::shared_ptr<OpState> submit(std::string name, size_t bytes, Task task, std::vector<int> peers = {}) {
    auto st = std::make_shared<OpState>();
    st->name = std::move(name);
    st->bytes = bytes;
    st->rank = world_rank_;
    st->peers = std::move(peers);
    {
      std::lock_guard<std::mutex> lk(m_);
      SAT_CHECK(!stopping_, st->name, ": MPI has been finalised (the process is exiting)");
      q_.push_back({st, std::move(task)});
    }
    cv_.notify_one();
    return st;
  }
  void run_sync(std::string name, Task task) {
    auto st = submit(std::move(name), 0, std::move(task));
    wait_state(*st);
  }

  // Communication thread only: request r completes part of st.
  void track(MPI_Request r, const std::shared_ptr<OpState>& st, bool is_recv) {
    reqs_.push_back(r);
    req_ops_.push_back(st);
    req_recv_.push_back(is_recv);
    ++st->outstanding;
  }

  ~MpiRuntime() { shutdown(); }

  // Finishes the queue and finalises MPI (once; at exit, or earlier by finish_job_together).
  void shutdown() {
    {
      std::lock_guard<std::mutex> lk(m_);
      if (stopping_) return;
      stopping_ = true;
    }
    cv_.notify_one();
    // The thread finishes the queue and finalises MPI. A peer that never arrives would
    // hang MPI_Finalize: bound the wait like any other op.
    std::unique_lock<std::mutex> lk(m_);
    double timeout = comm_timeout_seconds();
    bool ok = true;
    if (timeout > 0)
      ok = exit_cv_.wait_for(lk, std::chrono::duration<double>(timeout), [&] { return exited_; });
    else
      exit_cv_.wait(lk, [&] { return exited_; });
    lk.unlock();
    if (ok) {
      thread_.join();
    } else {
      OpState st;
      st.name = "MPI_Finalize";
      st.rank = world_rank_;
      watchdog_abort(st, timeout);
    }
  }

 private:
  struct Item {
    std::shared_ptr<OpState> st;
    Task task;
  };

  static void abort_on_error_exit(int status, void*) {
    if (status == 0) return;
    int inited = 0, fin = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&fin);
    if (!inited || fin) return;
    std::fflush(stdout);
    std::fprintf(stderr, "saturate: rank %d exits with status %d: ending the job\n", instance_rank(), status);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);  // from the exiting thread; see the top of this file
  }
  static int instance_rank();

  MpiRuntime() {
    thread_ = std::thread([this] { main(); });
    std::unique_lock<std::mutex> lk(m_);
    cv_.wait(lk, [&] { return init_done_; });
    if (!init_error_.empty()) {
      lk.unlock();
      thread_.join();
      throw Error(init_error_);
    }
  }

  void main() {
    // The polling waits below are tens of microseconds: Linux's default timer slack (50 us)
    // would stretch each to several times that.
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    std::string err = init();
    {
      std::lock_guard<std::mutex> lk(m_);
      init_done_ = true;
      init_error_ = err;
    }
    cv_.notify_all();
    if (!err.empty()) return;
    loop();
    finalize();
    {
      std::lock_guard<std::mutex> lk(m_);
      exited_ = true;
    }
    exit_cv_.notify_all();
  }

  std::string init() {
    int inited = 0;
    MPI_Initialized(&inited);
    int provided = MPI_THREAD_SINGLE;
    if (inited) {
      // Someone else initialised MPI: this thread may call it only at SERIALIZED or better.
      MPI_Query_thread(&provided);
      if (provided < MPI_THREAD_SERIALIZED)
        return "MPI was initialised by the program below MPI_THREAD_SERIALIZED: saturate's communication thread "
               "cannot use it";
      owns_mpi_ = false;
    } else {
      // MPI_Init_thread on this thread: it is MPI's main thread, every later call (and
      // MPI_Finalize) comes from it.
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return "MPI_Init_thread failed";
      if (provided < MPI_THREAD_FUNNELED) {
        MPI_Finalize();
        return "the MPI library offers no thread support (MPI_THREAD_FUNNELED or better is needed)";
      }
      owns_mpi_ = true;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
    // Polling without sleep while a caller waits costs nothing when each rank of the node
    // has a core (the waiter's); with more ranks than cores it would take one from a rank
    // that computes.
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    int on_node = 1;
    MPI_Comm_size(node, &on_node);
    MPI_Comm_free(&node);
    spin_while_waiting_ = unsigned(on_node) <= std::max(1u, std::thread::hardware_concurrency());
    return {};
  }

  // Point-to-point requests in flight are polled, backing off from 20 us to this. A
  // pipeline stage waits for its sends and receives at once, so every microsecond of
  // polling delay is a microsecond of bubble; the thread only polls while requests are
  // in flight (it sleeps on the queue otherwise).
  static constexpr int kMaxPollUs = 50;

  bool spinning() const { return spin_while_waiting_ && waiting_callers.load(std::memory_order_relaxed) > 0; }

  void loop() {
    auto idle = std::chrono::microseconds(20);
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lk(m_);
        if (reqs_.empty()) {
          cv_.wait(lk, [&] { return stopping_ || !q_.empty(); });
        } else if (q_.empty() && !spinning()) {
          // Requests in flight, nothing else to do and no one waiting: poll, backing off.
          cv_.wait_for(lk, idle, [&] { return !q_.empty(); });
        }
        if (!q_.empty()) {
          item = std::move(q_.front());
          q_.pop_front();
        } else if (stopping_) {
          break;
        }
      }
      if (item.task) {
        try {
          item.st->started = now_seconds();
          item.task(item.st);
          if (item.st->outstanding == 0) item.st->complete();
        } catch (const std::exception& e) {
          item.st->complete(e.what());
        }
      }
      if (!reqs_.empty()) {
        if (poll()) {
          idle = std::chrono::microseconds(20);
        } else {
          idle = std::min(idle * 2, std::chrono::microseconds(kMaxPollUs));
          if (spinning()) std::this_thread::yield();
        }
      }
    }
    // Exiting with point-to-point requests no one waited for: a recv is cancelled, a send
    // left to MPI.
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (reqs_[i] == MPI_REQUEST_NULL) continue;
      if (req_recv_[i]) MPI_Cancel(&reqs_[i]);
      MPI_Request_free(&reqs_[i]);
      req_ops_[i]->complete("cancelled: MPI is being finalised");
    }
    reqs_.clear();
    req_ops_.clear();
    req_recv_.clear();
  }

  // Tests the requests in flight; completes ops whose requests are all done. Returns
  // whether any request completed.
  bool poll() {
    int n = static_cast<int>(reqs_.size());
    idx_.resize(reqs_.size());
    int outcount = 0;
    MPI_Testsome(n, reqs_.data(), &outcount, idx_.data(), MPI_STATUSES_IGNORE);
    if (outcount <= 0) return false;  // 0, or MPI_UNDEFINED when none was active
    for (int k = 0; k < outcount; ++k) {
      auto& st = req_ops_[idx_[k]];
      if (--st->outstanding == 0) st->complete();
      st.reset();
    }
    size_t j = 0;
    for (size_t i = 0; i < reqs_.size(); ++i) {
      if (!req_ops_[i]) continue;
      reqs_[j] = reqs_[i];
      req_ops_[j] = std::move(req_ops_[i]);
      req_recv_[j] = req_recv_[i];
      ++j;
    }
    reqs_.resize(j);
    req_ops_.resize(j);
    req_recv_.resize(j);
    return true;
  }

  void finalize() {
    if (!owns_mpi_) return;
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
    finalized_ = true;
  }

  std::thread thread_;
  std::mutex m_;
  std::condition_variable cv_, exit_cv_;
  std::deque<Item> q_;
  bool stopping_ = false, init_done_ = false, exited_ = false;
  std::string init_error_;
  bool owns_mpi_ = false;
  bool finalized_ = false;
  bool spin_while_waiting_ = false;  // set by init(), read by the communication thread only
  int world_rank_ = 0, world_size_ = 1;
  // Communication thread only.
  std::vector<MPI_Request> reqs_;
  std::vector<std::shared_ptr<OpState>> req_ops_;
  std::vector<bool> req_recv_;
  std::vector<int> idx_;
};

int MpiRuntime::instance_rank() { return instance().world_rank(); }

class MpiComm final : public Comm {
 public:
  MpiComm() : rt_(MpiRuntime::instance()) {
    // A duplicate of MPI_COMM_WORLD: several communicators never mix their messages.
    rt_.run_sync("MPI_Comm_dup", [this](const std::shared_ptr<OpState>&) {
      MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
      adopt();
    });
  }
  // Takes ownership of comm (made on the communication thread, e.g. by MPI_Comm_split).
  MpiComm(MpiRuntime& rt, MPI_Comm comm) : rt_(rt), comm_(comm) {
    rt_.run_sync("MPI_Comm_rank", [this](const std::shared_ptr<OpState>&) { adopt(); });
  }
  ~MpiComm() override {
    // Runs after every op of this communicator (the queue is FIFO).
    try {
      rt_.run_sync("MPI_Comm_free", [this](const std::shared_ptr<OpState>&) { MPI_Comm_free(&comm_); });
    } catch (...) {
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend_name() const override { return "mpi"; }

  WorkPtr all_reduce(void* data, size_t count, DType t, ReduceOp op) override {
    check_dtype("all_reduce", t, true);
    SAT_CHECK(data || count == 0, "all_reduce: null buffer");
    return submit(str_cat("all_reduce (", reduce_op_name(op), ")"), count * dtype_size(t), [=, this](const std::shared_ptr<OpState>&) {
      char* p = static_cast<char*>(data);
      for (size_t off = 0; off < count; off += kMaxChunk) {
        size_t n = std::min(kMaxChunk, count - off);
        MPI_Allreduce(MPI_IN_PLACE, p + off * dtype_size(t), static_cast<int>(n), mpi_type(t), mpi_op(op), comm_);
      }
      if (op == ReduceOp::avg) divide(data, count, t, size_);
    });
  }

  WorkPtr reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) override {
    check_dtype("reduce_scatter", t, true);
    int n = to_int("reduce_scatter", recv_count);
    SAT_CHECK((send && recv) || recv_count == 0, "reduce_scatter: null buffer");
    const size_t block = recv_count * dtype_size(t);
    const bool in_place = recv == static_cast<const char*>(send) + size_t(rank_) * block;
    return submit(str_cat("reduce_scatter (", reduce_op_name(op), ")"), block * size_,
                  [=, this](const std::shared_ptr<OpState>&) {
                    if (in_place) {
                      // MPI leaves the in-place result at the start of the buffer.
                      void* all = const_cast<void*>(send);
                      MPI_Reduce_scatter_block(MPI_IN_PLACE, all, n, mpi_type(t), mpi_op(op), comm_);
                      if (recv != all) std::memmove(recv, all, block);
                    } else {
                      MPI_Reduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(op), comm_);
                    }
                    if (op == ReduceOp::avg) divide(recv, recv_count, t, size_);
                  });
  }

  WorkPtr all_gather(const void* send, void* recv, size_t send_count, DType t) override {
    check_dtype("all_gather", t, false);
    int n = to_int("all_gather", mpi_count(t, send_count));
    SAT_CHECK((send && recv) || send_count == 0, "all_gather: null buffer");
    size_t block = send_count * dtype_size(t);
    bool in_place = send == static_cast<const char*>(recv) + size_t(rank_) * block;
    return submit("all_gather", block * size_, [=, this](const std::shared_ptr<OpState>&) {
      MPI_Allgather(in_place ? MPI_IN_PLACE : send, n, mpi_type(t), recv, n, mpi_type(t), comm_);
    });
  }

  WorkPtr broadcast(void* data, size_t count, DType t, int root) override {
    check_dtype("broadcast", t, false);
    check_rank("broadcast", "root", root, size_);
    SAT_CHECK(data || count == 0, "broadcast: null buffer");
    return submit(str_cat("broadcast from rank ", root), count * dtype_size(t), [=, this](const std::shared_ptr<OpState>&) {
      size_t total = mpi_count(t, count), esize = mpi_type(t) == MPI_BYTE ? 1 : dtype_size(t);
      char* p = static_cast<char*>(data);
      for (size_t off = 0; off < total; off += kMaxChunk) {
        size_t n = std::min(kMaxChunk, total - off);
        MPI_Bcast(p + off * esize, static_cast<int>(n), mpi_type(t), root, comm_);
      }
    });
  }

  WorkPtr send(const void* data, size_t count, DType t, int peer, int tag) override {
    return post("send", str_cat("send to rank ", peer), {{true, const_cast<void*>(data), count, peer}}, t, tag);
  }

  WorkPtr recv(void* data, size_t count, DType t, int peer, int tag) override {
    return post("recv", str_cat("recv from rank ", peer), {{false, data, count, peer}}, t, tag);
  }

  WorkPtr send_recv(const void* send_data, size_t send_count, int dst, void* recv_data, size_t recv_count, int src,
                    DType t, int tag) override {
    return post("send_recv", str_cat("send_recv (to rank ", dst, ", from rank ", src, ")"),
                {{false, recv_data, recv_count, src}, {true, const_cast<void*>(send_data), send_count, dst}}, t, tag);
  }

  WorkPtr p2p(const std::vector<P2POp>& ops, DType t) override {
    if (ops.empty()) return completed_work();
    return post("p2p", str_cat("p2p (", describe_p2p_ops(ops), ")"), ops, t, 0);
  }

  WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                       const std::vector<size_t>& recv_counts, DType t) override {
    check_all_to_all(send, send_counts, recv, recv_counts, size_);
    const size_t n = size_t(size_);
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    size_t so = 0, ro = 0;  // offsets in MPI elements (bytes for the dtypes MPI has no type for)
    for (size_t p = 0; p < n; ++p) {
      sc[p] = to_int("all_to_all_v", mpi_count(t, send_counts[p]));
      rc[p] = to_int("all_to_all_v", mpi_count(t, recv_counts[p]));
      sd[p] = to_int("all_to_all_v", so), rd[p] = to_int("all_to_all_v", ro);
      so += size_t(sc[p]), ro += size_t(rc[p]);
    }
    const size_t esize = mpi_type(t) == MPI_BYTE ? 1 : dtype_size(t);
    return submit("all_to_all_v", so * esize, [=, this](const std::shared_ptr<OpState>&) {
      MPI_Alltoallv(send, sc.data(), sd.data(), mpi_type(t), recv, rc.data(), rd.data(), mpi_type(t), comm_);
    });
  }

  void barrier() override {
    auto st = rt_.submit("barrier", 0, [this](const std::shared_ptr<OpState>&) { MPI_Barrier(comm_); });
    wait_state(*st);
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm part = MPI_COMM_NULL;
    rt_.run_sync("MPI_Comm_split", [&](const std::shared_ptr<OpState>&) {
      MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &part);
    });
    if (part == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiComm>(rt_, part);
  }

 private:
  // Communication thread: the error handler, rank and size of comm_.
  void adopt() {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // The world rank of each member, so that a timeout names the processes it waited on.
    MPI_Group group, world;
    MPI_Comm_group(comm_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> mine(size_t(size_), 0);
    for (int i = 0; i < size_; ++i) mine[size_t(i)] = i;
    world_of_.assign(size_t(size_), 0);
    MPI_Group_translate_ranks(group, size_, mine.data(), world, world_of_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
  }

  int world_of(int peer) const { return world_of_[size_t(peer)]; }

  // A collective waits on every other member.
  WorkPtr submit(std::string name, size_t bytes, MpiRuntime::Task task) {
    std::vector<int> others;
    for (int i = 0; i < size_; ++i)
      if (i != rank_) others.push_back(world_of(i));
    return std::make_unique<MpiWork>(rt_.submit(std::move(name), bytes, std::move(task), std::move(others)));
  }

  // One queued task that starts every op's (chunked) MPI_Isend/MPI_Irecv, in list order, all
  // tracked under the task's OpState: the Work completes when the last request has.
  WorkPtr post(const char* op, std::string name, const std::vector<P2POp>& ops, DType t, int tag) {
    SAT_CHECK(tag >= 0 && tag <= 32767, op, ": tag ", tag, " is not in [0, 32767]");
    check_p2p_ops(op, ops, size_);
    size_t bytes = 0;
    std::vector<int> peers;
    for (const P2POp& o : ops) {
      bytes += o.count * dtype_size(t);
      if (std::find(peers.begin(), peers.end(), world_of(o.peer)) == peers.end()) peers.push_back(world_of(o.peer));
    }
    auto task = [=, this](const std::shared_ptr<OpState>& st) {
      for (const P2POp& o : ops) start(st, o, t, tag);
    };
    return std::make_unique<MpiWork>(rt_.submit(std::move(name), bytes, std::move(task), std::move(peers)));
  }

  // Communication thread: the requests of one op; a count of 0 still sends (and receives) an
  // empty message, so that message matching stays in step on both ranks.
  void start(const std::shared_ptr<OpState>& st, const P2POp& o, DType t, int tag) {
    size_t total = mpi_count(t, o.count), esize = mpi_type(t) == MPI_BYTE ? 1 : dtype_size(t);
    char* p = static_cast<char*>(o.data);
    size_t off = 0;
    do {
      size_t n = std::min(kMaxChunk, total - off);
      MPI_Request r;
      if (o.send)
        MPI_Isend(p + off * esize, static_cast<int>(n), mpi_type(t), o.peer, tag, comm_, &r);
      else
        MPI_Irecv(p + off * esize, static_cast<int>(n), mpi_type(t), o.peer, tag, comm_, &r);
      rt_.track(r, st, !o.send);
      off += n;
    } while (off < total);
  }

  MpiRuntime& rt_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_of_;  // world rank of each member of comm_
};

}  // namespace

bool have_mpi() { return true; }

std::unique_ptr<Comm> make_mpi_comm() { return std::make_unique<MpiComm>(); }

[[noreturn]] void abort_job(int code) {
  int inited = 0, fin = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&fin);
  std::fflush(stdout);
  if (inited && !fin) {
    // Name the rank ourselves: mpirun's own "MPI_ABORT was invoked on rank N" goes
    // through its help-message system, which can fail to print (seen under load).
    std::fprintf(stderr, "saturate: rank %d ends the job with status %d\n", detect_process().rank, code);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }
  std::exit(code);
}

bool report_failure_to_job(const std::string& message, double grace) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited || !detect_process().distributed()) return false;
  std::fflush(stderr);
  try {
    std::unique_ptr<Comm> comm = make_mpi_comm();
    Verdict v;
    return agree_on_outcome(*comm, &message, v, grace);
  } catch (const std::exception&) {
    return false;
  }
}

[[noreturn]] void end_job_after_input_error(int code, const std::string& message, double grace) {
  // The job's first collective is the verdict on every rank's setup (make_world_comm):
  // this rank's failure is its part of it. Every rank then ends together, with MPI
  // finalised, as a normal exit with `code` that the launcher passes on.
  if (report_failure_to_job(message, grace)) {
    finish_job_together();
    std::fflush(stdout);
    std::exit(code);
  }
  abort_job(code);
}

void finish_job_together() {
  int inited = 0;
  MPI_Initialized(&inited);
  if (inited) MpiRuntime::instance().shutdown();
}

}  // namespace sat::dist

#else  // !SAT_HAVE_MPI

namespace sat::dist {

bool have_mpi() { return false; }

std::unique_ptr<Comm> make_mpi_comm() {
  throw Error("this saturate was built without MPI: apt-get install libopenmpi-dev openmpi-bin and rebuild");
}

[[noreturn]] void abort_job(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::exit(code);
}

bool report_failure_to_job(const std::string&, double) { return false; }

[[noreturn]] void end_job_after_input_error(int code, const std::string&, double) { abort_job(code); }

void finish_job_together() {}

}  // namespace sat::dist

#endif
