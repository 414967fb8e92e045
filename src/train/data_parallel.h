// Gradient reduction of data parallelism over the dp group of the mesh, plugged into the
// executor's hooks: buckets of gradients are averaged while the last micro-batch's
// backward still runs (each bucket is launched as soon as its last parameter's gradient
// is final), or, under ZeRO-1, reduce-scattered after it; then parameters tied across
// pipeline stages (GPT's embedding and output head) get the sum of their copies'
// gradients over the embedding group.
//
// Buckets are cut from the end of the flat gradient array (the order backward finishes
// them), as PyTorch DDP does: a small first bucket so that communication starts early,
// then buckets of at most bucket_mb, and never fewer than about eight while the
// gradients allow it, so that there is always reduction to overlap with what remains of
// backward (DDP's 25 MiB default puts a model of under 26 MiB in two buckets, the second
// ready only at the end).
//
// On GPUs (a dp communicator whose buffers are device memory: NCCL) a bucket's
// all-reduce runs on the communicator's stream after an event recorded on the compute
// stream, and the compute stream waits for all of them before the update.
// ZeRO-1 the same way: its reduce-scatter after backward, its all-gather of the updated
// shards after the update, and the low-precision copy refreshed on the device.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "nn/graph.h"
#include "nn/params.h"

#include "backend/device_backend.h"
#include "nn/engine.h"

namespace sat {

struct BucketOptions {
  double bucket_mb = 25;       // the later buckets' cap
  double first_mb = 1;         // the first bucket's cap
  int min_buckets = 8;         // cap the later buckets at (gradient bytes / this) as well
};

// How a data-parallel step reduces its gradients and refreshes its parameters, plugged
// into the executor's hooks: GradReducer (plain data parallelism and ZeRO-1, below) or
// ShardedDP (ZeRO-2 and 3, train/sharded_dp.h).
class GradSync {
 public:
  virtual ~GradSync() = default;
  // Told after each backward node of a micro-batch (null: nothing to do then).
  virtual GradReady* ready(bool last_micro) = 0;
  // Whether a micro-batch's parameter gradients add to the earlier ones' in the store.
  virtual bool accumulates_grads() const { return true; }
  // After a micro-batch's backward of a chunk; replayed: the engine replayed a CUDA graph.
  virtual void after_backward(int chunk, bool last_micro, bool replayed) = 0;
  // The reduce_grads action, and after the optimizer step.
  virtual void reduce() = 0;
  virtual void after_update() = 0;
  // Seconds from the first reduction's launch to the end of the last, and of them the ones
  // the step waited for, summed since reset_timing().
  virtual double window_seconds() const = 0;
  virtual double exposed_seconds() const = 0;
  virtual void reset_timing() = 0;
};

class GradReducer : public GradSync, private GradReady {
 public:
  // dp: the data-parallel group (size 1: nothing to average unless force, as
  // --dist-backend nccl with one rank asks). tie: the embedding group (null: no tied
  // parameters here). zero: ZeRO-1 (ps is sharded over dp). device: orders the buckets'
  // collectives with the compute (backend/device_backend.h; null: the host's, waiting).
  // experts: the expert-data-parallel group (dist::Mesh::expert_dp_group; null without
  // expert parallelism). The gradients of expert parameters (ParamDecl::expert, in buckets of
  // their own) are averaged over it instead of dp, then scaled by its size over dp's: each
  // expert's gradient is the sum over the ranks that hold it, divided by all dp ranks as any
  // other gradient (the others hold other experts and contributed nothing to it).
  GradReducer(const Graph& g, ParamStore& ps, dist::Comm& dp, dist::Comm* tie, const BucketOptions& opt, bool zero,
              bool force = false, DeviceBackend* device = nullptr, dist::Comm* experts = nullptr);
  ~GradReducer() override;

  // Told after each backward node of the step's last micro-batch of a chunk (null when
  // nothing is reduced during backward): launches the buckets that node completed.
  GradReady* ready(bool last_micro) override;
  // After the last micro-batch's backward of a chunk; replayed: the engine replayed a
  // CUDA graph, in which the buckets of this chunk were launched at capture.
  void after_backward(int chunk, bool last_micro, bool replayed) override;
  // The reduce_grads action: every bucket launched and reduced (ZeRO-1: reduce-scattered),
  // tied copies summed. Measures the reduction window and the part of it that overlapped
  // backward.
  void reduce() override;
  // After the optimizer step: ZeRO-1 gathers the updated parameter shards.
  void after_update() override;

  // Seconds from the first bucket's launch to the end of the reduction, and of them the
  // ones not overlapped by backward, summed since reset_timing().
  double window_seconds() const override { return window_; }
  double exposed_seconds() const override { return exposed_; }
  void reset_timing() override { window_ = exposed_ = 0; }

 private:
  struct Bucket { int64_t lo, hi; int ready_node; int chunk; bool experts = false; };
  void plan_buckets(const Graph& g, const BucketOptions& opt);
  void launch(size_t b);
  void sum_tied();
  void scale_experts();
  void grads_ready(int node) override;
  void backward_queued() override { order_->seal(); }

  ParamStore& ps_;
  dist::Comm& dp_;
  dist::Comm* tie_;
  dist::Comm* experts_;
  DeviceBackend* device_;
  bool zero_, active_;
  std::vector<Bucket> buckets_;
  std::vector<bool> launched_;
  std::vector<dist::WorkPtr> works_;
  std::vector<std::pair<int64_t, int64_t>> tied_;  // flat ranges of tied parameters
  double t_first_ = -1, cpu_first_ = 0, window_ = 0, exposed_ = 0;
  std::unique_ptr<StreamOrder> order_;
};

}  // namespace sat
