#include "train/data_parallel.h"

#include <algorithm>
#include <cmath>

#include "core/timer.h"

#if SAT_HAVE_CUDA
#include "backend/cuda/context.h"
#endif

namespace sat {

#if SAT_HAVE_CUDA
struct GradReducer::Gpu {
  cudaStream_t compute = nullptr, comm = nullptr;
  std::vector<cudaEvent_t> ready;  // per bucket, recorded on the compute stream
  cudaEvent_t reduced = nullptr;   // recorded on the comm stream after the last bucket
  ~Gpu() {
    for (auto e : ready) cudaEventDestroy(e);
    if (reduced) cudaEventDestroy(reduced);
  }
};
#else
struct GradReducer::Gpu {};
#endif

GradReducer::GradReducer(const Graph& g, ParamStore& ps, dist::Comm& dp, dist::Comm* tie, const BucketOptions& opt,
                         bool zero, bool force, CUstream_st* compute_stream, CUstream_st* comm_stream)
    : ps_(ps), dp_(dp), tie_(tie), zero_(zero && dp.size() > 1), active_(dp.size() > 1 || force) {
  if (active_ && !zero_) plan_buckets(g, opt);
  launched_.assign(buckets_.size(), false);
  hook_ = [this](int node) {
    for (size_t b = 0; b < buckets_.size(); ++b)
      if (!launched_[b] && buckets_[b].ready_node == node) launch(b);
  };
  std::vector<std::string> tied = g.tied_copies();
  tied.insert(tied.end(), g.tied_remote().begin(), g.tied_remote().end());
  if (tie)
    for (const std::string& name : tied) {
      const int p = ps.find_param(name);
      SAT_CHECK(p >= 0, "internal error: tied parameter ", name, " is not in this stage's store");
      tied_.push_back({ps.offset(size_t(p)), ps.offset(size_t(p)) + ps.decl(size_t(p)).spec.shape.numel()});
    }
#if SAT_HAVE_CUDA
  if (dp.device() == Device::cuda) {
    gpu_ = std::make_unique<Gpu>();
    gpu_->compute = compute_stream;
    gpu_->comm = comm_stream;
    gpu_->ready.resize(buckets_.size());
    for (auto& e : gpu_->ready) SAT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    SAT_CUDA_CHECK(cudaEventCreateWithFlags(&gpu_->reduced, cudaEventDisableTiming));
  }
#else
  (void)compute_stream;
  (void)comm_stream;
#endif
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
  // are final early never wait for a large one that is final later.
  int64_t hi = total, lo = total;
  int ready = n;
  auto close = [&] {
    buckets_.push_back({lo, hi, ready, ready < n ? g.nodes()[size_t(ready)].chunk : 0});
    hi = lo;
    ready = n;
    cap = later;
  };
  for (size_t k = ps_.num_params(); k-- > 0;) {
    const int64_t start = ps_.offset(k);
    if (lo < hi && hi - start > cap) close();
    lo = start;
    ready = std::min(ready, final_after[k]);
    if (hi - lo >= cap || k == 0) close();
  }
}

const std::function<void(int)>* GradReducer::node_hook(bool last_micro) {
  return last_micro && !buckets_.empty() ? &hook_ : nullptr;
}

void GradReducer::launch(size_t b) {
  if (t_first_ < 0) t_first_ = now_seconds(), cpu_first_ = thread_cpu_seconds();
  launched_[b] = true;
  const Bucket& bk = buckets_[b];
#if SAT_HAVE_CUDA
  if (gpu_) {
    SAT_CUDA_CHECK(cudaEventRecord(gpu_->ready[b], gpu_->compute));
    SAT_CUDA_CHECK(cudaStreamWaitEvent(gpu_->comm, gpu_->ready[b], 0));
  }
#endif
  works_.push_back(dp_.all_reduce(ps_.flat_grads() + bk.lo, size_t(bk.hi - bk.lo), DType::f32, dist::ReduceOp::avg));
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
      dp_.reduce_scatter(g, g + ps_.shard_begin(), size_t(ps_.shard_len()), DType::f32, dist::ReduceOp::avg)->wait();
    } else {
      for (size_t b = 0; b < buckets_.size(); ++b)
        if (!launched_[b]) launch(b);
#if SAT_HAVE_CUDA
      if (gpu_) {
        SAT_CUDA_CHECK(cudaEventRecord(gpu_->reduced, gpu_->comm));
        SAT_CUDA_CHECK(cudaStreamWaitEvent(gpu_->compute, gpu_->reduced, 0));
      }
#endif
      if (!gpu_)
        for (auto& w : works_) w->wait();
    }
    // Hidden: the part of the reduction's window during which this thread computed the
    // rest of backward. Its CPU time counts, not the wall time: on a busy machine the
    // thread may wait for a core after starting the reduction, which overlaps nothing.
    if (t_first_ >= 0 && !gpu_) {
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
  float* p = ps_.flat_params();
  dp_.all_gather(p + ps_.shard_begin(), p, size_t(ps_.shard_len()), DType::f32)->wait();
}

}  // namespace sat
