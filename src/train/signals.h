// Stopping on a signal between steps: SIGTERM and SIGUSR1 (Slurm's --signal warning before
// preemption) and a first SIGINT ask the run to finish its step, write a checkpoint and stop;
// a second SIGINT stops the process at once (exit status 130). Installed only by runs that
// write checkpoints; the handlers only record the signal.
#pragma once

namespace sat {

void install_stop_signals();
// The first stop signal received so far (0: none).
int stop_signal_received();
// The exit status of a run stopped by `sig` after its checkpoint: 128 + sig, as a shell
// reports a process killed by it (SIGTERM 143, SIGUSR1 138, SIGINT 130).
int stop_exit_status(int sig);

}  // namespace sat
