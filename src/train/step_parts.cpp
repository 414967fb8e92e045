#include "train/step_parts.h"

#include <algorithm>
#include <cmath>

#include "dist/comm.h"
#include "nn/ring_attention.h"

namespace sat {

// ---- data --------------------------------------------------------------------------------
namespace {
std::vector<Tensor> inputs_of(const Graph& g, int x, int chunk, const Batch& b) {
  std::vector<Tensor> d;
  for (int v : g.chunks()[size_t(chunk)].data) d.push_back(v == x ? b.x : b.y);
  return d;
}
}  // namespace

std::vector<Tensor> ContextCut::cut(const Graph& g, int chunk, const std::vector<Tensor>& whole, int slot) {
  std::vector<Buffer>& bufs = bufs_.at(size_t(slot));
  size_t first = 0;  // this chunk's first input among the rank's
  for (int c = 0; c < chunk; ++c) first += g.chunks()[size_t(c)].data.size();
  bufs.resize(std::max(bufs.size(), first + whole.size()));
  std::vector<Tensor> out;
  for (size_t k = 0; k < whole.size(); ++k) {
    const Tensor& t = whole[k];
    SAT_CHECK(t.dtype == DType::i32 && t.shape.nd == 2, "internal error: --cp cuts token sequences [B, T], got ",
              t.shape.str());
    const int64_t B = t.shape[0], T = t.shape[1];
    const cp::Chunks c = cp::chunks_of(T, cp_, rank_);
    const size_t bytes = size_t(B * 2 * c.len) * sizeof(int32_t);
    Buffer& buf = bufs[first + k];
    if (buf.bytes() != bytes) buf = Buffer(bytes, "--cp: this rank's chunks of the batch");
    int32_t* dst = buf.as<int32_t>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < 2 * c.len; ++i) dst[b * 2 * c.len + i] = t.i32()[b * T + c.pos(i)];
    out.emplace_back(dst, Shape{B, 2 * c.len}, DType::i32);
  }
  return out;
}

BatchFeed::BatchFeed(BatchLoader& loader, const Graph& g, int x, int64_t accum)
    : loader_(loader), g_(g), x_(x), batches_(size_t(accum)) {}

std::vector<Tensor> BatchFeed::data(int chunk, int micro) {
  if (g_.chunks()[size_t(chunk)].data.empty()) return {};  // fetched only by the chunk that reads them
  while (fetched_ <= micro) {
    Batch& b = batches_[size_t(fetched_)];
    while (!loader_.next(b)) loader_.start_epoch(++epoch_);
    ++fetched_;
  }
  std::vector<Tensor> d = inputs_of(g_, x_, chunk, batches_[size_t(micro)]);
  return cut_ ? cut_->cut(g_, chunk, d, micro) : d;
}

std::vector<Tensor> OneBatchFeed::data(int chunk, int) {
  if (g_.chunks()[size_t(chunk)].data.empty()) return {};
  SAT_CHECK(b_, "internal error: no batch to feed");
  std::vector<Tensor> d = inputs_of(g_, x_, chunk, *b_);
  return cut_ ? cut_->cut(g_, chunk, d, 0) : d;
}

// ---- sequence parallelism's partial gradients ----------------------------------------------
PartialGradSum::PartialGradSum(const Graph& g, ParamStore& ps, dist::Comm& tp, bool sharded) : ps_(ps), tp_(tp) {
  std::vector<std::pair<int64_t, int64_t>> partial;
  for (size_t pid = 0; pid < g.params().size(); ++pid) {
    if (!g.params()[pid].shard.partial_grad) continue;
    if (sharded) {  // under ZeRO-2/3 the gradients are this rank's pieces: the parameter's part of them
      auto [at, n] = ps.shard_part(pid);
      if (n > 0) partial.push_back({at, at + n});
    } else {
      const int64_t lo = ps.offset(pid);
      partial.push_back({lo, lo + g.params()[pid].spec.shape.numel()});
    }
  }
  std::sort(partial.begin(), partial.end());
  // Neighbours separated by padding only go together (not pieces: there the gap may hold a
  // part of another parameter).
  for (size_t k = 0; k < partial.size();) {
    int64_t lo = partial[k].first, hi = partial[k].second;
    for (++k; !sharded && k < partial.size() && partial[k].first <= ((hi + 15) / 16) * 16; ++k) hi = partial[k].second;
    ranges_.push_back({lo, hi});
  }
}

