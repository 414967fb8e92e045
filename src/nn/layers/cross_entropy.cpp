#include "nn/layers/cross_entropy.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "dist/comm.h"
#include "nn/layers/activation.h"  // vexp

namespace sat {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements

// Labels must be < C (negative = ignored). Serial, before any parallel region. Returns the
// number of rows that count.
int64_t count_valid(const int32_t* labels, int64_t rows, int64_t C, const std::string& name) {
  int64_t n = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (int64_t(labels[r]) >= C)
      fail("CrossEntropy ", name, ": label ", labels[r], " (at row ", r, ") is out of range for ", C,
           " classes (negative labels are ignored)");
    n += labels[r] >= 0;
  }
  return n;
}
}  // namespace

void CrossEntropy::setup(LayerSetup& s) {
  name_ = s.name;
  SAT_CHECK(s.inputs.size() == 2, "CrossEntropy ", s.name, ": expected 2 inputs (logits, labels), got ",
            s.inputs.size());
  const TensorSpec& lg = s.inputs[0];
  const TensorSpec& lb = s.inputs[1];
  SAT_CHECK(lg.dtype == s.act && lg.shape.nd >= 1 && lg.shape[-1] > 0, "CrossEntropy ", s.name,
            ": expected ", dtype_name(s.act), " logits [..., C], got ", dtype_name(lg.dtype), " ", lg.shape.str());
  SAT_CHECK(lb.dtype == DType::i32, "CrossEntropy ", s.name, ": expected i32 labels, got ", dtype_name(lb.dtype));
  Shape lead = lg.shape;
  lead.nd -= 1;
  SAT_CHECK(lb.shape == lead, "CrossEntropy ", s.name, ": labels ", lb.shape.str(), " must match the logits' leading shape ",
            lead.str(), " (logits ", lg.shape.str(), ")");
  classes_ = lg.shape[-1];
  const int64_t rows = lead.numel();
  s.set_output({1});
  s.save({rows});             // saved 0: lse [rows]
  s.scratch_forward({rows});  // scratch_fwd 0: per-row loss [rows]
  if (tp_.on()) {
    s.scratch_forward({2, rows});  // scratch_fwd 1: sums of exps and target logits
    s.comm_fwd = 3.0 * double(rows) * 4;
  }
  if (s.device == Device::cuda) s.save({1}, DType::i32);  // saved 1: count of valid labels (GPU only)
  const double n = double(lg.shape.numel());
  s.flops_fwd = 4.0 * n;
  s.flops_bwd = 4.0 * n;
}

// Log-sum-exp of one row of C logits. Fast path: an integer-key max (vectorised; see
// detail::ordered_key) and a vectorised sum of exps. A row holding inf or NaN takes the exact
// scalar path instead, so a NaN logit gives a NaN loss (divergence stays visible) and -inf logits
// (masked classes) count as 0.
static float row_logsumexp(const float* x, int64_t C) {
  int32_t kmax = std::numeric_limits<int32_t>::min();
  int32_t nonfinite = 0;
#pragma omp simd reduction(max : kmax) reduction(| : nonfinite)
  for (int64_t j = 0; j < C; ++j) {
    const int32_t b = std::bit_cast<int32_t>(x[j]);
    nonfinite |= int32_t((b & 0x7f800000) == 0x7f800000);  // exponent all ones: inf or NaN
    kmax = std::max(kmax, detail::ordered_key(x[j]));
  }
  if (nonfinite) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < C; ++j) {
      if (std::isnan(x[j])) return x[j];
      m = std::max(m, x[j]);
    }
    if (!std::isfinite(m)) return m;  // all -inf (PyTorch: NaN loss; here -inf, then lse - x = NaN), or +inf
    double s = 0;
    for (int64_t j = 0; j < C; ++j) s += std::exp(double(x[j]) - m);
    return m + float(std::log(s));
  }
  const float m = detail::from_ordered_key(kmax);
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < C; ++j) s += vexp(x[j] - m);
  return m + std::log(s);
}

