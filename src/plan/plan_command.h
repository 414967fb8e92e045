// The command that runs a planned layout: `saturate train` with the layout's flags, under
// the launcher that starts its ranks. `saturate plan` prints it beside every layout and
// writes it to plan.json, so that what the planner recommends is what the user runs.
//
//   * the model as --model was given, --data synthetic (the data the planner plans for; a
//     user's own data replaces it), --device cuda on a GPU kind and --device cpu for
//     `--gpu this`, --precision and --optimizer when they differ from train's defaults;
//   * the layout: --batch MICRO, --accum ACCUM, --tp, --sequence-parallel, --pp,
//     --pp-schedule interleaved --virtual-stages V, --recompute, --zero (only those that
//     differ from train's defaults); dp is what the ranks leave (world / (tp x pp)), so the
//     global batch is MICRO x ACCUM x dp, the plan's;
//   * the launcher: none for one rank; `mpirun -np N` on one node (`--gpu this`, or N no more
//     than the devices of a node), with --oversubscribe when `--gpu this` plans more ranks
//     than this machine has hardware threads (OpenMPI refuses them otherwise); Slurm's
//     `srun --nodes=K --ntasks-per-node=G --gpus-per-node=G` across nodes (saturate reads
//     SLURM_PROCID and the step's tasks per node; a GPU per local rank).
#pragma once
#include <string>
#include <vector>

#include "plan/planner.h"

namespace sat {

// The command's words (argv), the launcher's first. l: a planned layout (dp set).
// host_threads: this machine's hardware threads, for `--gpu this` (0: std::thread's count).
std::vector<std::string> train_command_argv(const Layout& l, const PlanRequest& r, int host_threads = 0);
// The same as one shell line, each word quoted where the shell would split or expand it.
std::string train_command(const Layout& l, const PlanRequest& r, int host_threads = 0);

// The device `saturate train` runs the planned cluster on: a GPU kind's, or this machine's CPU.
Device plan_device(const PlanRequest& r);

}  // namespace sat
