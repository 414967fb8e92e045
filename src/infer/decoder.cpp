#include "infer/decoder.h"

#include "core/error.h"

namespace sat {

const std::vector<float>& Decoder::append(std::span<const int32_t> tokens) {
  const int64_t n = int64_t(tokens.size());
  SAT_CHECK(n >= 1, "internal error: no tokens to append");
  for (int32_t t : tokens)
    SAT_CHECK(t >= 0 && t < vocab_, "token ", t, " is outside the model's vocabulary 0..", vocab_ - 1);
  SAT_CHECK(length_ + n <= context_, length_ + n, " tokens would pass the model's context of ", context_);
  run(tokens.data(), n, length_);
  length_ += n;
  return logits_;
}

}  // namespace sat
