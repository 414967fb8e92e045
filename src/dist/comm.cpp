// Process detection from the launcher's environment, the self communicator (a world of
// one) and validation shared by the backends.
#include "dist/comm.h"
#include "dist/verdict.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <utility>

#include "core/error.h"
#include "core/timer.h"

namespace sat::dist {

namespace {

// An environment variable as a non-negative int, or -1 when unset. A value that is not a
// number is a broken launcher environment: say which variable.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return -1;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  SAT_CHECK(errno == 0 && end && *end == '\0' && x >= 0 && x <= std::numeric_limits<int>::max(),
            "environment variable ", name, "='", v, "' is not a process count or rank");
  return static_cast<int>(x);
}

// Slurm's per-node task list, "2(x3),1": the number of tasks on node `node` (-1 when the
// string cannot be read).
int slurm_tasks_on_node(const char* list, int node) {
  if (!list) return -1;
  const char* p = list;
  int n = 0;
  while (*p) {
    char* end = nullptr;
    long tasks = std::strtol(p, &end, 10);
    if (end == p) return -1;
    long reps = 1;
    p = end;
    if (*p == '(') {
      if (p[1] != 'x') return -1;
      reps = std::strtol(p + 2, &end, 10);
      if (*end != ')') return -1;
      p = end + 1;
    }
    if (node < n + reps) return static_cast<int>(tasks);
    n += static_cast<int>(reps);
    if (*p == ',') ++p;
  }
  return -1;
}

bool fill(ProcessInfo& info, const char* launcher, const char* rank, const char* world, const char* local_rank,
          const char* local_world) {
  int r = env_int(rank), w = env_int(world);
  if (r < 0 || w < 1) return false;
  SAT_CHECK(r < w, "environment variable ", rank, "=", r, " is not below ", world, "=", w);
  info.rank = r;
  info.world = w;
  int lr = local_rank ? env_int(local_rank) : -1;
  int lw = local_world ? env_int(local_world) : -1;
  // Without the local variables assume one node (local = global): right for the common
  // single-node launch, and the only use is choosing a GPU.
  info.local_rank = lr >= 0 ? lr : r;
  info.local_world = lw >= 1 ? lw : w;
  if (info.local_rank >= info.local_world) info.local_world = info.local_rank + 1;
  info.launcher = launcher;
  return true;
}

class DoneWork final : public Work {
 public:
  void wait() override {}
  bool done() override { return true; }
};

// Completes when every one of its Works has.
class AllWork final : public Work {
 public:
  explicit AllWork(std::vector<WorkPtr> parts) : parts_(std::move(parts)) {}
  void wait() override {
    for (auto& w : parts_) w->wait();
  }
  bool done() override {
    for (auto& w : parts_)
      if (!w->done()) return false;
    return true;
  }

 private:
  std::vector<WorkPtr> parts_;
};

