#include "nn/params.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/bf16.h"
#include "core/rng.h"
#include "nn/shard.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#endif

namespace sat {
namespace {
int64_t pad16(int64_t n) { return (n + 15) / 16 * 16; }
size_t pad64(size_t n) { return (n + 63) / 64 * 64; }

// The flat layout: each tensor at a multiple of 16 floats. ZeRO-1: the flat length is a
// multiple of 16 * parts, so that every optimizer shard has the same length and starts on
// a 64-byte boundary. ZeRO-2/3: so is every unit (units: [lo, hi) per unit).
struct Layout {
  std::vector<int64_t> offs;
  std::vector<int64_t> unit_lo, unit_hi;
  std::vector<int> unit_of;
  int64_t flat = 0;
  std::vector<size_t> soffs;
  size_t sbytes = 0;
};

Layout layout(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, const StoreSharding& sh) {
  Layout L;
  const int64_t unit = 16 * int64_t(sh.parts);
  auto round = [&](int64_t n) { return (n + unit - 1) / unit * unit; };
  int64_t f = 0;
  size_t next_unit = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (sh.stage >= 2 && next_unit < sh.units.size() && sh.units[next_unit] == int(i)) {
      if (!L.unit_lo.empty()) L.unit_hi.push_back(f = round(f));
      L.unit_lo.push_back(f);
      ++next_unit;
    }
    L.offs.push_back(f);
    L.unit_of.push_back(int(L.unit_lo.size()) - 1);
    f += pad16(params[i].spec.shape.numel());
  }
  L.flat = round(f);
  if (!L.unit_lo.empty()) L.unit_hi.push_back(L.flat);
  for (auto& s : states) {
    L.soffs.push_back(L.sbytes);
    L.sbytes += pad64(s.spec.bytes());
  }
  return L;
}

void check_sharding(const StoreSharding& sh, size_t params) {
  SAT_CHECK(sh.stage >= 0 && sh.stage <= 3 && sh.parts >= 1 && sh.index >= 0 && sh.index < sh.parts,
            "internal error: ZeRO stage ", sh.stage, ", shard ", sh.index, " of ", sh.parts);
  if (sh.stage < 2 || params == 0) return;
  SAT_CHECK(!sh.units.empty() && sh.units[0] == 0, "internal error: the first unit must start at parameter 0");
  for (size_t k = 1; k < sh.units.size(); ++k)
    SAT_CHECK(sh.units[k] > sh.units[k - 1] && size_t(sh.units[k]) < params, "internal error: bad unit starts");
}
}  // namespace

ParamStore::Sizes ParamStore::predict(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states,
                                      int slots, const StoreSharding& sh) {
  check_sharding(sh, params.size());
  const Layout L = layout(params, states, sh);
  const int64_t shard = L.flat / sh.parts;
  Sizes s;
  s.params = size_t(sh.stage >= 3 ? shard : L.flat) * 4;
  s.grads = sh.gradients ? size_t(sh.stage >= 2 ? shard : L.flat) * 4 : 0;
  s.optimizer = size_t(sh.stage >= 1 ? shard : L.flat) * 4 * size_t(slots);
  s.states = L.sbytes;
  return s;
}

ParamStore::Sizes ParamStore::predict(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states,
                                      int slots, int shards) {
  SAT_CHECK(shards >= 1, "internal error: optimizer shards must be positive");
  return predict(params, states, slots, StoreSharding{shards > 1 ? 1 : 0, shards, 0, {}});
}

std::vector<std::pair<int64_t, int64_t>> ParamStore::unit_ranges(const std::vector<ParamDecl>& params,
                                                                 const StoreSharding& sh) {
  check_sharding(sh, params.size());
  const Layout L = layout(params, {}, sh);
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t u = 0; u < L.unit_lo.size(); ++u) out.push_back({L.unit_lo[u], L.unit_hi[u]});
  return out;
}

ParamStore::ParamStore(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int slots,
                       int shards, int shard)
    : ParamStore(params, states, slots, StoreSharding{shards > 1 ? 1 : 0, shards, shard, {}}) {}

