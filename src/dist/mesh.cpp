// The process mesh (see mesh.h).
#include "dist/mesh.h"

#include "core/error.h"

namespace sat::dist {

namespace {

// A group of `size` ranks out of world, made by one collective split (color < 0: this rank is
// in no group, nullptr). Every rank knows `size` (the same numbers everywhere), so all ranks
// agree to skip the split where the groups have one rank: a self communicator then costs no
// communication and runs every op as a world of one. Not for device buffers (NCCL): the self
// communicator copies host memory. The group counts its traffic (CountingComm).
std::unique_ptr<Comm> group(Comm& world, int size, int color, int key) {
  if (size == 1 && world.device() == Device::cpu) return counted(color >= 0 ? make_self_comm() : nullptr);
  return counted(world.split(color, key));
}

const char* plural(int n, const char* one, const char* many) { return n == 1 ? one : many; }

}  // namespace

MeshCoords mesh_coords(int rank, int tp, int dp, int cp) {
  const int outer = rank / (tp * cp);  // dp + dp_size * pp
  return {rank % tp, outer % dp, outer / dp, rank / tp % cp};
}

int mesh_rank(const MeshCoords& c, int tp, int dp, int cp) { return c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp)); }

void Mesh::check(int world, int tp, int pp, int cp) {
  SAT_CHECK(world >= 1, "the job has ", world, " processes (expected at least 1)");
  SAT_CHECK(tp >= 1, "--tp ", tp, ": the tensor-parallel size must be at least 1");
  SAT_CHECK(pp >= 1, "--pp ", pp, ": the number of pipeline stages must be at least 1");
  SAT_CHECK(cp >= 1, "--cp ", cp, ": the context-parallel size must be at least 1");
  const int64_t ranks = int64_t(tp) * pp * cp;
  SAT_CHECK(world % ranks == 0, "--tp ", tp, cp > 1 ? str_cat(" x --cp ", cp) : std::string(), " x --pp ", pp, " = ",
            ranks, " does not divide the ", world, plural(world, " process", " processes"),
            " of this job (expected a divisor of ", world, ")");
}

void Mesh::check(int world, int tp, int pp, int cp, int ep) {
  check(world, tp, pp, cp);
  SAT_CHECK(ep >= 1, "--ep ", ep, ": the expert-parallel size must be at least 1");
  const int dp = world / (tp * pp * cp);
  SAT_CHECK(dp % ep == 0, "--ep ", ep, " does not divide the ", dp, " data-parallel ", plural(dp, "rank", "ranks"),
            " of this job (", world, plural(world, " process", " processes"), " / (--tp ", tp,
            cp > 1 ? str_cat(" x --cp ", cp) : std::string(), " x --pp ", pp,
            ")): expert parallelism is carved from data parallelism, expected a divisor of ", dp);
}

Mesh::Mesh(Comm& world, int tp, int pp, int cp, int ep) : world_(&world), tp_(tp), pp_(pp), cp_(cp), ep_(ep) {
  check(world.size(), tp, pp, cp, ep);
  dp_ = world.size() / (tp * pp * cp);
  const MeshCoords at = mesh_coords(world.rank(), tp_, dp_, cp_);
  tp_rank_ = at.tp, dp_rank_ = at.dp, pp_rank_ = at.pp, cp_rank_ = at.cp;
  // One split per dimension: the ranks that share the other coordinates, ranked by their
  // coordinate in this one. Same order on every rank (each split is a collective).
  tp_group_ = group(world, tp_, cp_rank_ + cp_ * (dp_rank_ + dp_ * pp_rank_), tp_rank_);
  dp_group_ = group(world, dp_, tp_rank_ + tp_ * (cp_rank_ + cp_ * pp_rank_), dp_rank_);
  pp_group_ = group(world, pp_, tp_rank_ + tp_ * (cp_rank_ + cp_ * dp_rank_), pp_rank_);
  const bool end_stage = pp_rank_ == 0 || pp_rank_ == pp_ - 1;
  embedding_group_ = group(world, pp_ == 1 ? 1 : 2, end_stage ? tp_rank_ + tp_ * (cp_rank_ + cp_ * dp_rank_) : -1,
                           pp_rank_);
  if (cp_ > 1) {  // made only with context parallelism: a job without it splits as before
    cp_group_ = group(world, cp_, tp_rank_ + tp_ * (dp_rank_ + dp_ * pp_rank_), cp_rank_);
    dp_cp_group_ = group(world, dp_ * cp_, tp_rank_ + tp_ * pp_rank_, cp_rank_ + cp_ * dp_rank_);
    SAT_ASSERT(cp_group_->rank() == cp_rank_ && dp_cp_group_->rank() == cp_rank_ + cp_ * dp_rank_);
  }
  if (ep_ > 1) {  // made only with expert parallelism: consecutive dp ranks
    const int block = dp_rank_ / ep_, blocks = dp_ / ep_;
    ep_group_ = group(world, ep_, tp_rank_ + tp_ * (cp_rank_ + cp_ * (block + blocks * pp_rank_)), dp_rank_ % ep_);
    SAT_ASSERT(ep_group_->rank() == dp_rank_ % ep_);
    expert_dp_group_ = group(world, blocks * cp_, tp_rank_ + tp_ * (dp_rank_ % ep_ + ep_ * pp_rank_), cp_rank_ + cp_ * block);
  }
  SAT_ASSERT(tp_group_->rank() == tp_rank_ && dp_group_->rank() == dp_rank_ && pp_group_->rank() == pp_rank_);
}

int Mesh::global_rank(int tp_rank, int dp_rank, int pp_rank, int cp_rank) const {
  check_rank("Mesh::global_rank", "tp", tp_rank, tp_);
  check_rank("Mesh::global_rank", "dp", dp_rank, dp_);
  check_rank("Mesh::global_rank", "pp", pp_rank, pp_);
  check_rank("Mesh::global_rank", "cp", cp_rank, cp_);
  return mesh_rank({tp_rank, dp_rank, pp_rank, cp_rank}, tp_, dp_, cp_);
}

Traffic Mesh::traffic_of(const std::string& group) const {
  const Comm* c = group == "tp"          ? tp_group_.get()
                  : group == "dp"        ? dp_group_.get()
                  : group == "pp"        ? pp_group_.get()
                  : group == "embedding" ? embedding_group_.get()
                  : group == "cp"        ? cp_group_.get()
                  : group == "dp_cp"     ? dp_cp_group_.get()
                  : group == "ep"        ? ep_group_.get()
                  : group == "expert_dp" ? expert_dp_group_.get()
                                         : nullptr;
  SAT_CHECK(c || group == "embedding" || group == "cp" || group == "dp_cp" || group == "ep" || group == "expert_dp",
            "Mesh::traffic_of: no group '", group, "' (expected tp, dp, pp, embedding, cp, dp_cp, ep or expert_dp)");
  const Traffic* t = c ? c->traffic() : nullptr;
  return t ? *t : Traffic{};
}

std::string Mesh::describe() const {
  return str_cat(size(), plural(size(), " rank", " ranks"), " = dp ", dp_, " x tp ", tp_, " x pp ", pp_,
                 cp_ > 1 ? str_cat(" x cp ", cp_) : std::string(), ep_ > 1 ? str_cat(" (ep ", ep_, ")") : std::string(),
                 "; this rank: dp ", dp_rank_, ", tp ", tp_rank_, ", pp ", pp_rank_,
                 cp_ > 1 ? str_cat(", cp ", cp_rank_) : std::string(), ep_ > 1 ? str_cat(", ep ", ep_rank()) : std::string());
}

}  // namespace sat::dist