// A world of one. Point-to-point to itself is matched in order of posting: a send with no
// posted recv is buffered (copied), a recv with no buffered send completes when the send
// is posted.
class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend_name() const override { return "self"; }

  WorkPtr all_reduce(void* data, size_t count, DType t, ReduceOp) override {
    check_dtype("all_reduce", t, true);
    SAT_CHECK(data || count == 0, "all_reduce: null buffer");
    return done();  // sum/avg/max/min over one rank: the data itself
  }
  WorkPtr reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp) override {
    check_dtype("reduce_scatter", t, true);
    copy(recv, send, recv_count * dtype_size(t));
    return done();
  }
  WorkPtr all_gather(const void* send, void* recv, size_t send_count, DType t) override {
    check_dtype("all_gather", t, false);
    copy(recv, send, send_count * dtype_size(t));
    return done();
  }
  WorkPtr broadcast(void* data, size_t, DType t, int root) override {
    check_dtype("broadcast", t, false);
    check_rank("broadcast", "root", root, 1);
    (void)data;
    return done();
  }
  WorkPtr send(const void* data, size_t count, DType t, int peer, int tag) override {
    check_dtype("send", t, false);
    check_rank("send", "peer", peer, 1);
    size_t bytes = count * dtype_size(t);
    for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
      auto& r = **it;
      if (r.cancelled || r.tag != tag) continue;
      SAT_CHECK(bytes <= r.bytes, "send of ", bytes, " bytes to self: the matching recv has room for ", r.bytes);
      copy(r.data, data, bytes);
      r.done = true;
      recvs_.erase(it);
      return done();
    }
    const char* p = static_cast<const char*>(data);
    msgs_.push_back({tag, std::vector<char>(p, p + bytes)});
    return done();
  }
  WorkPtr recv(void* data, size_t count, DType t, int peer, int tag) override {
    check_dtype("recv", t, false);
    check_rank("recv", "peer", peer, 1);
    size_t bytes = count * dtype_size(t);
    for (auto it = msgs_.begin(); it != msgs_.end(); ++it) {
      if (it->tag != tag) continue;
      SAT_CHECK(it->data.size() <= bytes, "recv of ", bytes, " bytes from self: the matching send has ",
                it->data.size());
      copy(data, it->data.data(), it->data.size());
      msgs_.erase(it);
      return done();
    }
    auto r = std::make_shared<PendingRecv>();
    r->data = data;
    r->bytes = bytes;
    r->tag = tag;
    recvs_.push_back(r);
    return std::make_unique<RecvWork>(r);
  }
  WorkPtr send_recv(const void* send_data, size_t send_count, int dst, void* recv_data, size_t recv_count, int src,
                    DType t, int tag) override {
    return post("send_recv", {{false, recv_data, recv_count, src}, {true, const_cast<void*>(send_data), send_count, dst}},
                t, tag);
  }
  WorkPtr p2p(const std::vector<P2POp>& ops, DType t) override { return post("p2p", ops, t, 0); }
  void barrier() override {}
  std::unique_ptr<Comm> split(int color, int) override { return color >= 0 ? make_self_comm() : nullptr; }

 private:
  struct Msg {
    int tag;
    std::vector<char> data;
  };
  struct PendingRecv {
    void* data = nullptr;
    size_t bytes = 0;
    int tag = 0;
    bool done = false, cancelled = false;
  };
  class RecvWork final : public Work {
   public:
    explicit RecvWork(std::shared_ptr<PendingRecv> r) : r_(std::move(r)) {}
    ~RecvWork() override { r_->cancelled = !r_->done; }
    void wait() override {
      SAT_CHECK(r_->done, "recv from self (tag ", r_->tag,
                "): no matching send was posted; in a world of one the send must come first or be posted "
                "before waiting");
    }
    bool done() override { return r_->done; }

   private:
    std::shared_ptr<PendingRecv> r_;
  };

  // Posts the ops in list order, each matched as send() and recv() match; the Work completes
  // when every recv of the batch has been matched (by a send of the batch or a later one).
  WorkPtr post(const char* op, const std::vector<P2POp>& ops, DType t, int tag) {
    check_dtype(op, t, false);
    check_p2p_ops(op, ops, 1);
    std::vector<WorkPtr> pending;
    for (const P2POp& o : ops) {
      WorkPtr w = o.send ? send(o.data, o.count, t, o.peer, tag) : recv(o.data, o.count, t, o.peer, tag);
      if (!w->done()) pending.push_back(std::move(w));
    }
    if (pending.empty()) return done();
    return std::make_unique<AllWork>(std::move(pending));
  }

  static WorkPtr done() { return std::make_unique<DoneWork>(); }
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes && dst != src) std::memmove(dst, src, bytes);
  }

  std::deque<Msg> msgs_;
  std::deque<std::shared_ptr<PendingRecv>> recvs_;
};

}  // namespace

ProcessInfo detect_process() {
  ProcessInfo info;
  // OpenMPI (mpirun, and srun with PMIx launching an OpenMPI program).
  if (fill(info, "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
           "OMPI_COMM_WORLD_LOCAL_SIZE"))
    return info;
  if (fill(info, "mvapich2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK",
           "MV2_COMM_WORLD_LOCAL_SIZE"))
    return info;
  // MPICH / Intel MPI hydra.
  if (fill(info, "pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")) return info;
  // PMIx launchers (prterun, OpenMPI 5) without the OMPI variables.
  if (fill(info, "pmix", "PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE")) return info;
  // srun. Only a job step (SLURM_STEP_NUM_TASKS): inside an sbatch script, outside srun,
  // SLURM_NTASKS is the allocation's size while the script itself is one process.
  if (std::getenv("SLURM_STEP_NUM_TASKS") &&
      fill(info, "slurm", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", nullptr)) {
    int node = env_int("SLURM_NODEID");
    int lw = slurm_tasks_on_node(std::getenv("SLURM_STEP_TASKS_PER_NODE"), node < 0 ? 0 : node);
    if (lw > info.local_rank) info.local_world = lw;
    return info;
  }
  return ProcessInfo{};
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
  }
  return "?";
}

