#include "nn/layers/embedding.h"

#include <omp.h>

#include <algorithm>
#include <cstring>

namespace sat {

namespace {
constexpr int64_t kParallelMin = 1 << 14;  // elements

// Throws if some idx[i] is outside [0, num). Serial and before any parallel region: an
// exception must not cross an OpenMP region.
void check_indices(const int32_t* idx, int64_t n, int64_t num, const char* kind, const std::string& name) {
  for (int64_t i = 0; i < n; ++i)
    if (idx[i] < 0 || int64_t(idx[i]) >= num)
      fail(kind, " ", name, ": index ", idx[i], " (at position ", i, ") is out of range for a vocabulary of size ",
           num);
}

// g[0, n) = 0, split over threads for large buffers (a 50257 x 768 gradient is 154 MB).
void parallel_zero(float* g, int64_t n) {
  constexpr int64_t kChunk = 1 << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 2)
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t b = k * kChunk;
    std::memset(g + b, 0, size_t(std::min(kChunk, n - b)) * sizeof(float));
  }
}

// dW[idx[i] - lo, :] += dy[i, :] for i < n with idx[i] in [lo, lo + num); dy [n, D], dW [num, D]. Repeated indices would race if
// threads split the rows, so they split the D columns instead (in 16-float = 64-byte pieces, so
// no two threads share a cache line): every thread walks all n indices in order (deterministic).
void scatter_add_rows(const int32_t* idx, const float* dy, int64_t n, int64_t D, float* dw, int64_t lo = 0,
                      int64_t num = INT64_MAX) {
#pragma omp parallel if (n * D > kParallelMin)
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t blocks = (D + 15) / 16;
    const int64_t c0 = std::min(D, blocks * t / nt * 16), c1 = std::min(D, blocks * (t + 1) / nt * 16);
    if (c1 > c0)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = int64_t(idx[i]) - lo;
        if (row < 0 || row >= num) continue;
        float* dst = dw + row * D;
        const float* src = dy + i * D;
#pragma omp simd
        for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
      }
  }
}
}  // namespace

// ---- Embedding ----

Embedding::Embedding(int64_t num, int64_t dim, ParamInit init, TPRank tp)
    : num_(num), dim_(dim), init_(init), tp_(tp) {
  SAT_CHECK(num > 0 && dim > 0, "Embedding: num and dim must be positive, got num=", num, " dim=", dim);
  SAT_CHECK(num % tp.parts == 0, "Embedding: a vocabulary of ", num, " does not split into ", tp.parts,
            " equal parts");
  rows_ = num / tp.parts;
  lo_ = rows_ * tp.index;
}

void Embedding::setup(LayerSetup& s) {
  name_ = s.name;
  SAT_CHECK(s.inputs.size() == 1, "Embedding ", s.name, ": expected 1 input, got ", s.inputs.size());
  const TensorSpec& x = s.inputs[0];
  SAT_CHECK(x.dtype == DType::i32, "Embedding ", s.name, ": expected i32 indices, got ", dtype_name(x.dtype));
  SAT_CHECK(x.shape.nd < Shape::kMaxDims, "Embedding ", s.name, ": input ", x.shape.str(), " has too many dims");
  Shape y = x.shape;
  y.d[size_t(y.nd++)] = dim_;
  s.set_output(y, s.act);
  const ParamShard rows = tp_.on() ? ParamShard{0, tp_.parts, tp_.index} : ParamShard{};
  s.param("weight", {rows_, dim_}, init_, rows);  // slot 0
  s.flops_fwd = 0;
  s.flops_bwd = double(y.numel());
}

void Embedding::forward(LayerCtx& c) {
  const int64_t n = c.in[0].numel(), D = dim_;
  const int32_t* idx = c.in[0].i32();  // [n]
  const float* w = c.params[0].f32();  // [rows_, D]
  float* y = c.out.f32();              // [n, D]
  check_indices(idx, n, num_, "Embedding", name_);
#pragma omp parallel for schedule(static) if (n * D > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = int64_t(idx[i]) - lo_;
    if (row >= 0 && row < rows_) std::memcpy(y + i * D, w + row * D, size_t(D) * sizeof(float));
    else std::memset(y + i * D, 0, size_t(D) * sizeof(float));  // another rank's token
  }
}

void Embedding::backward(LayerCtx& c) {
  float* dw = c.grads[0].f32();  // [rows_, D]
  if (!c.accumulate[0]) parallel_zero(dw, c.grads[0].numel());
  scatter_add_rows(c.in[0].i32(), c.dout.f32(), c.in[0].numel(), dim_, dw, lo_, rows_);
}

// ---- GPTEmbedding ----

