#include "nn/layers/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include "backend/cpu/blas.h"
#include "dist/comm.h"
#include "nn/layers/activation.h"

namespace sat {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements

std::mutex& load_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, MoeLoad>& load_table() {
  static std::map<std::string, MoeLoad> t;
  return t;
}

float sigmoid(float x) { return 1.0f / (1.0f + vexp(-x)); }

// Saved buffers of Moe (forward to backward).
enum Saved { kProbs, kTop, kGates, kSlot, kOffs, kPerm, kHg, kHu };
// Scratch of backward (forward uses the first three).
enum Scratch { kXe, kAct, kYe, kDy, kDhg, kDhu, kDgate };

int64_t rows_of(const LayerSetup& s, int i, int64_t width) { return s.in_shape(i).numel() / width; }
}  // namespace

void route_topk(const float* logits, int64_t n, int64_t E, int64_t k, float* probs, int32_t* top, float* gates) {
#pragma omp parallel for schedule(static) if (n * E > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * E;
    float* p = probs + t * E;
    float m = l[0];
    for (int64_t e = 1; e < E; ++e) m = std::max(m, l[e]);
    float z = 0;
    for (int64_t e = 0; e < E; ++e) z += (p[e] = std::exp(l[e] - m));
    for (int64_t e = 0; e < E; ++e) p[e] /= z;
    int32_t* tp = top + t * k;
    float sum = 0;
    for (int64_t j = 0; j < k; ++j) {  // selection: the largest not yet taken, lower index on ties
      int32_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || tp[i] == int32_t(e);
        if (!taken && (best < 0 || p[e] > p[best])) best = int32_t(e);
      }
      tp[j] = best;
      sum += p[best];
    }
    for (int64_t j = 0; j < k; ++j) gates[t * k + j] = p[tp[j]] / sum;
  }
}

int64_t moe_capacity(double cf, int64_t tokens, int64_t E, int64_t k) {
  if (cf <= 0) return tokens * k;
  return std::min(tokens * k, int64_t(std::ceil(cf * double(tokens) * double(k) / double(E))));
}

std::map<std::string, MoeLoad> moe_load() {
  std::lock_guard<std::mutex> lock(load_mutex());
  return load_table();
}

std::map<std::string, MoeLoad> take_moe_load() {
  std::lock_guard<std::mutex> lock(load_mutex());
  std::map<std::string, MoeLoad> r;
  r.swap(load_table());
  return r;
}

void sum_moe_load(dist::Comm& group) {
  std::lock_guard<std::mutex> lock(load_mutex());
  std::vector<int64_t> v;
  for (const auto& [layer, L] : load_table()) {
    v.insert(v.end(), L.tokens.begin(), L.tokens.end());
    v.push_back(L.dropped), v.push_back(L.routed);
  }
  group.all_reduce_sync(v.data(), v.size(), DType::i64, dist::ReduceOp::sum);
  size_t at = 0;
  for (auto& [layer, L] : load_table()) {
    for (int64_t& t : L.tokens) t = v[at++];
    L.dropped = v[at++], L.routed = v[at++];
  }
}

// ---- Moe ----

Moe::Moe(int64_t experts, int64_t top_k, int64_t ffn, double capacity_factor, int ep, int ep_rank)
    : E_(experts), K_(top_k), F_(ffn), cf_(capacity_factor), ep_(ep), ep_rank_(ep_rank) {
  SAT_CHECK(experts >= 1, "Moe: experts must be at least 1, got ", experts);
  SAT_CHECK(top_k >= 1 && top_k <= experts, "Moe: top_k must be in [1, experts = ", experts, "], got ", top_k);
  SAT_CHECK(ffn >= 1, "Moe: ffn must be positive, got ", ffn);
  SAT_CHECK(std::isfinite(capacity_factor), "Moe: capacity factor must be finite, got ", capacity_factor);
  SAT_CHECK(ep >= 1 && experts % ep == 0, "--ep ", ep, ": the ", experts, " experts do not split evenly over ", ep,
            " ranks (expected a divisor of ", experts, ")");
  SAT_CHECK(ep_rank >= 0 && ep_rank < ep, "Moe: expert-parallel rank ", ep_rank, " out of [0, ", ep, ")");
}

int64_t Moe::ep_rows() const {
  const int64_t a = n_ * K_, local = E_ / ep_;
  return int64_t(ep_) * std::min(a, local * moe_capacity(cf_, n_, E_, K_));
}

