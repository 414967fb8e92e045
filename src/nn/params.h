// Persistent state of a model: parameters, their gradients, optimizer state and
// non-trained state (BatchNorm running statistics). Parameters, gradients and each
// optimizer slot are single flat float arrays with identical layouts, so the
// optimizer is one fused loop over contiguous memory. Each tensor starts on a
// 64-byte boundary; the padding between tensors stays zero in every array.
#pragma once
#include <string>
#include <vector>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/tensor.h"
#include "nn/layer.h"

namespace sat {

class ParamStore {
 public:
  // ZeRO-1: with shards > 1 this store keeps optimizer state only for its shard (number
  // `shard`) of the flat arrays: the flat length is padded to a multiple of 16 * shards
  // and cut into `shards` equal, contiguous pieces.
  ParamStore(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int optimizer_slots,
             int shards = 1, int shard = 0);

  // Bytes each part will take, without allocating.
  struct Sizes { size_t params = 0, grads = 0, optimizer = 0, states = 0; size_t total() const { return params + grads + optimizer + states; } };
  static Sizes predict(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int optimizer_slots,
                       int shards = 1);

  // Initialise parameters by their ParamInit (seeded per name) and states by theirs.
  void init(uint64_t seed);
  // The parity initialisation shared with bench/peer/common.py (see parity_init there).
  void init_parity();
  void zero_optimizer_state();

  size_t num_params() const { return decls_.size(); }
  const ParamDecl& decl(size_t i) const { return decls_[i]; }
  // Views of the working copies: on the host, or on the GPU after to_device().
  Tensor param(size_t i) const { return {p_ + offsets_[i], decls_[i].spec.shape, DType::f32, device_}; }
  Tensor grad(size_t i) const { return {g_ + offsets_[i], decls_[i].spec.shape, DType::f32, device_}; }
  // The parameter in the low-precision dtype (GEMM inputs); == param(i) under f32.
  Tensor param_lp(size_t i) const {
    if (lp_dtype_ == DType::f32) return param(i);
    return {lp_.as<uint8_t>() + size_t(offsets_[i]) * dtype_size(lp_dtype_), decls_[i].spec.shape, lp_dtype_, device_};
  }
  int find_param(const std::string& name) const;  // -1 when absent
  int64_t offset(size_t i) const { return offsets_[i]; }  // of parameter i in the flat arrays, in floats

  size_t num_states() const { return state_decls_.size(); }
  const ParamDecl& state_decl(size_t i) const { return state_decls_[i]; }
  Tensor state(size_t i) const {
    return {s_ + state_offsets_[i], state_decls_[i].spec.shape, state_decls_[i].spec.dtype, device_};
  }
  int find_state(const std::string& name) const;

  // Flat views (length flat_size(), padding included) for the optimizer.
  int64_t flat_size() const { return flat_; }
  float* flat_params() const { return p_; }
  float* flat_grads() const { return g_; }
  // Optimizer slot s covers this store's shard: flat elements [shard_begin(),
  // shard_begin() + shard_len()) (the whole array without sharding).
  float* flat_slot(int s) const { return o_ + int64_t(s) * shard_len_; }
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_len() const { return shard_len_; }
  void* flat_lp() const { return lp_dtype_ == DType::f32 ? static_cast<void*>(p_) : lp_.data(); }
  DType lp_dtype() const { return lp_dtype_; }
  int optimizer_slots() const { return slots_; }
  int64_t param_count() const;

  // Moves the working copies to the GPU: parameters, gradients, optimizer slots and
  // states get device arrays initialised from the host ones, and with lp != f32 a
  // low-precision copy of the parameters (kept current by the optimizer). The host
  // arrays stay as the staging area of sync_to_host().
  void to_device(Device dev, DType lp);
  Device device() const { return device_; }
  // Copies parameters, optimizer slots and states back to the host arrays and returns a
  // host view of this store's values (for saving, checks and evaluation reports).
  void sync_to_host();
  Tensor host_param(size_t i) const { return {params_.as<float>() + offsets_[i], decls_[i].spec.shape}; }
  float* host_flat_params() const { return params_.as<float>(); }  // flat_size() floats
  Tensor host_state(size_t i) const {
    return {states_.as<uint8_t>() + state_offsets_[i], state_decls_[i].spec.shape, state_decls_[i].spec.dtype};
  }
  // Refreshes the low-precision copy from the parameters (after loading weights).
  void refresh_lp();
  // Bytes on the device beyond params/grads/optimizer/states: the low-precision copy.
  static size_t lp_bytes(const std::vector<ParamDecl>& params, DType lp);

 private:
  std::vector<ParamDecl> decls_, state_decls_;
  std::vector<int64_t> offsets_;        // in floats
  std::vector<size_t> state_offsets_;   // in bytes
  int64_t flat_ = 0;
  int64_t shard_begin_ = 0, shard_len_ = 0;
  size_t state_bytes_ = 0;
  int slots_ = 0;
  Buffer params_, grads_, optim_, states_;   // host arrays
  DeviceBuffer dparams_, dgrads_, doptim_, dstates_, lp_;  // GPU arrays after to_device()
  Device device_ = Device::cpu;
  DType lp_dtype_ = DType::f32;
  float* p_ = nullptr;  // working copies (host or device)
  float* g_ = nullptr;
  float* o_ = nullptr;
  uint8_t* s_ = nullptr;
};

}  // namespace sat
