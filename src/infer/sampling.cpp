#include "infer/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace sat {

void check_sampling(const Sampling& s) {
  SAT_CHECK(std::isfinite(s.temperature) && s.temperature >= 0, "--temperature: expected 0 (greedy) or a positive "
            "number, got ", s.temperature);
  SAT_CHECK(s.top_k >= 0, "--top-k: expected 0 (off) or a positive number of tokens, got ", s.top_k);
  SAT_CHECK(std::isfinite(s.top_p) && s.top_p > 0 && s.top_p <= 1, "--top-p: expected a probability in (0, 1] "
            "(1: off), got ", s.top_p);
}

int32_t argmax_token(const std::vector<float>& logits) {
  return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());  // the first of equal ones
}

std::vector<double> sampling_distribution(const std::vector<float>& logits, const Sampling& s) {
  const size_t V = logits.size();
  std::vector<double> p(V, 0.0);
  if (V == 0) return p;
  if (s.temperature == 0) {
    p[size_t(argmax_token(logits))] = 1.0;
    return p;
  }
  std::vector<double> z(V);
  for (size_t i = 0; i < V; ++i) z[i] = double(logits[i]) / s.temperature;
  std::vector<bool> keep(V, true);
  if (s.top_k > 0 && size_t(s.top_k) < V) {  // the k-th largest is the threshold
    std::vector<double> sorted = z;
    std::nth_element(sorted.begin(), sorted.begin() + (s.top_k - 1), sorted.end(), std::greater<double>());
    const double kth = sorted[size_t(s.top_k - 1)];
    for (size_t i = 0; i < V; ++i) keep[i] = z[i] >= kth;
  }
  double top = -INFINITY;
  for (size_t i = 0; i < V; ++i)
    if (keep[i]) top = std::max(top, z[i]);
  double sum = 0;
  for (size_t i = 0; i < V; ++i) sum += p[i] = keep[i] ? std::exp(z[i] - top) : 0.0;
  for (double& v : p) v /= sum;
  if (s.top_p < 1) {
    // Ascending by probability (ties: the larger id first, so that the smaller ids are kept
    // last, as a stable descending sort keeps them first); remove while the cumulative
    // probability stays <= 1 - p, never the most likely.
    std::vector<size_t> order(V);
    std::iota(order.begin(), order.end(), size_t(0));
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b] || (p[a] == p[b] && a > b); });
    double cum = 0;
    for (size_t r = 0; r + 1 < V; ++r) {
      cum += p[order[r]];
      if (cum > 1.0 - s.top_p) break;
      p[order[r]] = 0;
    }
    const double kept = std::accumulate(p.begin(), p.end(), 0.0);
    for (double& v : p) v /= kept;
  }
  return p;
}

int32_t sample_token(const std::vector<float>& logits, const Sampling& s, Rng& rng) {
  if (s.temperature == 0) return argmax_token(logits);
  const std::vector<double> p = sampling_distribution(logits, s);
  const double u = double(rng.uniform());
  double cum = 0;
  int32_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    last = int32_t(i);
    cum += p[i];
    if (u < cum) return last;
  }
  return last;  // rounding left the sum just below u: the last kept token
}

}  // namespace sat
