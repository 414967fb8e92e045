// The communication layer (src/dist/). Runs as one process (the self communicator, and
// the MPI communicator as a world of one) and, registered by CMake as dist_np2/3/4, under
// mpirun with 2, 3 and 4 processes: every test on the world communicator checks results
// exactly (sums of small integers are exact in float).
//
// Hidden child modes (used by the DistFailure tests, which launch this binary under
// mpirun): SAT_TEST_DIE_RANK=R makes rank R SIGKILL itself in the middle of a loop of
// all-reduces; SAT_TEST_HANG_RANK=R makes rank R stop taking part (it sleeps), so the
// others' watchdog must end the job; SAT_TEST_ABORT_RANK=R makes rank R end the job with
// abort_job(2); SAT_TEST_EXIT_RANK=R makes rank R exit(2), as the CLI does on an error.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "dist/bench_comm.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "dist/mesh.h"
#include "dist/nccl_comm.h"
#include "error_of.h"

using namespace sat;
using namespace sat::dist;

namespace {

// ---- hidden child modes ---------------------------------------------------------------

int env_rank(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : -1;
}

int run_child_mode() {
  int die = env_rank("SAT_TEST_DIE_RANK"), hang = env_rank("SAT_TEST_HANG_RANK");
  int quit = env_rank("SAT_TEST_EXIT_RANK"), abort = env_rank("SAT_TEST_ABORT_RANK");
  if (die < 0 && hang < 0 && quit < 0 && abort < 0) return 0;
  auto c = make_mpi_comm();
  std::vector<float> buf(256 * 1024);
  for (int it = 0; it < 100000; ++it) {
    if (it == 20 && c->rank() == die) {
      std::fprintf(stderr, "test_dist child: SIGKILL to myself (SAT_TEST_DIE_RANK) at unix time %.3f\n",
                   std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
      std::fflush(stderr);
      raise(SIGKILL);
    }
    if (it == 20 && c->rank() == hang) {
      std::fprintf(stderr, "test_dist child: sleeping instead of the all-reduce (SAT_TEST_HANG_RANK)\n");
      std::fflush(stderr);
      std::this_thread::sleep_for(std::chrono::seconds(600));
    }
    if (it == 20 && c->rank() == quit) {
      std::fprintf(stderr, "test_dist child: exit(2) instead of the all-reduce (SAT_TEST_EXIT_RANK)\n");
      std::exit(2);
    }
    if (it == 20 && c->rank() == abort) {
      std::fprintf(stderr, "test_dist child: abort_job(2) instead of the all-reduce (SAT_TEST_ABORT_RANK)\n");
      abort_job(2);
    }
    c->all_reduce_sync(buf.data(), buf.size(), DType::f32, ReduceOp::sum);
  }
  std::exit(0);  // not reached in the failure tests
}
const int g_child_mode = run_child_mode();

// ---- helpers --------------------------------------------------------------------------

// The communicator of the whole test process: MPI when built with it (a world of one when
// not launched by mpirun), the self communicator otherwise.
Comm& world() {
  static std::unique_ptr<Comm> c = [] {
    (void)g_child_mode;
    return have_mpi() ? make_mpi_comm() : make_self_comm();
  }();
  return *c;
}

// Rank-dependent small integers (negative ones too).
int64_t value(int rank, size_t i) { return int64_t((i * 7 + size_t(rank) * 13) % 23) - 7 + rank; }

template <typename T>
DType dtype_of();
template <>
DType dtype_of<float>() { return DType::f32; }
template <>
DType dtype_of<double>() { return DType::f64; }
template <>
DType dtype_of<int32_t>() { return DType::i32; }
template <>
DType dtype_of<int64_t>() { return DType::i64; }

template <typename T>
T expected(ReduceOp op, int n, size_t i) {
  T acc = static_cast<T>(value(0, i));
  for (int r = 1; r < n; ++r) {
    T v = static_cast<T>(value(r, i));
    if (op == ReduceOp::sum || op == ReduceOp::avg) acc = static_cast<T>(acc + v);
    if (op == ReduceOp::max) acc = std::max(acc, v);
    if (op == ReduceOp::min) acc = std::min(acc, v);
  }
  if (op == ReduceOp::avg) acc = static_cast<T>(acc / static_cast<T>(n));
  return acc;
}

const size_t kCounts[] = {0, 1, 7, 1000, 65537};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min};

template <typename T>
void check_all_reduce(Comm& c) {
  for (size_t count : kCounts) {
    for (ReduceOp op : kOps) {
      std::vector<T> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = static_cast<T>(value(c.rank(), i));
      c.all_reduce_sync(buf.data(), count, dtype_of<T>(), op);
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) bad += buf[i] != expected<T>(op, c.size(), i);
      EXPECT_EQ(bad, 0u) << dtype_name(dtype_of<T>()) << " " << reduce_op_name(op) << " count " << count;
    }
  }
}

// A little computation for the caller thread while an op is in flight.
double compute_for(std::chrono::milliseconds ms) {
  auto end = std::chrono::steady_clock::now() + ms;
  double acc = 0;
  while (std::chrono::steady_clock::now() < end)
    for (int i = 1; i < 10000; ++i) acc += std::sqrt(double(i));
  return acc;
}

using sat::test::error_of;

// The sum of v over the ranks of c.
int64_t sum_over(Comm& c, int64_t v) {
  c.all_reduce_sync(&v, 1, DType::i64, ReduceOp::sum);
  return v;
}

// The sum of the world ranks r in [0, n) for which keep(r) holds.
template <typename F>
int64_t sum_ranks(int n, F keep) {
  int64_t s = 0;
  for (int r = 0; r < n; ++r)
    if (keep(r)) s += r;
  return s;
}

struct EnvGuard {
  std::vector<std::pair<std::string, std::string>> saved;
  std::vector<std::string> unset_names;
  explicit EnvGuard(std::initializer_list<const char*> names) {
    for (const char* n : names) {
      const char* v = std::getenv(n);
      if (v)
        saved.emplace_back(n, v);
      else
        unset_names.push_back(n);
      unsetenv(n);
    }
  }
  ~EnvGuard() {
    for (auto& [n, v] : saved) setenv(n.c_str(), v.c_str(), 1);
    for (auto& n : unset_names) unsetenv(n.c_str());
  }
};

}  // namespace

// ---- process detection ----------------------------------------------------------------

TEST(DistProcess, DetectsLaunchersFromEnvironment) {
  EnvGuard g{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
             "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMIX_RANK", "PMIX_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
             "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE"};
  ProcessInfo p = detect_process();
  EXPECT_EQ(p.rank, 0);
  EXPECT_EQ(p.world, 1);
  EXPECT_EQ(p.launcher, "");
  EXPECT_FALSE(p.distributed());

  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
  p = detect_process();
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world, 8);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world, 2);
  EXPECT_EQ(p.launcher, "openmpi");
  setenv("OMPI_COMM_WORLD_RANK", "x", 1);
  EXPECT_THROW(detect_process(), Error);
  setenv("OMPI_COMM_WORLD_RANK", "8", 1);
  EXPECT_THROW(detect_process(), Error);  // rank not below size
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");

  setenv("PMI_RANK", "2", 1);
  setenv("PMI_SIZE", "4", 1);
  p = detect_process();
  EXPECT_EQ(p.launcher, "pmi");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.local_rank, 2);  // no local variables: one node assumed
  EXPECT_EQ(p.local_world, 4);
  unsetenv("PMI_RANK");
  unsetenv("PMI_SIZE");

  // Inside an sbatch script (no job step) Slurm's variables do not make a world.
  setenv("SLURM_PROCID", "0", 1);
  setenv("SLURM_NTASKS", "4", 1);
  EXPECT_EQ(detect_process().world, 1);
  setenv("SLURM_PROCID", "4", 1);
  setenv("SLURM_STEP_NUM_TASKS", "5", 1);
  setenv("SLURM_LOCALID", "1", 1);
  setenv("SLURM_NODEID", "1", 1);
  setenv("SLURM_STEP_TASKS_PER_NODE", "3,2", 1);
  p = detect_process();
  EXPECT_EQ(p.launcher, "slurm");
  EXPECT_EQ(p.rank, 4);
  EXPECT_EQ(p.world, 5);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_world, 2);
  setenv("SLURM_STEP_TASKS_PER_NODE", "2(x2),1", 1);
  EXPECT_EQ(detect_process().local_world, 2);
}

// ---- the self communicator ------------------------------------------------------------

TEST(DistSelf, CollectivesAreCopies) {
  auto c = make_self_comm();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_STREQ(c->backend_name(), "self");
  check_all_reduce<float>(*c);
  check_all_reduce<int64_t>(*c);
  std::vector<int32_t> a{1, 2, 3}, b(3);
  c->reduce_scatter(a.data(), b.data(), 3, DType::i32, ReduceOp::sum)->wait();
  EXPECT_EQ(b, a);
  c->reduce_scatter(b.data(), b.data(), 3, DType::i32, ReduceOp::avg)->wait();  // in place
  EXPECT_EQ(b, a);
  std::fill(b.begin(), b.end(), 0);
  c->all_gather(a.data(), b.data(), 3, DType::i32)->wait();
  EXPECT_EQ(b, a);
  c->all_gather(b.data(), b.data(), 3, DType::i32)->wait();  // in place
  EXPECT_EQ(b, a);
  c->broadcast(a.data(), 3, DType::i32, 0)->wait();
  EXPECT_THROW(c->broadcast(a.data(), 3, DType::i32, 1), Error);
  EXPECT_THROW(c->all_reduce(a.data(), 3, DType::u8, ReduceOp::sum), Error);
  c->barrier();
}

