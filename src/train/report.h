// What a run shows and writes, outside the step loop: the progress display, the
// metrics.jsonl line of every step, and summary.json.
#pragma once
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "nn/engine.h"
#include "train/config.h"

namespace sat {

// Progress on stderr (a bar on a terminal, a plain line every 5% otherwise) and one JSON
// object per step in DIR/metrics.jsonl, written as it happens.
class StepReporter {
 public:
  // progress: -1 automatic, 0 quiet, 1 lines, 2 bar. out_dir "" writes no metrics.
  // resumed_at > 0: a run resumed from the checkpoint of that step goes on with the existing
  // metrics.jsonl: its lines up to that step are kept (those of steps after it, written
  // before the run stopped, are dropped) and the new ones appended. 0: a new file.
  // A line that cannot be written whole (a full disk, a file size limit) is a sat::Error
  // naming metrics.jsonl: the run stops there, its checkpoints kept, and the file holds the
  // whole lines written before (the cut one is taken back).
  StepReporter(int progress, const std::string& out_dir, bool noise, int64_t resumed_at = 0);
  ~StepReporter();
  StepReporter(const StepReporter&) = delete;
  StepReporter& operator=(const StepReporter&) = delete;
  void step(const StepMetrics& m, int64_t total, double elapsed);
  // The line of a run resumed from checkpoint `from` at `step`, with the settings it changed:
  // {"event": "resume", "from_step": 10, "from": "...", "changes": {"lr": ["0.1", "0.5"]}}.
  void resumed(int64_t step, const std::string& from, const std::vector<SettingChange>& changes);

 private:
  void write_line(const std::string& line);

  int progress_;
  bool noise_;
  std::string path_;
  int fd_ = -1;
  long long written_ = 0;  // bytes of whole lines in the file
};

// A validation's fields of a metrics.jsonl line (after a comma): val_loss, val_accuracy
// (classifiers) or val_perplexity (language models: e^val_loss), val_samples.
std::string validation_fields(const EvalResult& e);
// The same for people: "loss 0.4321, accuracy 85.10% (1000 samples)".
std::string describe_validation(const EvalResult& e);

// The run's description beyond TrainConfig, for summary.json.
struct RunInfo {
  std::string model, data, schedule_name;
  int64_t parameters = 0;
  int threads = 1;
  bool tokens = false;
  int64_t seq_len = 0;
  double flops_per_sample = 0;
  uint64_t seed = 0;
  double wall_seconds = 0;
  double memory_budget = 0;  // bytes per rank (--memory-budget; 0: none)
};

nlohmann::ordered_json memory_plan_json(const MemoryPlan& p);
// summary.json: see the README's table of fields.
nlohmann::ordered_json run_summary(const RunInfo& info, const TrainConfig& cfg, const TrainResult& r,
                                   const MemoryPlan& plan);
// Writes j to path atomically (core/io.h's write_file_atomic): a failed write keeps the old one.
void write_json_atomic(const std::string& path, const nlohmann::ordered_json& j);

}  // namespace sat
