// The one executor: runs a rank's schedule (train/schedule.h) for one optimizer step on
// the engine, on either device. Every strategy is a schedule: plain gradient accumulation
// is the one-stage schedule F0 B0 F1 B1 ... REDUCE OPT, pipelines add sends and receives
// between stages, evaluation is the forward-only list. What differs between runs (data
// parallelism's gradient buckets, the noise scale, the optimizer of each device) plugs in
// at fixed points through the step's named parts (StepParts), never as a branch here.
//
// Communication: a run of consecutive send/receive actions is one group, posted together
// (Comm::p2p: its sends in one batch, then each receive as its own); a receive is waited for
// before the compute that reads it, the sends before the next compute other than a weight
// gradient or the next group (schedule.h, contract item 4: this cannot deadlock). A
// communicator whose operations are ordered on the device stream (NCCL) is not waited for on
// the host.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "dist/comm.h"
#include "nn/engine.h"
#include "profile/observe.h"
#include "train/schedule.h"

namespace sat {

class GradSync;
class DeviceOptimizer;

// The micro-batches a step's forwards read: the data inputs (Chunk::data order) of
// micro-batch `micro` for `chunk`.
class DataFeed {
 public:
  virtual ~DataFeed() = default;
  virtual void begin_step() {}  // a new pass over the list: its micro-batches are new ones
  virtual std::vector<Tensor> data(int chunk, int micro) = 0;
};

// Told of a step's gradients at two points: after each micro-batch's backward of a chunk
// (its gradients are in the store), and after the reduction (final, before the update).
class GradHook {
 public:
  virtual ~GradHook() = default;
  virtual void after_backward(int chunk, int micro) { (void)chunk, (void)micro; }
  virtual void after_reduce() {}
};

// The named parts of a step, called at fixed points of the schedule: the data feed before
// each forward, the gradient reduction during and after backward (data parallelism, ZeRO;
// train/data_parallel.h), the gradient hooks in order (the sequence-parallel sums, the
// noise probe), and the optimizer's update. Null parts are skipped; evaluation has a feed only.
struct StepParts {
  DataFeed* data = nullptr;
  GradSync* sync = nullptr;
  std::vector<GradHook*> grad_hooks;
  DeviceOptimizer* optimizer = nullptr;
};

// Where one step's time went on this rank (seconds; the rest of the step is the trainer's).
struct StepStats {
  double loss_sum = 0;   // losses of this rank's micro-batches (the stage with the loss)
  int losses = 0;
  double wait_seconds = 0;       // waiting for other pipeline stages (send/receive groups)
  double compute_seconds = 0;    // forward and backward actions, less the data wait
  double data_seconds = 0;       // the loader's hand-off of micro-batches (DataFeed::data)
  double reduce_seconds = 0;     // the data-parallel reduction's exposed part (reduce_grads)
  double optimizer_seconds = 0;  // the optimizer action
};

class Executor {
 public:
  // pp: the pipeline group (rank = stage; null without pipelining). ctx_of[chunk][micro]:
  // the context each micro-batch uses (RankPlan). training: false for a forward-only list
  // (evaluation: make_forward_schedule), whose forwards run without dropout.
  Executor(Engine& engine, const std::vector<Action>& actions, std::vector<std::vector<int>> ctx_of, dist::Comm* pp,
           bool training = true);
  // One pass over the list (an optimizer step, or one evaluated batch): seed(micro) is the
  // micro-batch's seed (the engine's set_dloss gives d(objective)/d(loss); the optimizer's
  // learning rate is the optimizer's own, set by the step loop).
  StepStats run_step(const std::function<uint64_t(int)>& seed, const StepParts& parts);
  // o must outlive its use (null: none).
  void set_observer(StepObserver* o) { observer_ = o; }
  // Replay each step as captured CUDA graphs from the second step on (the first runs
  // eagerly: the libraries initialise lazily); the engine ignores it on the host.
  void capture_from_second_step(bool on) { capture_ = on; }

 private:
  void post(const Action& a, std::vector<dist::P2POp>& ops) const;
  // Posts the group of actions [first, end) and waits for the sends of the group before
  // (schedule.h, contract item 4); the seconds waited.
  double post_group(size_t first, size_t end);
  double wait_sends();  // the sends posted last, complete (the seconds waited)
  // The receive compute action `index` reads (its input, or its output's gradient), complete
  // if one is pending; the seconds waited.
  double wait_receive(size_t index);
  void run_compute(size_t index, const std::function<uint64_t(int)>& seed, const StepParts& parts, StepStats& st);
  void run_backward(const Action& a, const StepParts& parts, BackwardPart part);
  void hand_on(const Action& a, bool forward);

  Engine& engine_;
  std::vector<Action> actions_;
  std::vector<std::vector<int>> ctx_of_;
  dist::Comm* pp_;
  bool training_;
  StepObserver* observer_ = nullptr;
  bool capture_ = false;
  int64_t steps_ = 0;
  std::vector<dist::WorkPtr> in_flight_;  // stream-ordered groups, complete by the step's end
  dist::WorkPtr sends_;                   // the last group's sends, waited for at the next group
  struct Pending {
    size_t index;  // the receive action
    dist::WorkPtr work;
  };
  std::map<std::tuple<bool, int, int>, Pending> receives_;  // posted, by Action::message_key
};

}  // namespace sat
