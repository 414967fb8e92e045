// The communication layer of parallel training: a communicator (Comm) over the processes
// of one job or a group of them (split()), with the collectives that training needs
// (all-reduce of the gradients, reduce-scatter/all-gather for sharded optimizers, broadcast
// of the initial parameters) plus point-to-point send/recv and batches of them (p2p, for
// pipeline stages). The process mesh and its groups are in mesh.h. Nothing here knows about
// layers or training.
//
// Backends:
//   self  — a world of one process; every op is a copy or a no-op. Always available.
//   mpi   — MPI_COMM_WORLD on host memory (mpi_comm.cpp). Every MPI call runs on one
//           dedicated communication thread, so nonblocking ops progress while the caller
//           computes. Needs SAT_HAVE_MPI.
//   nccl  — device memory, ops enqueued on a CUDA stream (nccl_comm.h).
//
// Rules that every backend shares:
//   * Collectives must be issued in the same order with the same counts/dtypes/ops on every
//     rank (as in MPI and NCCL). A Comm is used from one thread at a time.
//   * Buffers passed to a nonblocking op must stay alive and untouched until its Work has
//     completed (wait() returned or done() returned true). Destroying a Work that has not
//     completed waits for it, so a dropped handle never leaves an op writing into freed
//     memory.
//   * Work::wait() has a watchdog: when an op does not complete within the communication
//     timeout (comm_timeout_seconds(): env SAT_COMM_TIMEOUT, default 30 s, 0 = none) the
//     process prints which rank, op and size hung and aborts the whole job, since a peer
//     has most likely died and the job can never make progress again.
//   * ReduceOp::avg is sum / size(), done by the backend (integer types: truncating
//     division).
//   * Point-to-point ordering. Between two ranks of one communicator, messages of the same
//     tag are matched in the order they were posted: the k-th send from A to B (send,
//     send_recv or a send of a p2p batch; a batch posts its ops in list order) is received by
//     the k-th recv at B from A, so both ranks must post the messages between them in the
//     same order, with the same counts. p2p uses tag 0 (NCCL has no other). Messages of
//     different communicators (one made by split() included) never match each other, and
//     never match a collective.
//   * Communicators made by split() are used like any other (collectives in the same order on
//     every member). A rank in several groups must issue their ops in an order that cannot
//     deadlock: MPI runs the collectives of all communicators of the process one at a time,
//     in the order issued, on one thread (point-to-point ops do not hold it up); NCCL runs
//     every op of a communicator and of those split from it in the order issued on one
//     stream (point-to-point ops included).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace sat::dist {

// Where this process stands in a job, read from the launcher's environment variables only
// (OpenMPI's mpirun, MPICH/Intel MPI hydra, MVAPICH2, Slurm's srun). A plain `saturate
// train` sees world 1 and an empty launcher, and never needs to initialise MPI.
struct ProcessInfo {
  int rank = 0, world = 1;             // global rank and number of processes
  int local_rank = 0, local_world = 1;  // the same on this node (selects the GPU)
  std::string launcher;                 // "openmpi", "mvapich2", "pmi", "slurm" or "" (none)
  bool distributed() const { return world > 1; }
};
ProcessInfo detect_process();

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

// The communication timeout in seconds (env SAT_COMM_TIMEOUT, default 30; 0 = wait
// forever). Read once.
double comm_timeout_seconds();

// One point-to-point op of a batch (Comm::p2p): send data[0, count) to peer (data is only
// read), or receive count elements from peer into data.
struct P2POp {
  bool send = false;
  void* data = nullptr;
  size_t count = 0;
  int peer = 0;
};

