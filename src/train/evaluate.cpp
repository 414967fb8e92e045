#include "train/evaluate.h"

#include <algorithm>
#include <cmath>

#include "train/runtime.h"

namespace sat {

namespace {

// Sums over this rank's shard of the test split: loss * valid rows, valid rows, correct,
// counted, samples.
struct EvalSums {
  double v[5] = {0, 0, 0, 0, 0};
};

// One batch as the stage with the loss computed it: its loss, and (for classifiers, or a
// sink) its logits.
void count_batch(RankRuntime& rt, const Batch& b, double loss, int64_t first, const EvalSink& sink, EvalSums& s) {
  const bool classify = !rt.mc.tokens;
  const int32_t* y = b.y.i32();
  const int64_t rows = b.y.numel();
  int64_t valid = 0;
  for (int64_t k = 0; k < rows; ++k) valid += y[k] >= 0;
  if (valid > 0) s.v[0] += loss * double(valid);
  s.v[1] += double(valid);
  s.v[4] += double(b.valid);
  if (!sink && (!classify || valid == 0)) return;
  const int logits = rt.plan->model.logits;
  std::vector<float> host = rt.engine->read_f32(0, logits);
  const int64_t C = rt.engine->value(0, logits).shape[-1];
  if (sink) sink(EvalBatch{b, first, host.data(), C});
  if (!classify) return;
  for (int64_t k = 0; k < rows; ++k) {
    if (y[k] < 0) continue;
    const float* l = host.data() + k * C;
    s.v[2] += double(std::max_element(l, l + C) - l) == double(y[k]);
    s.v[3] += 1;
  }
}

EvalResult evaluate_split(RankRuntime& rt, const Dataset& data, BatchLoader* loader, const EvalSink& sink) {
  const dist::Mesh& m = *rt.mesh;
  SAT_CHECK(!sink || m.dp() * m.cp() == 1, "internal error: predictions of a data-parallel rank's shard");
  const Graph& g = *rt.plan->model.graph;
  ScheduleSpec one = rt.cfg.schedule_spec();
  one.micro = 1;
  const std::vector<std::vector<int>> ctx0(g.chunks().size(), std::vector<int>{0});
  Executor exec(*rt.engine, make_forward_schedule(one, m.pp_rank()), ctx0, rt.groups.pp, false);
  OneBatchFeed feed(g, rt.plan->model.x);
  if (m.cp() > 1) feed.set_cut(std::make_unique<ContextCut>(m.cp(), m.cp_rank(), 1));
  StepParts parts;
  parts.data = &feed;
  EvalSums s;
  const int64_t batches = BatchLoader::eval_batches(data.size(), rt.cfg.batch, m.dp());
  if (loader) loader->start_epoch(0);
  Batch b;
  for (int64_t i = 0; i < batches; ++i) {
    if (loader) SAT_CHECK(loader->next(b), "internal error: the test loader ended early");
    feed.set(&b);
    const StepStats st = exec.run_step([](int) { return uint64_t(0); }, parts);
    if (st.losses > 0) count_batch(rt, b, double(float(st.loss_sum)), i * rt.cfg.batch, sink, s);
  }
  // --cp: each cp rank's sums are its tokens' of the same samples (the same count on each).
  if (g.loss() >= 0 && m.cp() > 1) m.cp_group()->all_reduce_sync(s.v, 5, DType::f64, dist::ReduceOp::avg);
  if (g.loss() >= 0 && m.dp() > 1) m.dp_group().all_reduce_sync(s.v, 5, DType::f64, dist::ReduceOp::sum);
  if (m.pp() > 1) m.pp_group().broadcast_sync(s.v, 5, DType::f64, loss_stage(rt.cfg.schedule_spec()));
  EvalResult e;
  e.samples = int64_t(s.v[4]);
  e.loss = s.v[1] > 0 ? s.v[0] / s.v[1] : NAN;
  if (!rt.mc.tokens) e.accuracy = s.v[3] > 0 ? s.v[2] / s.v[3] : NAN;
  return e;
}

}  // namespace

EvalResult evaluate(RankRuntime& rt, const EvalSink& sink) {
  SAT_CHECK(rt.test, "internal error: no test split to evaluate");
  return evaluate_split(rt, *rt.test, rt.test_loader.get(), sink);
}

EvalResult evaluate(RankRuntime& rt, const Dataset& data, BatchLoader* loader) {
  return evaluate_split(rt, data, loader, {});
}

}  // namespace sat
