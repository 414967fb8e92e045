// A job's layout as one value: how its ranks split the work (data, tensor and pipeline
// parallelism), the micro-batch and accumulation, the pipeline's schedule and cut,
// activation recomputation, sequence parallelism and the ZeRO stage. Everything derived
// from a layout is derived here, once: its --layout text, its checks against the job's
// size, the global batch, the pipeline's schedule spec, and the rank arithmetic
// (rank -> coordinates) that the mesh, the planner and the CLI share.
//
// TrainConfig (train/config.h) is a Layout plus the run's other settings; the planner's
// layouts (plan/planner.h) and the tuner's choices are Layouts too.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dist/mesh.h"
#include "nn/models.h"
#include "train/schedule.h"

namespace sat {

struct Layout {
  // Data-parallel ranks; 0: what the job's ranks leave (world / (tp * cp * pp)), see with_world.
  int dp = 0;
  int tp = 1;                  // tensor-parallel ranks per layer (--tp)
  int pp = 1;                  // pipeline stages (--pp)
  int64_t batch = 64;          // micro-batch (--batch)
  int64_t accum = 1;           // micro-batches per optimizer step (--accum)
  PipeSchedule pp_schedule = PipeSchedule::one_f_one_b;
  int virtual_stages = 1;      // interleaved: model chunks per stage
  std::vector<int> pp_split;   // cut points between pipeline chunks, by block (empty: balanced)
  Recompute recompute = Recompute::none;
  bool sequence_parallel = false;
  int zero = 0;                // ZeRO stage 0..3 over the data-parallel ranks
  int cp = 1;                  // context-parallel ranks: the sequence split over a ring (--cp)
  int ep = 1;                  // expert-parallel ranks, carved from dp: the experts of moe layers split (--ep)

  // The data-parallel ranks of a job of `world` ranks (dp when set).
  int dp_of(int world) const { return dp > 0 ? dp : world / (tp * pp * cp); }
  // This layout on a job of `world` ranks, dp filled in; sat::Error naming the flag when the
  // ranks do not divide (Mesh::check) or a set dp disagrees with the job's size.
  Layout with_world(int world) const;
  // Every check that needs neither the model nor communication: sizes, the ranks of the
  // job (world > 0), the pipeline schedule against the accumulation, the ZeRO stage against
  // the data-parallel ranks, the global batch's range (sat::Error naming the flag).
  void check(int world) const;
  // micro-batch x accumulation x data-parallel ranks: the samples of one optimizer step
  // (sat::Error naming --batch and --accum when over 2^40).
  int64_t global_batch(int world) const;
  // The pipeline's schedule (make_schedule's input).
  ScheduleSpec schedule_spec() const;
  // Where a global rank sits in the mesh, and back (tp fastest, then cp, then dp, then pp:
  // Megatron's order); dp must be set (with_world).
  dist::MeshCoords coords(int rank) const { return dist::mesh_coords(rank, tp, dp, cp); }
  int rank_of(const dist::MeshCoords& c) const { return dist::mesh_rank(c, tp, dp, cp); }
  // "dp=2,tp=4,pp=8,micro=1,schedule=interleaved,v=2,recompute=full,sp=on,zero=1":
  // --layout's form (the schedule is "none" with one stage; ",cp=C" follows when cp > 1,
  // ",ep=E" when ep > 1).
  std::string str() const;
};

}  // namespace sat
