// The next token from a model's logits, as Hugging Face's generate and nanoGPT's sample.py
// define the knobs, in their order:
//   temperature  the logits divided by it; 0 is greedy decoding (the largest logit; among
//                equal ones the smallest id), and then top-k and top-p change nothing;
//   top_k        k > 0 keeps the k largest logits and every logit equal to the k-th (torch's
//                topk threshold: logits < the k-th largest are removed); 0 keeps all;
//   top_p        nucleus sampling, 0 < p <= 1: over the softmax of what is left, sorted by
//                probability, the tokens whose cumulative probability from the least likely
//                up is <= 1 - p are removed (HF's TopPLogitsWarper), the most likely always
//                kept; 1 keeps all;
// then one draw from the softmax of the kept logits with a seeded generator (core/rng.h):
// a uniform u in [0, 1) and the first token, in id order, whose cumulative probability
// passes u. The same seed and logits give the same tokens.
#pragma once
#include <cstdint>
#include <vector>

#include "core/rng.h"

namespace sat {

struct Sampling {
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
};

// sat::Error naming --temperature, --top-k or --top-p for a value out of range.
void check_sampling(const Sampling& s);

// The probabilities the draw uses (0 for removed tokens; they sum to 1), in double; for
// temperature 0, 1 on the greedy token.
std::vector<double> sampling_distribution(const std::vector<float>& logits, const Sampling& s);

// The next token: the greedy one at temperature 0 (rng untouched), else a draw.
int32_t sample_token(const std::vector<float>& logits, const Sampling& s, Rng& rng);

// The largest logit's id (the smallest id among equal ones).
int32_t argmax_token(const std::vector<float>& logits);

}  // namespace sat