void Moe::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 2, "Moe ", s.name, ": expected 2 inputs (x, router logits), got ", s.inputs.size());
  const TensorSpec &x = s.inputs[0], &l = s.inputs[1];
  // The layer runs on the CPU in float32 only (train refuses the rest by flag: validate.cpp's
  // Feature::moe); other devices and dtypes pass here so that plan and info can price them.
  SAT_CHECK(x.shape.nd >= 1 && l.shape.nd == x.shape.nd && l.shape[-1] == E_ &&
                x.shape.numel() / std::max<int64_t>(x.shape[-1], 1) == l.shape.numel() / E_,
            "Moe ", s.name, ": expected x [..., C] and router logits [..., ", E_, "] over the same tokens, got ",
            x.shape.str(), " and ", l.shape.str());
  C_ = x.shape[-1];
  name_ = s.name;
  s.set_output(x.shape, x.dtype);
  const ParamInit w = ParamInit::normal(0.02f);
  const int64_t El = E_ / ep_;
  for (int64_t l = 0; l < El; ++l) {  // this rank's experts: slots 3l, 3l + 1, 3l + 2
    const std::string p = "experts." + std::to_string(ep_rank_ * El + l) + ".";
    s.param(p + "gate_proj.weight", {F_, C_}, w, {}, ep_ > 1);
    s.param(p + "up_proj.weight", {F_, C_}, w, {}, ep_ > 1);
    s.param(p + "down_proj.weight", {C_, F_}, w, {}, ep_ > 1);
  }
  n_ = rows_of(s, 0, C_);
  const int64_t n = n_, a = n * K_, R = ep_ > 1 ? ep_rows() : a;  // R: the rows this rank's experts run
  s.save({n, E_});
  s.save({n, K_}, DType::i32);
  s.save({n, K_});
  s.save({n, K_}, DType::i32);
  s.save({E_ + 1}, DType::i32);
  s.save({a}, DType::i32);
  s.save({R, F_});
  s.save({R, F_});
  if (ep_ > 1) {
    s.save({R, C_});                        // kXl: the inputs received, by local expert
    s.save({a, C_});                        // kYb: the outputs returned, as sent
    s.save({E_}, DType::i32);               // kCounts: rows from each rank for each local expert
    for (Shape sh : {Shape{a, C_}, Shape{R, F_}, Shape{R, C_}, Shape{R, C_}}) s.scratch_forward(sh);
    for (Shape sh : {Shape{a, C_}, Shape{R, C_}, Shape{R, C_}, Shape{R, F_}, Shape{R, F_}, Shape{R, F_}, Shape{n, K_}})
      s.scratch_backward(sh);
  } else {
    for (Shape sh : {Shape{a, C_}, Shape{a, F_}, Shape{a, C_}}) s.scratch_forward(sh);
    for (Shape sh : {Shape{a, C_}, Shape{a, F_}, Shape{a, C_}, Shape{a, C_}, Shape{a, F_}, Shape{a, F_}, Shape{n, K_}})
      s.scratch_backward(sh);
  }
  // At most every assignment kept: 3 products of 2 C F per assignment forward, twice that backward.
  s.flops_fwd = 6.0 * double(a) * double(C_) * double(F_) + 6.0 * double(n) * double(E_);
  s.flops_bwd = 2.0 * s.flops_fwd;
}

// Routing, then the slots: expert e's kept assignments are rows [offs[e], offs[e+1]) of the
// dispatched buffers, in token order; slot[t, j] is the row of assignment (t, j), -1 if dropped.
void Moe::dispatch(LayerCtx& c, int64_t n) {
  int32_t* top = c.saved[kTop].i32();
  int32_t* slot = c.saved[kSlot].i32();
  int32_t* offs = c.saved[kOffs].i32();
  int32_t* perm = c.saved[kPerm].i32();
  route_topk(c.in[1].f32(), n, E_, K_, c.saved[kProbs].f32(), top, c.saved[kGates].f32());
  const int64_t cap = moe_capacity(cf_, n, E_, K_);
  std::vector<int64_t> want(size_t(E_), 0), fill(size_t(E_), 0);
  for (int64_t i = 0; i < n * K_; ++i) ++want[size_t(top[i])];
  offs[0] = 0;
  for (int64_t e = 0; e < E_; ++e) offs[e + 1] = offs[e] + int32_t(std::min(want[size_t(e)], cap));
  int64_t dropped = 0;
  for (int64_t i = 0; i < n * K_; ++i) {
    const int64_t e = top[i];
    if (fill[size_t(e)] < cap) {
      slot[i] = offs[e] + int32_t(fill[size_t(e)]++);
      perm[slot[i]] = int32_t(i / K_);
    } else {
      slot[i] = -1;
      ++dropped;
    }
  }
  if (c.recomputing || !c.training) return;
  std::lock_guard<std::mutex> lock(load_mutex());
  MoeLoad& L = load_table()[name_];
  L.tokens.resize(size_t(E_), 0);
  for (int64_t e = 0; e < E_; ++e) L.tokens[size_t(e)] += fill[size_t(e)];
  L.dropped += dropped;
  L.routed += n * K_;
}

