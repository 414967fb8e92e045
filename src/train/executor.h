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

struct StepStats {
  double loss_sum = 0;   // losses of this rank's micro-batches (the stage with the loss)
  int losses = 0;
  double wait_seconds = 0;  // waiting for other pipeline stages (send/receive groups)
};

class Executor {
 public:
  // pp: the pipeline group (rank = stage; null without pipelining). ctx_of[chunk][micro]:
  // the context each micro-batch uses (RankPlan).
  Executor(Engine& engine, const std::vector<Action>& actions, std::vector<std::vector<int>> ctx_of, dist::Comm* pp);
  // One optimizer step: seed(micro) is the micro-batch's seed, lr the optimizer's
  // learning rate (the engine's set_dloss gives d(objective)/d(loss)).
  StepStats run_step(const std::function<uint64_t(int)>& seed, float lr, StepHooks& hooks);

 private:
  void post(const Action& a, std::vector<dist::P2POp>& ops) const;
  double finish_group(std::vector<dist::P2POp>& ops);

  Engine& engine_;
  std::vector<Action> actions_;
  std::vector<std::vector<int>> ctx_of_;
  dist::Comm* pp_;
  std::vector<dist::WorkPtr> in_flight_;  // stream-ordered groups, complete by the step's end
};

}  // namespace sat