TEST(DistSelf, SendRecvToItselfInOrderPerTag) {
  auto c = make_self_comm();
  int x1 = 1, x2 = 2, x3 = 3, y = 0, z = 0, w = 0;
  c->send(&x1, 1, DType::i32, 0, 5)->wait();
  c->send(&x2, 1, DType::i32, 0, 6)->wait();
  c->send(&x3, 1, DType::i32, 0, 5)->wait();
  c->recv(&y, 1, DType::i32, 0, 6)->wait();
  c->recv(&z, 1, DType::i32, 0, 5)->wait();
  c->recv(&w, 1, DType::i32, 0, 5)->wait();
  EXPECT_EQ(y, 2);
  EXPECT_EQ(z, 1);
  EXPECT_EQ(w, 3);
  // A recv posted first completes when the send arrives.
  auto r = c->recv(&y, 1, DType::i32, 0, 0);
  EXPECT_FALSE(r->done());
  EXPECT_THROW(r->wait(), Error);  // nothing can ever send it
  c->send(&x3, 1, DType::i32, 0, 0);
  EXPECT_TRUE(r->done());
  EXPECT_EQ(y, 3);
  c->send_recv(&x1, 1, 0, &z, 1, 0, DType::i32)->wait();
  EXPECT_EQ(z, 1);
  EXPECT_THROW(c->send(&x1, 1, DType::i32, 1), Error);
}

TEST(DistSelf, P2PBatchesToItself) {
  auto c = make_self_comm();
  int32_t a = 1, b = 2, x = 0, y = 0;
  // The send before its recv in the batch, and the recv before its send.
  c->p2p({{true, &a, 1, 0}, {false, &x, 1, 0}}, DType::i32)->wait();
  EXPECT_EQ(x, 1);
  c->p2p({{false, &y, 1, 0}, {true, &b, 1, 0}}, DType::i32)->wait();
  EXPECT_EQ(y, 2);
  // Several messages in one batch are matched in posting order.
  std::vector<int32_t> s1{1, 2, 3}, s2{4, 5}, r1(3), r2(2);
  c->p2p({{true, s1.data(), 3, 0}, {true, s2.data(), 2, 0}, {false, r1.data(), 3, 0}, {false, r2.data(), 2, 0}},
         DType::i32)
      ->wait();
  EXPECT_EQ(r1, s1);
  EXPECT_EQ(r2, s2);
  // A recv of a batch is matched by a later send, a send of a batch by a later recv.
  auto w = c->p2p({{false, &x, 1, 0}}, DType::i32);
  EXPECT_FALSE(w->done());
  c->send(&b, 1, DType::i32, 0)->wait();
  EXPECT_TRUE(w->done());
  w->wait();
  EXPECT_EQ(x, 2);
  c->p2p({{true, &a, 1, 0}, {true, &b, 0, 0}}, DType::i32)->wait();
  c->recv(&y, 1, DType::i32, 0)->wait();
  EXPECT_EQ(y, 1);
  c->recv(&y, 0, DType::i32, 0)->wait();  // the empty message
  EXPECT_TRUE(c->p2p({}, DType::f32)->done());
  // Bad ops are refused before anything is posted: no message is left buffered.
  EXPECT_NE(error_of([&] { c->p2p({{true, &a, 1, 0}, {true, &a, 1, 1}}, DType::i32); }).find("destination rank 1"),
            std::string::npos);
  EXPECT_THROW(c->p2p({{false, nullptr, 1, 0}}, DType::i32), Error);
  EXPECT_FALSE(c->recv(&y, 1, DType::i32, 0)->done());
}

TEST(DistSelf, SplitAndMeshOfOne) {
  auto c = make_self_comm();
  EXPECT_EQ(c->split(-1, 0), nullptr);
  auto s = c->split(3, 7);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->size(), 1);
  EXPECT_EQ(s->rank(), 0);
  EXPECT_STREQ(s->backend_name(), "self");
  auto ss = s->split(0, 0);
  ASSERT_TRUE(ss);
  EXPECT_EQ(sum_over(*ss, 5), 5);
  Mesh m(*c, 1, 1);
  EXPECT_EQ(m.describe(), "1 rank = dp 1 x tp 1 x pp 1; this rank: dp 0, tp 0, pp 0");
  for (Comm* g : {&m.tp_group(), &m.dp_group(), &m.pp_group(), m.embedding_group()}) {
    ASSERT_TRUE(g);
    EXPECT_EQ(g->size(), 1);
    EXPECT_EQ(sum_over(*g, 7), 7);
  }
  EXPECT_EQ(error_of([&] { Mesh(*c, 2, 1); }),
            "--tp 2 x --pp 1 = 2 does not divide the 1 process of this job (expected a divisor of 1)");
}

// ---- counting the bytes of a communicator (CountingComm) ------------------------------

TEST(DistSelf, CountingCommCountsThePayload) {
  EXPECT_EQ(counted(nullptr), nullptr);
  auto plain = make_self_comm();
  EXPECT_EQ(plain->traffic(), nullptr);  // only a CountingComm counts
  auto c = counted(make_self_comm());
  ASSERT_TRUE(c->traffic());
  const Traffic& t = *c->traffic();
  EXPECT_EQ(t, Traffic{});
  EXPECT_EQ(t.total(), 0.0);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_STREQ(c->backend_name(), "self");
  EXPECT_EQ(c->device(), Device::cpu);

  std::vector<float> f(1000, 1.f);
  c->all_reduce_sync(f.data(), 1000, DType::f32, ReduceOp::sum);
  EXPECT_EQ(f[999], 1.f);  // forwarded: a world of one keeps its data
  EXPECT_EQ(t.all_reduce.bytes, 4000u);
  EXPECT_EQ(t.all_reduce.calls, 1u);
  std::vector<int32_t> a{1, 2, 3}, b(3);
  c->reduce_scatter(a.data(), b.data(), 3, DType::i32, ReduceOp::sum)->wait();  // input: 1 x 3 x 4
  EXPECT_EQ(b, a);
  c->all_gather(a.data(), b.data(), 3, DType::i32)->wait();  // output: 1 x 3 x 4
  c->broadcast_sync(a.data(), 3, DType::i32, 0);
  std::vector<double> d(5, 2.0), e(5);
  c->send(d.data(), 5, DType::f64, 0)->wait();                       // 40 sent
  c->recv(e.data(), 5, DType::f64, 0)->wait();                       // 40 received
  c->send_recv(d.data(), 2, 0, e.data(), 3, 0, DType::f64)->wait();  // 16 sent, 24 received
  c->p2p({{true, d.data(), 4, 0}, {false, e.data(), 4, 0}, {true, d.data(), 1, 0}, {false, e.data(), 1, 0}},
         DType::f64)
      ->wait();  // 40 sent, 40 received
  c->p2p({}, DType::f64)->wait();
  c->barrier();
  c->barrier();
  EXPECT_EQ(e[0], 2.0);
  EXPECT_EQ(t.reduce_scatter.bytes, 12u);
  EXPECT_EQ(t.all_gather.bytes, 12u);
  EXPECT_EQ(t.broadcast.bytes, 12u);
  EXPECT_EQ(t.reduce_scatter.calls + t.all_gather.calls + t.broadcast.calls, 3u);
  EXPECT_EQ(t.p2p.bytes, 40u + 16u + 40u);
  EXPECT_EQ(t.p2p_recv_bytes, 40u + 24u + 40u);
  EXPECT_EQ(t.p2p.calls, 5u);  // send, recv, send_recv and two batches
  EXPECT_EQ(t.barrier_calls, 2u);
  EXPECT_EQ(t.total(), 4000.0 + 3 * 12 + 96);

  // An op refused before it was posted counts nothing.
  Traffic before = t;
  EXPECT_THROW(c->broadcast(a.data(), 3, DType::i32, 1), Error);
  EXPECT_THROW(c->all_reduce(a.data(), 3, DType::u8, ReduceOp::sum), Error);
  EXPECT_THROW(c->p2p({{true, &a[0], 1, 0}, {true, &a[0], 1, 1}}, DType::i32), Error);
  EXPECT_EQ(t, before);

  // Deltas and sums.
  c->all_reduce_sync(f.data(), 10, DType::f32, ReduceOp::max);
  Traffic step = t - before;
  EXPECT_EQ(step.all_reduce.bytes, 40u);
  EXPECT_EQ(step.all_reduce.calls, 1u);
  EXPECT_EQ(step.total(), 40.0);
  EXPECT_EQ(step.p2p.calls + step.barrier_calls + step.p2p_recv_bytes, 0u);
  Traffic sum = before;
  sum += step;
  EXPECT_EQ(sum, t);

  // reset_traffic() and inner().
  auto& cc = static_cast<CountingComm&>(*c);
  EXPECT_EQ(&cc.counts(), &t);
  EXPECT_STREQ(cc.inner().backend_name(), "self");
  EXPECT_EQ(cc.inner().traffic(), nullptr);
  cc.reset_traffic();
  EXPECT_EQ(t, Traffic{});

  // A split counts on its own; color < 0 still gives nullptr.
  EXPECT_EQ(c->split(-1, 0), nullptr);
  auto s = c->split(0, 0);
  ASSERT_TRUE(s && s->traffic());
  EXPECT_EQ(sum_over(*s, 5), 5);
  EXPECT_EQ(s->traffic()->all_reduce.bytes, 8u);
  EXPECT_EQ(t, Traffic{});
}

TEST(DistSelf, MeshOfOneGroupsCount) {
  auto c = make_self_comm();
  Mesh m(*c, 1, 1);
  for (const char* g : {"tp", "dp", "pp", "embedding"}) EXPECT_EQ(m.traffic_of(g), Traffic{}) << g;
  EXPECT_NE(error_of([&] { m.traffic_of("world"); }).find("no group 'world'"), std::string::npos);
  double x[3] = {1, 2, 3};
  m.dp_group().all_reduce_sync(x, 3, DType::f64, ReduceOp::avg);
  m.embedding_group()->all_reduce_sync(x, 1, DType::f64, ReduceOp::sum);
  m.pp_group().broadcast_sync(x, 2, DType::f64, 0);
  ASSERT_TRUE(m.tp_group().traffic());
  EXPECT_EQ(m.tp_group().traffic()->total(), 0.0);
  EXPECT_EQ(m.dp_group().traffic()->all_reduce.bytes, 24u);
  EXPECT_EQ(m.embedding_group()->traffic()->all_reduce.bytes, 8u);
  EXPECT_EQ(m.traffic_of("pp").broadcast.bytes, 16u);
  EXPECT_EQ(m.traffic_of("dp").total(), 24.0);
  EXPECT_EQ(m.traffic_of("embedding").total(), 8.0);
  EXPECT_EQ(c->traffic(), nullptr);  // the world is the caller's and is not wrapped
}

