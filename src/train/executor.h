// The one executor: runs a rank's schedule (train/schedule.h) for one optimizer step on
// the engine, on either device. Every strategy is a schedule: plain gradient accumulation
// is the one-stage schedule F0 B0 F1 B1 ... REDUCE OPT, pipelines add sends and receives
// between stages. What differs between runs (data parallelism's gradient buckets, the
// noise scale, the optimizer of each device, the CUDA graphs) plugs in at fixed points
// through StepHooks, never as a branch here.
//
// Communication: a run of consecutive send/receive actions is one group: its operations
// are posted together (Comm::p2p) and waited for before the next compute action (the
// schedule orders them so that this cannot deadlock). A communicator whose operations
// are ordered on the device stream (NCCL) is not waited for on the host.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "dist/comm.h"
#include "nn/engine.h"
#include "train/schedule.h"

namespace sat {

class StepHooks {
 public:
  virtual ~StepHooks() = default;
  // The data inputs (Chunk::data order) of micro-batch `micro` for `chunk`.
  virtual std::vector<Tensor> data(int chunk, int micro) = 0;
  // Called after each node's backward in B(micro, chunk) (null: nothing to do): data
  // parallelism launches the gradient buckets that become final.
  virtual const std::function<void(int)>* node_hook(int chunk, int micro) { (void)chunk, (void)micro; return nullptr; }
  // After B(micro, chunk). replayed: the engine replayed a captured CUDA graph, so the
  // node hook did not run on the host (the work it enqueued at capture is in the graph).
  virtual void after_backward(int chunk, int micro, bool replayed) { (void)chunk, (void)micro, (void)replayed; }
  // Whether a micro-batch's parameter gradients add to the earlier ones' (false: every
  // backward overwrites them, as when they are reduce-scattered after each micro-batch).
  virtual bool accumulates_grads() const { return true; }
  virtual void reduce_grads() {}
  virtual void optimizer_step(float lr) = 0;
};

// Where one step's time went on this rank (seconds; the rest of the step is the trainer's).
struct StepStats {
  double loss_sum = 0;   // losses of this rank's micro-batches (the stage with the loss)
  int losses = 0;
  double wait_seconds = 0;       // waiting for other pipeline stages (send/receive groups)
  double compute_seconds = 0;    // forward and backward actions, less the data wait
  double data_seconds = 0;       // the loader's hand-off of micro-batches (StepHooks::data)
  double reduce_seconds = 0;     // the data-parallel reduction's exposed part (reduce_grads)
  double optimizer_seconds = 0;  // the optimizer action
};

// Told of every action of a step as it runs (traces; null: nothing): its index in the
// rank's list (the memory plan's timeline counts actions so), when it began, and when it
// ended; a send/receive group ends when it has been waited for. Within an action, the
// hooks' parts: a micro-batch's hand-off before a forward, and the gradient buckets
// after_backward launches.
enum class StepPart : uint8_t { data, grad_buckets };
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void action_begins(int index) = 0;
  virtual void action_timed(int index, const Action& a, double t0, double t1) = 0;
  virtual void part_timed(StepPart part, double t0, double t1) = 0;
};

class Executor {
 public:
  // pp: the pipeline group (rank = stage; null without pipelining). ctx_of[chunk][micro]:
  // the context each micro-batch uses (RankPlan).
  Executor(Engine& engine, const std::vector<Action>& actions, std::vector<std::vector<int>> ctx_of, dist::Comm* pp);
  // One optimizer step: seed(micro) is the micro-batch's seed, lr the optimizer's
  // learning rate (the engine's set_dloss gives d(objective)/d(loss)).
  StepStats run_step(const std::function<uint64_t(int)>& seed, float lr, StepHooks& hooks);
  // o must outlive its use (null: none).
  void set_observer(StepObserver* o) { observer_ = o; }

 private:
  void post(const Action& a, std::vector<dist::P2POp>& ops) const;
  // Posts the group of actions [first, end) and waits for it; the seconds waited.
  double finish_group(std::vector<dist::P2POp>& ops, size_t first, size_t end);
  void run_compute(size_t index, const std::function<uint64_t(int)>& seed, float lr, StepHooks& hooks, StepStats& st);

  Engine& engine_;
  std::vector<Action> actions_;
  std::vector<std::vector<int>> ctx_of_;
  dist::Comm* pp_;
  StepObserver* observer_ = nullptr;
  std::vector<dist::WorkPtr> in_flight_;  // stream-ordered groups, complete by the step's end
};

}  // namespace sat