// Rows [r0, r0 + m) of b.x through this rank's expert e (its local index): the hidden
// pre-activations into b.hg, b.hu (save) or read from them, act = silu(hg) * up, and with
// `output` y = act down^T.
void Moe::expert_forward(LayerCtx& c, int64_t e, int64_t r0, int64_t m, const Rows& b, bool save, bool output) {
  if (m == 0) return;
  float* hg = b.hg + r0 * F_;
  float* hu = b.hu + r0 * F_;
  const float* const x = b.x + r0 * C_;
  if (save) {
    cpu::gemm(false, true, m, F_, C_, 1.0f, x, C_, c.params[size_t(3 * e)].f32(), C_, 0.0f, hg, F_);
    cpu::gemm(false, true, m, F_, C_, 1.0f, x, C_, c.params[size_t(3 * e + 1)].f32(), C_, 0.0f, hu, F_);
  }
  float* a = b.act + r0 * F_;
  const int64_t cnt = m * F_;
#pragma omp parallel for simd schedule(static) if (cnt > kParallelMin)
  for (int64_t i = 0; i < cnt; ++i) a[i] = hg[i] * sigmoid(hg[i]) * hu[i];
  if (output)
    cpu::gemm(false, true, m, C_, F_, 1.0f, a, F_, c.params[size_t(3 * e + 2)].f32(), F_, 0.0f, b.y + r0 * C_, C_);
}

namespace {
void gather_rows(const float* x, const int32_t* perm, int64_t rows, int64_t C, float* xe) {
#pragma omp parallel for schedule(static) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) std::memcpy(xe + r * C, x + int64_t(perm[r]) * C, size_t(C) * sizeof(float));
}

// Each token's row of `out` (n x C): the sum over its kept slots of the expert rows `rows`
// (slot[t*K + j] >= 0), each times its gate where `gates` is given.
void gather_slots(float* out, const float* rows, const int32_t* slot, const float* gates, int64_t n, int64_t C,
                  int64_t K) {
#pragma omp parallel for schedule(static) if (n * C > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    float* yt = out + t * C;
    std::fill(yt, yt + C, 0.0f);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = slot[t * K + j];
      if (r < 0) continue;
      const float g = gates ? gates[t * K + j] : 1.0f;
      const float* src = rows + int64_t(r) * C;
      for (int64_t i = 0; i < C; ++i) yt[i] += g * src[i];
    }
  }
}
}  // namespace

void Moe::combine(LayerCtx& c, int64_t n, const float* ye) {
  gather_slots(c.out.f32(), ye, c.saved[kSlot].i32(), c.saved[kGates].f32(), n, C_, K_);
}

void Moe::forward(LayerCtx& c) {
  const int64_t n = c.in[0].numel() / C_;
  if (ep_ > 1) return ep_forward(c, n);
  dispatch(c, n);
  const int32_t* offs = c.saved[kOffs].i32();
  Rows b;
  float* xe = c.scratch[kXe].f32();
  b.x = xe, b.act = c.scratch[kAct].f32(), b.y = c.scratch[kYe].f32();
  b.hg = c.saved[kHg].f32(), b.hu = c.saved[kHu].f32();
  gather_rows(c.in[0].f32(), c.saved[kPerm].i32(), offs[E_], C_, xe);
  for (int64_t e = 0; e < E_; ++e) expert_forward(c, e, offs[e], offs[e + 1] - offs[e], b, true);
  combine(c, n, b.y);
}

