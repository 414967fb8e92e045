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
#include <fstream>
#include <iostream>
#include <sstream>
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

// A number of slots, "4": from 1 to 4096, or -1.
int slots_number(const std::string& s) {
  if (s.empty() || s.size() > 4 || s.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int v = std::stoi(s);
  return v >= 1 && v <= 4096 ? v : -1;
}

bool host_name_ok(const std::string& h) {
  return !h.empty() && h.find_first_of(" \t,:=#'\"") == std::string::npos;
}

int hosts_flag_slots(const std::string& spec) {
  const std::string expected = "; expected HOST:SLOTS[,HOST:SLOTS...], as in node1:8,node2:8";
  SAT_CHECK(!spec.empty(), "--hosts: empty", expected);
  int total = 0;
  std::stringstream in(spec + ",");
  std::string item;
  while (std::getline(in, item, ',')) {
    const size_t colon = item.rfind(':');
    const int n = colon == std::string::npos ? -1 : slots_number(item.substr(colon + 1));
    SAT_CHECK(n > 0 && host_name_ok(item.substr(0, colon)), "--hosts", item == spec ? "" : " '" + spec + "'", ": '",
              item, "' is not HOST:SLOTS (SLOTS a number from 1 to 4096)", expected);
    total += n;
  }
  return total;
}

// One line of a hostfile, "node1 slots=4 max_slots=8" (OpenMPI) or "node1:4" (MPICH): its
// slots, 0 when it states none, -1 for a comment or a blank line.
int hostfile_line_slots(const std::string& text, bool openmpi, const std::string& where) {
  const std::string line = text.substr(0, text.find('#'));
  std::stringstream in(line);
  std::string host, field;
  if (!(in >> host)) return -1;
  if (!openmpi) {
    const size_t colon = host.rfind(':');
    const int n = colon == std::string::npos ? 1 : slots_number(host.substr(colon + 1));
    SAT_CHECK(host_name_ok(host.substr(0, colon)) && n > 0 && !(in >> field), where,
              ": expected HOST or HOST:SLOTS (SLOTS from 1 to 4096), got '", line, "'");
    return n;
  }
  SAT_CHECK(host_name_ok(host), where, ": expected a host name first, got '", host, "'");
  int slots = 0, max_slots = 0;
  while (in >> field) {
    const size_t eq = field.find('=');
    const std::string key = field.substr(0, eq);
    const int n = eq == std::string::npos ? -1 : slots_number(field.substr(eq + 1));
    SAT_CHECK((key == "slots" || key == "max_slots") && n > 0, where, ": expected HOST [slots=N] [max_slots=N] ",
              "(N from 1 to 4096), got '", field, "'");
    (key == "slots" ? slots : max_slots) = n;
  }
  return slots > 0 ? slots : max_slots;  // OpenMPI: slots defaults to max_slots
}

int hostfile_slots(const std::string& file, bool openmpi) {
  std::ifstream in(file);
  SAT_CHECK(!file.empty() && in, "--hostfile: cannot read '", file, "': ", std::strerror(errno));
  int total = 0, hosts = 0, line_no = 0;
  bool unknown = false;
  for (std::string line; std::getline(in, line);) {
    const int n = hostfile_line_slots(line, openmpi, str_cat("--hostfile ", file, ": line ", ++line_no));
    if (n < 0) continue;
    ++hosts;
    unknown = unknown || n == 0;
    total += n;
  }
  SAT_CHECK(hosts > 0, "--hostfile ", file, ": names no host; expected one a line, as in 'node1 slots=8'");
  return unknown ? -1 : total;
}

}  // namespace

int host_slots(const LaunchOptions& o) {
  SAT_CHECK(o.hosts.empty() || o.hostfile.empty(), "--hosts and --hostfile: give one of them, not both");
  if (!o.hosts.empty()) return hosts_flag_slots(o.hosts);
  if (!o.hostfile.empty()) return hostfile_slots(o.hostfile, o.openmpi);
  return 0;
}

std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& saturate_args,
                                        const std::string& self_exe, const LaunchOptions& o) {
  SAT_CHECK(n >= 1, "launch: the number of processes must be at least 1 (got ", n, ")");
  int threads = o.hardware_threads > 0 ? o.hardware_threads : int(std::thread::hardware_concurrency());
  if (threads < 1) threads = 1;
  bool root = o.as_root >= 0 ? o.as_root != 0 : geteuid() == 0;
  const bool on_hosts = !o.hosts.empty() || !o.hostfile.empty();
  const int slots = on_hosts ? host_slots(o) : threads;  // -1: a hostfile's host without slots
  const bool oversubscribed = slots > 0 && n > slots;
  if (on_hosts)
    SAT_CHECK(!oversubscribed || o.oversubscribe, "-n ", n, ": the hosts of ",
              o.hosts.empty() ? "--hostfile " + o.hostfile : "--hosts " + o.hosts, " offer ", slots,
              " slot(s); give -n ", slots, " or fewer, more slots, or --oversubscribe to start more processes "
              "than that");
  else
    SAT_CHECK(!oversubscribed || o.oversubscribe || !o.mpirun_args.empty(), "-n ", n, ": this machine offers ",
              threads, " slot(s) (its hardware threads); give -n ", threads, " or fewer, --hosts or --hostfile "
              "to run on other machines too, or --oversubscribe to start more processes than it has cores");

  std::vector<std::string> cmd{"mpirun"};
  cmd.push_back(o.openmpi ? "-np" : "-n");
  cmd.push_back(std::to_string(n));
  if (!o.hosts.empty()) cmd.insert(cmd.end(), {o.openmpi ? "--host" : "-hosts", o.hosts});
  if (!o.hostfile.empty()) cmd.insert(cmd.end(), {o.openmpi ? "--hostfile" : "-f", o.hostfile});
  if (o.openmpi) {
    if (oversubscribed) cmd.push_back("--oversubscribe");
    if (root) cmd.push_back("--allow-run-as-root");
    cmd.push_back("--bind-to");
    cmd.push_back("none");
  }
  const char* omp = std::getenv("OMP_NUM_THREADS");
  // On other hosts this machine's cores say nothing: each rank divides its own host's.
  const std::string omp_threads = omp && *omp ? omp : on_hosts ? "" : std::to_string(std::max(1, threads / n));
  // Each rank also has a communication thread, which OpenMPI keeps spinning while a
  // reduction waits for a peer. When the compute threads fill every core it steals one
  // from backward; yielding when idle gave 11% more samples/s for gpt-mini with 1 MiB
  // buckets on 2 ranks x 1 thread on 2 cores (bench/dp/scaling). On hosts, the ranks'
  // own division of the cores fills them.
  const bool full = on_hosts ? omp_threads.empty()
                             : int64_t(n) * std::max(1, std::atoi(omp_threads.c_str())) >= threads;
  if (o.openmpi && full) {
    cmd.push_back("--mca");
    cmd.push_back("mpi_yield_when_idle");
    cmd.push_back("1");
  }
  if (!omp_threads.empty()) add_env(cmd, o.openmpi, "OMP_NUM_THREADS", omp_threads);
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
