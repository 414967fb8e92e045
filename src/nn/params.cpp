#include "nn/params.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "nn/shard.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#endif

namespace sat {
namespace {
int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }
size_t pad64(size_t n) { return (n + 63) / 64 * 64; }

// shards: the flat length is a multiple of 16 * shards, so that every optimizer shard
// has the same length and starts on a 64-byte boundary.
void layout(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int shards,
            std::vector<int64_t>* offs, int64_t* flat, std::vector<size_t>* soffs, size_t* sbytes) {
  int64_t f = 0;
  for (auto& p : params) {
    if (offs) offs->push_back(f);
    f += pad16(p.spec.shape.numel());
  }
  const int64_t unit = 16 * int64_t(shards);
  *flat = (f + unit - 1) / unit * unit;
  size_t b = 0;
  for (auto& s : states) {
    if (soffs) soffs->push_back(b);
    b += pad64(s.spec.bytes());
  }
  *sbytes = b;
}
}  // namespace

ParamStore::Sizes ParamStore::predict(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states,
                                      int slots, int shards) {
  SAT_CHECK(shards >= 1, "internal error: optimizer shards must be positive");
  int64_t flat;
  size_t sb;
  layout(params, states, shards, nullptr, &flat, nullptr, &sb);
  Sizes s;
  s.params = size_t(flat) * 4;
  s.grads = size_t(flat) * 4;
  s.optimizer = size_t(flat / shards) * 4 * size_t(slots);
  s.states = sb;
  return s;
}

ParamStore::ParamStore(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int slots,
                       int shards, int shard)
    : decls_(params), state_decls_(states), slots_(slots) {
  SAT_CHECK(shards >= 1 && shard >= 0 && shard < shards, "internal error: optimizer shard ", shard, " of ", shards);
  layout(params, states, shards, &offsets_, &flat_, &state_offsets_, &state_bytes_);
  shard_len_ = flat_ / shards;
  shard_begin_ = shard_len_ * shard;
  params_ = Buffer(size_t(flat_) * 4, "parameters");
  grads_ = Buffer(size_t(flat_) * 4, "gradients");
  optim_ = Buffer(size_t(shard_len_) * 4 * size_t(slots), "optimizer state");
  states_ = Buffer(state_bytes_, "model state");
  std::memset(params_.data(), 0, params_.bytes());
  std::memset(grads_.data(), 0, grads_.bytes());
  if (optim_.bytes()) std::memset(optim_.data(), 0, optim_.bytes());
  if (states_.bytes()) std::memset(states_.data(), 0, states_.bytes());
  p_ = params_.as<float>();
  g_ = grads_.as<float>();
  o_ = optim_.as<float>();
  s_ = states_.as<uint8_t>();
}

size_t ParamStore::lp_bytes(const std::vector<ParamDecl>& params, DType lp) {
  if (lp == DType::f32) return 0;
  int64_t flat = 0;
  for (auto& p : params) flat += pad16(p.spec.shape.numel());
  return size_t(flat) * dtype_size(lp);
}

void ParamStore::to_device(Device dev, DType lp) {
  SAT_CHECK(device_ == Device::cpu, "internal error: parameters are already on the GPU");
  if (dev == Device::cpu) {
    SAT_CHECK(lp == DType::f32, "--precision: bf16/f16 need --device cuda");
    return;
  }
  dparams_ = DeviceBuffer(dev, params_.bytes(), "parameters");
  dgrads_ = DeviceBuffer(dev, grads_.bytes(), "gradients");
  doptim_ = DeviceBuffer(dev, optim_.bytes(), "optimizer state");
  dstates_ = DeviceBuffer(dev, states_.bytes(), "model state");
  device_copy(dparams_.data(), dev, params_.data(), Device::cpu, params_.bytes());
  device_copy(dgrads_.data(), dev, grads_.data(), Device::cpu, grads_.bytes());
  device_copy(doptim_.data(), dev, optim_.data(), Device::cpu, optim_.bytes());
  device_copy(dstates_.data(), dev, states_.data(), Device::cpu, states_.bytes());
  device_ = dev;
  lp_dtype_ = lp;
  p_ = dparams_.as<float>();
  g_ = dgrads_.as<float>();
  o_ = doptim_.as<float>();
  s_ = dstates_.as<uint8_t>();
  if (lp != DType::f32) {
    lp_ = DeviceBuffer(dev, size_t(flat_) * dtype_size(lp), "low-precision parameters");
    refresh_lp();
  }
}

