#include "nn/layers/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/blas.h"

namespace sat {

Linear::Linear(int64_t in, int64_t out, bool bias, std::optional<ParamInit> w_init,
               std::optional<ParamInit> b_init, std::string tied_weight, LinearTP tp)
    : in_(in), out_(out), bias_(bias && tied_weight.empty()), add_bias_(bias_), tp_(tp), tied_(std::move(tied_weight)) {
  SAT_CHECK(in > 0 && out > 0, "Linear: in and out features must be positive, got in=", in, " out=", out);
  const float bound = 1.0f / std::sqrt(float(in));  // PyTorch's kaiming_uniform(a=sqrt(5)) bound
  w_init_ = w_init.value_or(ParamInit::uniform(bound));
  b_init_ = b_init.value_or(ParamInit::uniform(bound));
  const int parts = tp.split == LinearTP::Split::none ? 1 : tp.tp.parts;
  const int64_t split = tp.split == LinearTP::Split::column ? out : in;
  const int64_t unit = int64_t(parts) * (tp.split == LinearTP::Split::column ? tp.stride : 1);
  SAT_CHECK(parts == 1 || split % unit == 0, "Linear: ", split, tp.split == LinearTP::Split::column ? " output" : " input",
            " features do not split into ", unit, " equal parts");
  if (tp.split == LinearTP::Split::column) out_ = out / parts;
  if (tp.split == LinearTP::Split::row) in_ = in / parts, add_bias_ = bias_ && tp.tp.index == 0;
}

void Linear::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 1, "Linear ", s.name, ": expected 1 input, got ", s.inputs.size());
  const TensorSpec& x = s.inputs[0];
  SAT_CHECK(x.dtype == s.act && x.shape.nd >= 1 && x.shape[-1] == in_, "Linear ", s.name, ": expected an ",
            dtype_name(s.act), " input [..., ", in_, "], got ", dtype_name(x.dtype), " ", x.shape.str());
  Shape y = x.shape;
  y[-1] = out_;
  s.set_output(y, s.act);
  ParamShard w, b;
  if (tp_.split != LinearTP::Split::none && tp_.tp.on()) {
    const bool col = tp_.split == LinearTP::Split::column;
    w = {col ? 0 : 1, tp_.tp.parts, tp_.tp.index, col ? tp_.stride : 1};
    if (col) b = w;
  }
  if (tied_.empty())
    s.param("weight", {out_, in_}, w_init_, w);    // slot 0
  else
    s.shared_param(tied_, {out_, in_});            // slot 0 (split like the tied parameter)
  if (bias_) s.param("bias", {out_}, b_init_, b);  // slot 1
  const double rows = double(x.shape.numel() / in_);
  s.flops_fwd = 2.0 * rows * double(in_) * double(out_);
  s.flops_bwd = 4.0 * rows * double(in_) * double(out_);
  onednn_.reset();
  if (s.device == Device::cpu && s.act == DType::bf16 && s.bf16_native) setup_bf16(s);
}

void Linear::forward(LayerCtx& c) {
  if (onednn_) return forward_bf16(c);
  const int64_t rows = c.in[0].numel() / in_;
  const float* x = c.in[0].f32();     // [rows, in]
  const float* w = c.params[0].f32(); // [out, in]
  float* y = c.out.f32();             // [rows, out]
  float beta = 0.0f;
  if (add_bias_) {
    // Start Y from the broadcast bias and let the GEMM add into it (beta = 1): one pass fewer
    // than a separate bias-add over Y afterwards would cost in cache misses.
    const float* b = c.params[1].f32();  // [out]
#pragma omp parallel for schedule(static) if (rows * out_ > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * out_, b, size_t(out_) * sizeof(float));
    beta = 1.0f;
  }
  cpu::gemm(false, true, rows, out_, in_, 1.0f, x, in_, w, in_, beta, y, out_);
}

// db[j] (+)= sum_r dy[r, j] for dy [rows, cols]. Parallel over blocks of columns, so each thread
// owns its outputs (no race) and the summation order is fixed (deterministic); double accumulators.
static void column_sums(const float* dy, int64_t rows, int64_t cols, float* db, bool accumulate) {
  constexpr int64_t kBlock = 64;
  const int64_t nblocks = (cols + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16) && nblocks > 1)
  for (int64_t bi = 0; bi < nblocks; ++bi) {
    const int64_t c0 = bi * kBlock, n = std::min(kBlock, cols - c0);
    double acc[kBlock] = {};
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = dy + r * cols + c0;
      for (int64_t j = 0; j < n; ++j) acc[j] += double(row[j]);
    }
    for (int64_t j = 0; j < n; ++j) db[c0 + j] = float((accumulate ? double(db[c0 + j]) : 0.0) + acc[j]);
  }
}

void Linear::backward(LayerCtx& c) {
  if (onednn_) return backward_bf16(c);
  const int64_t rows = c.in[0].numel() / in_;
  const float* x = c.in[0].f32();     // [rows, in]
  const float* dy = c.dout.f32();     // [rows, out]
  float* dw = c.grads[0].f32();       // [out, in]
  // dW [out, in] (+)= dY^T [out, rows] X [rows, in]
  if (rows > 0)
    cpu::gemm(true, false, out_, in_, rows, 1.0f, dy, out_, x, in_, c.accumulate[0] ? 1.0f : 0.0f, dw, in_);
  else if (!c.accumulate[0])
    std::memset(dw, 0, c.grads[0].bytes());
  if (bias_) column_sums(dy, rows, out_, c.grads[1].f32(), c.accumulate[1]);  // db [out]
  Linear::backward_input(c);
}

// dX [rows, in] = dY [rows, out] W [out, in]
void Linear::backward_input(LayerCtx& c) {
  const int64_t rows = c.in[0].numel() / in_;
  if (c.din[0].defined())
    cpu::gemm(false, false, rows, in_, out_, 1.0f, c.dout.f32(), out_, c.params[0].f32(), in_, 0.0f, c.din[0].f32(), in_);
}

}  // namespace sat
