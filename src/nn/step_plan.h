// The layout of every transient byte of a training step (activations, saved buffers,
// activation gradients, scratch, and the buffers a pipeline stage receives into), in one
// arena, from a timeline of the step.
//
// A stage of a pipeline has several micro-batches in flight: micro-batch m of model
// chunk c runs its forward at one point of the rank's schedule and its backward at a
// later one, with other micro-batches' actions in between. Each micro-batch in flight
// uses a *context*: its own copy of the chunk's buffers. The timeline says, for every
// (micro-batch, chunk) of the step, which context it uses and at which action of the
// rank's schedule its data arrives, its forward runs, its outputs leave, its output
// gradients arrive, its backward runs and its input gradients leave. Time runs in
// action slots of W = nodes + 1 units: within a forward action node i runs at unit i,
// within a backward action at unit nodes - 1 - i. Each buffer of a context is live in
// one interval per micro-batch that uses the context, and the ArenaPlanner packs them
// so that nothing alive at the same time overlaps:
//   output of node i:      forward(i) .. backward(i) (its readers' backward may read it;
//                          a sent output also until it has been sent, the unit before
//                          MicroUse::send)
//   its gradient:          the first reader's backward (or its arrival, when sent) ..
//                          backward(i)
//   a received input:      arrival .. the backward of its last reader
//   its gradient:          the first reader's backward .. it has been sent
//   saved of node i:       forward(i) .. backward(i); scratch: during the call
// A split backward (MicroUse::wgt, zero-bubble schedules) runs its weight part in a later
// action, node i at the same unit within it: a node with a weight part keeps its saved
// buffers, its output's gradient and the inputs (and output) its backward reads until then,
// and has its backward scratch again there.
// Under full recomputation (Graph::set_recompute) a backward action is a finer sequence
// (W = its events + 1 units): for each node in backward order, the forward of its
// recompute unit's nodes when it is the unit's last node, then its backward. A value
// computed in a unit that nothing after the unit reads lives from forward(i) to its last
// reader's forward, then again from recompute(i) to backward(i); the unit's saved buffers
// live during the node's forward, then from recompute(i) to backward(i); forward scratch
// during both forward calls. The unit's output keeps its whole interval (the recompute
// writes the same bits into it).
// With one micro-batch at a time (no pipelining) every micro-batch reuses context 0 and
// the arena is that of a single micro-batch. Forward-only uses (evaluation) keep a value
// until its last reader, and the graph's loss and logits until the end of the forward.
#pragma once
#include <array>
#include <vector>

#include "core/plan.h"
#include "nn/graph.h"

namespace sat {

struct MicroUse {
  int chunk = 0;
  int ctx = 0;         // the context whose buffers it uses
  int recv = -1;       // action at which its received inputs arrive (-1: none; at fwd)
  int fwd = 0;         // its forward
  int send = -1;       // the action before which its sent outputs have left (-1: none)
  int recv_grad = -1;  // the gradients of its sent outputs arrive (-1: none; at bwd)
  int bwd = -1;        // its backward (-1: forward only)
  int send_grad = -1;  // the action before which its received inputs' gradients have left (-1: none; at bwd)
  // Zero-bubble schedules: bwd is its input-gradient part and wgt its weight-gradient part
  // (-1: a whole backward at bwd). The buffers a node's weight part reads (its inputs, its
  // output's gradient, its saved buffers; see backward_parts) stay live until wgt.
  int wgt = -1;
};

struct Timeline {
  std::vector<MicroUse> uses;  // in any order; uses of one context must not overlap in time
};

struct StepPlan {
  int contexts = 1;
  size_t arena = 0;  // bytes of the step arena
  // Bytes of each transient kind before lifetime reuse, summed over contexts.
  std::array<size_t, size_t(MemKind::kCount)> by_kind{};
  // Byte offsets into the arena, -1 where there is no buffer. Per context:
  struct Ctx {
    std::vector<int64_t> value, grad;                          // per value
    std::vector<std::vector<int64_t>> saved, sfwd, sbwd, temp;  // per node (temp: per input slot)
  };
  std::vector<Ctx> ctx;
  // The step's timeline, for memory over the step (traces): an action of the rank's
  // schedule spans `units` time units; within it node i's forward runs at unit i, its
  // backward at bwd_unit[i] and its recompute at rec_unit[i] (-1: none). lifetimes: every
  // transient buffer's bytes and the intervals [t0, t1] (inclusive units) it is live in,
  // with the buffer's kind.
  int units = 1;
  std::vector<int> bwd_unit, rec_unit;
  struct Live {
    size_t bytes;
    int t0, t1;
    MemKind kind = MemKind::scratch;
  };
  std::vector<Live> lifetimes;
};
StepPlan plan_step(const Graph& g, const Timeline& t);
// The bytes of the step's transient buffers live at each unit of the timeline (from 0 to
// the last unit a buffer lives in): what the arena holds then. Its largest element is the
// step's transient peak, at most the arena (whose packing may leave gaps).
std::vector<size_t> live_bytes(const StepPlan& p);
// The bytes of each transient kind live at the step's transient peak (the first unit at
// which live_bytes is largest): they sum to that peak, unlike StepPlan::by_kind, which sums
// every buffer of a kind whenever it lives (a kind's bytes there can exceed the arena many
// times over).
std::array<size_t, size_t(MemKind::kCount)> live_at_peak(const StepPlan& p);
// The same of any buffers' lifetimes (another arena's: ZeRO's staging).
std::array<size_t, size_t(MemKind::kCount)> live_at_peak(const std::vector<StepPlan::Live>& lifetimes);

}  // namespace sat
