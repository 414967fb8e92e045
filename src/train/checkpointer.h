// Checkpoints of a running job (the format: train/checkpoint.h): every rank's parameters,
// model states and optimizer state as logical tensors, in parallel files written by a
// background thread while training goes on; and resuming from one, in any layout. As an
// observer of the step loop it writes a checkpoint every --checkpoint-every steps or minutes,
// at the end, and when a signal asks the job to stop.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/observers.h"

namespace sat {

class RankRuntime;
struct Manifest;
struct CheckpointWrite;
class DirLock;

// Where a run resumed from a checkpoint goes on, and what it changed (train/resume_policy.h).
struct ResumeState {
  int64_t step = 0, epoch = 0, step_in_epoch = 0;
  std::vector<double> losses;
  std::string dir;
  std::vector<SettingChange> changes;
};

class Checkpointer final : public RunObserver {
 public:
  // With a checkpoint directory, takes it for the run (train/dir_lock.h; rank 0 holds it).
  // Collective; a directory another run holds is a sat::Error on every rank.
  explicit Checkpointer(RankRuntime& rt);
  ~Checkpointer() override;

  // Loads a checkpoint (any layout) into this rank's parameters and states, and unless
  // weights_only its optimizer state and run position. Collective; a checkpoint that does
  // not fit this run is a sat::Error on every rank, nothing changed.
  ResumeState load(const std::string& dir, bool weights_only = false);

  // --keep-best (train/validation.h): this step's checkpoint written as `dir`, a complete
  // checkpoint that replaces the one there atomically, its manifest recording `metric` and
  // its `value`. Collective; complete on return.
  void save_best(int64_t step, int64_t total, const std::vector<double>& losses, const std::string& dir,
                 const std::string& metric, double value);

  void step_begins(RunState& run) override;
  void step_ends(StepDone& done, RunState& run) override;
  void run_ends(RunState& run) override;

 private:
  struct Decision {
    bool save = false;
    int signal = 0;
    bool finish = false;  // every rank's background write is done: complete it now
  };
  Decision due(int64_t step) const;
  // Writes the checkpoint of step `step` under the checkpoint directory. Collective. With
  // wait, complete on return; otherwise finish() (or the next save) completes it.
  void save(int64_t step, int64_t total, const std::vector<double>& losses, bool wait);
  // Starts writing p (its root, tmp, dest and manifest's header set). Collective.
  void write(std::unique_ptr<CheckpointWrite> p, bool wait);
  void finish();
  Manifest header(int64_t step, int64_t total, const std::vector<double>& losses) const;
  void snapshot(CheckpointWrite& p);
  void publish(CheckpointWrite& p);
  // What must hold for this run to go on from the checkpoint; the settings it changes.
  std::vector<SettingChange> check_resumable(const std::string& dir, const Manifest& man) const;
  void load_tensors(const std::string& dir, const Manifest& man, bool weights_only);

  RankRuntime& rt_;
  std::unique_ptr<DirLock> lock_;
  std::unique_ptr<CheckpointWrite> pending_;
  double last_save_ = 0;
  struct {
    int64_t written = 0;
    double paused = 0, written_seconds = 0, last_bytes = 0;
    std::string last;
  } stats_;
};

}  // namespace sat