double comm_timeout_seconds() {
  static const double t = [] {
    const char* v = std::getenv("SAT_COMM_TIMEOUT");
    if (!v || !*v) return 30.0;
    char* end = nullptr;
    double x = std::strtod(v, &end);
    SAT_CHECK(end && *end == '\0' && x >= 0, "SAT_COMM_TIMEOUT='", v, "' is not a number of seconds (0 = none)");
    return x;
  }();
  return t;
}

void check_dtype(const char* op, DType t, bool reduction) {
  if (!reduction) return;  // data movement works on any dtype (as bytes)
  SAT_CHECK(t == DType::f32 || t == DType::f64 || t == DType::i32 || t == DType::i64, op, ": dtype ",
            dtype_name(t), " cannot be reduced (f32, f64, i32, i64)");
}

void check_rank(const char* op, const char* what, int r, int size) {
  SAT_CHECK(r >= 0 && r < size, op, ": ", what, " rank ", r, " is not in [0, ", size, ")");
}

void check_p2p_ops(const char* op, const std::vector<P2POp>& ops, int size) {
  for (const P2POp& o : ops) {
    check_rank(op, o.send ? "destination" : "source", o.peer, size);
    SAT_CHECK(o.data || o.count == 0, op, ": null buffer for the ", o.count, " elements ",
              o.send ? "sent to" : "received from", " rank ", o.peer);
  }
}

void check_all_to_all(const void* send, const std::vector<size_t>& send_counts, const void* recv,
                      const std::vector<size_t>& recv_counts, int size) {
  SAT_CHECK(send_counts.size() == size_t(size) && recv_counts.size() == size_t(size), "all_to_all_v: ",
            send_counts.size(), " send and ", recv_counts.size(), " receive counts for ", size,
            " ranks (expected one per rank)");
  size_t out = 0, in = 0;
  for (int p = 0; p < size; ++p) out += send_counts[size_t(p)], in += recv_counts[size_t(p)];
  SAT_CHECK((send || out == 0) && (recv || in == 0), "all_to_all_v: null buffer for ", send ? in : out, " elements");
}

WorkPtr Comm::all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                           const std::vector<size_t>& recv_counts, DType t) {
  check_all_to_all(send, send_counts, recv, recv_counts, size());
  const size_t esize = dtype_size(t);
  std::vector<P2POp> ops;
  size_t at = 0;
  for (int p = 0; p < size(); ++p) {  // receives first: a world of one matches its send at once
    if (recv_counts[size_t(p)]) ops.push_back({false, static_cast<char*>(recv) + at * esize, recv_counts[size_t(p)], p});
    at += recv_counts[size_t(p)];
  }
  at = 0;
  for (int p = 0; p < size(); ++p) {
    if (send_counts[size_t(p)])
      ops.push_back({true, const_cast<char*>(static_cast<const char*>(send)) + at * esize, send_counts[size_t(p)], p});
    at += send_counts[size_t(p)];
  }
  return p2p(ops, t);
}

std::string describe_p2p_ops(const std::vector<P2POp>& ops) {
  const size_t shown = 4;
  std::string s;
  for (size_t i = 0; i < ops.size() && i < shown; ++i)
    s += str_cat(i ? ", " : "", ops[i].send ? "send to rank " : "recv from rank ", ops[i].peer);
  if (ops.size() > shown) s += str_cat(" and ", ops.size() - shown, " more");
  return s;
}

WorkPtr completed_work() { return std::make_unique<DoneWork>(); }

// ---- Traffic and CountingComm ----------------------------------------------------------

double Traffic::total() const {
  return double(all_reduce.bytes) + double(reduce_scatter.bytes) + double(all_gather.bytes) + double(broadcast.bytes) +
         double(p2p.bytes) + double(all_to_all.bytes);
}

