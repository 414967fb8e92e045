// The KV-cached decoder (infer/decoder.h): the gpt and llama families' forward for a block
// of new positions, with every layer's keys and values kept from the earlier ones. Each
// operation is computed as the training layers compute it (nn/layers/: LayerNorm's two
// passes, RMSNorm's (x * rstd) * w, GELU's x / (1 + exp(-2u)), SwiGLU's g / (1 + exp(-g)) u,
// the rotary table in float32), so that the logits stay within rounding of the ordinary
// forward's (tests/test_generate.cpp holds them to it).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/blas.h"
#include "core/error.h"
#include "infer/decoder.h"
#include "nn/layers/activation.h"

namespace sat {

namespace {

constexpr float kBeta = 0.7978845608028654f;  // sqrt(2 / pi), as the GELU layer's
constexpr float kKappa = 0.044715f;
constexpr int64_t kParallelMin = int64_t(1) << 15;  // multiply-adds of attention worth threads

// A parameter of the store by name, of the shape the family's builder declares.
const float* weight(const ParamStore& ps, const std::string& name, const Shape& shape) {
  const int i = ps.find_param(name);
  SAT_CHECK(i >= 0, "internal error: the model has no parameter ", name);
  const Tensor t = ps.host_param(size_t(i));
  SAT_CHECK(t.shape == shape, "internal error: ", name, " is ", t.shape.str(), ", expected ", shape.str());
  return t.f32();
}

// y[n, out] = x[n, in] w[out, in]^T (+ b): PyTorch's Linear (one row: a matrix-vector product).
void linear(const float* x, int64_t n, int64_t in, const float* w, const float* b, int64_t out, float* y) {
  cpu::gemm(false, true, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  if (!b) return;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < out; ++j) y[r * out + j] += b[j];
}

void layer_norm(const float* x, int64_t n, int64_t D, const float* w, const float* b, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    float sum = 0.0f;
    for (int64_t j = 0; j < D; ++j) sum += xr[j];
    const float m = sum / float(D);
    float sq = 0.0f;
    for (int64_t j = 0; j < D; ++j) sq += (xr[j] - m) * (xr[j] - m);
    const float rs = 1.0f / std::sqrt(sq / float(D) + 1e-5f);
    for (int64_t j = 0; j < D; ++j) yr[j] = (xr[j] - m) * rs * w[j] + b[j];
  }
}

void rms_norm(const float* x, int64_t n, int64_t D, const float* w, float eps, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * D;
    float* yr = y + r * D;
    float sq = 0.0f;
    for (int64_t j = 0; j < D; ++j) sq += xr[j] * xr[j];
    const float rs = 1.0f / std::sqrt(sq / float(D) + eps);
    for (int64_t j = 0; j < D; ++j) yr[j] = (xr[j] * rs) * w[j];
  }
}

// Causal attention of n new rows (positions first..first+n-1) over the cache, whose rows
// 0..first+n-1 hold every key and value (kvw = kv_heads x hs floats a row). q: [n, heads x hs]
// with row stride ldq; y: [n, heads x hs].
struct Attention {
  int64_t heads, kv_heads, hs, context;
  void operator()(const float* q, int64_t ldq, const float* K, const float* V, float* y, int64_t n,
                  int64_t first) const {
    const int64_t kvw = kv_heads * hs, group = heads / kv_heads, W = heads * hs;
    const float scale = 1.0f / std::sqrt(float(hs));
    const int threads = omp_get_max_threads();
    std::vector<float> scores(size_t(threads) * size_t(context));
    const int64_t work = n * heads * (first + n) * hs;
#pragma omp parallel for schedule(static) if (work > kParallelMin)
    for (int64_t ih = 0; ih < n * heads; ++ih) {
      const int64_t i = ih / heads, h = ih % heads, rows = first + i + 1, kv = (h / group) * hs;
      float* s = scores.data() + size_t(omp_get_thread_num()) * size_t(context);
      // s = K[0:rows] q * scale, then its softmax, then y = V[0:rows]^T s: matrix-vector
      // products over the cache (single-threaded inside the loop's region, as attention.cpp's).
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(rows), int(hs), scale, K + kv, int(kvw), q + i * ldq + h * hs, 1,
                  0.0f, s, 1);
      const float m = *std::max_element(s, s + rows);
      float sum = 0.0f;
      for (int64_t j = 0; j < rows; ++j) sum += (s[j] = vexp(s[j] - m));
      cblas_sgemv(CblasRowMajor, CblasTrans, int(rows), int(hs), 1.0f / sum, V + kv, int(kvw), s, 1, 0.0f,
                  y + i * W + h * hs, 1);
    }
  }
};

