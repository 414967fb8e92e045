// The process mesh: the ranks of a job arranged in tensor-parallel (tp), context-parallel
// (cp), data-parallel (dp) and pipeline (pp) dimensions, with one communicator per group this rank belongs to.
#pragma once
#include <memory>
#include <string>

#include "dist/comm.h"

namespace sat::dist {

// A rank's place in the mesh: its coordinate in each dimension (and its rank in that group).
struct MeshCoords {
  int tp = 0, dp = 0, pp = 0;
  int cp = 0;  // context-parallel: which part of the sequence (between tp and dp in the order)
  bool operator==(const MeshCoords&) const = default;
};
// The rank arithmetic of a mesh of tp x cp x dp x pp ranks, pure and the same everywhere (the
// mesh, the planner, the CLI's per-stage plans): global rank =
// tp + tp_size * (cp + cp_size * (dp + dp_size * pp)) (with cp_size 1: tp + tp_size * (dp + dp_size * pp)).
MeshCoords mesh_coords(int rank, int tp, int dp, int cp = 1);
int mesh_rank(const MeshCoords& c, int tp, int dp, int cp = 1);

// World ranks arranged as Megatron orders them: tensor-parallel rank fastest, then
// context-parallel, then data-parallel, then pipeline: global rank = tp_rank + tp * (cp_rank +
// cp * (dp_rank + dp * pp_rank)). Tensor-parallel ranks, which communicate the most, are
// adjacent (on one node where it has tp GPUs), the ring of a cp group next.
// Groups are made once (Comm::split) and passed explicitly: every collective of the trainer
// names its group. Each group counts the bytes it moves: tp_group(), dp_group(), pp_group() and
// embedding_group() are CountingComms (comm.h), so their traffic() is never nullptr (world(),
// which the caller owns, is not wrapped). Communicators made from a group (NCCL ones
// bootstrapped over it, its splits) count on their own, if at all.
class Mesh {
 public:
  // Validation without communication (all ranks call it with the same numbers, so all fail
  // alike): tp >= 1 (--tp), pp >= 1 (--pp), world % (tp * pp) == 0, else sat::Error such as
  // "--tp 1 x --pp 3 = 3 does not divide the 4 processes of this job (expected a divisor of 4)".
  // With cp > 1 (--cp): cp >= 1 and world % (tp * cp * pp) == 0, the message naming --cp too.
  static void check(int world, int tp, int pp, int cp = 1);
  // Expert parallelism (--ep): ep >= 1 and ep divides the data-parallel ranks
  // (world / (tp * cp * pp)), else sat::Error naming --ep. Checks the rest as above.
  static void check(int world, int tp, int pp, int cp, int ep);

  // Collective over `world` (which must outlive the mesh): builds the tp, dp and pp groups and
  // the embedding group (the first and the last pipeline stage of this (tp, dp) coordinate;
  // nullptr on the stages in between; with pp == 1 it is a group of one). A group of one is a
  // self communicator when world works on host memory (a split of world otherwise).
  // cp > 1 adds the context-parallel group and the dp x cp group (see cp_group()).
  // ep > 1 adds the expert-parallel group and the expert-data-parallel group (see ep_group()).
  Mesh(Comm& world, int tp, int pp, int cp = 1, int ep = 1);

  int size() const { return world_->size(); }
  int rank() const { return world_->rank(); }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int dp() const { return dp_; }
  int cp() const { return cp_; }
  int ep() const { return ep_; }
  // This rank's coordinates; each is also its rank within the group of that dimension.
  int tp_rank() const { return tp_rank_; }
  int dp_rank() const { return dp_rank_; }
  int pp_rank() const { return pp_rank_; }
  int cp_rank() const { return cp_rank_; }
  // This rank's place in its expert-parallel group: dp_rank() % ep().
  int ep_rank() const { return dp_rank_ % ep_; }
  // The world rank at a coordinate (throws sat::Error when one is out of range).
  int global_rank(int tp_rank, int dp_rank, int pp_rank, int cp_rank = 0) const;

  Comm& world() const { return *world_; }
  // The ranks that differ from this one only in their tp (dp, pp) coordinate.
  Comm& tp_group() const { return *tp_group_; }
  Comm& dp_group() const { return *dp_group_; }
  Comm& pp_group() const { return *pp_group_; }
  // First and last stage of this rank's pipeline (tied input and output embeddings reduce
  // their gradients over it); nullptr on the stages in between.
  Comm* embedding_group() const { return embedding_group_.get(); }
  // Context parallelism: the ranks that hold the other parts of this rank's sequence (the
  // ring of its attention), ranked by cp coordinate; nullptr with cp 1 (no group is made).
  Comm* cp_group() const { return cp_group_.get(); }
  // The ranks that share this rank's parameters and average their gradients: dp x cp
  // (ranked cp fastest); the dp group itself with cp 1.
  Comm& dp_cp_group() const { return cp_ > 1 ? *dp_cp_group_ : *dp_group_; }
  // Expert parallelism, carved from the data-parallel ranks as Megatron-Core does: ep
  // consecutive dp ranks (dp coordinates ep*j .. ep*j + ep - 1, the other coordinates this
  // rank's) exchange their tokens with all-to-all and each computes 1/ep of the experts of
  // every moe layer; ranked by dp coordinate. nullptr with ep 1 (no group is made).
  Comm* ep_group() const { return ep_group_.get(); }
  // The ranks that hold this rank's experts and average their gradients (Megatron-Core's
  // expert-data-parallel group): the dp / ep data-parallel ranks of the same ep rank (dp
  // coordinates ep_rank, ep_rank + ep, ...) times the cp ranks (ranked cp fastest), the other
  // coordinates this rank's; nullptr with ep 1.
  Comm* expert_dp_group() const { return expert_dp_group_.get(); }

  // The traffic of a group so far: "tp", "dp", "pp", "embedding" (all zero on a stage that
  // has no embedding group), "cp" or "dp_cp" (all zero with cp 1), "ep" or "expert_dp" (all
  // zero with ep 1); sat::Error for another name. For the bytes of one step subtract
  // the traffic before it.
  Traffic traffic_of(const std::string& group) const;

  // "4 ranks = dp 2 x tp 1 x pp 2; this rank: dp 1, tp 0, pp 0"; with cp > 1
  // "8 ranks = dp 2 x tp 1 x pp 2 x cp 2; this rank: dp 1, tp 0, pp 0, cp 1".
  std::string describe() const;

 private:
  Comm* world_;
  int tp_, pp_, dp_, cp_, ep_ = 1;
  int tp_rank_, dp_rank_, pp_rank_, cp_rank_;
  std::unique_ptr<Comm> tp_group_, dp_group_, pp_group_, embedding_group_, cp_group_, dp_cp_group_, ep_group_;
  std::unique_ptr<Comm> expert_dp_group_;
};

}  // namespace sat::dist
