// Persistent state of a model: parameters, their gradients, optimizer state and
// non-trained state (BatchNorm running statistics). Parameters, gradients and each
// optimizer slot are single flat float arrays with identical layouts, so the
// optimizer is one fused loop over contiguous memory. Each tensor starts on a
// 64-byte boundary; the padding between tensors stays zero in every array.
//
// Mixed precision (activation dtype bf16/f16), as FSDP's param_dtype: the float32
// parameters are the master weights, which the optimizer updates; the layers read a
// low-precision working copy of them (param_lp, flat_lp) in the same flat layout, 2 bytes
// an element. It is sharded as the master is: whole on every rank under ZeRO-0/1/2, this
// rank's pieces of every unit under ZeRO-3 (gathered per unit into buffers bound with
// bind_unit). Whoever writes the master refreshes the copy (refresh_lp): to_device,
// shard_from, the optimizer (ZeRO-0/3) or the gather after it (ZeRO-1/2), loading weights.
// On the GPU the copy lives on the device; on the CPU (bf16) in host memory.
#pragma once
#include <string>
#include <vector>

#include "backend/device.h"
#include "core/alloc.h"
#include "core/tensor.h"
#include "nn/layer.h"

namespace sat {

// How a store is sharded over the data-parallel ranks (ZeRO stages).
//   stage 1: optimizer state only. The flat length is padded to a multiple of 16 * parts
//            and cut into `parts` equal, contiguous pieces; rank `index` keeps the state
//            of its piece (shard_begin(), shard_len()).
//   stage 2: gradients too; stage 3: parameters too. The flat arrays are cut into
//            *units* (contiguous runs of parameters, starting at the parameter indices in
//            `units`: a model's blocks), each padded to a multiple of 16 * parts; rank
//            `index` owns piece `index` of every unit (unit_piece()). Its shard arrays
//            (gradients, optimizer slots and, under stage 3, parameters) are its pieces of
//            all units, in unit order. The full gradients of a unit, and under stage 3 its
//            full parameters, exist only in buffers the step binds (bind_unit) while it
//            needs them.
struct StoreSharding {
  int stage = 0;
  int parts = 1, index = 0;
  std::vector<int> units;  // stage >= 2: first parameter of each unit, ascending, from 0
  // false: a store of weights only, with no gradient buffer (generation, weights gathered to
  // be saved or loaded); its grad() views are null.
  bool gradients = true;
  static StoreSharding weights_only() {
    StoreSharding s;
    s.gradients = false;
    return s;
  }
};

// A contiguous range that the optimizer updates: n parameters at p, their gradients at
// g, their state at flat_slot(s) + slot.
struct UpdateSpan {
  float* p;
  const float* g;
  int64_t slot;
  int64_t n;
};

class ParamStore {
 public:
  ParamStore(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int optimizer_slots,
             StoreSharding sharding = {});
  // ZeRO-1 over `shards` ranks (stage 1 when shards > 1).
  ParamStore(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int optimizer_slots,
             int shards, int shard = 0);

  // Bytes each part will take, without allocating.
  struct Sizes { size_t params = 0, grads = 0, optimizer = 0, states = 0; size_t total() const { return params + grads + optimizer + states; } };
  static Sizes predict(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int optimizer_slots,
                       const StoreSharding& sharding);
  static Sizes predict(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int optimizer_slots,
                       int shards = 1);
  // ZeRO-2/3: the flat range [begin, end) of each unit, without allocating.
  static std::vector<std::pair<int64_t, int64_t>> unit_ranges(const std::vector<ParamDecl>& params,
                                                              const StoreSharding& sharding);

  // Initialise parameters by their ParamInit (seeded per name) and states by theirs.
  void init(uint64_t seed);
  // The parity initialisation shared with bench/peer/common.py (see parity_init there).
  void init_parity();
  void zero_optimizer_state();

  size_t num_params() const { return decls_.size(); }
  const ParamDecl& decl(size_t i) const { return decls_[i]; }
  // Views of the working copies: on the host, or on the GPU after to_device(). Under ZeRO-2
  // the gradient, under ZeRO-3 both, lie in the buffers bound to the parameter's unit.
  Tensor param(size_t i) const { return {param_ptr(i), decls_[i].spec.shape, DType::f32, device_}; }
  Tensor grad(size_t i) const { return {grad_ptr(i), decls_[i].spec.shape, DType::f32, device_}; }
  // The parameter in the low-precision dtype, what the layers read under mixed precision;
  // == param(i) under f32. Under ZeRO-3 it lies in the low-precision buffer bound to its unit.
  Tensor param_lp(size_t i) const {
    if (lp_dtype_ == DType::f32) return param(i);
    return {lp_ptr(i), decls_[i].spec.shape, lp_dtype_, device_};
  }
  int find_param(const std::string& name) const;  // -1 when absent
  int64_t offset(size_t i) const { return offsets_[i]; }  // of parameter i in the flat arrays, in floats

  size_t num_states() const { return state_decls_.size(); }
  const ParamDecl& state_decl(size_t i) const { return state_decls_[i]; }
  Tensor state(size_t i) const {
    return {s_ + state_offsets_[i], state_decls_[i].spec.shape, state_decls_[i].spec.dtype, device_};
  }
  int find_state(const std::string& name) const;

