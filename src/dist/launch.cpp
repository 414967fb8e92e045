#include "dist/launch.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "core/error.h"

namespace sat::dist {

namespace {

void add_env(std::vector<std::string>& cmd, bool openmpi, const std::string& name, const std::string& value) {
  if (openmpi) {
    cmd.push_back("-x");
    cmd.push_back(name + "=" + value);
  } else {
    cmd.push_back("-genv");
    cmd.push_back(name);
    cmd.push_back(value);
  }
}

}  // namespace

std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& saturate_args,
                                        const std::string& self_exe, const LaunchOptions& o) {
  SAT_CHECK(n >= 1, "launch: the number of processes must be at least 1 (got ", n, ")");
  int threads = o.hardware_threads > 0 ? o.hardware_threads : int(std::thread::hardware_concurrency());
  if (threads < 1) threads = 1;
  bool root = o.as_root >= 0 ? o.as_root != 0 : geteuid() == 0;
  bool oversubscribed = n > threads;
  SAT_CHECK(!oversubscribed || o.oversubscribe || !o.mpirun_args.empty(), "-n ", n, ": this machine offers ", threads,
            " slot(s) (its hardware threads); give -n ", threads, " or fewer, or --oversubscribe to start more "
            "processes than it has cores");

  std::vector<std::string> cmd{"mpirun"};
  cmd.push_back(o.openmpi ? "-np" : "-n");
  cmd.push_back(std::to_string(n));
  if (o.openmpi) {
    if (oversubscribed) cmd.push_back("--oversubscribe");
    if (root) cmd.push_back("--allow-run-as-root");
    cmd.push_back("--bind-to");
    cmd.push_back("none");
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  const std::string omp_threads = omp && *omp ? omp : std::to_string(std::max(1, threads / n));
  // Each rank also has a communication thread, which OpenMPI keeps spinning while a
  // reduction waits for a peer. When the compute threads fill every core it steals one
  // from backward; yielding when idle gave 11% more samples/s for gpt-mini with 1 MiB
  // buckets on 2 ranks x 1 thread on 2 cores (bench/dp/scaling).
  if (o.openmpi && int64_t(n) * std::max(1, std::atoi(omp_threads.c_str())) >= threads) {
    cmd.push_back("--mca");
    cmd.push_back("mpi_yield_when_idle");
    cmd.push_back("1");
  }
  add_env(cmd, o.openmpi, "OMP_NUM_THREADS", omp_threads);
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  if (wait && *wait)
    add_env(cmd, o.openmpi, "OMP_WAIT_POLICY", wait);
  else if (oversubscribed)
    add_env(cmd, o.openmpi, "OMP_WAIT_POLICY", "passive");
  const char* timeout = std::getenv("SAT_COMM_TIMEOUT");
  if (timeout && *timeout) add_env(cmd, o.openmpi, "SAT_COMM_TIMEOUT", timeout);
  cmd.insert(cmd.end(), o.mpirun_args.begin(), o.mpirun_args.end());
  cmd.push_back(self_exe);
  cmd.insert(cmd.end(), saturate_args.begin(), saturate_args.end());
  return cmd;
}

std::string command_line(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) {
    if (!s.empty()) s += ' ';
    bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                                   "-_./=:,+@%") == std::string::npos;
    if (plain) {
      s += a;
    } else {
      s += '\'';
      for (char ch : a) s += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
      s += '\'';
    }
  }
  return s;
}

namespace {

const int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// The child's side of the fork: its own process group, killed with its parent, the
// parent's signal mask restored, then exec. On failure it reports errno through `report`.
[[noreturn]] void exec_child(const std::vector<std::string>& argv, pid_t parent, const sigset_t& mask, int report) {
  setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) _exit(128 + SIGTERM);  // the parent died before prctl
  pthread_sigmask(SIG_SETMASK, &mask, nullptr);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  const int e = errno;
  [[maybe_unused]] const ssize_t w = write(report, &e, sizeof e);
  _exit(127);
}

// Waits for the child, forwarding the signals this process receives (`forwarded`, blocked).
int wait_forwarding(pid_t pid, const std::string& name, const sigset_t& forwarded, double grace) {
  double deadline = -1;
  auto now = [] { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); };
  for (;;) {
    int st = 0;
    const pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0 && errno != EINTR) return 1;
    const timespec tick{0, 100 * 1000 * 1000};
    siginfo_t info;
    const int sig = sigtimedwait(&forwarded, &info, &tick);
    if (sig > 0) {
      kill(pid, sig);
      if (deadline < 0) deadline = now() + grace;
    }
    if (deadline >= 0 && now() > deadline) {
      std::fprintf(stderr, "saturate launch: %s still runs %g s after the signal: killing it\n", name.c_str(), grace);
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      deadline = now() + 3600;
    }
  }
}

}  // namespace

int run_forwarding_signals(const std::vector<std::string>& argv, double grace) {
  SAT_CHECK(!argv.empty(), "launch: empty command");
  if (geteuid() == 0) {
    // OpenMPI 4's environment form of --allow-run-as-root (harmless elsewhere).
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  std::cerr << "saturate: running " << command_line(argv) << std::endl;
  sigset_t forwarded, old;
  sigemptyset(&forwarded);
  for (int s : kForwarded) sigaddset(&forwarded, s);
  pthread_sigmask(SIG_BLOCK, &forwarded, &old);  // from before the fork: none is lost
  int report[2];
  SAT_CHECK(pipe2(report, O_CLOEXEC) == 0, "launch: pipe: ", std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) exec_child(argv, parent, old, report[1]);
  close(report[1]);
  int e = 0;
  const bool failed = pid < 0 || read(report[0], &e, sizeof e) == ssize_t(sizeof e);
  if (pid < 0) e = errno;
  close(report[0]);
  if (failed) {
    if (pid > 0) waitpid(pid, nullptr, 0);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (e == ENOENT && (argv[0] == "mpirun" || argv[0] == "mpiexec"))
      fail("saturate launch needs mpirun: apt-get install openmpi-bin");
    if (e == ENOENT) fail("launch: ", argv[0], " not found");
    fail("launch: cannot run ", argv[0], ": ", std::strerror(e));
  }
  setpgid(pid, pid);
  const int status = wait_forwarding(pid, argv[0], forwarded, grace);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return status;
}

std::string self_executable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  SAT_CHECK(n > 0, "cannot read /proc/self/exe: ", std::strerror(errno));
  return std::string(buf, size_t(n));
}

}  // namespace sat::dist
