#include "cli/tools.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <vector>

#include "backend/cpu/blas.h"
#include "core/error.h"
#include "dist/comm.h"
#include "dist/launch.h"
#include "dist/nccl_comm.h"
#include "plan/hardware.h"

namespace sat::cli {

int run_hardware(const HardwareArgs& a) {
  SAT_CHECK(a.threads >= 0, "--threads: expected 0 (the cores this rank may use) or a positive number, got ", a.threads);
  cpu::set_num_threads(a.threads, dist::detect_process().local_world);
  std::unique_ptr<dist::Comm> comm;
  if (a.gpu == "this") {
    comm = dist::make_world_comm();
    if (comm->rank() == 0)
      std::fprintf(stderr, "saturate hardware: measuring this machine (GEMM, memory%s), a few seconds\n",
                   comm->size() > 1 ? ", the links between the ranks" : "");
  }
  const Hardware h = hardware(a.gpu, comm.get());
  if ((comm ? comm->rank() : dist::detect_process().rank) != 0) return 0;
  std::printf("%s", a.json ? hardware_json(h).c_str() : hardware_table(h).c_str());
  return 0;
}

int run_bench_comm(const BenchCommArgs& a) {
  const dist::BenchCommOptions& o = a.options;
  SAT_CHECK(a.backend == "mpi" || a.backend == "nccl", "--backend: expected mpi or nccl, got '", a.backend, "'");
  // (the sweep's messages are float32 elements: a size that is not whole elements was rounded)
  SAT_CHECK(o.min_bytes >= 4 && o.min_bytes % 4 == 0, "--min-bytes: expected a multiple of 4 bytes (float32 "
            "elements), at least 4, got ", o.min_bytes);
  SAT_CHECK(o.max_bytes % 4 == 0, "--max-bytes: expected a multiple of 4 bytes (float32 elements), got ", o.max_bytes);
  SAT_CHECK(o.min_bytes <= o.max_bytes, "--min-bytes ", o.min_bytes, " is more than --max-bytes ", o.max_bytes,
            "; expected min <= max");
  SAT_CHECK(o.iters >= 1, "--iters: expected at least 1");
  auto comm = dist::make_world_comm();
  std::unique_ptr<dist::Comm> nccl;
  if (a.backend == "nccl") {
    SAT_CHECK(dist::have_nccl(), "--backend nccl: this saturate was built without NCCL");
    nccl = dist::make_nccl_comm(*comm, dist::local_rank_gpu("--backend nccl"));
  }
  dist::Comm& c = nccl ? *nccl : *comm;
  bool ok = true;
  for (auto& r : dist::bench_comm(c, o, std::cout)) ok = ok && r.ok;
  if (c.size() >= 2) {
    if (c.rank() == 0) std::cout << "\n";
    for (auto& r : dist::bench_p2p(c, o, std::cout)) ok = ok && r.ok;
  }
  return ok ? 0 : 1;
}

int run_launch(int argc, char** argv) {
  int n = 0;
  int i = 2;
  dist::LaunchOptions o;
  std::vector<std::string> rest;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if ((arg == "-n" || arg == "--np") && i + 1 < argc) {
      char* end = nullptr;
      errno = 0;
      const long v = std::strtol(argv[++i], &end, 10);
      SAT_CHECK(end != argv[i] && *end == 0 && errno == 0 && v >= 1 && v <= 4096,
                "-n: expected a number of processes from 1 to 4096, got '", argv[i], "'");
      n = int(v);
    } else if (arg == "--oversubscribe") {
      o.oversubscribe = true;
    } else if (arg == "--hosts" || arg == "--hostfile") {
      SAT_CHECK(i + 1 < argc && std::string(argv[i + 1]) != "--", arg, ": expected ",
                arg == "--hosts" ? "HOST:SLOTS[,HOST:SLOTS...]" : "a file", " after it");
      (arg == "--hosts" ? o.hosts : o.hostfile) = argv[++i];
    } else if (arg == "-h" || arg == "--help") {
      std::printf("usage: saturate launch -n N [--hosts H1:SLOTS,H2:SLOTS | --hostfile FILE] [--oversubscribe]\n"
                  "                       -- train [options]\n"
                  "runs N processes of saturate under mpirun, with the flags users forget (running as\n"
                  "root, binding), and prints the command. N is bounded by this machine's hardware\n"
                  "threads, or the slots of --hosts or --hostfile (mpirun's --host and --hostfile: the\n"
                  "ranks run on those machines, where saturate must be at the same path), unless\n"
                  "--oversubscribe. SIGINT/SIGTERM/SIGHUP are passed on to the ranks (a run with\n"
                  "--checkpoint-dir checkpoints and stops); nothing outlives launch.\n");
      return 0;
    } else {
      fail("saturate launch: unexpected argument '", arg, "'; usage: saturate launch -n N -- train ...");
    }
  }
  for (; i < argc; ++i) rest.push_back(argv[i]);
  SAT_CHECK(n >= 1, "saturate launch: -n N is required; usage: saturate launch -n N -- train ...");
  SAT_CHECK(!rest.empty(), "saturate launch: nothing to run; usage: saturate launch -n N -- train ...");
  return dist::run_forwarding_signals(dist::mpirun_command(n, rest, dist::self_executable(), o));
}

}  // namespace sat::cli