TEST(DistMesh, CheckNamesTheFlagsAndTheWorld) {
  EXPECT_EQ(error_of([] { Mesh::check(4, 1, 3); }),
            "--tp 1 x --pp 3 = 3 does not divide the 4 processes of this job (expected a divisor of 4)");
  EXPECT_EQ(error_of([] { Mesh::check(6, 4, 1); }),
            "--tp 4 x --pp 1 = 4 does not divide the 6 processes of this job (expected a divisor of 6)");
  EXPECT_NE(error_of([] { Mesh::check(4, 0, 1); }).find("--tp 0"), std::string::npos);
  EXPECT_NE(error_of([] { Mesh::check(4, 1, -1); }).find("--pp -1"), std::string::npos);
  for (auto [w, tp, pp] : std::vector<std::tuple<int, int, int>>{{1, 1, 1}, {4, 2, 2}, {6, 3, 2}, {8, 1, 8}, {12, 2, 3}})
    EXPECT_EQ(error_of([&] { Mesh::check(w, tp, pp); }), "") << w << " " << tp << " " << pp;
}

// Context parallelism's place in the order: tp fastest, then cp, then dp, then pp; cp 1 is
// the mesh without it.
TEST(DistMesh, ContextParallelRankArithmetic) {
  EXPECT_EQ(error_of([] { Mesh::check(8, 2, 1, 3); }),
            "--tp 2 x --cp 3 x --pp 1 = 6 does not divide the 8 processes of this job (expected a divisor of 8)");
  EXPECT_NE(error_of([] { Mesh::check(4, 1, 1, 0); }).find("--cp 0"), std::string::npos);
  EXPECT_EQ(error_of([] { Mesh::check(16, 2, 2, 2); }), "");
  const int tp = 2, cp = 2, dp = 3, pp = 2;
  for (int r = 0; r < tp * cp * dp * pp; ++r) {
    const MeshCoords c = mesh_coords(r, tp, dp, cp);
    EXPECT_EQ(c.tp, r % tp);
    EXPECT_EQ(c.cp, r / tp % cp);
    EXPECT_EQ(c.dp, r / (tp * cp) % dp);
    EXPECT_EQ(c.pp, r / (tp * cp * dp));
    EXPECT_EQ(mesh_rank(c, tp, dp, cp), r);
    EXPECT_EQ(mesh_coords(r, tp, dp * cp), (MeshCoords{c.tp, c.cp + cp * c.dp, c.pp, 0})) << "cp 1: as before";
  }
}

TEST(DistSelf, BenchRowsAreOk) {
  auto c = make_self_comm();
  BenchCommOptions o;
  o.min_bytes = 4;
  o.max_bytes = 1 << 16;
  o.step = 4;
  o.iters = 2;
  o.warmup = 1;
  std::ostringstream os;
  auto rows = bench_comm(*c, o, os);
  ASSERT_EQ(rows.size(), 8u);  // 4 B .. 64 KiB by 4
  for (auto& r : rows) {
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.count * 4, r.bytes);
    EXPECT_EQ(r.busbw_gbs, 0.0);  // one rank moves nothing
  }
  EXPECT_NE(os.str().find("busbw"), std::string::npos);
  EXPECT_EQ(os.str().find("WRONG"), std::string::npos);
}

// The fits recover the latency and bandwidth of timings made from the models themselves.
TEST(DistSelf, FitsRecoverAlphaAndBeta) {
  const double alpha = 7e-6, beta = 3e9;
  for (int n : {2, 4, 8}) {
    std::vector<BenchCommRow> rows;
    for (size_t bytes = 64; bytes <= (size_t(4) << 20); bytes *= 4) {
      BenchCommRow r;
      r.bytes = bytes;
      r.time_us = 1e6 * (2.0 * (n - 1) * alpha + 2.0 * (n - 1) / n * double(bytes) / beta);
      rows.push_back(r);
    }
    const AlphaBeta ab = fit_ring_all_reduce(rows, n);
    EXPECT_NEAR(ab.alpha, alpha, 1e-3 * alpha) << n;
    EXPECT_NEAR(ab.beta, beta, 1e-3 * beta) << n;
  }
  std::vector<BenchP2PRow> p2p;
  for (size_t bytes : {8, 4096, 1 << 20}) p2p.push_back({bytes, 1e6 * (alpha + double(bytes) / beta), 0, true});
  const AlphaBeta ab = fit_p2p(p2p);
  EXPECT_NEAR(ab.alpha, alpha, 1e-3 * alpha);
  EXPECT_NEAR(ab.beta, beta, 1e-3 * beta);
  // No latency to see (time proportional to size): alpha 0, beta still fitted.
  for (auto& r : p2p) r.time_us = 1e6 * double(r.bytes) / beta;
  const AlphaBeta none = fit_p2p(p2p);
  EXPECT_EQ(none.alpha, 0.0);
  EXPECT_NEAR(none.beta, beta, 1e-6 * beta);
  // Times that shrink with size (noise on a loaded host): no slope to fit, so the
  // bandwidth is the best rate seen, a lower bound, never zero.
  std::vector<BenchP2PRow> noisy = {{64, 50.0, 0, true}, {4096, 40.0, 0, true}, {1 << 18, 30.0, 0, true}};
  EXPECT_NEAR(fit_p2p(noisy).beta, double(1 << 18) / 30e-6, 1e-6 * double(1 << 18) / 30e-6);
  EXPECT_NE(error_of([&] { fit_p2p({p2p[0]}); }).find("at least two message sizes"), std::string::npos);
  EXPECT_NE(error_of([&] { fit_ring_all_reduce({}, 1); }).find("2 ranks or more"), std::string::npos);
}

TEST(DistSelf, PointToPointNeedsTwoRanks) {
  auto c = make_self_comm();
  std::ostringstream os;
  EXPECT_NE(error_of([&] { bench_p2p(*c, BenchCommOptions{}, os); }).find("needs 2 ranks or more"), std::string::npos);
}

TEST(DistSelf, WithoutMpiTheMpiCommunicatorSaysSo) {
  if (have_mpi()) GTEST_SKIP() << "built with MPI";
  try {
    make_mpi_comm();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("built without MPI"), std::string::npos);
  }
}

// ---- the world communicator (MPI; every rank runs these) -------------------------------

TEST(Dist, WorldMatchesLauncher) {
  Comm& c = world();
  ProcessInfo p = detect_process();
  if (have_mpi()) {
    EXPECT_STREQ(c.backend_name(), "mpi");
    EXPECT_EQ(c.size(), p.world);
    EXPECT_EQ(c.rank(), p.rank);
  }
  int n = c.size();
  int32_t ranks = c.rank();
  c.all_reduce_sync(&ranks, 1, DType::i32, ReduceOp::sum);
  EXPECT_EQ(ranks, n * (n - 1) / 2);
}

TEST(Dist, AllReduceEveryDtypeOpAndSize) {
  Comm& c = world();
  check_all_reduce<float>(c);
  check_all_reduce<double>(c);
  check_all_reduce<int32_t>(c);
  check_all_reduce<int64_t>(c);
}

TEST(Dist, NonblockingOpsProgressWhileTheCallerComputes) {
  Comm& c = world();
  const size_t n = 1 << 20;  // 4 MiB
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = float(value(c.rank(), i));
    b[i] = float(value(c.rank(), i + 1));
  }
  auto wa = c.all_reduce(a.data(), n, DType::f32, ReduceOp::sum);
  auto wb = c.all_reduce(b.data(), n, DType::f32, ReduceOp::max);
  // The caller makes no communication call: the ops must complete on their own.
  double acc = 0;
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!(wa->done() && wb->done()) && std::chrono::steady_clock::now() < until)
    acc += compute_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(wa->done() && wb->done()) << "nonblocking all-reduces made no progress without wait() " << acc;
  wb->wait();  // any order
  wa->wait();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    bad += a[i] != expected<float>(ReduceOp::sum, c.size(), i);
    bad += b[i] != expected<float>(ReduceOp::max, c.size(), i + 1);
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Dist, ManyOpsInFlightCompleteInOrder) {
  Comm& c = world();
  const int k = 16;
  std::vector<std::vector<int64_t>> bufs(k);
  std::vector<WorkPtr> works;
  for (int j = 0; j < k; ++j) {
    bufs[j].assign(size_t(100 + j), value(c.rank(), size_t(j)));
    works.push_back(c.all_reduce(bufs[j].data(), bufs[j].size(), DType::i64, ReduceOp::sum));
  }
  works.back()->wait();
  for (int j = 0; j < k; ++j) EXPECT_TRUE(works[j]->done()) << j;  // FIFO: the last done means all done
  for (int j = 0; j < k; ++j)
    for (int64_t v : bufs[j]) ASSERT_EQ(v, expected<int64_t>(ReduceOp::sum, c.size(), size_t(j)));
}

TEST(Dist, DroppedWorkHandleStillCompletes) {
  Comm& c = world();
  std::vector<int32_t> a(1000, c.rank() + 1);
  c.all_reduce(a.data(), a.size(), DType::i32, ReduceOp::sum);  // handle dropped: its destructor waits
  for (int32_t v : a) ASSERT_EQ(v, c.size() * (c.size() + 1) / 2);
}