void CrossEntropy::forward(LayerCtx& c) {
  if (tp_.on()) return forward_vocab_parallel(c);
  const int64_t C = classes_, rows = c.in[1].numel();
  const float* x = c.in[0].f32();        // [rows, C]
  const int32_t* lab = c.in[1].i32();    // [rows]
  float* lse = c.saved[0].f32();         // [rows]
  float* loss = c.scratch[0].f32();      // [rows]
  const int64_t valid = count_valid(lab, rows, C, name_);
#pragma omp parallel for schedule(static) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    lse[r] = row_logsumexp(xr, C);
    loss[r] = lab[r] >= 0 ? lse[r] - xr[lab[r]] : 0.0f;
  }
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) total += double(loss[r]);
  c.out.f32()[0] = valid > 0 ? float(total / double(valid)) : 0.0f;
}

// Rows' maxima, all-reduced; then sums of exp(x - max) and target logits, all-reduced.
void CrossEntropy::forward_vocab_parallel(LayerCtx& c) {
  const int64_t C = classes_, rows = c.in[1].numel(), lo = C * tp_.index;
  SAT_CHECK(c.group && c.group->size() == tp_.parts, "internal error: CrossEntropy ", name_,
            " runs without its tensor-parallel group");
  const float* x = c.in[0].f32();      // [rows, C]: classes [lo, lo + C)
  const int32_t* lab = c.in[1].i32();  // [rows]
  float* lse = c.saved[0].f32();       // [rows]: the maxima first
  float* sums = c.scratch[1].f32();    // [rows] sums of exps, [rows] target logits
  float* tgt = sums + rows;
  const int64_t valid = count_valid(lab, rows, C * tp_.parts, name_);
#pragma omp parallel for schedule(static) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float m = xr[0];
    for (int64_t j = 1; j < C; ++j) m = std::max(m, xr[j]);
    lse[r] = m;
  }
  c.group->all_reduce_sync(lse, size_t(rows), DType::f32, dist::ReduceOp::max);
#pragma omp parallel for schedule(static) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    const float m = lse[r];
    float e = 0.0f;
#pragma omp simd reduction(+ : e)
    for (int64_t j = 0; j < C; ++j) e += vexp(xr[j] - m);
    sums[r] = e;
    const int64_t k = int64_t(lab[r]) - lo;
    tgt[r] = k >= 0 && k < C ? xr[k] : 0.0f;
  }
  c.group->all_reduce_sync(sums, size_t(2 * rows), DType::f32, dist::ReduceOp::sum);
  float* loss = c.scratch[0].f32();
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    lse[r] += std::log(sums[r]);
    loss[r] = lab[r] >= 0 ? lse[r] - tgt[r] : 0.0f;
    total += double(loss[r]);
  }
  c.out.f32()[0] = valid > 0 ? float(total / double(valid)) : 0.0f;
}

void CrossEntropy::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  const int64_t C = classes_, rows = c.in[1].numel(), lo = C * tp_.index;
  const float* x = c.in[0].f32();      // [rows, C]
  const int32_t* lab = c.in[1].i32();  // [rows]
  const float* lse = c.saved[0].f32(); // [rows]
  float* dx = c.din[0].f32();          // [rows, C]
  const int64_t valid = count_valid(lab, rows, C * tp_.parts, name_);
  const float scale = valid > 0 ? c.dout.f32()[0] / float(valid) : 0.0f;
#pragma omp parallel for schedule(static) if (rows * C > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * C;
    float* dr = dx + r * C;
    if (lab[r] < 0) {
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) dr[j] = 0.0f;
      continue;
    }
    const float l = lse[r];
    if (std::isfinite(l)) {
      // softmax = exp(x - lse) <= 1; -inf logits land on vexp's floor (~1e-38), i.e. 0.
#pragma omp simd
      for (int64_t j = 0; j < C; ++j) dr[j] = scale * vexp(xr[j] - l);
    } else {
      for (int64_t j = 0; j < C; ++j) dr[j] = scale * std::exp(xr[j] - l);  // NaN/inf propagate
    }
    const int64_t k = int64_t(lab[r]) - lo;  // vocabulary parallel: only the rank holding the class
    if (k >= 0 && k < C) dr[k] -= scale;
  }
}

}  // namespace sat