Traffic& Traffic::operator+=(const Traffic& o) {
  for (auto [a, b] : {std::pair{&all_reduce, &o.all_reduce}, std::pair{&reduce_scatter, &o.reduce_scatter},
                      std::pair{&all_gather, &o.all_gather}, std::pair{&broadcast, &o.broadcast},
                      std::pair{&p2p, &o.p2p}, std::pair{&all_to_all, &o.all_to_all}}) {
    a->bytes += b->bytes;
    a->calls += b->calls;
  }
  p2p_recv_bytes += o.p2p_recv_bytes;
  all_to_all_recv_bytes += o.all_to_all_recv_bytes;
  barrier_calls += o.barrier_calls;
  return *this;
}

Traffic Traffic::operator-(const Traffic& o) const {
  Traffic d = *this;
  for (auto [a, b] : {std::pair{&d.all_reduce, &o.all_reduce}, std::pair{&d.reduce_scatter, &o.reduce_scatter},
                      std::pair{&d.all_gather, &o.all_gather}, std::pair{&d.broadcast, &o.broadcast},
                      std::pair{&d.p2p, &o.p2p}, std::pair{&d.all_to_all, &o.all_to_all}}) {
    a->bytes -= b->bytes;
    a->calls -= b->calls;
  }
  d.p2p_recv_bytes -= o.p2p_recv_bytes;
  d.all_to_all_recv_bytes -= o.all_to_all_recv_bytes;
  d.barrier_calls -= o.barrier_calls;
  return d;
}

namespace {

// Counted once the inner communicator has posted the op (so a refused op counts nothing).
void add(Traffic::Counter& c, size_t bytes) {
  c.bytes += bytes;
  ++c.calls;
}

// The Work of an observed op: the inner one, reporting the op once when it is seen complete.
class ObservedWork final : public Work {
 public:
  ObservedWork(WorkPtr inner, CommObserver* o, const std::string& group, const char* op, size_t bytes, size_t received)
      : inner_(std::move(inner)), o_(o), group_(group), e_{op, bytes, received, now_seconds(), 0} {}
  ~ObservedWork() override {
    try {
      inner_->wait();
      report();
    } catch (...) {
    }
  }
  void wait() override {
    inner_->wait();
    report();
  }
  bool done() override {
    const bool d = inner_->done();
    if (d) report();
    return d;
  }
  bool ran(double& t0, double& t1) const override { return inner_->ran(t0, t1); }

 private:
  void report() {
    if (reported_) return;
    reported_ = true;
    double t0, t1;
    if (inner_->ran(t0, t1)) e_.t0 = t0, e_.t1 = t1;
    else e_.t1 = now_seconds();
    o_->comm_timed(group_, e_);
  }
  WorkPtr inner_;
  CommObserver* o_;
  std::string group_;  // a copy: a Work may outlive its communicator's name
  CommEvent e_;
  bool reported_ = false;
};

}  // namespace

void CountingComm::observe(CommObserver* o, std::string group) {
  observer_ = o;
  group_ = std::move(group);
}

WorkPtr CountingComm::watched(WorkPtr w, const char* op, size_t bytes, size_t received) {
  if (!observer_) return w;
  return std::make_unique<ObservedWork>(std::move(w), observer_, group_, op, bytes, received);
}

CountingComm::CountingComm(std::unique_ptr<Comm> inner) : inner_(std::move(inner)) {
  SAT_CHECK(inner_, "CountingComm: no communicator to count");
}

WorkPtr CountingComm::all_reduce(void* data, size_t count, DType t, ReduceOp op) {
  WorkPtr w = inner_->all_reduce(data, count, t, op);
  add(traffic_.all_reduce, count * dtype_size(t));
  return watched(std::move(w), "all_reduce", count * dtype_size(t));
}

WorkPtr CountingComm::reduce_scatter(const void* send, void* recv, size_t recv_count, DType t, ReduceOp op) {
  WorkPtr w = inner_->reduce_scatter(send, recv, recv_count, t, op);
  add(traffic_.reduce_scatter, size_t(size()) * recv_count * dtype_size(t));
  return watched(std::move(w), "reduce_scatter", size_t(size()) * recv_count * dtype_size(t));
}

