// `saturate train` and `saturate tune`: the flags into the run's typed configs, one
// validation and the job's plan before MPI starts (every rank fails alike, with one line and
// status 2), tuning by the policy of tune/policy.h, then the trainer; rank 0 prints.
#pragma once
#include "cli/args.h"

namespace sat::cli {

// Returns the exit status (128 + signal when a signal stopped the run after its checkpoint).
int run_train(const RunArgs& a, bool tune_only);

}  // namespace sat::cli