// The bytes a communicator was asked to move, counted by CountingComm (below) per kind of
// op, on this rank. Payload bytes are the size of the op's user buffer, not the bytes on the
// wire (which depend on the backend's algorithm):
//   all_reduce      count * dtype size (the buffer reduced in place)
//   reduce_scatter  the INPUT: size() * recv_count * dtype size
//   all_gather      the OUTPUT: size() * send_count * dtype size
//   broadcast       count * dtype size (on the root and on every other rank alike)
//   p2p             bytes this rank SENT (send, the send half of send_recv, the sends of a p2p
//                   batch); p2p_recv_bytes: the bytes of the receives it posted (their
//                   counts). p2p.calls counts the calls of send, recv, send_recv and p2p (a
//                   batch is one call, the empty batch too).
//   all_to_all      bytes this rank SENT to the others by all_to_all_v (its own block, which
//                   stays on the rank, excluded); all_to_all_recv_bytes: received from others.
// A group of one counts its payload like any other (though nothing leaves the process). The
// textbook traffic per rank of the ring algorithms over n ranks follows from the payload S:
// all_reduce 2 (n-1)/n S, reduce_scatter and all_gather (n-1)/n S each. Only ops that were
// posted count: one refused with sat::Error before anything was posted moves nothing.
struct Traffic {
  struct Counter {
    uint64_t bytes = 0;  // payload bytes, as above
    uint64_t calls = 0;  // number of calls
    bool operator==(const Counter&) const = default;
  };
  Counter all_reduce, reduce_scatter, all_gather, broadcast;
  Counter p2p;                  // bytes sent by this rank
  uint64_t p2p_recv_bytes = 0;  // bytes received by this rank (not part of total())
  Counter all_to_all;           // bytes sent to other ranks by all_to_all_v
  uint64_t all_to_all_recv_bytes = 0;  // received from other ranks (not part of total())
  uint64_t barrier_calls = 0;

  // Payload of every collective plus the p2p and all-to-all bytes sent.
  double total() const;
  Traffic& operator+=(const Traffic& o);
  // Field by field (a per-step delta: traffic after the step - traffic before it).
  Traffic operator-(const Traffic& o) const;
  bool operator==(const Traffic&) const = default;
};

// A handle to a nonblocking op.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the op has completed. Throws sat::Error when the op failed; aborts the
  // job (see above) when it does not complete within the communication timeout.
  virtual void wait() = 0;
  // Whether the op has completed (never blocks; a failed op counts as completed and its
  // error is thrown by wait()).
  virtual bool done() = 0;
  // When a completed op ran (now_seconds() clock: started on the backend, completed), where
  // the backend measures it (MPI's communication thread); false otherwise.
  virtual bool ran(double& t0, double& t1) const { (void)t0, (void)t1; return false; }
};
using WorkPtr = std::unique_ptr<Work>;