void Moe::zero_grads(LayerCtx& c, int64_t e) {
  for (int k = 0; k < 3; ++k)
    if (!c.accumulate[size_t(3 * e + k)]) std::memset(c.grads[size_t(3 * e + k)].f32(), 0, size_t(C_ * F_) * sizeof(float));
}

// Rows [r0, r0 + m) of dy (the gated output gradient) through this rank's expert e: its
// weight gradients and b.dx (the rows' input gradients).
void Moe::expert_backward(LayerCtx& c, int64_t e, int64_t r0, int64_t m, const Rows& b, const float* dy) {
  float* dw[3] = {c.grads[size_t(3 * e)].f32(), c.grads[size_t(3 * e + 1)].f32(), c.grads[size_t(3 * e + 2)].f32()};
  if (m == 0) return zero_grads(c, e);
  auto beta = [&](int k) { return c.accumulate[size_t(3 * e + k)] ? 1.0f : 0.0f; };
  const float* x = b.x + r0 * C_;
  const float* a = b.act + r0 * F_;
  const float* hg = b.hg + r0 * F_;
  const float* hu = b.hu + r0 * F_;
  float* dhg = b.dhg + r0 * F_;
  float* dhu = b.dhu + r0 * F_;
  const float* dye = dy + r0 * C_;
  const float* wd = c.params[size_t(3 * e + 2)].f32();
  cpu::gemm(true, false, C_, F_, m, 1.0f, dye, C_, a, F_, beta(2), dw[2], F_);
  cpu::gemm(false, false, m, F_, C_, 1.0f, dye, C_, wd, F_, 0.0f, dhg, F_);  // d act
  const int64_t cnt = m * F_;
#pragma omp parallel for simd schedule(static) if (cnt > kParallelMin)
  for (int64_t i = 0; i < cnt; ++i) {
    const float s = sigmoid(hg[i]), da = dhg[i];
    dhu[i] = da * hg[i] * s;
    dhg[i] = da * hu[i] * s * (1.0f + hg[i] * (1.0f - s));
  }
  cpu::gemm(true, false, F_, C_, m, 1.0f, dhg, F_, x, C_, beta(0), dw[0], C_);
  cpu::gemm(true, false, F_, C_, m, 1.0f, dhu, F_, x, C_, beta(1), dw[1], C_);
  float* dx = b.dx + r0 * C_;
  cpu::gemm(false, false, m, C_, F_, 1.0f, dhg, F_, c.params[size_t(3 * e)].f32(), C_, 0.0f, dx, C_);
  cpu::gemm(false, false, m, C_, F_, 1.0f, dhu, F_, c.params[size_t(3 * e + 1)].f32(), C_, 1.0f, dx, C_);
}

// Through the renormalised gates and the softmax into d logits (overwritten). With
// S = sum over the chosen of p: d p_j = (d g_j - sum_i d g_i g_i) / S on the chosen, 0
// elsewhere; d l = p (d p - sum d p p).
void Moe::router_backward(LayerCtx& c, int64_t n, const float* dgate) {
  const float* probs = c.saved[kProbs].f32();
  const int32_t* top = c.saved[kTop].i32();
  const float* gates = c.saved[kGates].f32();
  float* dl = c.din[1].f32();
  const int64_t E = E_, K = K_;
#pragma omp parallel for schedule(static) if (n * E > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* p = probs + t * E;
    const int32_t* tp = top + t * K;
    const float* g = gates + t * K;
    const float* dg = dgate + t * K;
    float S = 0, dot = 0;
    for (int64_t j = 0; j < K; ++j) S += p[tp[j]], dot += dg[j] * g[j];
    float* d = dl + t * E;
    std::fill(d, d + E, 0.0f);
    float pd = 0;
    for (int64_t j = 0; j < K; ++j) {
      const float dp = (dg[j] - dot) / S;
      d[tp[j]] = dp;
      pd += dp * p[tp[j]];
    }
    for (int64_t e = 0; e < E; ++e) d[e] = p[e] * (d[e] - pd);
  }
}