WorkPtr CountingComm::all_gather(const void* send, void* recv, size_t send_count, DType t) {
  WorkPtr w = inner_->all_gather(send, recv, send_count, t);
  add(traffic_.all_gather, size_t(size()) * send_count * dtype_size(t));
  return watched(std::move(w), "all_gather", size_t(size()) * send_count * dtype_size(t));
}

WorkPtr CountingComm::broadcast(void* data, size_t count, DType t, int root) {
  WorkPtr w = inner_->broadcast(data, count, t, root);
  add(traffic_.broadcast, count * dtype_size(t));
  return watched(std::move(w), "broadcast", count * dtype_size(t));
}

WorkPtr CountingComm::send(const void* data, size_t count, DType t, int peer, int tag) {
  WorkPtr w = inner_->send(data, count, t, peer, tag);
  add(traffic_.p2p, count * dtype_size(t));
  return watched(std::move(w), "send", count * dtype_size(t));
}

WorkPtr CountingComm::recv(void* data, size_t count, DType t, int peer, int tag) {
  WorkPtr w = inner_->recv(data, count, t, peer, tag);
  add(traffic_.p2p, 0);
  traffic_.p2p_recv_bytes += count * dtype_size(t);
  return watched(std::move(w), "recv", 0, count * dtype_size(t));
}

WorkPtr CountingComm::send_recv(const void* send_data, size_t send_count, int dst, void* recv_data,
                                size_t recv_count, int src, DType t, int tag) {
  WorkPtr w = inner_->send_recv(send_data, send_count, dst, recv_data, recv_count, src, t, tag);
  add(traffic_.p2p, send_count * dtype_size(t));
  traffic_.p2p_recv_bytes += recv_count * dtype_size(t);
  return watched(std::move(w), "send_recv", send_count * dtype_size(t), recv_count * dtype_size(t));
}

WorkPtr CountingComm::p2p(const std::vector<P2POp>& ops, DType t) {
  WorkPtr w = inner_->p2p(ops, t);
  size_t sent = 0, received = 0;
  for (const P2POp& o : ops) (o.send ? sent : received) += o.count * dtype_size(t);
  add(traffic_.p2p, sent);
  traffic_.p2p_recv_bytes += received;
  return watched(std::move(w), "p2p", sent, received);
}

WorkPtr CountingComm::all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                   const std::vector<size_t>& recv_counts, DType t) {
  WorkPtr w = inner_->all_to_all_v(send, send_counts, recv, recv_counts, t);
  size_t sent = 0, received = 0;
  for (int p = 0; p < size(); ++p)
    if (p != rank()) sent += send_counts[size_t(p)] * dtype_size(t), received += recv_counts[size_t(p)] * dtype_size(t);
  add(traffic_.all_to_all, sent);
  traffic_.all_to_all_recv_bytes += received;
  return watched(std::move(w), "all_to_all_v", sent, received);
}

void CountingComm::barrier() {
  const double t0 = now_seconds();
  inner_->barrier();
  ++traffic_.barrier_calls;
  if (observer_) observer_->comm_timed(group_, {"barrier", 0, 0, t0, now_seconds()});
}

std::unique_ptr<Comm> CountingComm::split(int color, int key) { return counted(inner_->split(color, key)); }

std::unique_ptr<Comm> counted(std::unique_ptr<Comm> c) {
  if (!c) return nullptr;
  return std::make_unique<CountingComm>(std::move(c));
}

std::unique_ptr<Comm> make_self_comm() { return std::make_unique<SelfComm>(); }

std::unique_ptr<Comm> make_world_comm() {
  ProcessInfo p = detect_process();
  if (!p.distributed()) return make_self_comm();
  SAT_CHECK(have_mpi(), "launched as rank ", p.rank, " of ", p.world, " (", p.launcher,
            ") but this saturate was built without MPI: apt-get install libopenmpi-dev and rebuild");
  std::unique_ptr<Comm> c = make_mpi_comm();
  // The job's first collective: whether any rank failed before it got here.
  Verdict v;
  agree_on_outcome(*c, nullptr, v);
  if (!v.ok()) stop_with(*c, v, false);
  return c;
}

}  // namespace sat::dist
