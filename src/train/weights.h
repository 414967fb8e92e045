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

}  // namespace sat
