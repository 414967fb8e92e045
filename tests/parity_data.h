// bench/peer/common.py's parity data in C++: the samples PyTorch trains on in the goldens
// (tests/golden), step s taking samples s*B .. s*B+B-1. Images and features are
// hash_unit values with hashed class labels; token models read windows of T + 1 hashed
// tokens (x the first T, y the last T).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/rng.h"
#include "data/dataset.h"
#include "nn/models.h"
#include "optim/optimizer.h"

namespace sat::test {

// A golden's "optimizer" object (scripts/make-goldens, make-import-goldens) as saturate's.
inline OptimConfig optim_from_golden(const nlohmann::json& o) {
  OptimConfig c;
  c.name = o["name"];
  c.lr = o["lr"].get<float>();
  c.weight_decay = o["weight_decay"].get<float>();
  if (c.name == "sgd") {
    c.momentum = o["momentum"].get<float>();
    c.nesterov = o["nesterov"].get<bool>();
  } else {
    c.beta1 = o["betas"][0].get<float>();
    c.beta2 = o["betas"][1].get<float>();
    c.eps = o["eps"].get<float>();
  }
  c.clip_grad_norm = o.value("clip_grad_norm", 0.0f);
  return c;
}

// Samples first .. first + n - 1 of the model's parity data.
inline std::unique_ptr<Dataset> parity_data(const ModelConfig& mc, int64_t first, int64_t n) {
  if (mc.tokens) {
    const int64_t T = mc.seq_len;
    std::vector<int32_t> x(size_t(n * T)), y(size_t(n * T));
    const uint64_t h = fnv1a64(std::string("tok"));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k <= T; ++k) {
        const int32_t tok = int32_t(splitmix64(h + uint64_t((first + i) * (T + 1) + k)) % uint64_t(mc.vocab));
        if (k < T) x[size_t(i * T + k)] = tok;
        if (k > 0) y[size_t(i * T + k - 1)] = tok;
      }
    return make_tensor_dataset(Shape{T}, std::move(x), std::move(y), Shape{T}, mc.vocab, "parity tokens");
  }
  const int64_t numel = mc.image.numel();
  std::vector<float> x(size_t(n * numel));
  std::vector<int32_t> y(static_cast<size_t>(n));
  const uint64_t hx = fnv1a64(std::string("x")), hy = fnv1a64(std::string("y"));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < numel; ++k) x[size_t(i * numel + k)] = hash_unit(hx, uint64_t((first + i) * numel + k));
    y[size_t(i)] = int32_t(splitmix64(hy + uint64_t(first + i)) % uint64_t(mc.classes));
  }
  return make_tensor_dataset(mc.image, std::move(x), std::move(y), Shape{}, mc.classes, "parity images");
}

}  // namespace sat::test
