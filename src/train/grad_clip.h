// Gradient clipping by the total norm (--clip-grad-norm X), as torch.nn.utils.clip_grad_norm_
// with norm_type 2: after the gradients are final (the data-parallel reduction, the tied
// copies' sums, the sequence-parallel sums), total = sqrt(sum of every gradient element
// squared over the whole model), and the step's update reads every gradient multiplied by
// min(X / (total + 1e-6), 1) (DeviceOptimizer::set_grad_scale).
//
// One seam for every layout: each rank adds up the squares of the gradients its optimizer
// reads (its update spans: the whole store, or under ZeRO its shard), less what another rank
// counts already, and one sum over the job gives the total:
//   * data parallelism without ZeRO: every replica holds the same reduced gradients, so only
//     the first data-parallel rank counts (with ZeRO each rank counts its own shard); under
//     expert parallelism the first ep data-parallel ranks count their own experts (the first
//     holds the other parameters and counts them);
//   * tensor parallelism: a parameter split over the group counts on every rank (its part),
//     one whole on every rank (replicated) on the first tensor-parallel rank only;
//   * pipeline parallelism: each stage counts its parameters; a weight tied across stages
//     (GPT's output head's copy of the token embedding) counts on the stage of the original.
// Under fp16 the norm is of the unscaled gradients (the squared norms divide by the loss
// scale), as GradScaler's recipe clips after unscale_; a step whose gradients are not finite
// is not clipped (the loss scaling skips it).
#pragma once
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "backend/device_backend.h"
#include "dist/mesh.h"
#include "nn/graph.h"
#include "nn/params.h"
#include "optim/optimizer.h"
#include "train/executor.h"

namespace sat {

// The flat ranges (indices into ParamStore::flat_grads()) whose squares this rank adds to the
// model's gradient norm. zero: the store is sharded over the data-parallel ranks (ZeRO-1/2/3).
std::vector<std::pair<int64_t, int64_t>> norm_ranges(const Graph& g, const ParamStore& ps, const dist::Mesh& m,
                                                    bool zero);

class GradClip final : public GradHook {
 public:
  // max_norm > 0. loss_scale: the fp16 loss scale in device memory (null: none).
  GradClip(const Graph& g, const ParamStore& ps, const dist::Mesh& m, bool zero, float max_norm,
           DeviceBackend& device, const float* loss_scale, DeviceOptimizer& optimizer);
  // The gradients are final: the norm over the job (collective over the world), and the
  // optimizer's gradient scale for this step.
  void after_reduce() override;
  double norm() const { return norm_; }    // the last step's total norm, before clipping
  bool clipped() const { return clipped_; }  // whether the last step scaled its gradients

 private:
  const ParamStore& ps_;
  const dist::Mesh& m_;
  float max_norm_;
  DeviceOptimizer& optimizer_;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  std::unique_ptr<SquaredNorms> norms_;
  double norm_ = 0;
  bool clipped_ = false;
};

// clip_grad_norm_'s coefficient for a total norm: min(max_norm / (norm + 1e-6), 1); 1 for a
// norm that is not finite.
float clip_coefficient(double norm, float max_norm);

}  // namespace sat