// The residual stream of a block of rows and the scratch the layers write.
struct Rows {
  std::vector<float> x, h, a, b, c;
  void size(int64_t n, int64_t C, int64_t wide, int64_t qkv) {
    x.resize(size_t(n * C));
    h.resize(size_t(n * std::max(C, qkv)));
    a.resize(size_t(n * std::max(wide, qkv)));
    b.resize(size_t(n * std::max(wide, C)));
    c.resize(size_t(n * std::max(wide, C)));
  }
};

void add_rows(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

// Copies n rows of w floats (row stride ld) into the cache's rows first.. (stride w).
void to_cache(const float* src, int64_t ld, int64_t n, int64_t w, float* cache, int64_t first) {
  for (int64_t r = 0; r < n; ++r) std::copy(src + r * ld, src + r * ld + w, cache + (first + r) * w);
}

// ------------------------------------------------------------------------------------- GPT

class GptDecoder : public Decoder {
 public:
  GptDecoder(const ModelConfig& mc, const ParamStore& ps)
      : Decoder(mc.context, mc.vocab), C_(mc.n_embd), attn_{mc.n_head, mc.n_head, mc.n_embd / mc.n_head, mc.context} {
    const int64_t C = C_;
    wte_ = weight(ps, "transformer.wte.weight", {mc.vocab, C});  // the head too (tied)
    wpe_ = weight(ps, "transformer.wpe.weight", {mc.context, C});
    lnf_w_ = weight(ps, "transformer.ln_f.weight", {C});
    lnf_b_ = weight(ps, "transformer.ln_f.bias", {C});
    for (int64_t l = 0; l < mc.n_layer; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      Layer L;
      L.ln1_w = weight(ps, p + "ln_1.weight", {C});
      L.ln1_b = weight(ps, p + "ln_1.bias", {C});
      L.qkv_w = weight(ps, p + "attn.c_attn.weight", {3 * C, C});
      L.qkv_b = weight(ps, p + "attn.c_attn.bias", {3 * C});
      L.proj_w = weight(ps, p + "attn.c_proj.weight", {C, C});
      L.proj_b = weight(ps, p + "attn.c_proj.bias", {C});
      L.ln2_w = weight(ps, p + "ln_2.weight", {C});
      L.ln2_b = weight(ps, p + "ln_2.bias", {C});
      L.fc_w = weight(ps, p + "mlp.c_fc.weight", {4 * C, C});
      L.fc_b = weight(ps, p + "mlp.c_fc.bias", {4 * C});
      L.fc2_w = weight(ps, p + "mlp.c_proj.weight", {C, 4 * C});
      L.fc2_b = weight(ps, p + "mlp.c_proj.bias", {C});
      L.K.resize(size_t(mc.context * C));
      L.V.resize(size_t(mc.context * C));
      layers_.push_back(std::move(L));
    }
  }

 private:
  struct Layer {
    const float *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fc2_w, *fc2_b;
    std::vector<float> K, V;  // [context, C]: every position's keys and values
  };

  void run(const int32_t* tok, int64_t n, int64_t first) override {
    const int64_t C = C_;
    Rows& R = rows_;
    R.size(n, C, 4 * C, 3 * C);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < C; ++j) R.x[size_t(i * C + j)] = wte_[tok[i] * C + j] + wpe_[(first + i) * C + j];
    for (Layer& L : layers_) {
      layer_norm(R.x.data(), n, C, L.ln1_w, L.ln1_b, R.h.data());
      linear(R.h.data(), n, C, L.qkv_w, L.qkv_b, 3 * C, R.a.data());  // q | k | v per row
      to_cache(R.a.data() + C, 3 * C, n, C, L.K.data(), first);
      to_cache(R.a.data() + 2 * C, 3 * C, n, C, L.V.data(), first);
      attn_(R.a.data(), 3 * C, L.K.data(), L.V.data(), R.b.data(), n, first);
      linear(R.b.data(), n, C, L.proj_w, L.proj_b, C, R.c.data());
      add_rows(R.x.data(), R.c.data(), n * C);
      layer_norm(R.x.data(), n, C, L.ln2_w, L.ln2_b, R.h.data());
      linear(R.h.data(), n, C, L.fc_w, L.fc_b, 4 * C, R.a.data());
      for (int64_t i = 0; i < n * 4 * C; ++i) {
        const float v = R.a[size_t(i)], u = kBeta * (v + kKappa * v * v * v);
        R.a[size_t(i)] = v / (1.0f + vexp(-2.0f * u));
      }
      linear(R.a.data(), n, 4 * C, L.fc2_w, L.fc2_b, C, R.c.data());
      add_rows(R.x.data(), R.c.data(), n * C);
    }
    // Only the last row's logits are wanted.
    layer_norm(R.x.data() + (n - 1) * C, 1, C, lnf_w_, lnf_b_, R.h.data());
    logits_.resize(size_t(vocab()));
    linear(R.h.data(), 1, C, wte_, nullptr, vocab(), logits_.data());
  }

  int64_t C_;
  Attention attn_;
  const float *wte_, *wpe_, *lnf_w_, *lnf_b_;
  std::vector<Layer> layers_;
  Rows rows_;
};

