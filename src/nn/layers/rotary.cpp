#include "nn/layers/rotary.h"

#include <cmath>

#include "nn/ring_attention.h"

namespace sat {

namespace {

constexpr int64_t kParallelMin = 1 << 14;  // elements

// table [T, hs]: row t holds cos a_i in [0, H) and sin a_i in [H, hs), a_i = p(t) * inv_freq_i
// where p(t) is row t's position: t, or under context parallelism its place in the whole
// sequence (rank `rank` of `cp` holds two chunks of it).
// In float32 step by step, as PyTorch's LlamaRotaryEmbedding: inv_freq = 1 / theta^(2i/hs),
// then the product p(t) * inv_freq rounded to float before its cos and sin.
void fill_table(float* table, int64_t T, int64_t hs, float theta, int cp, int rank) {
  const int64_t H = hs / 2;
  const cp::Chunks chunks = cp > 1 ? cp::chunks_of(T * cp, cp, rank) : cp::Chunks{};
  for (int64_t i = 0; i < H; ++i) {
    const float inv = 1.0f / std::pow(theta, float(2 * i) / float(hs));
    for (int64_t t = 0; t < T; ++t) {
      const float a = float(cp > 1 ? chunks.pos(t) : t) * inv;
      table[t * hs + i] = float(std::cos(double(a)));
      table[t * hs + H + i] = float(std::sin(double(a)));
    }
  }
}

// Rotates every head of rows [B * T, W] by the angles of its position; sign -1 rotates
// back (the transpose, for backward).
void rotate(const float* x, float* y, const float* table, int64_t rows, int64_t T, int64_t W, int64_t hs, float sign) {
  const int64_t H = hs / 2;
#pragma omp parallel for schedule(static) if (rows * W > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    const float* cs = table + (r % T) * hs;
    for (int64_t h0 = 0; h0 < W; h0 += hs) {
      const float* xr = x + r * W + h0;
      float* yr = y + r * W + h0;
#pragma omp simd
      for (int64_t i = 0; i < H; ++i) {
        const float c = cs[i], s = sign * cs[H + i];
        const float a = xr[i], b = xr[i + H];
        yr[i] = a * c - b * s;
        yr[i + H] = b * c + a * s;
      }
    }
  }
}

}  // namespace

Rotary::Rotary(int64_t head_size, float theta, int cp, int cp_rank)
    : hs_(head_size), theta_(theta), cp_(cp), cp_rank_(cp_rank) {
  SAT_CHECK(cp >= 1 && cp_rank >= 0 && cp_rank < cp, "Rotary: rank ", cp_rank, " is not in a ring of ", cp);
  SAT_CHECK(head_size > 0 && head_size % 2 == 0, "Rotary: the head size must be positive and even (pairs of "
            "channels rotate together), got ", head_size);
  SAT_CHECK(theta > 1.0f, "Rotary: theta must be > 1, got ", theta);
}

void Rotary::setup(LayerSetup& s) {
  SAT_CHECK(s.inputs.size() == 1, "Rotary ", s.name, ": expected 1 input, got ", s.inputs.size());
  const TensorSpec& x = s.inputs[0];
  SAT_CHECK(x.dtype == s.act && x.shape.nd == 3 && x.shape[1] > 0 && x.shape[2] % hs_ == 0 && x.shape[2] > 0,
            "Rotary ", s.name, ": expected an ", dtype_name(s.act), " input [B, T, heads x ", hs_, "], got ",
            dtype_name(x.dtype), " ", x.shape.str());
  SAT_CHECK(cp_ == 1 || x.shape[1] % 2 == 0, "Rotary ", s.name, ": under --cp ", cp_,
            " the input holds two equal chunks of the sequence, got ", x.shape[1], " rows");
  s.set_output(x.shape, s.act);
  const Shape table{x.shape[1], hs_};
  s.scratch_forward(table);  // 0: cos | sin per position
  if (s.training) s.scratch_backward(table);
  s.flops_fwd = s.flops_bwd = 3.0 * double(x.shape.numel());
}

void Rotary::forward(LayerCtx& c) {
  const Shape& x = c.in[0].shape;
  fill_table(c.scratch[0].f32(), x[1], hs_, theta_, cp_, cp_rank_);
  rotate(c.in[0].f32(), c.out.f32(), c.scratch[0].f32(), x[0] * x[1], x[1], x[2], hs_, 1.0f);
}

void Rotary::backward(LayerCtx& c) {
  if (!c.din[0].defined()) return;
  const Shape& x = c.in[0].shape;
  fill_table(c.scratch[0].f32(), x[1], hs_, theta_, cp_, cp_rank_);
  rotate(c.dout.f32(), c.din[0].f32(), c.scratch[0].f32(), x[0] * x[1], x[1], x[2], hs_, -1.0f);
}

}  // namespace sat