  // Flat views (length flat_size(), padding included) for the optimizer. Under ZeRO-2
  // flat_grads(), under ZeRO-3 flat_params() too, are this rank's shard (shard_len()).
  int64_t flat_size() const { return flat_; }
  float* flat_params() const { return p_; }
  float* flat_grads() const { return g_; }
  // What the optimizer updates: one span, or under ZeRO-2 one per unit.
  std::vector<UpdateSpan> update_spans() const;

  // ZeRO-2/3 (sharding().stage >= 2).
  const StoreSharding& sharding() const { return sharding_; }
  size_t num_units() const { return unit_lo_.size(); }
  int64_t unit_begin(size_t u) const { return unit_lo_[u]; }  // flat range, padding included
  int64_t unit_end(size_t u) const { return unit_hi_[u]; }
  int unit_of(size_t param) const { return unit_of_[param]; }
  // This rank's piece of unit u: flat elements [unit_begin + index * n, + n), kept at
  // shard offset unit_begin / parts.
  int64_t unit_piece(size_t u) const { return (unit_hi_[u] - unit_lo_[u]) / sharding_.parts; }
  // Where unit u's full parameters (ZeRO-3; null under ZeRO-2, and under mixed precision,
  // where the layers read the low-precision copy), its full low-precision copy (ZeRO-3
  // under mixed precision) and its gradients are while a step uses them; set before an
  // Engine binds its views.
  void bind_unit(size_t u, float* params, float* grads, void* lp = nullptr);
  // The part of parameter i in this rank's shard arrays: {shard offset, elements}.
  std::pair<int64_t, int64_t> shard_part(size_t i) const;
  // ZeRO-3: copies this rank's pieces of every parameter from `full` (the same
  // declarations, unsharded), and its model states.
  void shard_from(const ParamStore& full);
  // Optimizer slot s covers this store's shard: flat elements [shard_begin(),
  // shard_begin() + shard_len()) (the whole array without sharding); under ZeRO-2/3 the
  // shard is this rank's pieces of every unit (shard_begin() 0, shard_len() flat / parts).
  float* flat_slot(int s) const { return o_ + int64_t(s) * shard_len_; }
  int64_t shard_begin() const { return shard_begin_; }
  int64_t shard_len() const { return shard_len_; }
  // The low-precision copy, flat (the layout of flat_params(): under ZeRO-3 this rank's
  // shard, shard_len() elements); flat_params() under f32.
  void* flat_lp() const { return lp_dtype_ == DType::f32 ? static_cast<void*>(p_) : lp_.data(); }
  DType lp_dtype() const { return lp_dtype_; }
  // Elements of the parameters' array, and of the low-precision copy: flat_size(), or under
  // ZeRO-3 shard_len().
  int64_t lp_size() const { return int64_t(params_.bytes() / 4); }
  int optimizer_slots() const { return slots_; }
  int64_t param_count() const;

  // Moves the working copies to the GPU: parameters, gradients, optimizer slots and
  // states get device arrays initialised from the host ones, and with lp != f32 a
  // low-precision copy of the parameters (kept current by the optimizer). The host
  // arrays stay as the staging area of sync_to_host(). On the CPU (dev cpu) nothing
  // moves; with lp bf16 the store makes its host low-precision copy.
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
  // Refreshes the low-precision copy from the parameters (after writing them: loading
  // weights, an update); under ZeRO-3 this rank's shard of it from its shard.
  void refresh_lp();
  // After an optimizer step: under ZeRO-1/2 the updated parameters are gathered first (the
  // gather refreshes the copy); otherwise the update is complete here and refreshes it.
  void refresh_lp_after_update() {
    if (sharding_.stage != 1 && sharding_.stage != 2) refresh_lp();
  }
  // Bytes beyond params/grads/optimizer/states: the low-precision copy (0 under f32), as
  // a store of that sharding keeps it (whole, or this rank's shard under ZeRO-3).
  static size_t lp_bytes(const std::vector<ParamDecl>& params, DType lp, const StoreSharding& sharding = {});

 private:
  float* param_ptr(size_t i) const;
  float* grad_ptr(size_t i) const;
  void* lp_ptr(size_t i) const;

  std::vector<ParamDecl> decls_, state_decls_;
  StoreSharding sharding_;
  std::vector<int64_t> unit_lo_, unit_hi_;  // ZeRO-2/3
  std::vector<int> unit_of_;                // per parameter
  std::vector<float*> unit_params_, unit_grads_;
  std::vector<void*> unit_lp_;
  std::vector<int64_t> offsets_;        // in floats
  std::vector<size_t> state_offsets_;   // in bytes
  int64_t flat_ = 0;
  int64_t shard_begin_ = 0, shard_len_ = 0;
  size_t state_bytes_ = 0;
  int slots_ = 0;
  Buffer params_, grads_, optim_, states_;   // host arrays
  DeviceBuffer dparams_, dgrads_, doptim_, dstates_;  // GPU arrays after to_device()
  DeviceBuffer lp_;  // the low-precision copy: on the GPU, or on the host (CPU bf16)
  Device device_ = Device::cpu;
  DType lp_dtype_ = DType::f32;
  float* p_ = nullptr;  // working copies (host or device)
  float* g_ = nullptr;
  float* o_ = nullptr;
  uint8_t* s_ = nullptr;
};

}  // namespace sat
