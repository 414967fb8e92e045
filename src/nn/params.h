// Persistent state of a model: parameters, their gradients, optimizer state and
// non-trained state (BatchNorm running statistics). Parameters, gradients and each
// optimizer slot are single flat float arrays with identical layouts, so the
// optimizer is one fused loop over contiguous memory. Each tensor starts on a
// 64-byte boundary; the padding between tensors stays zero in every array.
#pragma once
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/tensor.h"
#include "nn/layer.h"

namespace sat {

class ParamStore {
 public:
  ParamStore(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int optimizer_slots);

  // Bytes each part will take, without allocating.
  struct Sizes { size_t params = 0, grads = 0, optimizer = 0, states = 0; size_t total() const { return params + grads + optimizer + states; } };
  static Sizes predict(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int optimizer_slots);

  // Initialise parameters by their ParamInit (seeded per name) and states by theirs.
  void init(uint64_t seed);
  // The parity initialisation shared with bench/peer/common.py (see parity_init there).
  void init_parity();
  void zero_optimizer_state();

  size_t num_params() const { return decls_.size(); }
  const ParamDecl& decl(size_t i) const { return decls_[i]; }
  Tensor param(size_t i) const { return {params_.as<float>() + offsets_[i], decls_[i].spec.shape}; }
  Tensor grad(size_t i) const { return {grads_.as<float>() + offsets_[i], decls_[i].spec.shape}; }
  int find_param(const std::string& name) const;  // -1 when absent

  size_t num_states() const { return state_decls_.size(); }
  const ParamDecl& state_decl(size_t i) const { return state_decls_[i]; }
  Tensor state(size_t i) const {
    return {states_.as<uint8_t>() + state_offsets_[i], state_decls_[i].spec.shape, state_decls_[i].spec.dtype};
  }
  int find_state(const std::string& name) const;

  // Flat views (length flat_size(), padding included) for the optimizer.
  int64_t flat_size() const { return flat_; }
  float* flat_params() const { return params_.as<float>(); }
  float* flat_grads() const { return grads_.as<float>(); }
  float* flat_slot(int s) const { return optim_.as<float>() + int64_t(s) * flat_; }
  int optimizer_slots() const { return slots_; }
  int64_t param_count() const;

 private:
  std::vector<ParamDecl> decls_, state_decls_;
  std::vector<int64_t> offsets_;        // in floats
  std::vector<size_t> state_offsets_;   // in bytes
  int64_t flat_ = 0;
  size_t state_bytes_ = 0;
  int slots_ = 0;
  Buffer params_, grads_, optim_, states_;
};

}  // namespace sat