ParamStore::ParamStore(const std::vector<ParamDecl>& params, const std::vector<ParamDecl>& states, int slots,
                       StoreSharding sh)
    : decls_(params), state_decls_(states), sharding_(std::move(sh)), slots_(slots) {
  check_sharding(sharding_, params.size());
  if (sharding_.stage == 0) sharding_.parts = 1, sharding_.index = 0;
  Layout L = layout(params, states, sharding_);
  offsets_ = std::move(L.offs);
  state_offsets_ = std::move(L.soffs);
  state_bytes_ = L.sbytes;
  flat_ = L.flat;
  unit_lo_ = std::move(L.unit_lo);
  unit_hi_ = std::move(L.unit_hi);
  unit_of_ = std::move(L.unit_of);
  unit_params_.assign(unit_lo_.size(), nullptr);
  unit_grads_.assign(unit_lo_.size(), nullptr);
  unit_lp_.assign(unit_lo_.size(), nullptr);
  const int stage = sharding_.stage;
  shard_len_ = flat_ / sharding_.parts;  // the whole array without sharding (parts 1)
  shard_begin_ = stage == 1 ? shard_len_ * sharding_.index : 0;
  params_ = Buffer(size_t(stage >= 3 ? shard_len_ : flat_) * 4, "parameters");
  grads_ = Buffer(sharding_.gradients ? size_t(stage >= 2 ? shard_len_ : flat_) * 4 : 0, "gradients");
  optim_ = Buffer(size_t(shard_len_) * 4 * size_t(slots), "optimizer state");
  states_ = Buffer(state_bytes_, "model state");
  std::memset(params_.data(), 0, params_.bytes());
  if (grads_.bytes()) std::memset(grads_.data(), 0, grads_.bytes());
  if (optim_.bytes()) std::memset(optim_.data(), 0, optim_.bytes());
  if (states_.bytes()) std::memset(states_.data(), 0, states_.bytes());
  p_ = params_.as<float>();
  g_ = grads_.bytes() ? grads_.as<float>() : nullptr;
  o_ = optim_.as<float>();
  s_ = states_.as<uint8_t>();
}

float* ParamStore::param_ptr(size_t i) const {
  if (sharding_.stage < 3) return p_ + offsets_[i];
  const size_t u = size_t(unit_of_[i]);
  return unit_params_[u] ? unit_params_[u] + (offsets_[i] - unit_lo_[u]) : nullptr;
}

float* ParamStore::grad_ptr(size_t i) const {
  if (sharding_.stage < 2) return g_ ? g_ + offsets_[i] : nullptr;
  const size_t u = size_t(unit_of_[i]);
  return unit_grads_[u] ? unit_grads_[u] + (offsets_[i] - unit_lo_[u]) : nullptr;
}

void* ParamStore::lp_ptr(size_t i) const {
  const size_t es = dtype_size(lp_dtype_);
  if (sharding_.stage < 3) return lp_.as<uint8_t>() + size_t(offsets_[i]) * es;
  const size_t u = size_t(unit_of_[i]);
  if (!unit_lp_[u]) return nullptr;
  return static_cast<uint8_t*>(unit_lp_[u]) + size_t(offsets_[i] - unit_lo_[u]) * es;
}

void ParamStore::bind_unit(size_t u, float* params, float* grads, void* lp) {
  SAT_CHECK(sharding_.stage >= 2 && u < unit_lo_.size(), "internal error: bind_unit without ZeRO-2/3 units");
  unit_params_[u] = params;
  unit_grads_[u] = grads;
  unit_lp_[u] = lp;
}

std::vector<UpdateSpan> ParamStore::update_spans() const {
  if (sharding_.stage != 2) return {{p_ + shard_begin_, g_ + shard_begin_, 0, shard_len_}};
  std::vector<UpdateSpan> out;
  for (size_t u = 0; u < unit_lo_.size(); ++u) {
    const int64_t n = unit_piece(u), so = unit_lo_[u] / sharding_.parts;
    out.push_back({p_ + unit_lo_[u] + sharding_.index * n, g_ + so, so, n});
  }
  return out;
}