// d gate (the output gradient against each kept expert output ye) and the gated output
// gradient dy of each row.
void Moe::gate_grads(LayerCtx& c, int64_t n, const float* ye, float* dy, float* dgate) {
  const int32_t* slot = c.saved[kSlot].i32();
  const float* gates = c.saved[kGates].f32();
  const float* g = c.dout.f32();
  const int64_t C = C_, K = K_;
#pragma omp parallel for schedule(static) if (n * C > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < K; ++j) {
      const int32_t r = slot[t * K + j];
      float s = 0;
      if (r >= 0) {
        const float gt = gates[t * K + j];
        for (int64_t i = 0; i < C; ++i) s += g[t * C + i] * ye[int64_t(r) * C + i], dy[int64_t(r) * C + i] = gt * g[t * C + i];
      }
      dgate[t * K + j] = s;
    }
  }
}

void Moe::input_grad(LayerCtx& c, int64_t n, const float* dxe) {
  if (!c.din[0].defined()) return;
  gather_slots(c.din[0].f32(), dxe, c.saved[kSlot].i32(), nullptr, n, C_, K_);
}

void Moe::backward(LayerCtx& c) {
  const int64_t n = c.in[0].numel() / C_;
  if (ep_ > 1) return ep_backward(c, n);
  const int32_t* offs = c.saved[kOffs].i32();
  Rows b;
  float* xe = c.scratch[kXe].f32();
  b.x = xe, b.act = c.scratch[kAct].f32(), b.y = c.scratch[kYe].f32();
  b.hg = c.saved[kHg].f32(), b.hu = c.saved[kHu].f32();
  b.dhg = c.scratch[kDhg].f32(), b.dhu = c.scratch[kDhu].f32();
  float* dy = c.scratch[kDy].f32();
  float* dgate = c.scratch[kDgate].f32();
  gather_rows(c.in[0].f32(), c.saved[kPerm].i32(), offs[E_], C_, xe);
  for (int64_t e = 0; e < E_; ++e) expert_forward(c, e, offs[e], offs[e + 1] - offs[e], b, false);
  gate_grads(c, n, b.y, dy, dgate);
  b.dx = b.y;  // ye is read no more
  for (int64_t e = 0; e < E_; ++e) expert_backward(c, e, offs[e], offs[e + 1] - offs[e], b, dy);
  input_grad(c, n, b.dx);
  if (c.din[1].defined()) router_backward(c, n, dgate);
}

// ---- Moe under expert parallelism ----

namespace {
enum SavedEp { kXl = kHu + 1, kYb, kCounts };
enum ScratchFwdEp { kSend, kActEp, kYl, kStage };
enum ScratchBwdEp { kDys, kB1, kB2, kActB, kDhgB, kDhuB, kDgateB };

// Where the rows of one layer's exchange go: to each rank (the kept assignments of its
// experts, in expert order), from each rank, and the first row of each local expert once
// the received rows are grouped by expert.
struct EpRows {
  std::vector<size_t> send, recv;  // rows, per rank of the group
  std::vector<int64_t> local;      // El + 1 offsets
};

// offs: this rank's expert offsets (E + 1); counts[s El + l]: the rows rank s sends for local expert l.
EpRows ep_rows_of(const int32_t* offs, const int32_t* counts, int P, int64_t El) {
  EpRows r{std::vector<size_t>(size_t(P), 0), std::vector<size_t>(size_t(P), 0), std::vector<int64_t>(size_t(El) + 1, 0)};
  for (int q = 0; q < P; ++q) r.send[size_t(q)] = size_t(offs[(q + 1) * El] - offs[q * El]);
  for (int s = 0; s < P; ++s)
    for (int64_t l = 0; l < El; ++l) {
      r.recv[size_t(s)] += size_t(counts[s * El + l]);
      r.local[size_t(l) + 1] += counts[s * El + l];
    }
  for (int64_t l = 0; l < El; ++l) r.local[size_t(l) + 1] += r.local[size_t(l)];
  return r;
}

std::vector<size_t> times(const std::vector<size_t>& rows, int64_t width) {
  std::vector<size_t> v(rows);
  for (size_t& x : v) x *= size_t(width);
  return v;
}

// Rows as received (by rank, then local expert) to rows by local expert, then rank
// (to_experts), or back.
void regroup(const int32_t* counts, int P, int64_t El, int64_t width, const float* src, float* dst, bool to_experts) {
  std::vector<int64_t> by_rank(size_t(P * El)), by_expert(size_t(P * El));
  int64_t at = 0;
  for (int64_t b = 0; b < P * El; ++b) by_rank[size_t(b)] = at, at += counts[b];
  at = 0;
  for (int64_t l = 0; l < El; ++l)
    for (int s = 0; s < P; ++s) by_expert[size_t(s * El + l)] = at, at += counts[s * El + l];
  for (int64_t b = 0; b < P * El; ++b) {
    const int64_t from = to_experts ? by_rank[size_t(b)] : by_expert[size_t(b)];
    const int64_t to = to_experts ? by_expert[size_t(b)] : by_rank[size_t(b)];
    if (counts[b]) std::memcpy(dst + to * width, src + from * width, size_t(counts[b] * width) * sizeof(float));
  }
}

dist::Comm& ep_group_of(const LayerCtx& c, int ep, const std::string& name) {
  SAT_CHECK(c.ep_group && c.ep_group->size() == ep, "Moe ", name, ": expert parallelism over ", ep,
            " ranks needs the expert-parallel group of ", ep, " ranks (LayerCtx::ep_group)");
  return *c.ep_group;
}
}  // namespace

