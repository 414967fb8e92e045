#include "train/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/timer.h"
#include "device/devices.h"

namespace sat {

GradReducer::GradReducer(const Graph& g, ParamStore& ps, dist::Comm& dp, dist::Comm* tie, const BucketOptions& opt,
                         bool zero, bool force, DeviceBackend* device, dist::Comm* experts)
    : ps_(ps), dp_(dp), tie_(tie), experts_(experts), device_(device), zero_(zero && dp.size() > 1),
      active_(dp.size() > 1 || force) {
  SAT_CHECK(!experts || !zero_, "internal error: ZeRO-1 with expert-parallel parameters");
  if (active_ && !zero_) plan_buckets(g, opt);
  launched_.assign(buckets_.size(), false);
  std::vector<std::string> tied = g.tied_copies();
  tied.insert(tied.end(), g.tied_remote().begin(), g.tied_remote().end());
  if (tie)
    for (const std::string& name : tied) {
      const int p = ps.find_param(name);
      SAT_CHECK(p >= 0, "internal error: tied parameter ", name, " is not in this stage's store");
      tied_.push_back({ps.offset(size_t(p)), ps.offset(size_t(p)) + ps.decl(size_t(p)).spec.shape.numel()});
    }
  // ZeRO-1 orders its reduce-scatter and its gather with the event of slot 0.
  order_ = device ? device->stream_order(std::max<size_t>(1, buckets_.size())) : host_stream_order();
}

GradReducer::~GradReducer() { works_.clear(); }

void GradReducer::plan_buckets(const Graph& g, const BucketOptions& opt) {
  // A parameter's gradient is final after the backward of the lowest-numbered node that
  // uses it (backward runs nodes in reverse), in the last micro-batch of that node's
  // chunk. Flat offsets follow declaration (forward) order, so buckets are cut from the
  // end of the gradient array towards its start.
  const int n = int(g.nodes().size());
  std::vector<int> final_after(g.params().size(), n);
  for (int i = 0; i < n; ++i)
    for (int pid : g.nodes()[size_t(i)].param_ids) final_after[size_t(pid)] = std::min(final_after[size_t(pid)], i);
  const double mib = 1024.0 * 1024.0;
  const int64_t total = ps_.flat_size();
  const int64_t later = std::max<int64_t>(
      16, std::min(int64_t(opt.bucket_mb * mib / 4),
                   std::max(int64_t(opt.first_mb * mib / 4), total / std::max(1, opt.min_buckets))));
  int64_t cap = std::max<int64_t>(16, std::min(later, int64_t(opt.first_mb * mib / 4)));
  // A parameter that would take a bucket past its cap starts the next one: gradients that
  // are final early never wait for a large one that is final later. Expert parameters and
  // the others never share a bucket (they are averaged over different groups).
  int64_t hi = total, lo = total;
  int ready = n;
  bool experts = false;
  auto close = [&] {
    buckets_.push_back({lo, hi, ready, ready < n ? g.nodes()[size_t(ready)].chunk : 0, experts});
    hi = lo;
    ready = n;
    cap = later;
  };
  for (size_t k = ps_.num_params(); k-- > 0;) {
    const int64_t start = ps_.offset(k);
    const bool expert = experts_ && ps_.decl(k).expert;
    if (lo < hi && (hi - start > cap || expert != experts)) close();
    experts = expert;
    lo = start;
    ready = std::min(ready, final_after[k]);
    if (hi - lo >= cap || k == 0) close();
  }
}

GradReady* GradReducer::ready(bool last_micro) { return last_micro && !buckets_.empty() ? this : nullptr; }

void GradReducer::grads_ready(int node) {
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!launched_[b] && buckets_[b].ready_node == node) launch(b);
}

void GradReducer::launch(size_t b) {
  if (t_first_ < 0) t_first_ = now_seconds(), cpu_first_ = thread_cpu_seconds();
  launched_[b] = true;
  const Bucket& bk = buckets_[b];
  order_->before(b);
  dist::Comm& over = bk.experts ? *experts_ : dp_;
  works_.push_back(over.all_reduce(ps_.flat_grads() + bk.lo, size_t(bk.hi - bk.lo), DType::f32, dist::ReduceOp::avg));
}

// After the expert buckets' average over the ranks holding the same experts: the share of
// all dp ranks (host memory: the experts run on the CPU).
void GradReducer::scale_experts() {
  if (!experts_) return;
  const float s = float(experts_->size()) / float(dp_.size());
  for (const Bucket& b : buckets_)
    if (b.experts)
      for (float *g = ps_.flat_grads() + b.lo, *e = ps_.flat_grads() + b.hi; g < e; ++g) *g *= s;
}

void GradReducer::after_backward(int chunk, bool last_micro, bool replayed) {
  // A replayed graph launched this chunk's buckets on the device without the host seeing it.
  if (last_micro && replayed)
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (buckets_[b].chunk == chunk) launched_[b] = true;
}

void GradReducer::reduce() {
  if (active_) {
    const double t_bwd_end = now_seconds(), cpu_bwd_end = thread_cpu_seconds();
    if (zero_) {
      // ZeRO-1: each rank gets the average gradient of its shard only, and updates it.
      // Tied copies are summed first: the shards cut across parameters.
      sum_tied();
      t_first_ = t_bwd_end, cpu_first_ = cpu_bwd_end;
      float* g = ps_.flat_grads();
      order_->before(0);
      works_.push_back(
          dp_.reduce_scatter(g, g + ps_.shard_begin(), size_t(ps_.shard_len()), DType::f32, dist::ReduceOp::avg));
      order_->join(works_);
    } else {
      for (size_t b = 0; b < buckets_.size(); ++b)
        if (!launched_[b]) launch(b);
      order_->join(works_);
      scale_experts();
    }
    // Hidden: the part of the reduction's window during which this thread computed the
    // rest of backward. Its CPU time counts, not the wall time: on a busy machine the
    // thread may wait for a core after starting the reduction, which overlaps nothing.
    if (t_first_ >= 0 && order_->host_waits()) {
      const double window = now_seconds() - t_first_;
      const double overlapped = std::clamp(std::min(t_bwd_end - t_first_, cpu_bwd_end - cpu_first_), 0.0, window);
      window_ += window;
      exposed_ += window - overlapped;
    }
    t_first_ = -1;
    std::fill(launched_.begin(), launched_.end(), false);
  }
  if (!zero_) sum_tied();
}

// Parameters tied across pipeline stages: each copy's gradient becomes the sum of all.
void GradReducer::sum_tied() {
  for (auto [lo, hi] : tied_) tie_->all_reduce(ps_.flat_grads() + lo, size_t(hi - lo), DType::f32, dist::ReduceOp::sum)->wait();
}

void GradReducer::after_update() {
  works_.clear();  // complete: the update waited for them
  if (!zero_) return;
  // After the update of this rank's shard, queued before it (on a GPU the compute stream's).
  float* p = ps_.flat_params();
  order_->before(0);
  works_.push_back(dp_.all_gather(p + ps_.shard_begin(), p, size_t(ps_.shard_len()), DType::f32));
  order_->join(works_);
  // The whole updated parameters are here now (the layers' copy follows them).
  if (device_)
    device_->refresh_lp(ps_);
  else
    ps_.refresh_lp();
}

}  // namespace sat
