// What --profile and --trace record while training, through the step's seams, never a
// branch of the step loop: the engine's NodeTimer (every layer's forward, backward and
// recompute), the executor's StepObserver (every action of the rank's schedule and the
// loader's hand-off) and the mesh groups' CommObserver (every collective and pipeline
// transfer, timed on the communication thread).
//
//  * --profile: per-layer totals over the measured steps (table()).
//  * --trace DIR: the steps TraceSchedule records, one Chrome trace file per rank and
//    window (profile/trace.h), on the tracks
//      "main"          ProfilerStep#N > schedule actions (0F3, 0B3, REDUCE_GRAD, OPTIMIZER,
//                      1SEND_F3 ...) > layers (their module path; kind, phase, Input Dims,
//                      FLOPs and bytes in args) and the loader's hand-off
//      "comm <group>"  the collectives and transfers of that group (backend:op, bytes,
//                      group size, algorithm bandwidth); "comm <group> 2", 3 ... when ops
//                      of the group are in flight at once (a pipeline stage's sends
//                      complete while it posts its next group), so that each track nests
//      "memory"        the plan's bytes in use at each layer call and action ([memory]
//                      records as PyTorch writes them, a counter, and the peak marked)
//    Memory follows the plan: the step's persistent bytes plus its transient buffers live
//    at that point of the timeline (nn/step_plan.h), at the real times the layers ran.
//
// Cost: with neither option no profiler exists (the seams are null pointers). Outside a
// traced window the engine's timer is detached, so layers read no clock; actions and
// communication pay a virtual call each.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "dist/comm.h"
#include "nn/engine.h"
#include "profile/trace.h"
#include "nn/step_plan.h"
#include "profile/observe.h"

namespace sat {

struct ProfileOptions {
  bool table = false;      // --profile
  std::string trace_dir;   // --trace DIR ("": no traces)
  TraceSchedule schedule;  // --trace-steps
  int rank = 0, world = 1;
  std::string backend = "mpi";  // distributedInfo.backend and the collectives' prefix
};

// An action of the rank's list as traces show it: its name (PyTorch's: "0F3", "1SEND_B2",
// "REDUCE_GRAD") and the span's title (the optimizer as PyTorch names it,
// "Optimizer.step#AdamW.step", which TensorBoard's overview counts as optimizer time).
struct TracedAction {
  std::string name, shown;
};

class Profiler final : public NodeTimer, public StepObserver, public dist::CommObserver {
 public:
  // g, plan and actions: this rank's graph, step plan and schedule; memory: its plan
  // (persistent and reserved bytes around the step's transient ones).
  Profiler(const Graph& g, const StepPlan& plan, std::vector<TracedAction> actions, const MemoryPlan& memory,
           ProfileOptions o);

  // Around every step this process runs (step: the global step, 1-based). measured: the
  // step counts towards --profile's totals. Whether layers should be timed during it.
  bool begin_step(int64_t step, bool measured);
  // The step's times; writes the window's file when the schedule says so.
  void end_step(double t0, double t1);
  // Writes a window cut short by the end of the run (when it recorded any step).
  void finish();

  void node_timed(int node, NodePhase phase, double t0, double t1) override;
  void action_begins(int index) override;
  void action_timed(int index, double t0, double t1) override;
  void part_timed(StepPart part, double t0, double t1) override;
  void comm_timed(const std::string& group, const dist::CommEvent& e) override;

  // --profile: every layer, slowest first: calls, forward and backward ms per step, share,
  // GFLOP/s and the share of gemm_peak (FLOP/s; 0: not shown). Per measured step.
  std::string table(double gemm_peak) const;
  // Seconds per measured step spent in tensor-parallel collective layers (0 unless timed).
  double tp_comm_seconds() const;
  int64_t measured_steps() const { return measured_; }
  const std::vector<std::string>& files() const { return files_; }

 private:
  void memory_sample(int unit, double t);
  void hook_timed(const std::string& after, double t0, double t1);
  void save();

  const Graph& g_;
  ProfileOptions o_;
  std::vector<TracedAction> actions_;
  int units_ = 1;
  std::vector<int> bwd_unit_, rec_unit_;
  std::vector<size_t> live_;         // transient bytes live per timeline unit
  size_t base_ = 0, reserved_ = 0;   // bytes outside the arena; the plan's total
  std::vector<std::string> names_;   // per node: its module path
  std::vector<std::vector<TraceArg>> node_args_;
  std::vector<char> is_tp_comm_;     // per node: a tensor-parallel collective
  // --profile totals per node.
  struct Totals {
    double fwd = 0, bwd = 0;
    int64_t calls = 0;
  };
  std::vector<Totals> totals_;
  int64_t measured_ = 0;
  bool measuring_ = false;
  // Traces.
  TraceEvents ev_;
  TraceSchedule::Action now_ = TraceSchedule::Action::none;
  int64_t step_ = 0, run_steps_ = 0, window_steps_ = 0;
  int action_ = 0;  // the action running
  int main_ = 0, mem_ = 0;
  // Per comm track: the spans on it, so that a span partly overlapping one goes on another.
  std::map<std::string, std::vector<std::pair<double, double>>> comm_spans_;
  size_t last_bytes_ = 0, peak_bytes_ = 0;
  double peak_t_ = 0;
  std::vector<std::string> files_;
  std::string worker_;
};

}  // namespace sat