TEST(Dist, ReduceScatterAllGatherRoundTrip) {
  Comm& c = world();
  const int n = c.size();
  for (size_t block : {size_t(0), size_t(1), size_t(5), size_t(1023)}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      std::vector<float> send(block * size_t(n)), part(block), full(block * size_t(n), -1.f);
      for (size_t i = 0; i < send.size(); ++i) send[i] = float(value(c.rank(), i));
      c.reduce_scatter(send.data(), part.data(), block, DType::f32, op)->wait();
      size_t bad = 0;
      for (size_t i = 0; i < block; ++i) bad += part[i] != expected<float>(op, n, size_t(c.rank()) * block + i);
      EXPECT_EQ(bad, 0u) << "reduce_scatter " << reduce_op_name(op) << " block " << block;
      c.all_gather(part.data(), full.data(), block, DType::f32)->wait();
      bad = 0;
      for (size_t i = 0; i < full.size(); ++i) bad += full[i] != expected<float>(op, n, i);
      EXPECT_EQ(bad, 0u) << "all_gather after reduce_scatter " << reduce_op_name(op) << " block " << block;
    }
    // In place, as ZeRO-1 uses it: the reduced block lands at the rank's own place.
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      std::vector<float> buf(block * size_t(n));
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(value(c.rank(), i));
      float* mine = buf.data() + size_t(c.rank()) * block;
      c.reduce_scatter(buf.data(), mine, block, DType::f32, op)->wait();
      size_t bad = 0;
      for (size_t i = 0; i < block; ++i) bad += mine[i] != expected<float>(op, n, size_t(c.rank()) * block + i);
      EXPECT_EQ(bad, 0u) << "in-place reduce_scatter " << reduce_op_name(op) << " block " << block;
    }
    // In place: each rank's block already sits at its place in the output.
    std::vector<int64_t> inplace(block * size_t(n), -1);
    for (size_t i = 0; i < block; ++i) inplace[size_t(c.rank()) * block + i] = value(c.rank(), i);
    c.all_gather(inplace.data() + size_t(c.rank()) * block, inplace.data(), block, DType::i64)->wait();
    size_t bad = 0;
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < block; ++i) bad += inplace[size_t(r) * block + i] != value(r, i);
    EXPECT_EQ(bad, 0u) << "in-place all_gather block " << block;
  }
}

TEST(Dist, BroadcastFromFirstAndLastRank) {
  Comm& c = world();
  for (int root : {0, c.size() - 1}) {
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(100003)}) {
      std::vector<double> d(count);
      std::vector<uint8_t> u(count);
      for (size_t i = 0; i < count; ++i) {
        d[i] = double(value(c.rank(), i));
        u[i] = uint8_t(value(c.rank(), i) + 50);
      }
      auto w1 = c.broadcast(d.data(), count, DType::f64, root);
      auto w2 = c.broadcast(u.data(), count, DType::u8, root);
      w1->wait();
      w2->wait();
      size_t bad = 0;
      for (size_t i = 0; i < count; ++i) {
        bad += d[i] != double(value(root, i));
        bad += u[i] != uint8_t(value(root, i) + 50);
      }
      EXPECT_EQ(bad, 0u) << "root " << root << " count " << count;
    }
  }
  EXPECT_THROW(c.broadcast(nullptr, 0, DType::f32, c.size()), Error);
}

TEST(Dist, SendRecvRing) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  for (size_t count : {size_t(0), size_t(1), size_t(9), size_t(300000)}) {
    std::vector<int32_t> out(count), in(count, -1), in2(count, -1);
    for (size_t i = 0; i < count; ++i) out[i] = int32_t(value(r, i));
    // Separate send and recv, both posted before either is waited for.
    auto ws = c.send(out.data(), count, DType::i32, next, 3);
    auto wr = c.recv(in.data(), count, DType::i32, prev, 3);
    wr->wait();
    ws->wait();
    // The combined exchange, the other way round the ring.
    c.send_recv(out.data(), count, prev, in2.data(), count, next, DType::i32, 4)->wait();
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      bad += in[i] != int32_t(value(prev, i));
      bad += in2[i] != int32_t(value(next, i));
    }
    EXPECT_EQ(bad, 0u) << "count " << count;
  }
  // Tags: two messages to the same peer, received in the opposite order of sending.
  int64_t a = 100 + r, b = 200 + r, x = 0, y = 0;
  auto s1 = c.send(&a, 1, DType::i64, next, 1);
  auto s2 = c.send(&b, 1, DType::i64, next, 2);
  auto r2 = c.recv(&y, 1, DType::i64, prev, 2);
  auto r1 = c.recv(&x, 1, DType::i64, prev, 1);
  r1->wait();
  r2->wait();
  s1->wait();
  s2->wait();
  EXPECT_EQ(x, 100 + prev);
  EXPECT_EQ(y, 200 + prev);
}

TEST(Dist, BarrierAndASecondCommunicator) {
  Comm& c = world();
  for (int i = 0; i < 5; ++i) c.barrier();
  if (!have_mpi()) return;
  auto c2 = make_mpi_comm();
  EXPECT_EQ(c2->size(), c.size());
  EXPECT_EQ(c2->rank(), c.rank());
  // Interleaved ops on the two communicators do not mix.
  int32_t x = c.rank(), y = 10 * c.rank();
  auto w1 = c.all_reduce(&x, 1, DType::i32, ReduceOp::max);
  auto w2 = c2->all_reduce(&y, 1, DType::i32, ReduceOp::sum);
  w2->wait();
  w1->wait();
  EXPECT_EQ(x, c.size() - 1);
  EXPECT_EQ(y, 10 * c.size() * (c.size() - 1) / 2);
}

// ---- groups: Comm::split --------------------------------------------------------------

TEST(Dist, SplitSizesAndRanks) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  // Even and odd ranks.
  auto parity = c.split(r % 2, r);
  ASSERT_TRUE(parity);
  EXPECT_STREQ(parity->backend_name(), c.backend_name());
  EXPECT_EQ(parity->size(), r % 2 ? n / 2 : (n + 1) / 2);
  EXPECT_EQ(parity->rank(), r / 2);
  EXPECT_EQ(sum_over(*parity, r), sum_ranks(n, [&](int q) { return q % 2 == r % 2; }));
  // Ordered by key, reversed; equal keys keep the order of the ranks.
  auto reversed = c.split(0, n - 1 - r);
  ASSERT_TRUE(reversed);
  EXPECT_EQ(reversed->size(), n);
  EXPECT_EQ(reversed->rank(), n - 1 - r);
  auto tied = c.split(5, 0);
  ASSERT_TRUE(tied);
  EXPECT_EQ(tied->rank(), r);
  // color < 0 takes part in the split but gets no communicator.
  auto rest = c.split(r == 0 ? -1 : 1, r);
  if (r == 0) {
    EXPECT_EQ(rest, nullptr);
  } else {
    ASSERT_TRUE(rest);
    EXPECT_EQ(rest->size(), n - 1);
    EXPECT_EQ(rest->rank(), r - 1);
    EXPECT_EQ(sum_over(*rest, r), int64_t(n) * (n - 1) / 2);
  }
  // A split of a split: the reversed world by parity of its rank; then each of those groups
  // split again by key reversed.
  auto sub = reversed->split(reversed->rank() % 2, reversed->rank());
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->rank(), (n - 1 - r) / 2);
  EXPECT_EQ(sum_over(*sub, r), sum_ranks(n, [&](int q) { return (n - 1 - q) % 2 == (n - 1 - r) % 2; }));
  auto subsub = sub->split(0, -sub->rank());
  ASSERT_TRUE(subsub);
  EXPECT_EQ(subsub->size(), sub->size());
  EXPECT_EQ(subsub->rank(), sub->size() - 1 - sub->rank());
  subsub->barrier();
  // A split communicator outlives the one it was split from.
  reversed.reset();
  sub.reset();
  EXPECT_EQ(sum_over(*subsub, 1), subsub->size());
}

TEST(Dist, SiblingGroupsDoNotMix) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  auto parity = c.split(r % 2, r);                  // even and odd ranks
  auto halves = c.split(2 * r < n ? 0 : 1, r);      // lower and upper half
  ASSERT_TRUE(parity && halves);
  // All-reduces on the even and the odd group, on the halves and on the world in flight at
  // once, each with its own values.
  const size_t count = 10000;
  std::vector<int64_t> a(count), b(count), w(count);
  for (size_t i = 0; i < count; ++i) {
    a[i] = value(r, i);
    b[i] = 1000 + value(r, i);
    w[i] = -value(r, i);
  }
  auto wa = parity->all_reduce(a.data(), count, DType::i64, ReduceOp::sum);
  auto wb = halves->all_reduce(b.data(), count, DType::i64, ReduceOp::sum);
  auto ww = c.all_reduce(w.data(), count, DType::i64, ReduceOp::sum);
  ww->wait();
  wb->wait();
  wa->wait();
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    int64_t ea = 0, eb = 0, ew = 0;
    for (int q = 0; q < n; ++q) {
      if (q % 2 == r % 2) ea += value(q, i);
      if ((2 * q < n) == (2 * r < n)) eb += 1000 + value(q, i);
      ew -= value(q, i);
    }
    bad += (a[i] != ea) + (b[i] != eb) + (w[i] != ew);
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Dist, P2POnASplitWhileTheWorldIsUsed) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // The reversed world: its next rank is the world's previous one, so both rings move
  // messages of tag 0 between the same pairs of processes at the same time.
  auto rev = c.split(0, n - 1 - r);
  ASSERT_TRUE(rev);
  const int rn = rev->size(), rr = rev->rank();
  const size_t count = 5000;
  std::vector<int32_t> out_w(count), out_s(count), in_w(count, -1), in_s(count, -1);
  for (size_t i = 0; i < count; ++i) {
    out_w[i] = int32_t(value(r, i));
    out_s[i] = int32_t(-1000 - value(r, i));
  }
  auto w1 = c.p2p({{true, out_w.data(), count, next}, {false, in_w.data(), count, prev}}, DType::i32);
  auto w2 = rev->p2p({{true, out_s.data(), count, (rr + 1) % rn}, {false, in_s.data(), count, (rr + rn - 1) % rn}},
                     DType::i32);
  int64_t x = r;
  auto w3 = c.all_reduce(&x, 1, DType::i64, ReduceOp::sum);
  w3->wait();
  w2->wait();
  w1->wait();
  EXPECT_EQ(x, int64_t(n) * (n - 1) / 2);
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    bad += in_w[i] != int32_t(value(prev, i));
    bad += in_s[i] != int32_t(-1000 - value(next, i));  // the reversed ring's previous is the world's next
  }
  EXPECT_EQ(bad, 0u);
}