// A Work that has already completed (an op with nothing to do).
WorkPtr completed_work();

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* backend_name() const = 0;  // "self", "mpi", "nccl"
  // Where the buffers of the ops live: host memory (self, mpi) or device memory (nccl).
  virtual Device device() const { return Device::cpu; }
  // Whether its ops are ordered on the device's stream (NCCL): the step's compute that
  // follows them needs no wait on the host (and a host wait would break graph capture).
  virtual bool stream_ordered() const { return false; }

  // In place: data[0, count) becomes op over the data of all ranks.
  virtual WorkPtr all_reduce(void* data, size_t count, DType t, ReduceOp op) = 0;
  // send holds size() blocks of recv_count elements; rank r receives in recv the reduction
  // of block r over all ranks. In place when recv == send + rank() * recv_count elements
  // (the rest of send is then clobbered); otherwise send and recv must not overlap.
  virtual WorkPtr reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) = 0;
  // Every rank contributes send_count elements; recv (size() * send_count elements) holds
  // them in rank order on every rank. In place when send == recv + rank() * send_count
  // elements; otherwise send and recv must not overlap.
  virtual WorkPtr all_gather(const void* send, void* recv, size_t send_count, DType t) = 0;
  // data of rank root is copied to every rank.
  virtual WorkPtr broadcast(void* data, size_t count, DType t, int root) = 0;
  // Point to point, matched as the ordering rule at the top of this file says. The NCCL
  // backend has no tags (must be 0) and runs a send and the matching recv only when both are
  // posted: where ranks send to each other at once (a ring, an exchange, a pipeline's
  // forward and backward) post both halves together, with send_recv or p2p.
  virtual WorkPtr send(const void* data, size_t count, DType t, int peer, int tag = 0) = 0;
  virtual WorkPtr recv(void* data, size_t count, DType t, int peer, int tag = 0) = 0;
  virtual WorkPtr send_recv(const void* send_data, size_t send_count, int dst, void* recv_data, size_t recv_count,
                            int src, DType t, int tag = 0) = 0;
  // Posts every op of the batch together (tag 0; NCCL: one group) and returns one Work that
  // completes when all of them have: no order of the ops within a batch can deadlock. An
  // empty batch is complete at once.
  virtual WorkPtr p2p(const std::vector<P2POp>& ops, DType t) = 0;
  // All-to-all with a count per peer (MPI_Alltoallv; the token dispatch and combine of expert
  // parallelism): this rank sends send_counts[p] elements to rank p, read from send at offset
  // send_counts[0] + ... + send_counts[p-1], and receives recv_counts[p] elements from rank p
  // into recv at the same prefix sum of recv_counts. Both lists have size() entries and
  // recv_counts[p] must be what rank p sends here (exchange the counts first, e.g. with an
  // all_to_all_v of one count per peer). A collective: every rank of the communicator calls
  // it, in order with the others. send and recv must not overlap. The default posts one p2p
  // batch (a receive and a send per peer with a non-zero count, itself included: NCCL runs
  // it as one group of send/recv); the MPI backend runs MPI_Alltoallv.
  virtual WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                               const std::vector<size_t>& recv_counts, DType t);
  // Blocks until every rank has entered the barrier (with the watchdog of wait()).
  virtual void barrier() = 0;

  // Collective over this communicator (issued in order with its other collectives): the
  // ranks that pass the same color >= 0 form a new communicator, ranked by key, ties by
  // their rank here. A rank passing color < 0 takes part and gets nullptr. The new
  // communicator has the backend of this one (MPI: the same communication thread and
  // watchdog; NCCL: the same device and stream, bootstrapped over a split of the host
  // communicator) and may outlive this one.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;

  // The bytes this communicator has moved when it counts them (a CountingComm: the groups of
  // a Mesh), nullptr otherwise.
  virtual const Traffic* traffic() const { return nullptr; }

  // Blocking conveniences.
  void all_reduce_sync(void* data, size_t count, DType t, ReduceOp op) { all_reduce(data, count, t, op)->wait(); }
  void broadcast_sync(void* data, size_t count, DType t, int root) { broadcast(data, count, t, root)->wait(); }
};

// One completed op of an observed communicator (CountingComm::observe): what it was, its
// payload (as Traffic counts it), and when it ran (the backend's times where it measures
// them, else from its posting to when its completion was seen).
struct CommEvent {
  const char* op;  // "all_reduce", "reduce_scatter", "all_gather", "broadcast", "send", "recv", "send_recv", "p2p", "all_to_all_v", "barrier"
  size_t bytes = 0;     // the payload as Traffic counts it (point-to-point: the bytes sent)
  size_t received = 0;  // point-to-point: the bytes received
  double t0 = 0, t1 = 0;
};
class CommObserver {
 public:
  virtual ~CommObserver() = default;
  // group: the name the communicator was observed under ("dp", "tp", ...).
  virtual void comm_timed(const std::string& group, const CommEvent& e) = 0;
};

// A communicator that counts the payload of every op (Traffic) and forwards it to the one it
// owns, unchanged (the same Work, the same errors). Its split() counts on its own: the group
// returned is a CountingComm over the inner communicator's split, starting from zero, and its
// ops are not counted here. Counters are plain integers, as a Comm is used from one thread at
// a time.
class CountingComm final : public Comm {
 public:
  explicit CountingComm(std::unique_ptr<Comm> inner);

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* backend_name() const override { return inner_->backend_name(); }
  Device device() const override { return inner_->device(); }
  bool stream_ordered() const override { return inner_->stream_ordered(); }

