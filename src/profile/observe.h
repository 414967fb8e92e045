// What the executor tells an observer of a step (traces; null: nothing): every action of the
// rank's list as it runs, by its index in the list (the memory plan's timeline counts actions
// so), when it began and when it ended (a send/receive group ends when it has been waited
// for); and, within an action, the hooks' parts: a micro-batch's hand-off before a forward,
// and the gradient buckets launched after a backward. Declared here, below the trainer, so
// that observers (the profiler) need nothing of train/.
#pragma once
#include <cstdint>

namespace sat {

enum class StepPart : uint8_t { data, grad_buckets };

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void action_begins(int index) = 0;
  virtual void action_timed(int index, double t0, double t1) = 0;
  virtual void part_timed(StepPart part, double t0, double t1) = 0;
};

}  // namespace sat