// ---- batched point-to-point --------------------------------------------------------------

TEST(Dist, P2PRingInOneBatch) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // Every rank sends before it receives: with blocking sends this would deadlock.
  for (size_t count : {size_t(0), size_t(1), size_t(1000), size_t(1) << 20}) {  // up to 4 MiB
    std::vector<float> out(count), in(count, -1.f), back(count, -1.f);
    for (size_t i = 0; i < count; ++i) out[i] = float(value(r, i));
    c.p2p({{true, out.data(), count, next}, {false, in.data(), count, prev}}, DType::f32)->wait();
    // The other way round the ring, the recv listed first.
    c.p2p({{false, back.data(), count, next}, {true, out.data(), count, prev}}, DType::f32)->wait();
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) bad += (in[i] != float(value(prev, i))) + (back[i] != float(value(next, i)));
    EXPECT_EQ(bad, 0u) << "count " << count;
  }
}

TEST(Dist, P2PMessagesToOnePeerArriveInPostingOrder) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  const size_t sizes[] = {3, 1000, 0, 1, 70000};
  const int k = 5;
  // Message j carries value(sender, i) + 1000 j: a message received out of order shows.
  std::vector<std::vector<int64_t>> out(k), in(k);
  std::vector<P2POp> sends, recvs;
  for (int j = 0; j < k; ++j) {
    out[j].resize(sizes[j]);
    in[j].assign(sizes[j], -1);
    for (size_t i = 0; i < sizes[j]; ++i) out[j][i] = value(r, i) + 1000 * j;
    sends.push_back({true, out[j].data(), sizes[j], next});
    recvs.push_back({false, in[j].data(), sizes[j], prev});
  }
  // All sends in one batch, received by two batches: the first two messages with the sends
  // (odd ranks list them first), the rest in a second batch posted before either is waited for.
  std::vector<P2POp> first(recvs.begin(), recvs.begin() + 2), second(recvs.begin() + 2, recvs.end());
  first.insert(r % 2 ? first.end() : first.begin(), sends.begin(), sends.end());
  auto w1 = c.p2p(first, DType::i64);
  auto w2 = c.p2p(second, DType::i64);
  w2->wait();
  w1->wait();
  size_t bad = 0;
  for (int j = 0; j < k; ++j)
    for (size_t i = 0; i < sizes[j]; ++i) bad += in[j][i] != value(prev, i) + 1000 * j;
  EXPECT_EQ(bad, 0u);

  // Across calls too: send(), then two batches, all in flight before any wait; the
  // receiver takes them with a batch, then recv().
  int64_t m1 = 10 + r, m2 = 20 + r, m3 = 30 + r, x1 = 0, x2 = 0, x3 = 0;
  auto s1 = c.send(&m1, 1, DType::i64, next);
  auto b1 = c.p2p({{true, &m2, 1, next}, {false, &x1, 1, prev}}, DType::i64);
  auto b2 = c.p2p({{false, &x2, 1, prev}, {true, &m3, 1, next}}, DType::i64);
  auto rv = c.recv(&x3, 1, DType::i64, prev);
  rv->wait();
  b2->wait();
  b1->wait();
  s1->wait();
  EXPECT_EQ(x1, 10 + prev);
  EXPECT_EQ(x2, 20 + prev);
  EXPECT_EQ(x3, 30 + prev);
}

TEST(Dist, P2PPipelineForwardAndBackward) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  // A chain of stages as pipeline 1F1B runs it: stage r sends its activation to r + 1 and
  // receives the gradient from it, in the same batch as it receives the activation of r - 1
  // and sends that stage its gradient. The two ranks of a pair send to each other at once.
  const size_t act = 777, grad = 1000;
  for (int step = 0; step < 3; ++step) {
    std::vector<float> act_out(act), act_in(act, -1.f), grad_out(grad), grad_in(grad, -1.f);
    for (size_t i = 0; i < act; ++i) act_out[i] = float(value(r, i) + step);
    for (size_t i = 0; i < grad; ++i) grad_out[i] = float(-value(r, i) - step);
    std::vector<P2POp> ops;
    if (r + 1 < n) {
      ops.push_back({true, act_out.data(), act, r + 1});
      ops.push_back({false, grad_in.data(), grad, r + 1});
    }
    if (r > 0) {
      ops.push_back({false, act_in.data(), act, r - 1});
      ops.push_back({true, grad_out.data(), grad, r - 1});
    }
    auto w = c.p2p(ops, DType::f32);
    if (ops.empty()) {
      EXPECT_TRUE(w->done());
    }
    w->wait();
    size_t bad = 0;
    if (r > 0)
      for (size_t i = 0; i < act; ++i) bad += act_in[i] != float(value(r - 1, i) + step);
    if (r + 1 < n)
      for (size_t i = 0; i < grad; ++i) bad += grad_in[i] != float(-value(r + 1, i) - step);
    EXPECT_EQ(bad, 0u) << "step " << step;
  }
}

// all_to_all_v: rank r sends count(r, p) = (r + 2 p) % 3 + (p == 1 ? 0 : 1) elements to rank
// p (some zero), each naming its sender, receiver and index; on the world (MPI_Alltoallv),
// on the counted world split by parity, on the same split seen through the base class's p2p
// batch, as f32 and as bf16 (bytes).
namespace {
size_t a2a_count(int from, int to) { return size_t((from + 2 * to) % 3 + (to == 1 ? 0 : 1)); }
float a2a_value(int from, int to, size_t i) { return float(1000 * from + 10 * to) + float(i); }

// The default (one p2p batch) of any communicator, reached past a backend's own all_to_all_v.
class P2PAllToAll final : public Comm {
 public:
  explicit P2PAllToAll(Comm& c) : c_(c) {}
  int rank() const override { return c_.rank(); }
  int size() const override { return c_.size(); }
  const char* backend_name() const override { return c_.backend_name(); }
  WorkPtr all_reduce(void* d, size_t n, DType t, ReduceOp op) override { return c_.all_reduce(d, n, t, op); }
  WorkPtr reduce_scatter(const void* s, void* r, size_t n, DType t, ReduceOp op) override { return c_.reduce_scatter(s, r, n, t, op); }
  WorkPtr all_gather(const void* s, void* r, size_t n, DType t) override { return c_.all_gather(s, r, n, t); }
  WorkPtr broadcast(void* d, size_t n, DType t, int root) override { return c_.broadcast(d, n, t, root); }
  WorkPtr send(const void* d, size_t n, DType t, int p, int tag) override { return c_.send(d, n, t, p, tag); }
  WorkPtr recv(void* d, size_t n, DType t, int p, int tag) override { return c_.recv(d, n, t, p, tag); }
  WorkPtr send_recv(const void* s, size_t sn, int dst, void* r, size_t rn, int src, DType t, int tag) override {
    return c_.send_recv(s, sn, dst, r, rn, src, t, tag);
  }
  WorkPtr p2p(const std::vector<P2POp>& ops, DType t) override { return c_.p2p(ops, t); }
  void barrier() override { c_.barrier(); }
  std::unique_ptr<Comm> split(int color, int key) override { return c_.split(color, key); }

 private:
  Comm& c_;
};

void check_all_to_all_v(Comm& c, DType t) {
  const int n = c.size(), r = c.rank();
  std::vector<size_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
  std::vector<float> send, want;
  for (int p = 0; p < n; ++p) {
    sc[size_t(p)] = a2a_count(r, p), rc[size_t(p)] = a2a_count(p, r);
    for (size_t i = 0; i < sc[size_t(p)]; ++i) send.push_back(a2a_value(r, p, i));
    for (size_t i = 0; i < rc[size_t(p)]; ++i) want.push_back(a2a_value(p, r, i));
  }
  std::vector<float> got(want.size() + 1, -1.f);
  if (t == DType::f32) {
    c.all_to_all_v(send.data(), sc, got.data(), rc, t)->wait();
  } else {  // bf16: the values above are exact in bf16 only when small, so compare bytes
    std::vector<uint16_t> s16(send.size()), g16(want.size() + 1, 0xFFFF);
    for (size_t i = 0; i < send.size(); ++i) s16[i] = uint16_t(i * 7 + size_t(r));
    // receive what each peer's formula gives: recompute the peer's block values
    c.all_to_all_v(s16.data(), sc, g16.data(), rc, t)->wait();
    size_t at = 0;
    for (int p = 0; p < n; ++p) {
      size_t off = 0;  // where rank p's block for r starts in p's send buffer
      for (int q = 0; q < r; ++q) off += a2a_count(p, q);
      for (size_t i = 0; i < rc[size_t(p)]; ++i, ++at) EXPECT_EQ(g16[at], uint16_t((off + i) * 7 + size_t(p)));
    }
    EXPECT_EQ(g16.back(), 0xFFFF) << "wrote past the received elements";
    return;
  }
  EXPECT_EQ(got.back(), -1.f) << "wrote past the received elements";
  got.pop_back();
  EXPECT_EQ(got, want) << c.backend_name() << " rank " << r << " of " << n;
}
}  // namespace

