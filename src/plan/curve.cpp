#include "plan/curve.h"

#include "plan/planner.h"

namespace sat {

std::function<double(int64_t)> throughput_curve(const ModelConfig& mc, const TrainConfig& cfg, int ranks,
                                                const Hardware& hw, int64_t global_batch) {
  PlanRequest r;
  r.model = mc;
  r.hw = hw;
  r.gpus = ranks;
  r.gpus_per_node = ranks;
  r.precision = hw.gpu ? DType::bf16 : DType::f32;
  r.optimizer = cfg.optim.name;
  r.top = 1;
  r.exact_memory = false;
  r.memory_limit = 1e30;  // the tuner prunes by its own budget
  const int dp = cfg.dp_of(ranks);
  r.filter.dp = dp, r.filter.tp = cfg.tp, r.filter.pp = cfg.pp;
  r.filter.schedule = cfg.pp_schedule, r.filter.recompute = cfg.recompute, r.filter.sp = cfg.sequence_parallel;
  r.filter.zero = cfg.zero;
  if (cfg.pp_schedule == PipeSchedule::interleaved) r.filter.v = cfg.virtual_stages;
  return [r, dp, global_batch](int64_t b) {
    PlanRequest q = r;
    q.filter.micro = b;
    q.global_batch = global_batch > 0 ? global_batch : b * dp;
    if (q.global_batch % (b * dp)) return 0.0;
    try {
      const PlanResult p = plan_layouts(q);
      return p.best.empty() ? 0.0 : p.best[0].samples_per_second;
    } catch (const Error&) {
      return 0.0;  // a micro-batch the layout cannot take (the tuner skips it)
    }
  };
}

}  // namespace sat
