// The memory tables of `saturate plan` and `saturate info`: a rank's exact plan
// (train/plan.h) as the bytes live at its peak, by kind. The plan's transient kinds
// (MemoryPlan::by_kind) sum every buffer whenever it lives: activations, scratch or gathered
// units summed that way can exceed the device many times over. Here each arena is split by
// what it holds at its own peak, and what its packing leaves unused is a row of its own, so
// the rows add up to the total.
#include <algorithm>

#include "core/error.h"
#include "plan/planner.h"

namespace sat {

namespace {

const char* sharded(int zero, int from) { return zero >= from ? ", this rank's 1/dp shard" : ", whole"; }

}  // namespace

std::vector<MemoryRow> memory_rows(const MemoryPlan& m, const KindBytes& arena_peak, const KindBytes& staging_peak,
                                   int zero, DType lp) {
  std::vector<MemoryRow> rows;
  auto kind = [&](MemKind k) { return double(m.by_kind[size_t(k)]); };
  auto add = [&](std::string name, std::string note, double bytes) {
    if (bytes > 0) rows.push_back({note.empty() ? name : str_cat(name, " (", note, ")"), bytes, name, note});
  };
  // The fp32 parameters are a master only beside a low-precision copy.
  const char* params = kind(MemKind::lp_params) > 0 ? "fp32 master" : "fp32";
  add("parameters", str_cat(params, sharded(zero, 3)), kind(MemKind::parameters));
  add("gradients", str_cat("fp32", sharded(zero, 2)), kind(MemKind::gradients));
  add("optimizer state", str_cat("fp32", sharded(zero, 1)), kind(MemKind::optimizer_state));
  add(mem_kind_name(MemKind::model_state), "", kind(MemKind::model_state));
  add("low-precision parameters", str_cat(dtype_name(lp), sharded(zero, 3)), kind(MemKind::lp_params));
  add(mem_kind_name(MemKind::workspace), "", kind(MemKind::workspace));
  // The step arena: its kinds at its peak, then what the packing leaves between them.
  double at_peak = 0;
  for (size_t k = 0; k < arena_peak.size(); ++k) {
    add(mem_kind_name(MemKind(k)), "live at the step's peak", double(arena_peak[k]));
    at_peak += double(arena_peak[k]);
  }
  add("step arena: gaps its packing leaves", "", double(m.transient) - at_peak);
  // ZeRO-2/3's staging arena: its units in flight at its peak when the plan gives them.
  const double gathered = double(staging_peak[size_t(MemKind::gathered_params)]);
  const double buckets = double(staging_peak[size_t(MemKind::grad_buckets)]);
  if (gathered + buckets > 0 && gathered + buckets <= double(m.staging)) {
    add("gathered units in flight", "ZeRO-3", gathered);
    add("gradient buckets in flight", "fp32, ZeRO-2/3", buckets);
    add("staging arena: gaps its packing leaves", "", double(m.staging) - gathered - buckets);
  } else {
    add("ZeRO staging arena", zero >= 3 ? "gathered units and gradient buckets in flight" : "gradient buckets in flight",
        double(m.staging));
  }
  add(mem_kind_name(MemKind::inputs), "", double(m.inputs));
  return rows;
}

}  // namespace sat