TEST(Dist, AllToAllVWithCountsPerPeer) {
  Comm& c = world();
  check_all_to_all_v(c, DType::f32);
  check_all_to_all_v(c, DType::bf16);
  auto half = counted(c.split(c.rank() % 2, c.rank()));
  ASSERT_TRUE(half);
  check_all_to_all_v(*half, DType::f32);
  // Counted: the f32 call's bytes to and from the others (not the rank's own block).
  const Traffic t = *half->traffic();
  P2PAllToAll batch(*half);  // (counted as the p2p batches it posts)
  check_all_to_all_v(batch, DType::f32);
  check_all_to_all_v(batch, DType::bf16);
  size_t sent = 0, received = 0;
  for (int p = 0; p < half->size(); ++p)
    if (p != half->rank()) sent += a2a_count(half->rank(), p) * 4, received += a2a_count(p, half->rank()) * 4;
  EXPECT_EQ(t.all_to_all.calls, 1u);
  EXPECT_EQ(t.all_to_all.bytes, sent);
  EXPECT_EQ(t.all_to_all_recv_bytes, received);
  EXPECT_EQ(t.total(), double(sent));
  // The wrong number of counts is refused before anything is posted (every rank alike).
  std::vector<size_t> few(size_t(c.size()) + 1, 0);
  std::vector<float> x(1);
  EXPECT_THROW(c.all_to_all_v(x.data(), few, x.data(), few, DType::f32), Error);
}

TEST(Dist, P2PValidation) {
  Comm& c = world();
  const int n = c.size();
  float x = 0;
  EXPECT_TRUE(c.p2p({}, DType::f32)->done());
  EXPECT_NE(error_of([&] { c.p2p({{true, &x, 1, n}}, DType::f32); }).find("destination rank " + std::to_string(n)),
            std::string::npos);
  EXPECT_NE(error_of([&] { c.p2p({{false, &x, 1, -1}}, DType::f32); }).find("source rank -1"), std::string::npos);
  EXPECT_NE(error_of([&] { c.p2p({{false, nullptr, 4, 0}}, DType::f32); }).find("null buffer"), std::string::npos);
  c.barrier();  // nothing was posted: the ranks are still in step
}

// ---- the process mesh ------------------------------------------------------------------

TEST(Dist, MeshEveryLayout) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  for (int tp = 1; tp <= n; ++tp) {
    for (int pp = 1; pp <= n; ++pp) {
      if (n % (tp * pp)) continue;
      Mesh m(c, tp, pp);
      SCOPED_TRACE(m.describe());
      const int dp = n / (tp * pp);
      EXPECT_EQ(m.size(), n);
      EXPECT_EQ(m.rank(), r);
      EXPECT_EQ(&m.world(), &c);
      EXPECT_EQ(m.tp(), tp);
      EXPECT_EQ(m.pp(), pp);
      EXPECT_EQ(m.dp(), dp);
      // Tensor-parallel rank fastest, then data-parallel, then pipeline.
      EXPECT_EQ(m.tp_rank(), r % tp);
      EXPECT_EQ(m.dp_rank(), r / tp % dp);
      EXPECT_EQ(m.pp_rank(), r / (tp * dp));
      EXPECT_EQ(m.describe(), str_cat(n, n == 1 ? " rank" : " ranks", " = dp ", dp, " x tp ", tp, " x pp ", pp,
                                      "; this rank: dp ", m.dp_rank(), ", tp ", m.tp_rank(), ", pp ", m.pp_rank()));
      std::vector<int> seen(size_t(n), 0);
      for (int p = 0; p < pp; ++p)
        for (int d = 0; d < dp; ++d)
          for (int t = 0; t < tp; ++t) {
            int g = m.global_rank(t, d, p);
            ASSERT_TRUE(g >= 0 && g < n) << g;
            ++seen[size_t(g)];
            EXPECT_EQ(g, t + tp * (d + dp * p));
          }
      EXPECT_EQ(seen, std::vector<int>(size_t(n), 1));
      EXPECT_THROW(m.global_rank(tp, 0, 0), Error);
      EXPECT_THROW(m.global_rank(0, dp, 0), Error);
      EXPECT_THROW(m.global_rank(0, 0, -1), Error);
      // Each group: its size, this rank's place in it, and the sum of its world ranks.
      const int t0 = m.tp_rank(), d0 = m.dp_rank(), p0 = m.pp_rank();
      EXPECT_EQ(m.tp_group().size(), tp);
      EXPECT_EQ(m.dp_group().size(), dp);
      EXPECT_EQ(m.pp_group().size(), pp);
      EXPECT_EQ(m.tp_group().rank(), t0);
      EXPECT_EQ(m.dp_group().rank(), d0);
      EXPECT_EQ(m.pp_group().rank(), p0);
      int64_t tp_sum = 0, dp_sum = 0, pp_sum = 0;
      for (int t = 0; t < tp; ++t) tp_sum += m.global_rank(t, d0, p0);
      for (int d = 0; d < dp; ++d) dp_sum += m.global_rank(t0, d, p0);
      for (int p = 0; p < pp; ++p) pp_sum += m.global_rank(t0, d0, p);
      // All three in flight at once: groups of one rank each do not mix with the others.
      int64_t xs[3] = {r, r, r};
      auto w1 = m.tp_group().all_reduce(&xs[0], 1, DType::i64, ReduceOp::sum);
      auto w2 = m.dp_group().all_reduce(&xs[1], 1, DType::i64, ReduceOp::sum);
      auto w3 = m.pp_group().all_reduce(&xs[2], 1, DType::i64, ReduceOp::sum);
      w3->wait();
      w2->wait();
      w1->wait();
      EXPECT_EQ(xs[0], tp_sum);
      EXPECT_EQ(xs[1], dp_sum);
      EXPECT_EQ(xs[2], pp_sum);
      // The embedding group: the first and the last stage of this rank's pipeline.
      Comm* e = m.embedding_group();
      if (p0 == 0 || p0 == pp - 1) {
        ASSERT_TRUE(e);
        EXPECT_EQ(e->size(), pp == 1 ? 1 : 2);
        EXPECT_EQ(e->rank(), p0 == 0 ? 0 : 1);
        int64_t expect = m.global_rank(t0, d0, 0) + (pp > 1 ? m.global_rank(t0, d0, pp - 1) : 0);
        EXPECT_EQ(sum_over(*e, r), expect);
      } else {
        EXPECT_EQ(e, nullptr);
      }
    }
  }
}

// ---- counting the bytes of a communicator (every rank) ---------------------------------

TEST(Dist, CountingCommCountsThePayloadOfEveryOp) {
  const int n = world().size(), r = world().rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  auto c = counted(world().split(0, r));  // the world, counted
  ASSERT_TRUE(c && c->traffic());
  ASSERT_EQ(c->size(), n);
  const Traffic& t = *c->traffic();
  const uint64_t N = 1000, B = 37, K = 11;

  // all_reduce: N floats.
  std::vector<float> f(N);
  for (size_t i = 0; i < N; ++i) f[i] = float(value(r, i));
  c->all_reduce_sync(f.data(), N, DType::f32, ReduceOp::sum);
  EXPECT_EQ(f[3], expected<float>(ReduceOp::sum, n, 3));
  EXPECT_EQ(t.all_reduce.bytes, N * 4);
  EXPECT_EQ(t.all_reduce.calls, 1u);
  // reduce_scatter: blocks of B doubles; the input (n * B) counts.
  std::vector<double> rs_in(size_t(n) * B, 1.0), rs_out(B);
  c->reduce_scatter(rs_in.data(), rs_out.data(), B, DType::f64, ReduceOp::sum)->wait();
  EXPECT_EQ(rs_out[0], double(n));
  EXPECT_EQ(t.reduce_scatter.bytes, uint64_t(n) * B * 8);
  // all_gather: B i32 from every rank; the output (n * B) counts.
  std::vector<int32_t> ag_in(B, r), ag_out(size_t(n) * B);
  c->all_gather(ag_in.data(), ag_out.data(), B, DType::i32)->wait();
  EXPECT_EQ(ag_out.back(), n - 1);
  EXPECT_EQ(t.all_gather.bytes, uint64_t(n) * B * 4);
  // broadcast: K bytes from the last rank, counted on every rank.
  std::vector<uint8_t> u(K, uint8_t(r));
  c->broadcast_sync(u.data(), K, DType::u8, n - 1);
  EXPECT_EQ(u[0], uint8_t(n - 1));
  EXPECT_EQ(t.broadcast.bytes, K);
  EXPECT_EQ(t.reduce_scatter.calls + t.all_gather.calls + t.broadcast.calls, 3u);

  // p2p round the ring: send + recv, send_recv, a batch.
  std::vector<int64_t> out(N, r), in(N, -1);
  auto ws = c->send(out.data(), N, DType::i64, next, 3);
  auto wr = c->recv(in.data(), N, DType::i64, prev, 3);
  wr->wait();
  ws->wait();
  EXPECT_EQ(in[0], prev);
  c->send_recv(out.data(), B, prev, in.data(), B, next, DType::i64)->wait();
  EXPECT_EQ(in[0], next);
  c->p2p({{true, out.data(), K, next}, {false, in.data(), K, prev}, {true, out.data(), 1, next},
          {false, in.data() + K, 1, prev}},
         DType::i64)
      ->wait();
  EXPECT_EQ(in[0], prev);
  EXPECT_EQ(t.p2p.bytes, (N + B + K + 1) * 8);
  EXPECT_EQ(t.p2p_recv_bytes, (N + B + K + 1) * 8);
  EXPECT_EQ(t.p2p.calls, 4u);
  c->barrier();
  EXPECT_EQ(t.barrier_calls, 1u);
  EXPECT_EQ(t.total(), double(N * 4 + uint64_t(n) * B * 8 + uint64_t(n) * B * 4 + K + (N + B + K + 1) * 8));

  // A pipeline's edges: the first stage only sends, the last only receives.
  Traffic before = t;
  std::vector<P2POp> ops;
  if (r + 1 < n) ops.push_back({true, out.data(), N, r + 1});
  if (r > 0) ops.push_back({false, in.data(), N, r - 1});
  c->p2p(ops, DType::i64)->wait();
  Traffic step = t - before;
  EXPECT_EQ(step.p2p.bytes, r + 1 < n ? N * 8 : 0u);
  EXPECT_EQ(step.p2p_recv_bytes, r > 0 ? N * 8 : 0u);
  EXPECT_EQ(step.p2p.calls, 1u);
  EXPECT_EQ(step.total(), double(step.p2p.bytes));
  // Every byte sent was received: over the job the sums agree.
  EXPECT_EQ(sum_over(world(), int64_t(t.p2p.bytes)), sum_over(world(), int64_t(t.p2p_recv_bytes)));
}