// ----------------------------------------------------------------------------------- Llama

class LlamaDecoder : public Decoder {
 public:
  LlamaDecoder(const ModelConfig& mc, const ParamStore& ps)
      : Decoder(mc.context, mc.vocab),
        C_(mc.n_embd), F_(mc.ffn), hs_(mc.n_embd / mc.n_head), eps_(mc.norm_eps),
        attn_{mc.n_head, mc.n_kv_head, mc.n_embd / mc.n_head, mc.context} {
    const int64_t C = C_, Q = mc.n_head * hs_, KV = mc.n_kv_head * hs_, F = F_;
    embed_ = weight(ps, "model.embed_tokens.weight", {mc.vocab, C});
    norm_ = weight(ps, "model.norm.weight", {C});
    head_ = weight(ps, "lm_head.weight", {mc.vocab, C});
    for (int64_t l = 0; l < mc.n_layer; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Layer L;
      L.in_norm = weight(ps, p + "input_layernorm.weight", {C});
      L.q = weight(ps, p + "self_attn.q_proj.weight", {Q, C});
      L.k = weight(ps, p + "self_attn.k_proj.weight", {KV, C});
      L.v = weight(ps, p + "self_attn.v_proj.weight", {KV, C});
      L.o = weight(ps, p + "self_attn.o_proj.weight", {C, Q});
      L.post_norm = weight(ps, p + "post_attention_layernorm.weight", {C});
      L.gate = weight(ps, p + "mlp.gate_proj.weight", {F, C});
      L.up = weight(ps, p + "mlp.up_proj.weight", {F, C});
      L.down = weight(ps, p + "mlp.down_proj.weight", {C, F});
      L.K.resize(size_t(mc.context * KV));
      L.V.resize(size_t(mc.context * KV));
      layers_.push_back(std::move(L));
    }
    // The Rotary layer's inverse frequencies, in float32 as it computes them (the config's theta).
    for (int64_t i = 0; i < hs_ / 2; ++i)
      inv_freq_.push_back(1.0f / std::pow(mc.rope_theta, float(2 * i) / float(hs_)));
  }

 private:
  struct Layer {
    const float *in_norm, *q, *k, *v, *o, *post_norm, *gate, *up, *down;
    std::vector<float> K, V;  // [context, kv_heads x hs], the keys rotated
  };

