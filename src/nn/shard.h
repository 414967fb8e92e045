// Moving between a full tensor and one tensor-parallel rank's part of it (ParamShard,
// nn/layer.h): initialisation draws the full tensor and keeps the part; saving gathers
// the parts into the full tensor; loading keeps the part of the file's full tensor.
#pragma once
#include <cstdint>

#include "nn/layer.h"

namespace sat {

// Copies this rank's part out of the full tensor: local (decl.spec.shape) <- full
// (decl.full_shape()). Replicated parameters are copied whole. Element type: `elem` bytes.
void shard_extract(const ParamDecl& decl, const void* full, void* local, size_t elem = 4);
// The reverse: writes this rank's part into its place in the full tensor.
void shard_insert(const ParamDecl& decl, const void* local, void* full, size_t elem = 4);
// The same for part `index` of the group (all parts have this rank's shape).
void shard_insert_part(const ParamDecl& decl, int index, const void* local, void* full, size_t elem = 4);

}  // namespace sat