// Route and cap this rank's tokens, send each kept row to its expert's rank, run the local
// experts on every rank's rows, send the outputs back, combine.
void Moe::ep_forward(LayerCtx& c, int64_t n) {
  dist::Comm& g = ep_group_of(c, ep_, name_);
  const int P = ep_, me = ep_rank_;
  const int64_t El = E_ / P;
  SAT_ASSERT(g.rank() == me);
  dispatch(c, n);
  const int32_t* offs = c.saved[kOffs].i32();
  int32_t* counts = c.saved[kCounts].i32();
  std::vector<int32_t> mine(static_cast<size_t>(E_));
  for (int64_t e = 0; e < E_; ++e) mine[size_t(e)] = offs[e + 1] - offs[e];
  const std::vector<size_t> per_rank(static_cast<size_t>(P), static_cast<size_t>(El));
  g.all_to_all_v(mine.data(), per_rank, counts, per_rank, DType::i32)->wait();
  const EpRows r = ep_rows_of(offs, counts, P, El);
  SAT_ASSERT(r.local.back() <= ep_rows());
  float* xe = c.scratch[kSend].f32();
  float* stage = c.scratch[kStage].f32();
  gather_rows(c.in[0].f32(), c.saved[kPerm].i32(), offs[E_], C_, xe);
  g.all_to_all_v(xe, times(r.send, C_), stage, times(r.recv, C_), DType::f32)->wait();
  Rows b;
  float* xl = c.saved[kXl].f32();
  b.x = xl, b.act = c.scratch[kActEp].f32(), b.y = c.scratch[kYl].f32();
  b.hg = c.saved[kHg].f32(), b.hu = c.saved[kHu].f32();
  regroup(counts, P, El, C_, stage, xl, true);
  for (int64_t l = 0; l < El; ++l)
    expert_forward(c, l, r.local[size_t(l)], r.local[size_t(l) + 1] - r.local[size_t(l)], b, true);
  regroup(counts, P, El, C_, b.y, stage, false);
  float* yb = c.saved[kYb].f32();
  g.all_to_all_v(stage, times(r.recv, C_), yb, times(r.send, C_), DType::f32)->wait();
  combine(c, n, yb);
}

// The gated output gradients to the experts' ranks, the local experts' backward (the only
// experts this rank holds), the input gradients back, the router's backward.
void Moe::ep_backward(LayerCtx& c, int64_t n) {
  dist::Comm& g = ep_group_of(c, ep_, name_);
  const int P = ep_;
  const int64_t El = E_ / P;
  const int32_t* counts = c.saved[kCounts].i32();
  const EpRows r = ep_rows_of(c.saved[kOffs].i32(), counts, P, El);
  float* dys = c.scratch[kDys].f32();
  float* b1 = c.scratch[kB1].f32();
  float* b2 = c.scratch[kB2].f32();
  float* dgate = c.scratch[kDgateB].f32();
  gate_grads(c, n, c.saved[kYb].f32(), dys, dgate);
  g.all_to_all_v(dys, times(r.send, C_), b1, times(r.recv, C_), DType::f32)->wait();
  regroup(counts, P, El, C_, b1, b2, true);  // d y by local expert
  Rows b;
  b.x = c.saved[kXl].f32(), b.act = c.scratch[kActB].f32();
  b.hg = c.saved[kHg].f32(), b.hu = c.saved[kHu].f32();
  b.dhg = c.scratch[kDhgB].f32(), b.dhu = c.scratch[kDhuB].f32(), b.dx = b1;
  for (int64_t l = 0; l < El; ++l) {
    const int64_t r0 = r.local[size_t(l)], m = r.local[size_t(l) + 1] - r0;
    expert_forward(c, l, r0, m, b, false, false);
    expert_backward(c, l, r0, m, b, b2);
  }
  regroup(counts, P, El, C_, b1, b2, false);
  g.all_to_all_v(b2, times(r.recv, C_), dys, times(r.send, C_), DType::f32)->wait();
  input_grad(c, n, dys);
  if (c.din[1].defined()) router_backward(c, n, dgate);
}