GPTEmbedding::GPTEmbedding(int64_t vocab, int64_t max_t, int64_t dim, float std, TPRank tp, int cp, int cp_rank)
    : vocab_(vocab), max_t_(max_t), dim_(dim), std_(std), tp_(tp), cp_(cp), cp_rank_(cp_rank) {
  SAT_CHECK(cp >= 1 && cp_rank >= 0 && cp_rank < cp, "GPTEmbedding: rank ", cp_rank, " is not in a ring of ", cp);
  SAT_CHECK(vocab > 0 && max_t > 0 && dim > 0, "GPTEmbedding: vocab, max_t and dim must be positive, got ", vocab,
            ", ", max_t, ", ", dim);
  SAT_CHECK(vocab % tp.parts == 0, "GPTEmbedding: a vocabulary of ", vocab, " does not split into ", tp.parts,
            " equal parts");
  rows_ = vocab / tp.parts;
  lo_ = rows_ * tp.index;
}

void GPTEmbedding::setup(LayerSetup& s) {
  name_ = s.name;
  SAT_CHECK(s.inputs.size() == 1, "GPTEmbedding ", s.name, ": expected 1 input, got ", s.inputs.size());
  const TensorSpec& x = s.inputs[0];
  SAT_CHECK(x.dtype == DType::i32 && x.shape.nd == 2, "GPTEmbedding ", s.name,
            ": expected i32 tokens [B, T], got ", dtype_name(x.dtype), " ", x.shape.str());
  SAT_CHECK(x.shape[1] * cp_ <= max_t_, "GPTEmbedding ", s.name, ": sequence length ", x.shape[1] * cp_,
            " exceeds the model's block size ", max_t_);
  SAT_CHECK(cp_ == 1 || (s.device == Device::cpu && x.shape[1] % 2 == 0), "GPTEmbedding ", s.name, ": under --cp ",
            cp_, " the input holds two equal chunks of the sequence (CPU only yet), got ", x.shape[1], " rows");
  s.set_output({x.shape[0], x.shape[1], dim_}, s.act);
  const ParamShard rows = tp_.on() ? ParamShard{0, tp_.parts, tp_.index} : ParamShard{};
  s.param("wte.weight", {rows_, dim_}, ParamInit::normal(std_), rows);  // slot 0
  s.param("wpe.weight", {max_t_, dim_}, ParamInit::normal(std_));  // slot 1
  const double n = double(x.shape.numel() * dim_);
  s.flops_fwd = n;
  s.flops_bwd = 2.0 * n;
}

int64_t GPTEmbedding::position(int64_t t, int64_t T) const {
  if (cp_ == 1) return t;
  const int64_t len = T / 2;  // chunks cp_rank_ and 2 cp - 1 - cp_rank_ of 2 cp
  return t < len ? cp_rank_ * len + t : (2 * int64_t(cp_) - 1 - cp_rank_) * len + t - len;
}

void GPTEmbedding::forward(LayerCtx& c) {
  const int64_t B = c.in[0].shape[0], T = c.in[0].shape[1], D = dim_;
  const int32_t* tok = c.in[0].i32();    // [B, T]
  const float* wte = c.params[0].f32();  // [vocab, D]
  const float* wpe = c.params[1].f32();  // [max_t, D]
  float* y = c.out.f32();                // [B, T, D]
  check_indices(tok, B * T, vocab_, "GPTEmbedding", name_);
  const bool positions = tp_.index == 0;  // vocabulary parallel: part 0 adds them
#pragma omp parallel for schedule(static) if (B * T * D > kParallelMin)
  for (int64_t i = 0; i < B * T; ++i) {
    const int64_t row = int64_t(tok[i]) - lo_;
    const float* p = wpe + position(i % T, T) * D;
    float* yr = y + i * D;
    if (row >= 0 && row < rows_) {
      const float* e = wte + row * D;
      if (positions) {
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) yr[j] = e[j] + p[j];
      } else {
        std::memcpy(yr, e, size_t(D) * sizeof(float));
      }
    } else if (positions) {
      std::memcpy(yr, p, size_t(D) * sizeof(float));
    } else {
      std::memset(yr, 0, size_t(D) * sizeof(float));
    }
  }
}

void GPTEmbedding::backward(LayerCtx& c) {
  const int64_t B = c.in[0].shape[0], T = c.in[0].shape[1], D = dim_;
  const float* dy = c.dout.f32();  // [B, T, D]
  // wte: scatter-add over all B*T tokens.
  float* dwte = c.grads[0].f32();  // [vocab, D]
  if (!c.accumulate[0]) parallel_zero(dwte, c.grads[0].numel());
  scatter_add_rows(c.in[0].i32(), dy, B * T, D, dwte, lo_, rows_);
  // wpe: the position of local row t gets sum_b dy[b, t]; the others get nothing (zero unless
  // accumulating).
  float* dwpe = c.grads[1].f32();  // [max_t, D]
  if (!c.accumulate[1]) parallel_zero(dwpe, c.grads[1].numel());
#pragma omp parallel for schedule(static) if (B * T * D > kParallelMin)
  for (int64_t t = 0; t < T; ++t) {
    float* g = dwpe + position(t, T) * D;
    for (int64_t b = 0; b < B; ++b) {
      const float* src = dy + (b * T + t) * D;
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) g[j] += src[j];
    }
  }
}

}  // namespace sat
