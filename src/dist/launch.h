// `saturate launch`: start N copies of saturate under mpirun with the flags that users
// forget (see mpirun_command).
#pragma once
#include <string>
#include <vector>

namespace sat::dist {

struct LaunchOptions {
  int hardware_threads = 0;  // 0: std::thread::hardware_concurrency()
  int as_root = -1;          // -1: geteuid() == 0
  bool openmpi = true;       // OpenMPI's mpirun (MPICH's hydra takes other flags)
  std::vector<std::string> mpirun_args;  // extra flags before the program (hostfile, ...)
};

// The argv of `mpirun ... self_exe saturate_args...` for n processes on this machine:
//  * --oversubscribe when n exceeds the hardware threads (OpenMPI refuses otherwise);
//  * --allow-run-as-root when running as root (OpenMPI refuses root otherwise; exec_command
//    also sets OMPI_ALLOW_RUN_AS_ROOT/_CONFIRM, the environment form of the same);
//  * --bind-to none: OpenMPI binds each rank to one core (np <= 2) or one socket by
//    default, which puts all of a rank's OpenMP threads, and its communication thread, on
//    that core; unbound, the OS spreads the threads and OMP_NUM_THREADS splits the cores;
//  * -x OMP_NUM_THREADS=max(1, threads / n) unless the user set it (then it is forwarded):
//    n processes each starting one OpenMP thread per hardware thread oversubscribe the
//    machine n times over;
//  * -x OMP_WAIT_POLICY=passive when oversubscribed (spinning threads steal the cores of
//    other ranks), forwarded as set otherwise; -x SAT_COMM_TIMEOUT when set.
// With openmpi = false: MPICH hydra's -n and -genv instead.
std::vector<std::string> mpirun_command(int n, const std::vector<std::string>& saturate_args,
                                        const std::string& self_exe, const LaunchOptions& o = {});

// The command as one shell-quoted line (for printing).
std::string command_line(const std::vector<std::string>& argv);

// Prints the command to stderr and execvp's it. Throws sat::Error "saturate launch needs
// mpirun: apt-get install openmpi-bin" when argv[0] is not found, and another sat::Error
// when exec fails otherwise.
[[noreturn]] void exec_command(const std::vector<std::string>& argv);

// The path of the running executable (/proc/self/exe), for self_exe.
std::string self_executable();

}  // namespace sat::dist