// ---- MoeAux ----

MoeAux::MoeAux(int64_t experts, int64_t top_k, float coef) : E_(experts), K_(top_k), coef_(coef) {
  SAT_CHECK(experts >= 1, "MoeAux: experts must be at least 1, got ", experts);
  SAT_CHECK(top_k >= 1 && top_k <= experts, "MoeAux: top_k must be in [1, experts = ", experts, "], got ", top_k);
  SAT_CHECK(std::isfinite(coef) && coef >= 0, "MoeAux: the coefficient must be finite and >= 0, got ", coef);
}

void MoeAux::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 1, "MoeAux ", s.name, ": expected 1 input (router logits), got ", s.inputs.size());
  const TensorSpec& l = s.inputs[0];
  SAT_CHECK(l.shape.nd >= 1 && l.shape[-1] == E_, "MoeAux ", s.name, ": expected router logits [..., ", E_,
            "], got ", dtype_name(l.dtype), " ", l.shape.str());
  s.set_output({1});
  const int64_t n = l.shape.numel() / E_;
  for (int pass = 0; pass < 2; ++pass) {
    auto add = [&](Shape sh, DType dt) { return pass ? s.scratch_backward(sh, dt) : s.scratch_forward(sh, dt); };
    add({n, E_}, DType::f32);
    add({n, K_}, DType::i32);
    add({n, K_}, DType::f32);
  }
  s.flops_fwd = 8.0 * double(n) * double(E_);
  s.flops_bwd = 2.0 * s.flops_fwd;
}

namespace {
// f_e: the share of the n k assignments that chose expert e.
std::vector<double> assignment_share(const int32_t* top, int64_t n, int64_t E, int64_t k) {
  std::vector<double> f(size_t(E), 0.0);
  for (int64_t i = 0; i < n * k; ++i) f[size_t(top[i])] += 1.0;
  for (double& v : f) v /= double(n * k);
  return f;
}
}  // namespace

void MoeAux::forward(LayerCtx& c) {
  const int64_t n = c.in[0].numel() / E_;
  float* p = c.scratch[0].f32();
  route_topk(c.in[0].f32(), n, E_, K_, p, c.scratch[1].i32(), c.scratch[2].f32());
  const std::vector<double> f = assignment_share(c.scratch[1].i32(), n, E_, K_);
  std::vector<double> P(size_t(E_), 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = 0; e < E_; ++e) P[size_t(e)] += double(p[t * E_ + e]);
  double sum = 0;
  for (int64_t e = 0; e < E_; ++e) sum += f[size_t(e)] * P[size_t(e)] / double(n);
  c.out.f32()[0] = float(double(coef_) * double(E_) * sum);
}

// d P_e = dout coef E f_e, d p_te = d P_e / n, then the softmax: d l = p (d p - sum d p p).
void MoeAux::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  const int64_t n = c.in[0].numel() / E_, E = E_;
  float* p = c.scratch[0].f32();
  route_topk(c.in[0].f32(), n, E_, K_, p, c.scratch[1].i32(), c.scratch[2].f32());
  const std::vector<double> f = assignment_share(c.scratch[1].i32(), n, E_, K_);
  std::vector<float> dp(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e)
    dp[size_t(e)] = float(double(c.dout.f32()[0]) * double(coef_) * double(E) * f[size_t(e)] / double(n));
  float* dl = c.din[0].f32();
#pragma omp parallel for schedule(static) if (n * E > kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* pt = p + t * E;
    float s = 0;
    for (int64_t e = 0; e < E; ++e) s += dp[size_t(e)] * pt[e];
    for (int64_t e = 0; e < E; ++e) dl[t * E + e] = pt[e] * (dp[size_t(e)] - s);
  }
}

}  // namespace sat
