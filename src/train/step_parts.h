// The small named parts a training step is made of, besides the engine and the gradient
// reduction (train/data_parallel.h): the data feed that hands the executor each
// micro-batch, the sequence-parallel sum of partial gradients, and the noise probe that
// measures the gradient noise scale's inputs. Each is plugged into the executor through
// StepParts (train/executor.h); none knows the device it runs on (backend/device_backend.h).
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend/device_backend.h"
#include "core/alloc.h"
#include "data/loader.h"
#include "dist/mesh.h"
#include "nn/params.h"
#include "train/config.h"
#include "train/executor.h"

namespace sat {

// Context parallelism (--cp): each rank of a cp group feeds its two chunks (r and 2C-1-r of
// 2C, nn/ring_attention.h) of every sequence of its replica's batch, tokens and targets,
// cut into buffers of its own (counted: sat::Buffer), one set per micro-batch slot (the
// embedding's backward reads the tokens after later micro-batches were fed).
class ContextCut {
 public:
  ContextCut(int cp, int cp_rank, int slots) : cp_(cp), rank_(cp_rank), bufs_(size_t(slots)) {}
  // whole: chunk `chunk`'s data inputs, i32 [B, T] tensors (T divisible by 2 cp); returns
  // them as [B, T / cp], in buffers of their own per slot and input of the rank (zb-v's
  // first stage has two chunks that read: the tokens and the labels of the same micro-batch,
  // both kept until the micro-batch's last weight part).
  std::vector<Tensor> cut(const Graph& g, int chunk, const std::vector<Tensor>& whole, int slot);
  // The bytes cut() holds: `inputs` i32 tensors [B, rows] (a rank's rows, its chunks' data
  // inputs together) per slot.
  static size_t bytes(int64_t B, int64_t rows, int inputs, int slots) {
    return size_t(slots) * size_t(inputs) * size_t(B * rows) * sizeof(int32_t);
  }

 private:
  int cp_, rank_;
  std::vector<std::vector<Buffer>> bufs_;  // [slot][input]
};

// The training split's micro-batches: fetched from the loader by the chunk that reads them
// (the loader keeps that many valid), epoch after epoch.
class BatchFeed final : public DataFeed {
 public:
  // x: the model's input value (the other data input is the labels).
  BatchFeed(BatchLoader& loader, const Graph& g, int x, int64_t accum);
  void set_epoch(int64_t e) { epoch_ = e; }
  void begin_step() override { fetched_ = 0; }
  std::vector<Tensor> data(int chunk, int micro) override;
  void set_cut(std::unique_ptr<ContextCut> c) { cut_ = std::move(c); }  // --cp

 private:
  BatchLoader& loader_;
  const Graph& g_;
  int x_;
  std::unique_ptr<ContextCut> cut_;
  std::vector<Batch> batches_;  // this step's micro-batches (the loader keeps them valid)
  int fetched_ = 0;
  int64_t epoch_ = 0;
};

// One batch at a time (evaluation's, and any caller's): the batch set last.
class OneBatchFeed final : public DataFeed {
 public:
  OneBatchFeed(const Graph& g, int x) : g_(g), x_(x) {}
  void set(const Batch* b) { b_ = b; }
  std::vector<Tensor> data(int chunk, int micro) override;
  void set_cut(std::unique_ptr<ContextCut> c) { cut_ = std::move(c); }  // --cp

 private:
  const Graph& g_;
  int x_;
  std::unique_ptr<ContextCut> cut_;
  const Batch* b_ = nullptr;
};

// Sequence parallelism: LayerNorm gradients are each tensor-parallel rank's part of the sum
// over the tokens; after the data-parallel reduction (linear: the order does not matter) the
// tensor-parallel group adds them up.
class PartialGradSum final : public GradHook {
 public:
  // tp: the group's device side; sharded: ZeRO-2/3 (the gradients are this rank's pieces).
  PartialGradSum(const Graph& g, ParamStore& ps, dist::Comm& tp, bool sharded);
  bool empty() const { return ranges_.empty(); }
  void after_reduce() override;

 private:
  ParamStore& ps_;
  dist::Comm& tp_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;  // flat ranges summed together
};

// The two-batch estimator's inputs each step: |gradient of the first micro-batch|^2 (chunk by
// chunk, as each chunk's backward of micro-batch 0 ends) and |gradient of the global
// batch|^2 after the reduction. A parameter whole on every tensor-parallel rank counts once.
class NoiseProbe final : public GradHook {
 public:
  NoiseProbe(const Graph& g, const ParamStore& ps, const dist::Mesh& m, const TrainConfig& cfg, DeviceBackend& device,
             const float* loss_scale);
  void after_backward(int chunk, int micro) override;
  void after_reduce() override;
  // The step's sample, agreed over the job (collective), appended to out unless not finite
  // (fp16: a step skipped for inf/NaN gradients has no usable norms).
  void sample(std::vector<GradNormSample>& out);

 private:
  void add(std::pair<int64_t, int64_t> r, int slot);

  const ParamStore& ps_;
  const dist::Mesh& m_;
  const TrainConfig& cfg_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;    // per chunk: its parameters' flat range
  std::vector<std::pair<int64_t, int64_t>> excluded_;  // flat ranges counted on another tp rank
  std::unique_ptr<SquaredNorms> norms_;                // slots: one per chunk, then the global batch's
};

}  // namespace sat
