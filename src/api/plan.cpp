// plan_json and info_json (include/saturate/plan.h): `saturate plan --json` and `saturate
// info` for a library Model, through the commands' own request builders.
#include "saturate/plan.h"

#include <thread>

#include "api/impl.h"
#include "backend/cpu/blas.h"
#include "data/loader.h"
#include "plan/info_plan.h"
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
    SAT_CHECK(o.device == "cpu" || o.device == "cuda", "device: expected cpu or cuda, got '", o.device, "'");
    const bool gpu = o.device == "cuda";
    sat::TrainConfig cfg;  // as saturate info builds it from its flags (cli/info.cpp)
    cfg.precision = sat::parse_precision(o.precision);
    cfg.batch = o.batch, cfg.accum = o.accum, cfg.tp = o.tp, cfg.pp = o.pp, cfg.zero = o.zero;
    cfg.recompute = sat::parse_recompute(o.recompute, "recompute");
    cfg.optim.name = o.optimizer;
    cfg.loader_workers = sat::auto_loader_workers(int(std::thread::hardware_concurrency()), 1,
                                                  gpu ? 1 : sat::cpu::num_threads());
    sat::InfoPlan p(model.impl()->config, cfg, o.ranks, gpu);
    return sat::info_json(p);
  });
}

}  // namespace saturate
