// InfoPlan and its JSON (plan/info_plan.h): `saturate info`'s plan, and what the library's
// saturate::info_json returns and Python's saturate.info parses.
#include "plan/info_plan.h"

#include <nlohmann/json.hpp>

#include "core/alloc.h"
#include "plan/planner.h"
#include "train/trainer.h"
#include "train/validate.h"

namespace sat {

namespace {

using ojson = nlohmann::ordered_json;

// The model as the plan is made for: on a GPU, the GPU engine's (its activations and GEMM
// inputs in the precision, the low-precision copy of the parameters, the library
// workspace); otherwise the CPU engine's.
ModelConfig planned_model(const ModelConfig& mc, const TrainConfig& cfg, bool gpu) {
  ModelConfig m = resolved_model(mc, cfg);
  if (gpu) m.device = Device::cuda, m.act = activation_dtype(cfg.precision, Device::cuda);
  return m;
}

// One rank's plan: the rows as live at its peak (they sum to total_bytes), the step arena
// they include, each kind's bytes, and what the rank communicates per optimizer step.
ojson rank_json(const RankPlan& rp, const TrainConfig& cfg, int dp, DType lp) {
  const MemoryPlan& p = rp.memory;
  ojson rows = ojson::array();
  for (const MemoryRow& r : memory_rows(p, live_at_peak(rp.step), KindBytes{}, cfg.zero, lp))
    rows.push_back({{"name", r.name}, {"bytes", int64_t(r.bytes)}, {"note", r.note}});
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
  if (b.cp > 0) j["communicated_per_step"]["cp"] = b.cp;  // --cp: the ring's
  if (rp.reads_data) j["loader"] = rp.loader.describe();
  return j;
}

}  // namespace

InfoPlan::InfoPlan(const ModelConfig& model, const TrainConfig& cfg, int ranks_, bool gpu_) : gpu(gpu_), ranks(ranks_) {
  validate_run(model, cfg, ranks * cfg.pp * cfg.tp * cfg.cp);
  (void)resolve_optim(cfg.optim);  // (the optimizer's name, before anything is printed)
  // The plan of `saturate train` on data of the model's default shape (its shapes only:
  // planning generates and allocates no data): loader rings included.
  data = synthetic_shapes(data_options_for(model, 0));
  job = std::make_unique<JobPlan>(planned_model(model, cfg, gpu), cfg, *data.train, data.test.get(), ranks);
}

std::string info_json(InfoPlan& p) {
  JobPlan& job = *p.job;
  const TrainConfig& cfg = job.config();
  const ModelConfig& mc = job.model();
  const Graph& g = *job.unsplit().graph;
  ojson j{{"model", mc.name},
          {"config", model_spec(mc)},
          {"description", describe_model(mc)},
          {"input_shape", job.unsplit().x_shape.vec()},
          {"input_dtype", dtype_name(job.unsplit().x_dtype)},
          {"parameters", g.param_count()},
          {"parameter_tensors", g.params().size()},
          {"layers", g.nodes().size()},
          {"blocks", g.block_starts().size()},
          {"flops_forward_per_sample", g.flops_forward() / double(cfg.batch)},
          {"flops_per_sample", job.model_flops_per_sample()},
          {"device", p.gpu ? "cuda" : "cpu"},
          {"micro_batch", cfg.batch},
          {"accum", cfg.accum},
          {"ranks", p.ranks},
          {"dp", job.dp()},
          {"tp", cfg.tp},
          {"pp", cfg.pp},
          {"zero", cfg.zero},
          {"recompute", recompute_name(cfg.recompute)},
          {"precision", precision_name(cfg.precision)},
          {"optimizer", cfg.optim.name}};
  ojson stages = ojson::array();
  for (int s = 0; s < cfg.pp; ++s) stages.push_back(rank_json(job.stage(s), cfg, job.dp(), mc.act));
  j["memory"] = stages[0]["memory"];  // stage 0's (the whole model's without --pp)
  j["total_bytes"] = stages[0]["total_bytes"];
  j["step_arena_bytes"] = stages[0]["step_arena_bytes"];
  j["stages"] = stages;
  return j.dump(1) + "\n";
}

}  // namespace sat
