#include "cli/info.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/support.h"
#include "core/alloc.h"
#include "core/error.h"
#include "data/dataset.h"
#include "plan/info_plan.h"
#include "plan/planner.h"
#include "train/plan.h"
#include "train/trainer.h"
#include "train/validate.h"

namespace sat::cli {

namespace {

// A rank's memory as live at its peak, by kind: the rows `saturate plan` prints (memory_rows),
// which sum to the total; then the step arena they include, and each transient kind summed
// over its buffers' lifetimes (MemoryPlan::by_kind), which share the arenas and are never all
// live at once: a sum that can exceed the total, said apart from the table.
void print_plan(const RankPlan& rp, int zero, DType lp) {
  const MemoryPlan& p = rp.memory;
  const std::vector<MemoryRow> rows = memory_rows(p, live_at_peak(rp.step), KindBytes{}, zero, lp);
  size_t width = 30;
  for (const MemoryRow& r : rows) width = std::max(width, r.name.size());
  auto line = [&](const std::string& name, size_t bytes, const std::string& note) {
    const std::string human = format_bytes(double(bytes));
    std::printf("  %-*s %12zu  %s%s\n", int(width), name.c_str(), bytes, human.c_str(),
                note.empty() ? "" : (std::string(human.size() < 10 ? 10 - human.size() : 0, ' ') + "  " + note).c_str());
  };
  for (const MemoryRow& r : rows) line(r.name, size_t(r.bytes), r.note);
  line("total", p.total(), "");
  line("step arena", p.transient, "included above: the rows live at the step's peak and its gaps");
  std::string sums;
  for (MemKind k : {MemKind::activations, MemKind::saved, MemKind::activation_grads, MemKind::scratch,
                    MemKind::gathered_params, MemKind::grad_buckets})
    if (p.by_kind[size_t(k)])
      sums += str_cat(sums.empty() ? "" : ", ", mem_kind_name(k), " ", format_bytes(double(p.by_kind[size_t(k)])));
  if (!sums.empty())
    std::printf("  buffers over the step, each kind summed over its lifetimes (never all live at once): %s\n",
                sums.c_str());
  if (rp.reads_data) std::printf("  loader: %s\n", rp.loader.describe().c_str());
}

// The bytes a rank moves over each group per optimizer step (predict_comm).
void print_comm(const RankPlan& rp, const TrainConfig& cfg, int dp) {
  const GroupBytes b = predict_comm(rp, cfg, dp);
  if (b.tp + b.dp + b.pp + b.embedding + b.cp == 0) return;
  std::printf("  %-30s tp %s, dp %s, pp %s, embedding %s%s\n", "communicated per step", format_bytes(b.tp).c_str(),
              format_bytes(b.dp).c_str(), format_bytes(b.pp).c_str(), format_bytes(b.embedding).c_str(),
              b.cp > 0 ? (", cp " + format_bytes(b.cp) + " (dp: over dp x cp)").c_str() : "");
}

// The whole model: its configuration, input, size and work.
void print_model(const JobPlan& job) {
  const ModelConfig& mc = job.model();
  const BuiltModel& m = job.unsplit();
  const Graph& g = *m.graph;
  const int64_t batch = job.config().batch;
  std::printf("model       %s\n", mc.name.c_str());
  std::printf("config      %s (%s)\n", model_spec(mc).c_str(), describe_model(mc).c_str());
  std::printf("input       %s %s per micro-batch of %lld\n", m.x_shape.str().c_str(), dtype_name(m.x_dtype),
              (long long)batch);
  std::printf("parameters  %lld (%zu tensors)\n", (long long)g.param_count(), g.params().size());
  std::printf("layers      %zu in %zu blocks\n", g.nodes().size(), g.block_starts().size());
  std::printf("FLOPs       %.4g per sample forward, %.4g per sample training step (forward + backward)\n",
              g.flops_forward() / double(batch), job.model_flops_per_sample());
}

// With --pp: every stage's part of the model and its plan (the plan its ranks train with).
void print_stages(JobPlan& job) {
  const TrainConfig& cfg = job.config();
  const char* m = v_shaped(cfg.pp_schedule)                   ? "6"
                  : cfg.virtual_stages > 1                     ? "V"
                  : cfg.pp_schedule == PipeSchedule::zb_h1 ? "3"
                                                               : "";
  std::printf("pipeline    %d stages, %s schedule%s, %lld micro-batches per step: bubble (P-1)/(%sM+P-1) = %.1f%%\n",
              cfg.pp, pipe_schedule_name(cfg.pp_schedule),
              cfg.virtual_stages > 1 ? (", " + std::to_string(cfg.virtual_stages) + " model chunks per stage").c_str() : "",
              (long long)cfg.accum, m, 100 * theoretical_bubble(cfg.schedule_spec()));
  for (int s = 0; s < cfg.pp; ++s) {
    const RankPlan& rp = job.stage(s);
    const Graph& g = *rp.model.graph;
    std::string blocks;
    for (int c = 0; c < cfg.virtual_stages; ++c) {
      const int k = piece_of(cfg.schedule_spec(), s, c);
      blocks += str_cat(c ? ", " : "", rp.split.cuts[size_t(k)], "-", rp.split.cuts[size_t(k) + 1] - 1);
    }
    std::printf("stage %d     blocks %s of %d: %zu layers, %lld parameters%s, %.4g FLOPs per sample; %d micro-batch(es) "
                "in flight\n", s, blocks.c_str(), rp.split.blocks, g.nodes().size(), (long long)g.param_count(),
                g.tied_copies().empty() ? "" : " (with a copy of the tied embedding)", rp.flops_per_sample,
                rp.memory.contexts);
    print_plan(rp, cfg.zero, job.model().act);
    print_comm(rp, cfg, job.dp());
  }
}

// The same plan keeping every activation (another model: a JobPlan of its own), and the
// FLOPs recomputation adds (whole model).
void print_recompute(JobPlan& job) {
  const TrainConfig& cfg = job.config();
  TrainConfig keep = cfg;
  keep.recompute = Recompute::none;
  ModelConfig kept = job.model();
  kept.recompute = Recompute::none;
  JobPlan none(kept, keep, job.train(), job.test(), job.dp());
  const MemoryPlan& p = job.stage(0).memory;
  const MemoryPlan& w = none.stage(0).memory;
  const double extra = recompute_flops(*job.unsplit().graph) / double(cfg.batch);
  const double step = job.model_flops_per_sample();
  std::printf("recompute %s: activations (step arena) %s (none: %s), total %s (none: %s)%s; recomputing adds %.4g "
              "FLOPs per sample, %.1f%% of the step's %.4g\n",
              recompute_name(cfg.recompute), format_bytes(double(p.transient)).c_str(),
              format_bytes(double(w.transient)).c_str(), format_bytes(double(p.total())).c_str(),
              format_bytes(double(w.total())).c_str(), cfg.pp > 1 ? " (stage 0)" : "", extra, 100.0 * extra / step,
              step);
}

// What the ZeRO stage saves against plain data parallelism, per rank (stage 0 of a pipeline).
void print_zero_saving(JobPlan& job) {
  const TrainConfig& cfg = job.config();
  TrainConfig plain = cfg;
  plain.zero = 0;
  const MemoryPlan w = job.memory_with(0, plain);
  const MemoryPlan& p = job.stage(0).memory;
  auto kind = [](const MemoryPlan& m, MemKind k) { return format_bytes(double(m.by_kind[size_t(k)])); };
  const double saved = double(w.total()) - double(p.total());
  std::printf("ZeRO-%d saves %s per rank (%.1f%% of %s): parameters %s (was %s), gradients %s (was %s), optimizer "
              "state %s (was %s)",
              cfg.zero, format_bytes(saved).c_str(), 100.0 * saved / double(w.total()),
              format_bytes(double(w.total())).c_str(), kind(p, MemKind::parameters).c_str(),
              kind(w, MemKind::parameters).c_str(), kind(p, MemKind::gradients).c_str(),
              kind(w, MemKind::gradients).c_str(), kind(p, MemKind::optimizer_state).c_str(),
              kind(w, MemKind::optimizer_state).c_str());
  if (p.by_kind[size_t(MemKind::lp_params)])
    std::printf(", low-precision parameters %s (was %s)", kind(p, MemKind::lp_params).c_str(),
                kind(w, MemKind::lp_params).c_str());
  if (cfg.zero >= 2)
    std::printf(", plus a staging arena of %s for gathered parameters and gradient buckets",
                format_bytes(double(p.staging)).c_str());
  std::printf("\n");
}

void print_memory(JobPlan& job, const RunArgs& a) {
  const TrainConfig& cfg = job.config();
  const int slots = optimizer_slots(resolve_optim(cfg.optim));
  const std::string zero_note =
      cfg.zero ? ", ZeRO-" + std::to_string(cfg.zero) + " over " + std::to_string(a.ranks) + " rank(s)" : "";
  const std::string slot_note = slots ? " with " + std::to_string(slots) + " state slot(s)" : "";
  std::printf("memory plan per rank%s (micro-batch %lld%s, optimizer %s%s%s%s), as live at its peak:\n",
              job.model().device == Device::cuda ? " on a GPU" : "", (long long)cfg.batch,
              cfg.accum > 1 ? (" x " + std::to_string(cfg.accum) + " accumulation").c_str() : "", a.optimizer.c_str(),
              slot_note.c_str(), zero_note.c_str(), cfg.precision == Precision::bf16 ? ", bf16 activations" : "");
  const RankPlan& first = job.stage(0);
  if (cfg.tp > 1)
    std::printf("tensor      %d-way%s: each rank%s holds %lld of the parameters (split ones 1/%d, the rest whole)\n",
                cfg.tp, cfg.sequence_parallel ? ", sequence parallel" : "", cfg.pp > 1 ? " of stage 0" : "",
                (long long)first.model.graph->param_count(), cfg.tp);
  if (cfg.pp > 1) {
    print_stages(job);
  } else {
    print_plan(first, cfg.zero, job.model().act);
    print_comm(first, cfg, job.dp());
  }
}

// info's flags as the plan: the layout, precision, optimizer and loaders of --device's engine.
InfoPlan info_plan(const RunArgs& a, const ModelConfig& mc) {
  const bool gpu = a.device == "cuda" || a.device.rfind("cuda:", 0) == 0;
  SAT_CHECK(gpu || a.device == "cpu" || a.device == "auto", "--device: expected cpu or cuda, got '", a.device, "'");
  TrainConfig cfg;  // the CPU engine's plan (the device's own support is the table below)
  cfg.precision = parse_precision(a.precision);
  static_cast<Layout&>(cfg) = layout_of(a, parse_batch(a.batch));
  cfg.optim.name = a.optimizer;
  cfg.optim.momentum = float(a.momentum);
  cfg.prefetch = a.prefetch;
  cfg.loader_workers = loader_workers_of(a, gpu, 1);
  return InfoPlan(mc, cfg, a.ranks, gpu);
}

}  // namespace

int run_info(const RunArgs& a) {
  InfoPlan p = info_plan(a, model_for(a));
  JobPlan& job = *p.job;
  const TrainConfig& cfg = job.config();
  print_model(job);
  print_memory(job, a);
  if (cfg.recompute != Recompute::none) print_recompute(job);
  if (cfg.zero) print_zero_saving(job);
  if (p.gpu) std::printf("\n%s", support_table().c_str());
  return 0;
}

}  // namespace sat::cli
