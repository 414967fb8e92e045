// Weights in and out of a running job (train/runtime.h): safetensors files with PyTorch's
// parameter names, whatever the layout.
#pragma once
#include <string>

#include "train/runtime.h"

namespace sat {

// Loads parameters (and states) by name from a safetensors file into every stage (a stage
// skips the tensors of the others), agreed and broadcast over the data-parallel replicas.
void load_weights(RankRuntime& rt, const std::string& path);
// Writes the whole model's parameters and states, gathered from the pipeline stages and the
// tensor-parallel parts, to a safetensors file on global rank 0. Collective over the job.
void save_weights(RankRuntime& rt, const std::string& path);

// The training data's schema (Dataset::schema(): a table's columns, classes and
// standardisation) saved with weights under nn/safetensors.h's kDataSchemaKey (a
// safetensors file, or a checkpoint directory or the newest under it); "" when there is none or the path cannot be read (loading it says why).
std::string saved_data_schema(const std::string& path);

struct Manifest;
// The parameters and model states of checkpoint `dir` (its manifest m) into the host arrays
// of `into`, each tensor-parallel part its own piece (sat::Error naming the checkpoint when a
// tensor is missing or of another shape). The low-precision copy is the caller's to refresh.
void read_checkpoint_weights(const std::string& dir, const Manifest& m, ParamStore& into);

// One process's whole model from --init-weights, as train reads them: a safetensors file, or
// a checkpoint directory (or the newest under a root: its files verified, its model
// `model_name`). sat::Error naming --init-weights or the file otherwise.
void load_weights_into(ParamStore& ps, const std::string& path, const std::string& model_name);

}  // namespace sat
