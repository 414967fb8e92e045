// `saturate info`'s plan as JSON (cli/info.h): what the library's saturate::info_json returns
// and Python's saturate.info parses.
#include <nlohmann/json.hpp>

#include "cli/info.h"
#include "core/alloc.h"
#include "plan/planner.h"
#include "train/validate.h"

namespace sat::cli {

namespace {

using ojson = nlohmann::ordered_json;

// One rank's plan: the rows as live at its peak (they sum to total_bytes), the step arena
// they include, each kind's bytes, and what the rank communicates per optimizer step.
ojson rank_json(const RankPlan& rp, const TrainConfig& cfg, int dp, DType lp) {
  const MemoryPlan& p = rp.memory;
  ojson rows = ojson::array();
  for (const MemoryRow& r : memory_rows(p, live_at_peak(rp.step), KindBytes{}, cfg.zero, lp))
    rows.push_back({{"name", r.name}, {"bytes", r.bytes}, {"note", r.note}});
  ojson kinds = ojson::object();
  for (int i = 0; i < int(MemKind::kCount); ++i)
    if (p.by_kind[size_t(i)]) kinds[mem_kind_name(MemKind(i))] = p.by_kind[size_t(i)];
  const GroupBytes b = predict_comm(rp, cfg, dp);
  ojson j{{"parameters", rp.model.graph->param_count()},
          {"layers", rp.model.graph->nodes().size()},
          {"flops_per_sample", rp.flops_per_sample},
          {"micro_batches_in_flight", p.contexts},
          {"memory", rows},
          {"total_bytes", p.total()},
          {"step_arena_bytes", p.transient},
          {"memory_by_kind", kinds},
          {"communicated_per_step", {{"tp", b.tp}, {"dp", b.dp}, {"pp", b.pp}, {"embedding", b.embedding}}}};
  if (rp.reads_data) j["loader"] = rp.loader.describe();
  return j;
}

}  // namespace

std::string info_json(const RunArgs& a, const ModelConfig& model) {
  InfoPlan p(a, model);
  JobPlan& job = *p.job;
  const TrainConfig& cfg = job.config();
  const ModelConfig& mc = job.model();
  const BuiltModel& m = job.unsplit();
  const Graph& g = *m.graph;
  ojson j{{"model", mc.name},
          {"config", model_spec(mc)},
          {"description", describe_model(mc)},
          {"input_shape", m.x_shape.vec()},
          {"input_dtype", dtype_name(m.x_dtype)},
          {"parameters", g.param_count()},
          {"parameter_tensors", g.params().size()},
          {"layers", g.nodes().size()},
          {"blocks", g.block_starts().size()},
          {"flops_forward_per_sample", g.flops_forward() / double(cfg.batch)},
          {"flops_per_sample", job.model_flops_per_sample()},
          {"device", p.gpu ? "cuda" : "cpu"},
          {"micro_batch", cfg.batch},
          {"accum", cfg.accum},
          {"ranks", a.ranks},
          {"dp", job.dp()},
          {"tp", cfg.tp},
          {"pp", cfg.pp},
          {"zero", cfg.zero},
          {"recompute", recompute_name(cfg.recompute)},
          {"precision", a.precision},
          {"optimizer", a.optimizer}};
  ojson stages = ojson::array();
  for (int s = 0; s < cfg.pp; ++s) stages.push_back(rank_json(job.stage(s), cfg, job.dp(), mc.act));
  j["memory"] = stages[0]["memory"];  // stage 0's (the whole model's without --pp)
  j["total_bytes"] = stages[0]["total_bytes"];
  j["step_arena_bytes"] = stages[0]["step_arena_bytes"];
  j["stages"] = stages;
  return j.dump(1) + "\n";
}

}  // namespace sat::cli