  WorkPtr all_reduce(void* data, size_t count, DType t, ReduceOp op) override;
  WorkPtr reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) override;
  WorkPtr all_gather(const void* send, void* recv, size_t send_count, DType t) override;
  WorkPtr broadcast(void* data, size_t count, DType t, int root) override;
  WorkPtr send(const void* data, size_t count, DType t, int peer, int tag = 0) override;
  WorkPtr recv(void* data, size_t count, DType t, int peer, int tag = 0) override;
  WorkPtr send_recv(const void* send_data, size_t send_count, int dst, void* recv_data, size_t recv_count, int src,
                    DType t, int tag = 0) override;
  WorkPtr p2p(const std::vector<P2POp>& ops, DType t) override;
  WorkPtr all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                       const std::vector<size_t>& recv_counts, DType t) override;
  void barrier() override;
  std::unique_ptr<Comm> split(int color, int key) override;

  // Never nullptr. (The counters themselves: counts().)
  const Traffic* traffic() const override { return &traffic_; }
  const Traffic& counts() const { return traffic_; }
  void reset_traffic() { traffic_ = Traffic{}; }
  // Tells o of every op from now on, once it has completed (null: none; o must outlive the
  // ops). The Work returned then reports when waited for, found done or destroyed.
  void observe(CommObserver* o, std::string group);
  Comm& inner() { return *inner_; }
  const Comm& inner() const { return *inner_; }

 private:
  WorkPtr watched(WorkPtr w, const char* op, size_t bytes, size_t received = 0);
  std::unique_ptr<Comm> inner_;
  Traffic traffic_;
  CommObserver* observer_ = nullptr;
  std::string group_;
};

// c wrapped in a CountingComm (nullptr stays nullptr).
std::unique_ptr<Comm> counted(std::unique_ptr<Comm> c);

// A world of one process: ops are copies or no-ops. Always available.
std::unique_ptr<Comm> make_self_comm();

// MPI_COMM_WORLD (a duplicate of it, so that several communicators never mix messages).
// Initialises MPI on first use (MPI_Init_thread on the communication thread) and finalises
// it at exit. Throws sat::Error "this saturate was built without MPI" when SAT_HAVE_MPI is 0.
std::unique_ptr<Comm> make_mpi_comm();

// Whether this build has the MPI backend.
bool have_mpi();

// The communicator for this process: MPI when launched by an MPI launcher with world > 1
// (detect_process()), the self communicator otherwise.
std::unique_ptr<Comm> make_world_comm();

// Before an exit with a non-zero status that every rank takes together at the same point
// (a run stopped by a signal, exit 128 + signal): finalises MPI now, once no communicator
// is left, so that the status ends the job as a normal exit, which mpirun and srun pass
// on, instead of the abort that a non-zero exit otherwise triggers. Nothing without MPI.
void finish_job_together();

// Ends the whole job after a fatal error on this rank: MPI_Abort when MPI is initialised
// (so the other ranks do not wait for this one until their watchdog fires), exit(code)
// otherwise. Prints nothing itself. (With glibc, exit() or a return from main with a
// non-zero status does the same once MPI is initialised.)
[[noreturn]] void abort_job(int code);

// Ends the job after an error on this rank before the job communicates (a bad flag, a
// missing file, a layout that does not fit), once this rank has printed its line (message).
// The job's first collective is the verdict on every rank's setup (dist/verdict.h): this
// rank takes its part as a failing rank, so that every rank stops within seconds, the
// others printing this message, and all exit with `code` together. Should the others not
// arrive within `grace` seconds (a command that does not communicate), abort_job(code).
[[noreturn]] void end_job_after_input_error(int code, const std::string& message, double grace = 10);

// The same verdict without ending the process (a library call that failed before its job
// started): true when every rank took it within `grace` seconds (they stop with this rank's
// message). False outside a distributed job, or once MPI has started.
bool report_failure_to_job(const std::string& message, double grace = 10);

// Validation shared by the backends (throws sat::Error naming the op).
void check_dtype(const char* op, DType t, bool reduction);
void check_rank(const char* op, const char* what, int r, int size);
// Every op of a p2p batch: peer in [0, size), a buffer unless count is 0.
void check_p2p_ops(const char* op, const std::vector<P2POp>& ops, int size);
// Both count lists of all_to_all_v have size entries, a buffer where a count is not 0.
void check_all_to_all(const void* send, const std::vector<size_t>& send_counts, const void* recv,
                      const std::vector<size_t>& recv_counts, int size);
// "send to rank 1, recv from rank 3" (the first few ops), for watchdog and error messages.
std::string describe_p2p_ops(const std::vector<P2POp>& ops);

}  // namespace sat::dist
