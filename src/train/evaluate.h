// Evaluation of a running job on its test split, through the one executor: every test
// batch runs the forward-only schedule (train/schedule.h: make_forward_schedule) of the
// rank's stage, stage after stage and virtual stage after virtual stage, as training's
// forwards do; the stage with the loss counts, and the sums are added over the
// data-parallel ranks and broadcast along the pipeline.
#pragma once
#include <functional>

#include "data/loader.h"
#include "train/config.h"

namespace sat {

class RankRuntime;

// One evaluated micro-batch as the stage with the loss sees it (saturate predict): rows
// [0, batch.valid) are test samples first, first + 1, ...; logits are the model's output
// on the host, [rows of batch.y, classes] (a token model's rows are its B x T positions).
struct EvalBatch {
  const Batch& batch;
  int64_t first = 0;
  const float* logits = nullptr;
  int64_t classes = 0;
};
using EvalSink = std::function<void(const EvalBatch&)>;

// The test split's loss (and accuracy for classifiers); `sink` (one data-parallel rank only)
// also sees every batch's logits, so predictions come from the same forward pass. Collective.
EvalResult evaluate(RankRuntime& rt, const EvalSink& sink = {});
// The same over `data` in place of the test split (validation during training: its first
// samples), read by `loader` (built as the runtime builds its test loader; null on the ranks
// whose stage reads no data). Collective.
EvalResult evaluate(RankRuntime& rt, const Dataset& data, BatchLoader* loader);

}  // namespace sat