// The part of parameter i that this rank's piece of its unit holds: flat [a, b), kept at
// shard offset `at` (a == b: none).
namespace {
struct Overlap { int64_t a, b, at; };
Overlap overlap(const ParamStore& ps, size_t i) {
  const size_t u = size_t(ps.unit_of(i));
  const int64_t n = ps.unit_piece(u), lo = ps.unit_begin(u) + ps.sharding().index * n;
  const int64_t a = std::max(ps.offset(i), lo), b = std::min(ps.offset(i) + ps.decl(i).spec.shape.numel(), lo + n);
  return {a, std::max(a, b), ps.unit_begin(u) / ps.sharding().parts + (a - lo)};
}
}  // namespace

void ParamStore::shard_from(const ParamStore& full) {
  SAT_CHECK(sharding_.stage >= 3 && device_ == Device::cpu && full.num_params() == decls_.size(),
            "internal error: shard_from needs a ZeRO-3 store on the host");
  for (size_t i = 0; i < decls_.size(); ++i) {
    const Overlap o = overlap(*this, i);
    const float* src = full.host_param(i).f32() + (o.a - offsets_[i]);
    std::copy(src, src + (o.b - o.a), p_ + o.at);
  }
  SAT_CHECK(full.state_bytes_ == state_bytes_, "internal error: shard_from: different model states");
  if (state_bytes_) std::memcpy(s_, full.s_, state_bytes_);
  refresh_lp();
}

std::pair<int64_t, int64_t> ParamStore::shard_part(size_t i) const {
  if (sharding_.stage < 2) {
    const int64_t a = std::max(offsets_[i], shard_begin_);
    const int64_t b = std::min(offsets_[i] + decls_[i].spec.shape.numel(), shard_begin_ + shard_len_);
    return {a, std::max<int64_t>(0, b - a)};
  }
  const Overlap o = overlap(*this, i);
  return {o.at, o.b - o.a};
}


size_t ParamStore::lp_bytes(const std::vector<ParamDecl>& params, DType lp, const StoreSharding& sh) {
  if (lp == DType::f32) return 0;
  check_sharding(sh, params.size());
  const int64_t flat = layout(params, {}, sh).flat;
  return size_t(sh.stage >= 3 ? flat / sh.parts : flat) * dtype_size(lp);
}

void ParamStore::to_device(Device dev, DType lp) {
  SAT_CHECK(device_ == Device::cpu, "internal error: parameters are already on the GPU");
  if (dev == Device::cpu) {  // bf16 on the CPU: the host copy the layers read
    SAT_CHECK(lp == DType::f32 || lp == DType::bf16, "--precision: f16 needs --device cuda");
    if (lp == DType::f32 || lp_dtype_ == lp) return;
    lp_ = DeviceBuffer(Device::cpu, params_.bytes() / 4 * dtype_size(lp), "low-precision parameters");
    lp_dtype_ = lp;
    refresh_lp();
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
  g_ = grads_.bytes() ? dgrads_.as<float>() : nullptr;
  o_ = doptim_.as<float>();
  s_ = dstates_.as<uint8_t>();
  if (lp != DType::f32) {
    lp_ = DeviceBuffer(dev, size_t(lp_size()) * dtype_size(lp), "low-precision parameters");
    refresh_lp();
  }
}

void ParamStore::refresh_lp() {
  if (lp_dtype_ == DType::f32) return;
  if (device_ == Device::cpu) {  // the master's array: whole, or this rank's shard (ZeRO-3)
    cpu::to_bf16(p_, lp_.as<uint16_t>(), int64_t(params_.bytes() / 4));
    return;
  }
#if SAT_HAVE_CUDA
  cuda::convert(p_, DType::f32, lp_.data(), lp_dtype_, lp_size(), nullptr);
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
  SAT_CHECK(sharding_.stage < 3, "internal error: initialise a full store, then shard_from() it (ZeRO-3)");
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
  SAT_CHECK(sharding_.stage < 3, "internal error: initialise a full store, then shard_from() it (ZeRO-3)");
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
