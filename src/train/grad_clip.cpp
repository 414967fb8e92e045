#include "train/grad_clip.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "dist/comm.h"

namespace sat {

std::vector<std::pair<int64_t, int64_t>> norm_ranges(const Graph& g, const ParamStore& ps, const dist::Mesh& m,
                                                    bool zero) {
  std::vector<std::pair<int64_t, int64_t>> counted, other;  // other: held here, counted on another rank
  // A replica of the first data-parallel (and context-parallel) rank's gradients; under --ep an
  // expert's of the first rank that holds it (the first ep data-parallel ranks hold them all).
  if (!zero && (m.dp_rank() >= m.ep() || m.cp_rank() > 0)) return {};
  const std::set<std::string> copies(g.tied_copies().begin(), g.tied_copies().end());
  for (size_t i = 0; i < g.params().size(); ++i) {
    const ParamDecl& d = g.params()[i];
    const auto [at, n] = ps.shard_part(i);  // (the whole parameter without ZeRO)
    if (n <= 0) continue;
    const bool replica = !zero && !d.expert && m.dp_rank() > 0;
    const bool elsewhere = replica || copies.count(d.name) > 0 || (!d.shard.split() && m.tp_rank() > 0);
    (elsewhere ? other : counted).push_back({at, at + n});
  }
  std::sort(counted.begin(), counted.end());
  std::sort(other.begin(), other.end());
  // Neighbours go together unless what lies between them is counted elsewhere (the rest of a
  // gap is padding, zero in every array).
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const auto& r : counted) {
    const bool joins = !out.empty() && std::none_of(other.begin(), other.end(), [&](const auto& o) {
      return o.first < r.first && o.second > out.back().second;
    });
    if (joins)
      out.back().second = r.second;
    else
      out.push_back(r);
  }
  return out;
}

float clip_coefficient(double norm, float max_norm) {
  if (!std::isfinite(norm)) return 1.0f;
  const double c = double(max_norm) / (norm + 1e-6);
  return c < 1.0 ? float(c) : 1.0f;
}

GradClip::GradClip(const Graph& g, const ParamStore& ps, const dist::Mesh& m, bool zero, float max_norm,
                   DeviceBackend& device, const float* loss_scale, DeviceOptimizer& optimizer)
    : ps_(ps), m_(m), max_norm_(max_norm), optimizer_(optimizer),
      ranges_(norm_ranges(g, ps, m, zero)) {
  norms_ = device.squared_norms(std::max<size_t>(1, ranges_.size()), loss_scale);
}

void GradClip::after_reduce() {
  for (auto [lo, hi] : ranges_) norms_->add(0, ps_.flat_grads() + lo, hi - lo);
  double sq = norms_->take(1)[0];  // (waits for the device)
  if (m_.size() > 1) m_.world().all_reduce_sync(&sq, 1, DType::f64, dist::ReduceOp::sum);
  norm_ = std::sqrt(sq);
  const float c = clip_coefficient(norm_, max_norm_);
  clipped_ = c < 1.0f;
  optimizer_.set_grad_scale(c);
}

}  // namespace sat
