// One validation of a training run: every check that needs no communication, no data and
// no model graph (the layout against the job's ranks, the settings' ranges, the device's
// support matrix, the model's own limits under tensor parallelism and recomputation, what
// measuring the noise scale needs). The CLI calls it before MPI starts (so every rank
// fails alike with one line and status 2), the library's fit() calls it, and the trainer
// calls it again (a library user may build a Trainer directly). Checks that need the model's
// graph (the pipeline's cut) run when the job's plan is built (train/plan.h), and those that
// need the data when the trainer opens it.
#pragma once
#include <string>
#include <vector>

#include "backend/support.h"
#include "nn/models.h"
#include "train/config.h"

namespace sat {

// sat::Error naming the flag and what was expected. world: the job's ranks.
void validate_run(const ModelConfig& mc, const TrainConfig& cfg, int world);

// The ZeRO stage against the device and the data-parallel ranks (part of validate_run).
void check_zero(const TrainConfig& cfg, bool cuda, int dp);

// What `train` on device d would refuse in layout l today (backend/support.h), one line
// each as the refusal words it: the planner and --layout auto say so beside the layouts
// they recommend. With the model, its family too (Llama's kernels are CPU-only yet).
std::vector<std::string> refusals(const Layout& l, Device d, const ModelConfig* model = nullptr);

// The activation dtype of a precision on a device (sat::Error when the device lacks it).
DType activation_dtype(Precision p, Device dev);

// The model as the job runs it: device, activation dtype and the tensor-parallel layout
// (tp_rank: this rank's part of each split layer). dev_index: the GPU --device names.
// cp_rank: this rank's part of each sequence under context parallelism (--cp); ep_rank: its
// place in its expert-parallel group (--ep: the experts it holds).
ModelConfig resolved_model(const ModelConfig& mc, const TrainConfig& cfg, int tp_rank = 0, int* dev_index = nullptr,
                           int cp_rank = 0, int ep_rank = 0);

}  // namespace sat
