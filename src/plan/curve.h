// The cost model's throughput curve for the batch-size tuner (TuneConfig's hook): the samples
// per second that `saturate plan` predicts for the job's own layout at each micro-batch.
#pragma once
#include <cstdint>
#include <functional>

#include "nn/models.h"
#include "plan/hardware.h"
#include "train/config.h"

namespace sat {

// Global samples per second at micro-batch b for cfg's layout (tp, pp, schedule, virtual
// stages, recomputation, sequence parallelism, ZeRO) on `ranks` ranks of hw, with cfg's
// optimizer; global_batch 0: one micro-batch per rank and step, otherwise the accumulation
// that forms it (0 where b cannot).
std::function<double(int64_t)> throughput_curve(const ModelConfig& mc, const TrainConfig& cfg, int ranks,
                                                const Hardware& hw, int64_t global_batch);

}  // namespace sat
