// plan_json and info_json (include/saturate/plan.h): `saturate plan --json` and `saturate
// info` for a library Model, through the commands' own request builders.
#include "saturate/plan.h"

#include "api/impl.h"
#include "cli/info.h"
#include "plan/plan_cli.h"
#include "plan/planner.h"

namespace saturate {

std::string plan_json(const Model& model, const PlanOptions& o) {
  return guarded([&] {
    sat::PlanArgs a;
    a.model = model.impl()->spec.empty() ? model.name() : model.impl()->spec;
    a.gpu = o.gpu;
    a.gpus = o.gpus;
    a.gpus_per_node = o.gpus_per_node;
    a.global_batch = o.global_batch;
    a.precision = o.precision;
    a.optimizer = o.optimizer;
    a.layout = o.layout;
    a.memory_budget = o.memory_budget;
    a.top = o.top;
    a.runnable_only = o.runnable_only;
    a.engine = o.engine;
    SAT_CHECK(o.top >= 1, "top: expected 1 or more layouts, got ", o.top);
    sat::check_plan_args(a);
    const sat::PlanRequest r = sat::plan_request(a, model.impl()->config, nullptr);
    return sat::plan_json(sat::plan_layouts(r), r);
  });
}

std::string info_json(const Model& model, const InfoOptions& o) {
  return guarded([&] {
    SAT_CHECK(o.batch >= 1, "batch: expected a micro-batch of 1 or more, got ", o.batch);
    SAT_CHECK(o.accum >= 1, "accum: expected 1 or more, got ", o.accum);
    SAT_CHECK(o.ranks >= 1 && o.tp >= 1 && o.pp >= 1, "ranks, tp, pp: expected 1 or more, got ", o.ranks, ", ",
              o.tp, ", ", o.pp);
    sat::cli::RunArgs a;
    a.model = model.name();
    a.batch = std::to_string(o.batch);
    a.accum = o.accum;
    a.ranks = o.ranks;
    a.tp = o.tp;
    a.pp = o.pp;
    a.zero = o.zero;
    a.recompute = o.recompute;
    a.precision = o.precision;
    a.optimizer = o.optimizer;
    a.device = o.device;
    return sat::cli::info_json(a, model.impl()->config);
  });
}

}  // namespace saturate