void ParamStore::refresh_lp() {
  if (lp_dtype_ == DType::f32 || device_ == Device::cpu) return;
#if SAT_HAVE_CUDA
  cuda::convert(p_, DType::f32, lp_.data(), lp_dtype_, flat_, nullptr);
  SAT_CUDA_CHECK(cudaDeviceSynchronize());
#endif
}

void ParamStore::sync_to_host() {
  if (device_ == Device::cpu) return;
  device_copy(params_.data(), Device::cpu, p_, device_, params_.bytes());
  device_copy(optim_.data(), Device::cpu, o_, device_, optim_.bytes());
  device_copy(states_.data(), Device::cpu, s_, device_, states_.bytes());
}

int64_t ParamStore::param_count() const {
  int64_t n = 0;
  for (auto& d : decls_) n += d.spec.shape.numel();
  return n;
}

int ParamStore::find_param(const std::string& name) const {
  for (size_t i = 0; i < decls_.size(); ++i)
    if (decls_[i].name == name) return int(i);
  return -1;
}

int ParamStore::find_state(const std::string& name) const {
  for (size_t i = 0; i < state_decls_.size(); ++i)
    if (state_decls_[i].name == name) return int(i);
  return -1;
}

static void init_states(const ParamStore& ps) {
  for (size_t i = 0; i < ps.num_states(); ++i) {
    Tensor t = ps.host_state(i);
    std::memset(t.ptr, 0, t.bytes());
    const ParamInit& in = ps.state_decl(i).init;
    if (t.dtype != DType::f32) continue;
    float v = in.kind == ParamInit::Kind::ones ? 1.0f : in.kind == ParamInit::Kind::constant ? in.scale : 0.0f;
    for (int64_t k = 0; k < t.numel(); ++k) t.f32()[k] = v;
  }
}

namespace {
// Fills a parameter drawn as its full tensor (so that every tensor-parallel layout starts
// from the weights of one process) and keeps this rank's part: fill(full, numel).
template <class Fill>
void fill_param(const ParamDecl& d, Tensor local, Fill fill) {
  if (!d.shard.split()) {
    fill(local.f32(), local.numel());
    return;
  }
  std::vector<float> full(size_t(d.full_shape().numel()));
  fill(full.data(), int64_t(full.size()));
  shard_extract(d, full.data(), local.ptr);
}
}  // namespace

void ParamStore::init(uint64_t seed) {
  SAT_CHECK(device_ == Device::cpu, "internal error: initialise parameters before moving them to the GPU");
  for (size_t i = 0; i < decls_.size(); ++i) {
    const ParamInit& in = decls_[i].init;
    fill_param(decls_[i], host_param(i), [&](float* p, int64_t n) {
      Rng rng(mix_seed(seed, fnv1a64(decls_[i].name)));
      for (int64_t k = 0; k < n; ++k) {
        switch (in.kind) {
          case ParamInit::Kind::zeros: p[k] = 0; break;
          case ParamInit::Kind::ones: p[k] = 1; break;
          case ParamInit::Kind::constant: p[k] = in.scale; break;
          case ParamInit::Kind::uniform: p[k] = rng.uniform(-in.scale, in.scale); break;
          case ParamInit::Kind::normal: p[k] = in.scale * rng.normal(); break;
        }
      }
    });
  }
  init_states(*this);
  zero_optimizer_state();
}

// Norm weights (init ones): 1 + 0.1 v; other 1-D: 0.1 v; >= 2-D: v / sqrt(fan_in),
// v = 2 unit(fnv1a64(name), k) - 1 in double, stored as float (k, fan_in: of the full tensor).
void ParamStore::init_parity() {
  SAT_CHECK(device_ == Device::cpu, "internal error: initialise parameters before moving them to the GPU");
  for (size_t i = 0; i < decls_.size(); ++i) {
    const ParamDecl& d = decls_[i];
    const Shape full = d.full_shape();
    fill_param(d, host_param(i), [&](float* p, int64_t n) {
      uint64_t h = fnv1a64(d.name);
      double fan_in = full.nd >= 2 ? double(n / full[0]) : 1.0;
      double base = (full.nd == 1 && d.init.kind == ParamInit::Kind::ones) ? 1.0 : 0.0;
      for (int64_t k = 0; k < n; ++k) {
        double v = 2.0 * double(hash_unit(h, uint64_t(k))) - 1.0;
        p[k] = float(full.nd >= 2 ? v / std::sqrt(fan_in) : base + 0.1 * v);
      }
    });
  }
  init_states(*this);
  zero_optimizer_state();
}

void ParamStore::zero_optimizer_state() {
  if (optim_.bytes()) std::memset(optim_.data(), 0, optim_.bytes());
  if (device_ != Device::cpu) device_memset(o_, device_, 0, optim_.bytes());
}

}  // namespace sat
