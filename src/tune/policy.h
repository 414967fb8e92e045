// What a run does about tuning and memory before it trains, the same for `saturate train`,
// `saturate tune` and the library's fit(): take the cached choice of an earlier tuning or
// tune now (the batch tuner, tune.h; the layout tuner, layout_tune.h), keep its report in the
// cache and beside the run's output, put the choice into the run's TrainConfig, and hold
// the run to its memory budget.
//
// The cache: one directory (tune.json, tune.html) per tuning problem (model, data, device,
// precision, ranks, budget and tuning settings), under $XDG_CACHE_HOME/saturate/tune
// (~/.cache by default). Rank 0 reads it, like any input (a damaged file is ignored with a
// line saying so), and tells every rank whether to tune.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "data/dataset.h"
#include "nn/models.h"
#include "train/config.h"
#include "tune/layout_tune.h"
#include "tune/tune.h"

namespace sat {

namespace dist { class Comm; }

// The largest micro-batch a run takes (--batch; a cached choice above it is refused).
constexpr int64_t kMaxMicroBatch = int64_t(1) << 24;

struct TunePolicy {
  TuneConfig tune;             // the batch tuner's settings (budget in bytes, global batch, objective, ...)
  std::string budget_text;     // the budget as the user wrote it ("40MiB"; "": none): the cache key's form
  std::string data;            // the data's description (the cache key's)
  int64_t seq_len = 0;         // a window other than the model's context (0: the context)
  bool cache = true;           // read and write the cache (the library's fit does not)
  bool cost_model = true;      // on the CPU, measure this machine so that the cost model guides the probes
  bool print = true;           // rank 0 prints the choice and where it came from
  bool noise_scale = false;    // the run measures the noise scale (it needs two micro-batches per step)
  bool tune_only = false;      // saturate tune: report the choice, change nothing
  std::string out_dir;         // a copy of the report goes here too ("": none; rank 0 writes)
};

// The cache directory of a tuning problem, by its key.
std::string tune_cache_dir(const std::string& key);
// Writes DIR/tune.json and DIR/tune.html (atomically: a failed run keeps the old ones).
void write_tune_files(const std::string& dir, const std::string& json, const std::string& html);

// --batch auto, saturate tune, fit's batch_size 0 (collective over comm): the cached choice
// or a new tuning; its micro-batch, accumulation, learning rate, warm-up and memory lever go
// into cfg (also when tune_only: saturate tune writes them as config.toml). test: the
// evaluation split whose loader counts in the budget (null: none). Returns false when tune_only.
bool apply_tuning(const TunePolicy& p, const ModelConfig& mc, const Dataset& train, const Dataset* test,
                  dist::Comm& comm, TrainConfig& cfg);

// --layout auto|FIELDS (collective): the planner's best layouts for these ranks timed, or the
// cached choice; the chosen layout goes into cfg (unless tune_only). Returns false when
// tune_only.
bool apply_layout_tuning(const TunePolicy& p, const ModelConfig& mc, const Dataset& train, const Dataset* test,
                         LayoutTuneConfig t, dist::Comm& comm, TrainConfig& cfg);

// --memory-budget: sat::Error when this rank's plan needs more than `budget` bytes;
// otherwise allocations beyond it fail from now on (host buffers that exist already, none of
// the plan's, do not count).
void hold_to_budget(size_t budget, const MemoryPlan& plan, const TrainConfig& cfg);

}  // namespace sat