TEST(Dist, CountingCommSplitsCountOnTheirOwn) {
  const int n = world().size(), r = world().rank();
  auto c = counted(world().split(0, r));
  ASSERT_TRUE(c);
  const Traffic& t = *c->traffic();
  auto parity = c->split(r % 2, r);
  auto rest = c->split(r == 0 ? -1 : 1, r);
  EXPECT_EQ(t, Traffic{});  // a split moves no payload
  ASSERT_TRUE(parity && parity->traffic());
  EXPECT_EQ(parity->traffic()->total(), 0.0);
  EXPECT_EQ(parity->size(), r % 2 ? n / 2 : (n + 1) / 2);
  std::vector<int64_t> x(100, 1);
  parity->all_reduce_sync(x.data(), 100, DType::i64, ReduceOp::sum);
  EXPECT_EQ(x[0], parity->size());
  EXPECT_EQ(parity->traffic()->all_reduce.bytes, 800u);
  EXPECT_EQ(t, Traffic{});  // not counted by the communicator it was split from
  if (r == 0) {
    EXPECT_EQ(rest, nullptr);
  } else {
    ASSERT_TRUE(rest && rest->traffic());
    std::vector<float> g(size_t(rest->size()) * 3);
    rest->all_gather(g.data() + size_t(rest->rank()) * 3, g.data(), 3, DType::f32)->wait();
    EXPECT_EQ(rest->traffic()->all_gather.bytes, uint64_t(n - 1) * 12);
    EXPECT_EQ(parity->traffic()->all_gather.bytes, 0u);
  }
  c->all_reduce_sync(x.data(), 1, DType::i64, ReduceOp::sum);
  EXPECT_EQ(t.all_reduce.bytes, 8u);
  EXPECT_EQ(parity->traffic()->all_reduce.bytes, 800u);
  // A split of a split, outliving its parents.
  auto sub = parity->split(0, -parity->rank());
  parity.reset();
  c.reset();
  ASSERT_TRUE(sub && sub->traffic());
  sub->barrier();
  EXPECT_EQ(sub->traffic()->barrier_calls, 1u);
  EXPECT_EQ(sub->traffic()->total(), 0.0);
}

// Every mesh with context parallelism the job's size allows: coordinates, the cp group (the
// ring) and the dp x cp group (gradient averaging), each checked by the sum of its world ranks.
TEST(Dist, MeshWithContextParallelism) {
  Comm& c = world();
  const int n = c.size(), r = c.rank();
  for (int cp = 2; cp <= n; ++cp)
    for (int tp = 1; tp * cp <= n; ++tp) {
      if (n % (tp * cp)) continue;
      const int pp = (n / (tp * cp)) % 2 == 0 ? 2 : 1, dp = n / (tp * cp * pp);
      Mesh m(c, tp, pp, cp);
      SCOPED_TRACE(m.describe());
      EXPECT_EQ(m.cp(), cp);
      EXPECT_EQ(m.dp(), dp);
      const MeshCoords at = mesh_coords(r, tp, dp, cp);
      EXPECT_EQ(m.cp_rank(), at.cp);
      EXPECT_EQ(m.tp_rank(), at.tp);
      EXPECT_EQ(m.dp_rank(), at.dp);
      EXPECT_EQ(m.pp_rank(), at.pp);
      EXPECT_EQ(m.global_rank(at.tp, at.dp, at.pp, at.cp), r);
      EXPECT_THROW(m.global_rank(0, 0, 0, cp), Error);
      EXPECT_EQ(m.describe(), str_cat(n, " ranks = dp ", dp, " x tp ", tp, " x pp ", pp, " x cp ", cp,
                                      "; this rank: dp ", at.dp, ", tp ", at.tp, ", pp ", at.pp, ", cp ", at.cp));
      ASSERT_TRUE(m.cp_group());
      EXPECT_EQ(m.cp_group()->size(), cp);
      EXPECT_EQ(m.cp_group()->rank(), at.cp);
      EXPECT_EQ(m.dp_cp_group().size(), dp * cp);
      EXPECT_EQ(m.dp_cp_group().rank(), at.cp + cp * at.dp);
      EXPECT_EQ(m.tp_group().size(), tp);
      EXPECT_EQ(m.dp_group().size(), dp);
      EXPECT_EQ(m.pp_group().size(), pp);
      int64_t cp_sum = 0, dp_cp_sum = 0, tp_sum = 0, dp_sum = 0;
      for (int k = 0; k < cp; ++k) cp_sum += m.global_rank(at.tp, at.dp, at.pp, k);
      for (int d = 0; d < dp; ++d)
        for (int k = 0; k < cp; ++k) dp_cp_sum += m.global_rank(at.tp, d, at.pp, k);
      for (int t = 0; t < tp; ++t) tp_sum += m.global_rank(t, at.dp, at.pp, at.cp);
      for (int d = 0; d < dp; ++d) dp_sum += m.global_rank(at.tp, d, at.pp, at.cp);
      EXPECT_EQ(sum_over(*m.cp_group(), r), cp_sum);
      EXPECT_EQ(sum_over(m.dp_cp_group(), r), dp_cp_sum);
      EXPECT_EQ(sum_over(m.tp_group(), r), tp_sum);
      EXPECT_EQ(sum_over(m.dp_group(), r), dp_sum);
      EXPECT_EQ(m.traffic_of("cp").all_reduce.bytes, 8u);
      EXPECT_EQ(m.traffic_of("dp_cp").all_reduce.bytes, 8u);
    }
  Mesh plain(c, 1, 1);
  EXPECT_EQ(plain.cp_group(), nullptr);
  EXPECT_EQ(&plain.dp_cp_group(), &plain.dp_group());
  EXPECT_EQ(plain.traffic_of("cp"), Traffic{});
}

TEST(Dist, MeshGroupsCountTheirOwnTraffic) {
  Comm& w = world();
  const int n = w.size();
  EXPECT_EQ(w.traffic(), nullptr);
  for (int tp = 1; tp <= n; ++tp) {
    for (int pp = 1; pp <= n; ++pp) {
      if (n % (tp * pp)) continue;
      Mesh m(w, tp, pp);
      SCOPED_TRACE(m.describe());
      for (Comm* g : {&m.tp_group(), &m.dp_group(), &m.pp_group()}) {
        ASSERT_TRUE(g->traffic());
        EXPECT_EQ(*g->traffic(), Traffic{});
      }
      // A different op on each group: each counts only its own.
      std::vector<float> grad(1000, 1.f);
      m.dp_group().all_reduce_sync(grad.data(), grad.size(), DType::f32, ReduceOp::avg);
      std::vector<float> act(size_t(tp) * 10);
      m.tp_group().all_gather(act.data() + size_t(m.tp_rank()) * 10, act.data(), 10, DType::f32)->wait();
      double loss = 1;
      m.pp_group().broadcast_sync(&loss, 1, DType::f64, pp - 1);
      EXPECT_EQ(m.traffic_of("dp").all_reduce.bytes, 4000u);
      EXPECT_EQ(m.traffic_of("dp").total(), 4000.0);
      EXPECT_EQ(m.traffic_of("tp").all_gather.bytes, uint64_t(tp) * 40);
      EXPECT_EQ(m.traffic_of("tp").total(), double(tp * 40));
      EXPECT_EQ(m.traffic_of("pp").broadcast.bytes, 8u);
      EXPECT_EQ(m.traffic_of("pp").total(), 8.0);
      Comm* e = m.embedding_group();
      if (e) {
        ASSERT_TRUE(e->traffic());
        EXPECT_EQ(sum_over(*e, 1), e->size());
        EXPECT_EQ(m.traffic_of("embedding").all_reduce.bytes, 8u);
        EXPECT_EQ(m.traffic_of("embedding").total(), 8.0);
      } else {
        EXPECT_EQ(m.traffic_of("embedding"), Traffic{});
      }
    }
  }
}

TEST(Dist, MeshThatDoesNotDivideTheWorldFailsOnEveryRank) {
  Comm& c = world();
  const int n = c.size();
  EXPECT_EQ(error_of([&] { Mesh(c, n + 1, 1); }),
            str_cat("--tp ", n + 1, " x --pp 1 = ", n + 1, " does not divide the ", n, n == 1 ? " process" : " processes",
                    " of this job (expected a divisor of ", n, ")"));
  EXPECT_NE(error_of([&] { Mesh(c, 1, 0); }).find("--pp 0"), std::string::npos);
  c.barrier();  // no rank entered a split
}

TEST(Dist, BenchCommRowsAreOk) {
  Comm& c = world();
  BenchCommOptions o;
  o.min_bytes = 4 << 10;
  o.max_bytes = 256 << 10;
  o.step = 4;
  o.iters = 3;
  o.warmup = 1;
  std::ostringstream os;
  auto rows = bench_comm(c, o, os);
  ASSERT_EQ(rows.size(), 4u);
  for (auto& r : rows) {
    EXPECT_TRUE(r.ok) << r.bytes;
    EXPECT_EQ(r.count * 4, r.bytes);
    EXPECT_GT(r.time_us, 0.0);
    EXPECT_NEAR(r.busbw_gbs, r.algbw_gbs * 2.0 * (c.size() - 1) / c.size(), 1e-9);
  }
  if (c.rank() == 0) {
    EXPECT_NE(os.str().find("262144"), std::string::npos) << os.str();
    EXPECT_NE(os.str().find(" ok"), std::string::npos) << os.str();
    EXPECT_EQ(os.str().find("# fit t = 2(n-1) alpha") != std::string::npos, c.size() >= 2) << os.str();
  } else {
    EXPECT_EQ(os.str(), "");  // the table is rank 0's
  }
}

