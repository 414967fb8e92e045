// Validation during training (--eval-every N, --eval-batches K, --keep-best METRIC): an
// observer of the step loop (train/observers.h) that evaluates the test split after every
// N-th optimizer step through evaluation's own path (train/evaluate.h: the forward-only
// schedule of the rank's stage, so every layout, all ranks taking part, the data-parallel
// replicas' model states first made the first replica's as for the final evaluation). It
// hands the result to the step's metrics (metrics.jsonl and the progress line: the
// progress observer, attached after it, writes them), and with keep_best writes the
// checkpoint of the best evaluation so far to best_dir through the checkpointer (a whole
// checkpoint, replaced atomically). A resumed run starts from the best that best_dir holds.
#pragma once
#include <memory>
#include <string>

#include "data/dataset.h"
#include "nn/models.h"
#include "train/config.h"
#include "train/observers.h"

namespace sat {

class Checkpointer;
class RankRuntime;

// --keep-best's metrics: val_loss (lower is better) and val_accuracy (higher is better).
bool is_best_metric(const std::string& metric);
bool lower_is_better(const std::string& metric);
// The value of `metric` in an evaluation (NaN: none, as a language model's accuracy).
double metric_value(const EvalResult& e, const std::string& metric);

// The settings alone (part of validate_run): sat::Error naming the flag.
void check_validation(const ModelConfig& mc, const TrainConfig& cfg);
// Against the data and the run's length: a test split to evaluate, eval_every within the
// run's `total` optimizer steps (0: not known yet, not checked).
void check_validation(const TrainConfig& cfg, const Dataset* test, int64_t total);

// Whether the evaluations read a prefix of the test split (eval_batches x batch samples, fewer
// than it holds) through a loader of their own, whose buffers the memory plan counts.
bool validates_prefix(const TrainConfig& cfg, const Dataset& test);

// The observer, attached by every rank before the progress observer.
std::unique_ptr<RunObserver> validation_observer(RankRuntime& rt, Checkpointer& checkpoints, RunState& run);

}  // namespace sat
