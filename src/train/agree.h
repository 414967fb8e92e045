// Under mpirun every rank must train the same thing: the same resolved configuration, the
// same data, and replicas that start from the same weights. A rank launched with other flags
// (an MPMD command line, a script that differs by host) or that read another file under the
// same name would otherwise train on silently, or hang in a collective of another size.
// These checks are collective and every rank reaches the same decision: on a disagreement
// each rank prints one line, all wait until every rank has (a barrier), and each throws
// ReportedError (the CLI exits with status 2 without printing it again).
#pragma once
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "dist/comm.h"
#include "nn/models.h"
#include "nn/params.h"
#include "train/config.h"

namespace sat {

// The configuration every rank must share, as "key=value;" fields: the model, the
// training settings and the data (its name, sizes and scaling: --normalize); whether the
// run writes checkpoints (their collectives), but not where (what differs by rank by
// design, such as the progress display and the output directory, is left out).
std::string config_fingerprint(const ModelConfig& mc, const TrainConfig& cfg, const Dataset& train, const Dataset* test);

// Collective over `world`: every rank's fingerprint against rank 0's; the first field that
// differs is named by the rank that has it.
void agree_on_config(dist::Comm& world, const std::string& fingerprint);

// A checksum of a store's parameters (this rank's shard) and model states, bytewise.
uint64_t store_checksum(const ParamStore& ps);

// Collective over `world`: the replicas of each data-parallel group (`dp`, a group of
// `world`) hold the same values (checksum). `what`: where they came from, for the message.
void agree_on_replicas(dist::Comm& world, dist::Comm& dp, uint64_t checksum, const std::string& what);

}  // namespace sat