// Ping-pong between ranks 0 and 1 (the others wait): intact both ways, every rank gets rank
// 0's times, and the table ends with the fitted latency and bandwidth.
TEST(DistRanks, BenchP2PRowsAreOk) {
  Comm& c = world();
  if (c.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  BenchCommOptions o;
  o.min_bytes = 64;
  o.max_bytes = 256 << 10;
  o.step = 8;
  o.iters = 3;
  o.warmup = 1;
  std::ostringstream os;
  auto rows = bench_p2p(c, o, os);
  ASSERT_EQ(rows.size(), 5u);  // 64 B .. 256 KiB by 8
  std::vector<double> times;
  for (auto& r : rows) {
    EXPECT_TRUE(r.ok) << r.bytes;
    EXPECT_GT(r.time_us, 0.0);
    EXPECT_NEAR(r.bw_gbs, double(r.bytes) / r.time_us / 1e3, 1e-9 * r.bw_gbs);
    times.push_back(r.time_us);
  }
  std::vector<double> root_times = times;
  c.broadcast_sync(root_times.data(), root_times.size(), DType::f64, 0);
  EXPECT_EQ(times, root_times);
  const AlphaBeta ab = fit_p2p(rows);
  EXPECT_GT(ab.beta, 0.0);
  if (c.rank() == 0) {
    EXPECT_NE(os.str().find("# fit t = alpha + S/beta: alpha "), std::string::npos) << os.str();
    EXPECT_EQ(os.str().find("WRONG"), std::string::npos) << os.str();
  } else {
    EXPECT_EQ(os.str(), "");
  }
}

// ---- NCCL: a world of one (bootstrapped over the self communicator; needs a GPU) -------

TEST(DistNccl, WithoutNcclTheBuildSaysSo) {
  if (have_nccl()) GTEST_SKIP() << "built with NCCL";
  auto self = make_self_comm();
  EXPECT_THROW(make_nccl_comm(*self, 0, nullptr), Error);
}

// DistNccl.WorldOfOneOnTheGpu is in test_cuda_dist.cpp (scripts/gpu-check runs test_cuda_*).

// ---- launch ---------------------------------------------------------------------------

TEST(DistLaunch, MpirunCommandAddsTheForgottenFlags) {
  EnvGuard g{"OMP_NUM_THREADS", "OMP_WAIT_POLICY", "SAT_COMM_TIMEOUT"};
  LaunchOptions o;
  o.hardware_threads = 2;
  o.as_root = 1;
  // More processes than slots: refused, as mpirun does, unless the user says --oversubscribe.
  try {
    mpirun_command(4, {"train"}, "/x/saturate", o);
    ADD_FAILURE() << "-n 4 on 2 slots accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-n 4: this machine offers 2 slot(s)"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--oversubscribe"), std::string::npos) << e.what();
  }
  o.oversubscribe = true;
  auto cmd = mpirun_command(4, {"train", "--epochs", "1"}, "/x/saturate", o);
  std::string line = command_line(cmd);
  EXPECT_EQ(cmd.front(), "mpirun");
  EXPECT_NE(line.find("-np 4"), std::string::npos) << line;
  EXPECT_NE(line.find("--oversubscribe"), std::string::npos) << line;
  EXPECT_NE(line.find("--allow-run-as-root"), std::string::npos) << line;
  EXPECT_NE(line.find("--bind-to none"), std::string::npos) << line;
  EXPECT_NE(line.find("-x OMP_NUM_THREADS=1"), std::string::npos) << line;
  EXPECT_NE(line.find("-x OMP_WAIT_POLICY=passive"), std::string::npos) << line;
  EXPECT_NE(line.find("/x/saturate train --epochs 1"), std::string::npos) << line;
  EXPECT_EQ(line.substr(line.size() - std::string("/x/saturate train --epochs 1").size()),
            "/x/saturate train --epochs 1");

  o.hardware_threads = 16;
  o.as_root = 0;
  setenv("SAT_COMM_TIMEOUT", "90", 1);
  line = command_line(mpirun_command(2, {"train"}, "/x/saturate", o));
  EXPECT_EQ(line.find("--oversubscribe"), std::string::npos) << line;
  EXPECT_EQ(line.find("--allow-run-as-root"), std::string::npos) << line;
  EXPECT_EQ(line.find("OMP_WAIT_POLICY"), std::string::npos) << line;
  EXPECT_NE(line.find("-x OMP_NUM_THREADS=8"), std::string::npos) << line;
  EXPECT_NE(line.find("-x SAT_COMM_TIMEOUT=90"), std::string::npos) << line;
  setenv("OMP_NUM_THREADS", "3", 1);
  line = command_line(mpirun_command(2, {}, "/x/saturate", o));
  EXPECT_NE(line.find("-x OMP_NUM_THREADS=3"), std::string::npos) << line;

  o.openmpi = false;
  line = command_line(mpirun_command(2, {}, "/x/saturate", o));
  EXPECT_NE(line.find("mpirun -n 2 -genv OMP_NUM_THREADS 3"), std::string::npos) << line;
  EXPECT_THROW(mpirun_command(0, {}, "/x/saturate"), Error);
  EXPECT_EQ(command_line({"a b", "it's", "plain"}), "'a b' 'it'\\''s' plain");
}

TEST(DistLaunch, MissingMpirunIsAClearError) {
  EnvGuard g{"PATH"};
  setenv("PATH", "/nonexistent-saturate-test", 1);
  try {
    run_forwarding_signals({"mpirun", "-np", "2", "true"});
    FAIL() << "it ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("saturate launch needs mpirun: apt-get install openmpi-bin"),
              std::string::npos)
        << e.what();
  }
}

namespace {

// run_forwarding_signals(argv, grace) in a forked copy of this process (one thread, so a
// signal sent to it is the launcher's), sent SIGTERM after 0.5 s: the copy's exit status.
int launcher_status_after_sigterm(const std::vector<std::string>& argv, double grace) {
  const pid_t pid = fork();
  if (pid == 0) {
    int st = 1;
    try {
      st = run_forwarding_signals(argv, grace);
    } catch (...) {
    }
    _exit(st);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

}  // namespace

// The child's exit status comes back; a signal sent to the launcher reaches the child, and
// a child that outlives it by the grace period is killed with its process group.
TEST(DistLaunch, RunForwardingSignalsPassesStatusAndSignals) {
  EXPECT_EQ(run_forwarding_signals({"sh", "-c", "exit 3"}), 3);
  // The child traps SIGTERM and exits 7: the launcher's SIGTERM was forwarded to it.
  EXPECT_EQ(launcher_status_after_sigterm({"sh", "-c", "trap 'exit 7' TERM; while :; do sleep 0.05; done"}, 30), 7);
  // A child ignoring SIGTERM is killed after the grace period, with its process group.
  EXPECT_EQ(launcher_status_after_sigterm({"sh", "-c", "trap '' TERM; sleep 60; sleep 60"}, 1.0), 128 + SIGKILL);
}

// ---- failure: a rank that dies or hangs ends the whole job ----------------------------

#ifdef SAT_MPIEXEC
namespace {

struct ChildResult {
  int status = -1;  // exit status of the shell that ran mpirun (124: the outer timeout)
  double seconds = 0;
  std::string output;
};

// Runs this test binary under `mpirun -np 2` with the given child mode, bounded by an outer
// timeout, in a clean environment (this process may itself be an MPI singleton).
ChildResult run_child(const std::string& mode_env) {
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
  std::string cmd = "env -i PATH='" + path +
                    "' HOME=/tmp OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive SAT_COMM_TIMEOUT=3 " +
                    mode_env + " timeout -k 5 60 " SAT_MPIEXEC " -np 2 " + self_executable() +
                    " 2>&1";
  auto t0 = std::chrono::steady_clock::now();
  FILE* f = popen(cmd.c_str(), "r");
  ChildResult res;
  if (!f) return res;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) res.output.append(buf, n);
  int st = pclose(f);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return res;
}

bool skip_failure_tests() { return detect_process().distributed(); }

}  // namespace

TEST(DistFailure, KilledRankEndsTheJob) {
  if (skip_failure_tests()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  ChildResult r = run_child("SAT_TEST_DIE_RANK=1");
  std::printf("mpirun exit status %d after %.1f s; its output:\n%s\n", r.status, r.seconds, r.output.c_str());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, 124) << "the job did not end by itself";
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << "the output does not name the failed rank";
}

TEST(DistFailure, HungRankTripsTheWatchdog) {
  if (skip_failure_tests()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  ChildResult r = run_child("SAT_TEST_HANG_RANK=1");
  std::printf("mpirun exit status %d after %.1f s; its output:\n%s\n", r.status, r.seconds, r.output.c_str());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.status, 124) << "the job did not end by itself";
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_NE(r.output.find("saturate: rank 0: all_reduce (sum) of 1048576 bytes did not complete within 3 s"),
            std::string::npos);
  EXPECT_NE(r.output.find("rank 1, which it waits on, has probably failed or stopped"), std::string::npos)
      << "the watchdog does not name the rank the collective waited on";
}

TEST(DistFailure, ExitWithAnErrorEndsTheJobAtOnce) {
  if (skip_failure_tests()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  ChildResult r = run_child("SAT_TEST_EXIT_RANK=1");
  std::printf("mpirun exit status %d after %.1f s; its output:\n%s\n", r.status, r.seconds, r.output.c_str());
#ifdef __GLIBC__
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("saturate: rank 1 exits with status 2: ending the job"), std::string::npos);
  EXPECT_EQ(r.output.find("did not complete"), std::string::npos) << "the watchdog, not the exit, ended the job";
#else
  EXPECT_NE(r.status, 0);
#endif
  EXPECT_LT(r.seconds, 30.0);
}

TEST(DistFailure, AbortJobEndsTheJobAtOnce) {
  if (skip_failure_tests()) GTEST_SKIP() << "runs its own mpirun; not from inside one";
  ChildResult r = run_child("SAT_TEST_ABORT_RANK=1");
  std::printf("mpirun exit status %d after %.1f s; its output:\n%s\n", r.status, r.seconds, r.output.c_str());
  EXPECT_EQ(r.status, 2);
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << "the output does not name the failed rank";
  EXPECT_EQ(r.output.find("did not complete"), std::string::npos) << "the watchdog, not abort_job, ended the job";
}
#endif
