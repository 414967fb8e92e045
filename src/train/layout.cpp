#include "train/layout.h"

#include "core/error.h"
#include "core/text.h"

namespace sat {

Layout Layout::with_world(int world) const {
  dist::Mesh::check(world, tp, pp, cp, ep);
  Layout l = *this;
  l.dp = world / (tp * pp * cp);
  SAT_CHECK(dp == 0 || dp == l.dp, "dp=", dp, " x --tp ", tp, cp > 1 ? str_cat(" x --cp ", cp) : std::string(),
            " x --pp ", pp, " = ", int64_t(dp) * tp * pp * cp, " ranks, but the job has ", world);
  return l;
}

void Layout::check(int world) const {
  SAT_CHECK(batch >= 1, "--batch: expected a positive micro-batch size, got ", batch);
  SAT_CHECK(accum >= 1, "--accum: expected a positive number of micro-batches, got ", accum);
  SAT_CHECK(tp >= 1, "--tp: expected a positive tensor-parallel size, got ", tp);
  SAT_CHECK(pp >= 1, "--pp: expected a positive number of pipeline stages, got ", pp);
  SAT_CHECK(cp >= 1, "--cp: expected a positive context-parallel size, got ", cp);
  SAT_CHECK(ep >= 1, "--ep: expected a positive expert-parallel size, got ", ep);
  SAT_CHECK(zero >= 0 && zero <= 3, "--zero: expected a ZeRO stage 0, 1, 2 or 3, got ", zero);
  const Layout l = with_world(world);
  SAT_CHECK(pp > 1 || pp_split.empty(), "--pp-split needs --pp 2 or more (it names the cuts between stages)");
  check_schedule(schedule_spec());
  SAT_CHECK(zero < 2 || l.dp > 1, "--zero ", zero, " shards the model over the data-parallel ranks, and this job has "
            "one (", world, " rank(s), --tp ", tp, " --pp ", pp, "): run more ranks or leave --zero out");
  (void)l.global_batch(world);
}

int64_t Layout::global_batch(int world) const {
  const int64_t d = std::max(1, dp_of(world));
  int64_t g = 0;
  const bool overflow = __builtin_mul_overflow(batch, accum, &g) || __builtin_mul_overflow(g, d, &g);
  SAT_CHECK(!overflow && g <= (int64_t(1) << 40), "--batch ", batch, " x --accum ", accum, " x ", d,
            " data-parallel rank(s): more than 2^40 samples per optimizer step");
  return g;
}

ScheduleSpec Layout::schedule_spec() const { return {pp_schedule, pp, int(accum), virtual_stages}; }

std::string Layout::str() const {
  std::string s = str_cat("dp=", dp, ",tp=", tp, ",pp=", pp, ",micro=", batch, ",schedule=",
                          pp == 1 ? "none" : pipe_schedule_name(pp_schedule));
  if (pp_schedule == PipeSchedule::interleaved) s += str_cat(",v=", virtual_stages);
  return s + str_cat(",recompute=", recompute_name(recompute), ",sp=", sequence_parallel ? "on" : "off",
                     ",zero=", zero, cp > 1 ? str_cat(",cp=", cp) : std::string(),
                     ep > 1 ? str_cat(",ep=", ep) : std::string());
}

}  // namespace sat