  // Rotates every head of n rows of w floats by the angles of positions first.. (the Rotary
  // layer's table and rule).
  void rotate(float* x, int64_t n, int64_t w, int64_t first) const {
    const int64_t H = hs_ / 2;
    std::vector<float> cs(static_cast<size_t>(hs_));
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t i = 0; i < H; ++i) {
        const float a = float(first + r) * inv_freq_[size_t(i)];
        cs[size_t(i)] = float(std::cos(double(a)));
        cs[size_t(H + i)] = float(std::sin(double(a)));
      }
      for (int64_t h0 = 0; h0 < w; h0 += hs_) {
        float* xr = x + r * w + h0;
        for (int64_t i = 0; i < H; ++i) {
          const float c = cs[size_t(i)], s = cs[size_t(H + i)], a = xr[i], b = xr[i + H];
          xr[i] = a * c - b * s;
          xr[i + H] = b * c + a * s;
        }
      }
    }
  }

  void run(const int32_t* tok, int64_t n, int64_t first) override {
    const int64_t C = C_, F = F_, Q = attn_.heads * hs_, KV = attn_.kv_heads * hs_;
    Rows& R = rows_;
    R.size(n, C, F, Q + 2 * KV);
    for (int64_t i = 0; i < n; ++i) std::copy(embed_ + tok[i] * C, embed_ + (tok[i] + 1) * C, R.x.data() + i * C);
    std::vector<float>& q = R.a;
    for (Layer& L : layers_) {
      rms_norm(R.x.data(), n, C, L.in_norm, eps_, R.h.data());
      linear(R.h.data(), n, C, L.q, nullptr, Q, q.data());
      rotate(q.data(), n, Q, first);
      float* Kn = L.K.data() + first * KV;  // the new rows go straight into the cache
      float* Vn = L.V.data() + first * KV;
      linear(R.h.data(), n, C, L.k, nullptr, KV, Kn);
      rotate(Kn, n, KV, first);
      linear(R.h.data(), n, C, L.v, nullptr, KV, Vn);
      attn_(q.data(), Q, L.K.data(), L.V.data(), R.b.data(), n, first);
      linear(R.b.data(), n, Q, L.o, nullptr, C, R.c.data());
      add_rows(R.x.data(), R.c.data(), n * C);
      rms_norm(R.x.data(), n, C, L.post_norm, eps_, R.h.data());
      linear(R.h.data(), n, C, L.gate, nullptr, F, R.a.data());
      linear(R.h.data(), n, C, L.up, nullptr, F, R.b.data());
      for (int64_t i = 0; i < n * F; ++i) {
        const float g = R.a[size_t(i)];
        R.a[size_t(i)] = g / (1.0f + vexp(-g)) * R.b[size_t(i)];
      }
      linear(R.a.data(), n, F, L.down, nullptr, C, R.c.data());
      add_rows(R.x.data(), R.c.data(), n * C);
    }
    rms_norm(R.x.data() + (n - 1) * C, 1, C, norm_, eps_, R.h.data());
    logits_.resize(size_t(vocab()));
    linear(R.h.data(), 1, C, head_, nullptr, vocab(), logits_.data());
  }

  int64_t C_, F_, hs_;
  float eps_;  // RMSNorm's
  Attention attn_;
  const float *embed_, *norm_, *head_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  Rows rows_;
};

}  // namespace

std::unique_ptr<Decoder> make_cached_decoder(const ModelConfig& mc, const ParamStore& ps) {
  SAT_CHECK((mc.family == ModelFamily::gpt || mc.family == ModelFamily::llama) && mc.experts == 0, "--model ", mc.name,
            ": the KV cache decodes the gpt and llama families, not moe (--no-cache runs any language model's forward)");
  SAT_CHECK(mc.tp == 1 && mc.device == Device::cpu && mc.act == DType::f32,
            "internal error: the cached decoder runs a whole float32 model on the CPU");
  for (size_t i = 0; i < ps.num_params(); ++i)
    SAT_CHECK(!ps.decl(i).shard.split(), "internal error: the cached decoder needs the whole model's parameters");
  if (mc.family == ModelFamily::gpt) return std::make_unique<GptDecoder>(mc, ps);
  return std::make_unique<LlamaDecoder>(mc, ps);
}

}  // namespace sat
