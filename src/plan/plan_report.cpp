// What `saturate plan` prints and writes: the table of the best layouts and plan.json
// (plan.html is plan_html.cpp's).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/alloc.h"
#include "core/text.h"
#include "plan/plan_command.h"
#include "plan/planner.h"
#include "train/validate.h"

namespace sat {
namespace {

using ojson = nlohmann::ordered_json;

ojson num(double v) { return std::isfinite(v) ? ojson(v) : ojson(nullptr); }

const char* schedule_of(const Layout& l) { return l.pp == 1 ? "none" : pipe_schedule_name(l.pp_schedule); }

ojson layout_json(const Prediction& p, const PlanRequest& r) {
  const Layout& l = p.layout;
  const std::vector<std::string> refused = refusals(l, plan_device(r), &r.model);
  ojson j;
  j["dp"] = l.dp, j["tp"] = l.tp, j["pp"] = l.pp, j["cp"] = l.cp, j["ep"] = l.ep;
  j["micro_batch"] = l.batch, j["accum"] = l.accum;
  j["schedule"] = schedule_of(l), j["virtual_stages"] = l.virtual_stages;
  j["recompute"] = recompute_name(l.recompute), j["sequence_parallel"] = l.sequence_parallel, j["zero"] = l.zero;
  j["layout"] = l.str();
  j["command"] = train_command(l, r);
  j["runnable"] = refused.empty(), j["refusals"] = refused;
  j["memory_bytes_per_gpu"] = num(p.memory_bytes);
  j["memory_exact"] = p.memory_exact, j["memory_stage"] = p.memory_stage, j["fits"] = p.fits;
  j["step_seconds"] = num(p.step_seconds);
  j["tokens_per_second"] = num(p.tokens_per_second), j["samples_per_second"] = num(p.samples_per_second);
  j["tflops_per_gpu"] = num(p.tflops_per_gpu), j["mfu"] = num(p.mfu), j["bubble_fraction"] = num(p.bubble_fraction);
  j["cp_comm_seconds"] = num(p.cp_comm_seconds), j["ep_comm_seconds"] = num(p.ep_comm_seconds);
  j["compute_seconds"] = num(p.compute_seconds), j["tp_comm_seconds"] = num(p.tp_comm_seconds);
  j["pp_comm_seconds"] = num(p.pp_comm_seconds), j["dp_exposed_seconds"] = num(p.dp_exposed_seconds);
  j["optimizer_seconds"] = num(p.optimizer_seconds);
  ojson peak = ojson::object();
  for (const MemoryRow& m : p.memory_rows) peak[m.what] = m.bytes;
  if (!p.memory_rows.empty()) j["memory_at_peak"] = peak;
  j["memory_model"] = p.memory_exact ? "exact plan" : p.memory_formula ? "published formulas" : "estimate";
  if (p.memory_exact) {
    ojson k = ojson::object();
    for (int i = 0; i < int(MemKind::kCount); ++i)
      if (p.memory.by_kind[size_t(i)]) k[mem_kind_name(MemKind(i))] = p.memory.by_kind[size_t(i)];
    j["memory_by_kind"] = k;
    j["step_arena_bytes"] = p.memory.transient;
  }
  return j;
}

// A row of the table; `!` after the number marks a layout `saturate train` refuses on the device.
std::string row(int i, const Prediction& p, bool tokens, bool refused) {
  const Layout& l = p.layout;
  std::string sched = l.pp == 1 ? "-" : l.pp_schedule == PipeSchedule::interleaved ? strf("interleaved v=%d", l.virtual_stages)
                                                                                 : schedule_of(l);
  if (l.cp > 1) sched += strf(" cp=%d", l.cp);
  if (l.ep > 1) sched += strf(" ep=%d", l.ep);
  return strf("%2d%c dp %-4d tp %-2d pp %-3d %-16s %-9s sp %-3s zero %d  %4lld x %-5lld %10s%s %10.4g %12.4g %8.1f %5.1f%% %5.1f%%\n",
             i, refused ? '!' : ' ', l.dp, l.tp, l.pp, sched.c_str(), recompute_name(l.recompute), l.sequence_parallel ? "on" : "off", l.zero,
             (long long)l.batch, (long long)l.accum, format_bytes(p.memory_bytes).c_str(),
             p.memory_exact || p.memory_formula ? " " : "~", p.step_seconds, tokens ? p.tokens_per_second : p.samples_per_second,
             p.tflops_per_gpu, 100 * p.mfu, 100 * p.bubble_fraction);
}

// The rank's memory by kind, as live at its peak (the rows sum to the total).
std::string memory_table(const Prediction& p) {
  std::string s = p.memory_exact     ? strf("  memory of pipeline stage %d (the most of any rank), exact plan, by kind as live "
                                            "at its peak:\n", p.memory_stage)
                   : p.memory_formula ? strf("  memory of pipeline stage %d (the most of any rank), by the published formulas "
                                            "(docs/planning.md), term by term at the step's peak:\n", p.memory_stage)
                                      : strf("  memory of pipeline stage %d (the most of any rank), estimate, by kind:\n",
                                            p.memory_stage);
  for (const MemoryRow& m : p.memory_rows) s += strf("    %-66s %10s\n", m.what.c_str(), format_bytes(m.bytes).c_str());
  s += strf("    %-66s %10s\n", "total", format_bytes(p.memory_bytes).c_str());
  return s;
}

// What `saturate train` refuses on the planned device today (backend/support.h), under the
// table: one line per refusal, with the rows it marks.
std::string refusal_notes(const PlanResult& p, const PlanRequest& r) {
  std::vector<std::pair<std::string, std::string>> notes;  // refusal, rows
  for (size_t i = 0; i < p.best.size(); ++i)
    for (const std::string& why : refusals(p.best[i].layout, plan_device(r), &r.model)) {
      auto it = std::find_if(notes.begin(), notes.end(), [&](const auto& n) { return n.first == why; });
      if (it == notes.end()) it = notes.insert(notes.end(), {why, ""});
      it->second += strf("%s#%zu", it->second.empty() ? "" : ", ", i + 1);
    }
  std::string s;
  for (const auto& [why, rows] : notes)
    s += strf(" ! saturate train refuses %s on %s today: %s\n", rows.c_str(), device_kind_name(plan_device(r)),
              why.c_str());
  return s;
}

// The command to run: the best layout's, or when `saturate train` refuses it on the device,
// the fastest of the table that it runs, said as such.
std::string run_line(const PlanResult& p, const PlanRequest& r) {
  const Device d = plan_device(r);
  size_t i = 0;
  while (i < p.best.size() && (!p.best[i].fits || !refusals(p.best[i].layout, d, &r.model).empty())) ++i;
  if (i == 0) return strf("run: %s\n", train_command(p.best[0].layout, r).c_str());
  if (i == p.best.size())
    return strf("! saturate train refuses every layout above on %s today (see ! above); plan --runnable-only searches "
                "only the layouts it runs\n", device_kind_name(d));
  return strf("! saturate train refuses it on %s today (see ! above); the fastest layout it runs is #%zu (%s), %.1f%% "
              "slower:\nrun: %s\n", device_kind_name(d), i + 1, p.best[i].layout.str().c_str(),
              100 * (p.best[i].step_seconds / p.best[0].step_seconds - 1), train_command(p.best[i].layout, r).c_str());
}

}  // namespace

std::string plan_text(const PlanResult& p, const PlanRequest& r) {
  const bool tokens = p.tokens_per_sample > 0;
  std::string s = strf("model    %s: %.4g parameters, %.4g FLOPs per sample (forward + backward)\n", r.model.name.c_str(),
                      p.model_parameters, p.model_flops_per_sample);
  s += strf("devices  %d x %s (%d per node; %s of memory each, %.4g TFLOP/s peak %s), global batch %lld\n", r.gpus,
           r.hw.name.c_str(), r.gpus_per_node, format_bytes(r.memory_limit > 0 ? r.memory_limit : r.hw.memory_bytes).c_str(),
           r.hw.peak(r.hw.gpu ? r.precision : DType::f32) / 1e12, r.hw.gpu ? dtype_name(r.precision) : "f32",
           (long long)r.global_batch);
  s += strf("engine   %s: %s\n", r.engine.name.c_str(), r.engine.description.c_str());
  s += strf("searched %lld layouts in %.2f s: ", (long long)p.layouts, p.seconds);
  if (r.runnable_only)
    s += strf("%lld that saturate train refuses on %s today (--runnable-only), ", (long long)p.not_runnable,
              device_kind_name(plan_device(r)));
  if (p.uncut > 0)
    s += strf("%lld whose pipeline cuts a skip connection would cross twice (saturate train refuses them), ",
              (long long)p.uncut);
  s += strf("%lld over the memory, %lld slower than the best by a lower bound, %zu simulated\n",
            (long long)p.over_memory, (long long)p.slower, p.considered.size());
  if (p.best.empty() || !p.best[0].fits) {
    const Prediction* m = p.smallest ? &*p.smallest : nullptr;
    s += "no layout fits";
    if (m)
      s += strf(": the smallest needs %s per device (%s, %s); more devices, a smaller micro-batch or global batch, "
               "recomputation or a higher ZeRO stage would be needed",
               format_bytes(m->memory_bytes).c_str(), m->layout.str().c_str(),
               m->memory_exact ? "exact plan" : m->memory_formula ? "formula" : "estimate");
    s += "\n";
    if (m && !m->memory_rows.empty() && p.best.empty()) s += memory_table(*m);  // (else the best's follows)
    if (p.best.empty()) return s;
  }
  s += strf("\n #  layout                                                          micro x accum  memory/GPU  step (s) %12s TFLOP/s/GPU   MFU  bubble\n",
           tokens ? "tokens/s" : "samples/s");
  for (size_t i = 0; i < p.best.size(); ++i)
    s += row(int(i) + 1, p.best[i], tokens, !refusals(p.best[i].layout, plan_device(r), &r.model).empty());
  s += refusal_notes(p, r);
  for (size_t i = 0; i < p.best.size(); ++i) s += strf(" #%zu: %s\n", i + 1, train_command(p.best[i].layout, r).c_str());
  const Prediction& b = p.best[0];
  s += strf("\nbest: %s (%s)\n", b.layout.str().c_str(), p.why.c_str());
  if (b.fits) s += run_line(p, r);
  if (b.fits && r.engine.kind != EngineKind::saturate)
    s += strf("  (the command runs saturate's own engine, whose memory is its exact plan: --engine saturate plans it; "
              "the memory above is %s's)\n", r.engine.name.c_str());
  s += strf("  step %.4g s = compute %.4g s on the busiest stage (tensor-parallel collectives %.3g s) + bubble %.1f%% + "
           "exposed data-parallel %.3g s + optimizer %.3g s\n",
           b.step_seconds, b.compute_seconds, b.tp_comm_seconds, 100 * b.bubble_fraction, b.dp_exposed_seconds,
           b.optimizer_seconds);
  if (!b.memory_rows.empty()) s += memory_table(b);
  return s;
}

std::string plan_json(const PlanResult& p, const PlanRequest& r) {
  ojson j;
  j["model"] = r.model.name;
  j["gpu"] = r.hw.name, j["gpus"] = r.gpus, j["gpus_per_node"] = r.gpus_per_node;
  j["global_batch"] = r.global_batch, j["precision"] = r.hw.gpu ? dtype_name(r.precision) : "f32";
  j["memory_limit_bytes"] = r.memory_limit > 0 ? r.memory_limit : r.hw.memory_bytes;
  j["model_parameters"] = p.model_parameters, j["model_flops_per_sample"] = p.model_flops_per_sample;
  j["layouts_searched"] = p.layouts, j["over_memory"] = p.over_memory, j["slower_by_bound"] = p.slower, j["search_seconds"] = p.seconds;
  j["why"] = p.why;
  j["engine"] = r.engine.name;
  j["runnable_only"] = r.runnable_only, j["not_runnable"] = p.not_runnable, j["uncut"] = p.uncut;
  // The command of the fastest layout that fits and that `saturate train` runs on the device.
  j["run"] = nullptr;
  for (const Prediction& x : p.best)
    if (x.fits && refusals(x.layout, plan_device(r), &r.model).empty()) {
      j["run"] = train_command(x.layout, r);
      break;
    }
  j["best"] = p.best.empty() ? ojson(nullptr) : layout_json(p.best[0], r);
  ojson all = ojson::array();
  for (const Prediction& x : p.best) all.push_back(layout_json(x, r));
  j["layouts"] = all;
  if (p.smallest) j["smallest"] = layout_json(*p.smallest, r);
  return j.dump(1) + "\n";
}

}  // namespace sat
