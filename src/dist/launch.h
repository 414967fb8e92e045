// `saturate launch`: start N copies of saturate under mpirun with the flags that users
// forget (see mpirun_command), on this machine or on the hosts of --hosts/--hostfile.
#pragma once
#include <string>
#include <vector>

namespace sat::dist {

struct LaunchOptions {
  int hardware_threads = 0;  // 0: std::thread::hardware_concurrency()
  int as_root = -1;          // -1: geteuid() == 0
  bool openmpi = true;       // OpenMPI's mpirun (MPICH's hydra takes other flags)
  bool oversubscribe = false;  // the user's --oversubscribe: more processes than slots
  std::string hosts;     // --hosts "h1:4,h2:4": mpirun's --host (MPICH: -hosts), as given
  std::string hostfile;  // --hostfile FILE: mpirun's --hostfile (MPICH: -f), as given
  std::vector<std::string> mpirun_args;  // extra flags before the program
};

// The slots the hosts of --hosts or --hostfile offer together, checking their syntax:
//  * --hosts: HOST:SLOTS[,HOST:SLOTS...], SLOTS from 1 to 4096 (a host named twice adds up);
//  * --hostfile: OpenMPI's format, one host a line, `HOST [slots=N] [max_slots=M]`, # comments
//    (MPICH's: `HOST[:N]`, 1 slot without N). An OpenMPI host without slots has as many as
//    mpirun finds cores there, which saturate cannot know: the total is then -1 (mpirun
//    bounds -n itself).
// sat::Error naming the flag (and the file and line) for anything else, for both given, or a
// hostfile that cannot be read or names no host. 0 when neither is given.
int host_slots(const LaunchOptions& o);

// The argv of `mpirun ... self_exe saturate_args...` for n processes on this machine, or
// on the hosts of o.hosts or o.hostfile (passed on as --host/--hostfile; self_exe must be at
// the same path on every host):
//  * n is bounded by the slots this machine offers (its hardware threads), or the hosts'
//    total slots (host_slots), as mpirun bounds it without --oversubscribe (sat::Error
//    naming -n otherwise); with the user's oversubscribe, --oversubscribe when n exceeds
//    them (OpenMPI refuses otherwise);
//  * --allow-run-as-root when running as root (OpenMPI refuses root otherwise; exec_command
//    also sets OMPI_ALLOW_RUN_AS_ROOT/_CONFIRM, the environment form of the same);
//  * --bind-to none: OpenMPI binds each rank to one core (np <= 2) or one socket by
//    default, which puts all of a rank's OpenMP threads, and its communication thread, on
//    that core; unbound, the OS spreads the threads and OMP_NUM_THREADS splits the cores;
//  * -x OMP_NUM_THREADS=max(1, threads / n) unless the user set it (then it is forwarded):
//    n processes each starting one OpenMP thread per hardware thread oversubscribe the
//    machine n times over. On hosts, only the user's: each rank's --threads 0 divides its
//    own host's cores among the ranks there;
//  * -x OMP_WAIT_POLICY=passive when oversubscribed (spinning threads steal the cores of
//    other ranks), forwarded as set otherwise; -x SAT_COMM_TIMEOUT when set.
// With openmpi = false: MPICH hydra's -n and -genv instead.
std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& saturate_args,
                                        const std::string& self_exe, const LaunchOptions& o = {});

// The command as one shell-quoted line (for printing).
std::string command_line(const std::vector<std::string>& argv);

// Prints the command to stderr, runs it as a child in a process group of its own and waits
// for it; returns its exit status (128 + signal when a signal ended it). SIGINT, SIGTERM,
// SIGHUP and SIGQUIT sent to this process are forwarded to the child (mpirun passes them
// to its ranks: a run with --checkpoint-dir checkpoints and stops); should the child still
// run `grace` seconds after the first, its process group is killed. The child is killed
// should this process die first (PR_SET_PDEATHSIG): nothing is left behind. Throws
// sat::Error "saturate launch needs mpirun: apt-get install openmpi-bin" when argv[0] is
// not found, and another sat::Error when it cannot be started otherwise.
int run_forwarding_signals(const std::vector<std::string>& argv, double grace = 30);

// The path of the running executable (/proc/self/exe), for self_exe.
std::string self_executable();

}  // namespace sat::dist