void PartialGradSum::after_reduce() {
  for (auto [lo, hi] : ranges_)
    tp_.all_reduce(ps_.flat_grads() + lo, size_t(hi - lo), DType::f32, dist::ReduceOp::sum)->wait();
}

// ---- the gradient noise scale's inputs -----------------------------------------------------
NoiseProbe::NoiseProbe(const Graph& g, const ParamStore& ps, const dist::Mesh& m, const TrainConfig& cfg,
                       DeviceBackend& device, const float* loss_scale)
    : ps_(ps), m_(m), cfg_(cfg) {
  // Flat gradient range of each chunk's parameters (declared in node order, so contiguous).
  ranges_.assign(g.chunks().size(), {ps.flat_size(), 0});
  std::vector<bool> seen(g.params().size(), false);
  for (const Node& n : g.nodes())
    for (int pid : n.param_ids) {
      if (seen[size_t(pid)]) continue;
      seen[size_t(pid)] = true;
      auto& r = ranges_[size_t(n.chunk)];
      const int64_t lo = ps.offset(size_t(pid));
      const ParamDecl& d = g.params()[size_t(pid)];
      r.first = std::min(r.first, lo);
      r.second = std::max(r.second, lo + d.spec.shape.numel());
      // Tensor parallel: a parameter whole on every rank of the group counts on its first.
      if (!d.shard.split() && m.tp_rank() > 0) excluded_.push_back({lo, lo + d.spec.shape.numel()});
    }
  std::sort(excluded_.begin(), excluded_.end());
  norms_ = device.squared_norms((excluded_.size() + 1) * (ranges_.size() + 1), loss_scale);
}

// |gradient|^2 of the flat range r, less the excluded ranges, into `slot`.
void NoiseProbe::add(std::pair<int64_t, int64_t> r, int slot) {
  if (r.second <= r.first) return;
  int64_t at = r.first;
  for (auto [lo, hi] : excluded_) {
    if (hi <= at) continue;
    if (lo >= r.second) break;
    if (lo > at) norms_->add(slot, ps_.flat_grads() + at, lo - at);
    at = std::max(at, hi);
  }
  if (at < r.second) norms_->add(slot, ps_.flat_grads() + at, r.second - at);
}

void NoiseProbe::after_backward(int chunk, int micro) {
  if (micro == 0) add(ranges_[size_t(chunk)], chunk);
}

void NoiseProbe::after_reduce() {
  const bool zero = cfg_.zero >= 1 && m_.dp() > 1;
  add(zero ? std::pair<int64_t, int64_t>{ps_.shard_begin(), ps_.shard_begin() + ps_.shard_len()}
           : std::pair<int64_t, int64_t>{0, ps_.flat_size()},
      int(ranges_.size()));
}

void NoiseProbe::sample(std::vector<GradNormSample>& out) {
  const std::vector<double> sums = norms_->take(int(ranges_.size()) + 1);
  double small = 0;
  for (size_t c = 0; c < ranges_.size(); ++c) small += sums[c];
  const double k = double(cfg_.accum);
  double v[2] = {k * k * small, sums.back()};  // backward scaled each micro-batch's gradient by 1/accum
  // Each stage holds its own parameters: sum over the pipeline; the first micro-batch's
  // norm is averaged over the data-parallel ranks, the global batch's summed over the
  // ZeRO-1 shards.
  if (m_.pp() > 1) m_.pp_group().all_reduce_sync(v, 2, DType::f64, dist::ReduceOp::sum);
  if (m_.tp() > 1) m_.tp_group().all_reduce_sync(v, 2, DType::f64, dist::ReduceOp::sum);  // each element once
  if (m_.dp() > 1) {
    m_.dp_group().all_reduce_sync(v, 1, DType::f64, dist::ReduceOp::avg);
    if (cfg_.zero >= 1) m_.dp_group().all_reduce_sync(v + 1, 1, DType::f64, dist::ReduceOp::sum);
  }
  if (std::isfinite(v[0]) && std::isfinite(v[1]))
    out.push_back({v[0], v[1], cfg_.batch, cfg_.global_batch(m_.size())});
}

}  // namespace sat
