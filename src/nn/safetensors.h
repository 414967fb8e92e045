// Parameters and model state (BatchNorm running statistics) as safetensors files,
// with PyTorch's names and layouts (a state_dict without the tied lm_head.weight).
// Format: u64 little-endian header length, JSON header, raw little-endian data.
#pragma once
#include <set>
#include <string>

#include "nn/params.h"

namespace sat {

// The format's name of a dtype: "F32", "I64", "BF16", ...
const char* safetensors_dtype(DType t);

// Writes atomically (core/io.h: a unique temporary file beside it, fsynced and renamed), so an existing file is never lost
// to a failed write.
// Writes the host copies: on the GPU, call ps.sync_to_host() first.
void save_safetensors(const std::string& path, const ParamStore& ps, const std::string& model_name);
// Loads every parameter and state tensor; a missing tensor, a wrong shape or dtype,
// an unknown tensor name or a corrupt file is a sat::Error naming the file. A pipeline
// stage's store holds part of the model: given the names of the whole model's
// parameters and states, the file's tensors of other stages are skipped. A tensor-parallel
// part (ParamDecl::shard) is read from the file's full tensor.
void load_safetensors(const std::string& path, ParamStore& ps, const std::set<std::string>* model_names = nullptr);

}  // namespace sat
