// What `--layout auto` prints and writes: the table of the layouts measured (the planner's
// prediction beside the measurement), tune.json (`layouts`, `layout_choice`) and a
// self-contained tune.html (inline SVG bars; no scripts, fonts or images from elsewhere).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/alloc.h"
#include "core/text.h"
#include "tune/layout_tune.h"

namespace sat {
namespace {

using ojson = nlohmann::ordered_json;

ojson num(double v) { return std::isfinite(v) ? ojson(v) : ojson(nullptr); }

double ratio(const LayoutTrial& t) {
  return t.predicted.samples_per_second > 0 ? t.measured_samples_per_second / t.predicted.samples_per_second : NAN;
}

// The Layout's fields as plan.json writes them.
ojson layout_fields(const Layout& l) {
  ojson j;
  j["dp"] = l.dp, j["tp"] = l.tp, j["pp"] = l.pp;
  j["micro_batch"] = l.batch, j["accum"] = l.accum;
  j["schedule"] = l.pp == 1 ? "none" : pipe_schedule_name(l.pp_schedule), j["virtual_stages"] = l.virtual_stages;
  j["recompute"] = recompute_name(l.recompute), j["sequence_parallel"] = l.sequence_parallel, j["zero"] = l.zero;
  j["layout"] = l.str();
  return j;
}

ojson trial_json(const LayoutTrial& t, int rank) {
  ojson j = layout_fields(t.predicted.layout);
  j["planner_rank"] = rank;
  j["predicted_step_seconds"] = num(t.predicted.step_seconds);
  j["predicted_samples_per_second"] = num(t.predicted.samples_per_second);
  j["measured_step_seconds"] = num(t.measured_step_seconds);
  j["measured_samples_per_second"] = num(t.measured_samples_per_second);
  j["measured_over_predicted"] = num(ratio(t));
  j["predicted_memory_bytes"] = num(t.predicted.memory_bytes);
  j["measured_peak_bytes"] = t.measured_peak_bytes;
  j["timed_steps"] = t.timed_steps;
  j["chosen"] = t.chosen;
  if (!t.failed.empty()) j["failed"] = t.failed;
  return j;
}

std::string text_row(int i, const LayoutTrial& t) {
  return strf("%2d  %-66s %10.1f %10.1f %6.2f %11s %11s%s\n", i, t.predicted.layout.str().c_str(),
             t.predicted.samples_per_second, t.measured_samples_per_second, ratio(t),
             format_bytes(t.predicted.memory_bytes).c_str(), format_bytes(double(t.measured_peak_bytes)).c_str(),
             t.chosen ? "  <- chosen" : t.failed.empty() ? "" : ("  not timed: " + t.failed).c_str());
}

// Two bars per layout (the planner's and the measurement), scaled to the largest value.
struct BarRow {
  std::string label;
  double a = 0, b = 0;
  bool chosen = false;
};

std::string bar_plot(const std::vector<BarRow>& rows, const char* a_name, const char* b_name,
                     const std::function<std::string(double)>& label) {
  double top = 0;
  for (const BarRow& r : rows) top = std::max({top, r.a, r.b});
  if (!(top > 0)) return "<p class=\"note\">nothing measured</p>\n";
  const double W = 740, left = 40, width = 560, bar = 14, H = 30 + double(rows.size()) * (2 * bar + 26);
  std::string s = strf("<svg viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                      "font-size=\"12\" style=\"max-width:100%%;height:auto\">\n", W, H, W, H);
  s += strf("<rect x=\"%.0f\" y=\"6\" width=\"12\" height=\"10\" fill=\"#9aa4ad\"/><text x=\"%.0f\" y=\"15\">%s</text>\n",
           left, left + 16, a_name);
  s += strf("<rect x=\"%.0f\" y=\"6\" width=\"12\" height=\"10\" fill=\"#2f6fb0\"/><text x=\"%.0f\" y=\"15\">%s</text>\n",
           left + 160, left + 176, b_name);
  double y = 30;
  for (const BarRow& r : rows) {
    s += strf("<text x=\"%.0f\" y=\"%.0f\"%s>%s</text>\n", left, y + 10, r.chosen ? " font-weight=\"bold\"" : "",
             html_escape(r.label).c_str());
    y += 14;
    for (auto [v, color] : {std::pair{r.a, "#9aa4ad"}, std::pair{r.b, r.chosen ? "#e07b00" : "#2f6fb0"}}) {
      const double w = std::isfinite(v) && v > 0 ? width * v / top : 0;
      s += strf("<rect x=\"%.0f\" y=\"%.0f\" width=\"%.1f\" height=\"%.0f\" fill=\"%s\"/>", left, y, w, bar - 2, color);
      s += strf("<text x=\"%.1f\" y=\"%.0f\">%s</text>\n", left + w + 5, y + bar - 4, label(v).c_str());
      y += bar;
    }
    y += 12;
  }
  return s + "</svg>\n";
}

std::vector<BarRow> rows_of(const LayoutTuneResult& r, bool memory) {
  std::vector<BarRow> rows;
  for (size_t i = 0; i < r.trials.size(); ++i) {
    const LayoutTrial& t = r.trials[i];
    rows.push_back({strf("#%zu %s%s", i + 1, t.predicted.layout.str().c_str(), t.chosen ? " (chosen)" : ""),
                    memory ? t.predicted.memory_bytes : t.predicted.samples_per_second,
                    memory ? double(t.measured_peak_bytes) : t.measured_samples_per_second, t.chosen});
  }
  return rows;
}

const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:960px;margin:2em auto;padding:0 1em}
body{color:#222;line-height:1.45}
h1{font-size:1.5em;margin-bottom:.3em}h2{font-size:1.15em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.85em}td,th{padding:3px 8px;text-align:right;border-bottom:1px solid #ddd}
td.l{text-align:left;font-family:monospace}
table.meta td{text-align:left;border:none;padding:1px 12px 1px 0}table.meta td:first-child{color:#666}
th{background:#f2f2f2}tr.chosen td{background:#fff1dc;font-weight:bold}
.choice{background:#fff6e8;border-left:5px solid #e07b00;padding:.6em 1.1em;margin:1.4em 0}
.choice .big{font-size:1.15em;font-family:monospace}.reason{font-style:italic}.note{color:#555;font-size:.92em}
)";

std::string meta_table(const LayoutTuneResult& r) {
  auto row = [](const char* k, const std::string& v) { return std::string("<tr><td>") + k + "</td><td>" + v + "</td></tr>\n"; };
  std::string h = "<table class=\"meta\">\n";
  h += row("model", html_escape(r.model)) + row("data", html_escape(r.data)) + row("ranks", strf("%d (one host)", r.world));
  h += row("global batch", strf("%lld", (long long)r.global_batch));
  h += row("fixed fields", r.filter.empty() ? "none (--layout auto)" : html_escape(r.filter));
  h += row("memory budget", format_bytes(double(r.budget)) + " per rank (" + html_escape(r.budget_source) + ")");
  h += row("this machine", strf("%.3g GFLOP/s fp32 peak per rank, memory %.3g GB/s, all-reduce %.3g GB/s, latency %.3g us",
                               r.hw.peak_fp32 / 1e9, r.hw.memory_bandwidth / 1e9, r.hw.intra.bandwidth / 1e9,
                               r.hw.intra.alpha * 1e6));
  h += row("planner", strf("%lld layouts searched in %.2f s", (long long)r.layouts_searched, r.plan_seconds));
  h += row("tuning", strf("%zu layouts timed; %.1f s in all (%.1f s measuring the machine)", r.trials.size(),
                         r.tuning_seconds, r.hardware_seconds));
  return h + "</table>\n";
}

std::string trials_table(const LayoutTuneResult& r) {
  std::string h = "<table>\n<tr><th>#</th><th>layout</th><th>predicted samples/s</th><th>measured samples/s</th>"
                  "<th>measured / predicted</th><th>predicted memory</th><th>measured peak</th><th>timed steps</th></tr>\n";
  for (size_t i = 0; i < r.trials.size(); ++i) {
    const LayoutTrial& t = r.trials[i];
    h += strf("<tr%s><td>%zu</td><td class=\"l\">%s</td><td>%.1f</td><td>%.1f</td><td>%.2f</td><td>%s</td><td>%s</td>"
             "<td>%d</td></tr>\n", t.chosen ? " class=\"chosen\"" : "", i + 1, html_escape(t.predicted.layout.str()).c_str(),
             t.predicted.samples_per_second, t.measured_samples_per_second, ratio(t),
             format_bytes(t.predicted.memory_bytes).c_str(), format_bytes(double(t.measured_peak_bytes)).c_str(),
             t.timed_steps);
  }
  return h + "</table>\n";
}

}  // namespace

std::string layout_tune_text(const LayoutTuneResult& r) {
  std::string s = strf("layout auto: %s on %d rank(s), global batch %lld%s, memory budget %s per rank; the planner "
                      "searched %lld layouts in %.0f ms\n\n",
                      r.model.c_str(), r.world, (long long)r.global_batch, r.filter.empty() ? "" : (", " + r.filter).c_str(),
                      format_bytes(double(r.budget)).c_str(), (long long)r.layouts_searched, 1000 * r.plan_seconds);
  s += strf(" #  %-66s %10s %10s %6s %11s %11s\n", "layout", "predicted", "measured", "ratio", "memory", "peak");
  s += strf("    %-66s %10s %10s %6s %11s %11s\n", "", "samples/s", "samples/s", "", "(plan)", "(measured)");
  for (size_t i = 0; i < r.trials.size(); ++i) s += text_row(int(i) + 1, r.trials[i]);
  if (r.chosen >= 0) s += strf("\nchosen: #%d %s: %s\n", r.chosen + 1, r.choice().predicted.layout.str().c_str(), r.reason.c_str());
  return s;
}

std::string layout_tune_json(const LayoutTuneResult& r) {
  ojson j;
  j["kind"] = "layout";
  j["model"] = r.model, j["data"] = r.data, j["device"] = "cpu", j["world"] = r.world;
  j["global_batch"] = r.global_batch, j["fixed"] = r.filter;
  j["memory_budget_bytes"] = r.budget, j["budget_source"] = r.budget_source;
  j["hardware"] = {{"name", r.hw.name}, {"peak_fp32", num(r.hw.peak_fp32)}, {"memory_bandwidth", num(r.hw.memory_bandwidth)},
                   {"allreduce_alpha", num(r.hw.intra.alpha)}, {"allreduce_bandwidth", num(r.hw.intra.bandwidth)},
                   {"p2p_alpha", num(r.hw.p2p_intra.alpha)}, {"p2p_bandwidth", num(r.hw.p2p_intra.bandwidth)}};
  j["layouts_searched"] = r.layouts_searched, j["plan_seconds"] = num(r.plan_seconds);
  j["hardware_seconds"] = num(r.hardware_seconds), j["tuning_seconds"] = num(r.tuning_seconds);
  ojson ls = ojson::array();
  for (size_t i = 0; i < r.trials.size(); ++i) ls.push_back(trial_json(r.trials[i], int(i) + 1));
  j["layouts"] = ls;
  if (r.chosen >= 0) {
    ojson c = layout_fields(r.choice().predicted.layout);
    c["planner_rank"] = r.chosen + 1;
    c["measured_samples_per_second"] = num(r.choice().measured_samples_per_second);
    c["predicted_samples_per_second"] = num(r.choice().predicted.samples_per_second);
    c["reason"] = r.reason;
    j["layout_choice"] = c;
  }
  return j.dump(2) + "\n";
}

std::string layout_tune_html(const LayoutTuneResult& r) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>saturate tune "
                  "--layout auto: " + html_escape(r.model) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  h += "<h1>Layout tuning: " + html_escape(r.model) + "</h1>\n" + meta_table(r);
  if (r.chosen >= 0)
    h += "<div class=\"choice\">\n<div class=\"big\">" + html_escape(r.choice().predicted.layout.str()) +
         "</div>\n<p class=\"reason\">" + html_escape(r.reason) + "</p>\n</div>\n";
  h += "<h2>Layouts: the planner's prediction and the measurement</h2>\n" + trials_table(r);
  h += "<h2>Throughput</h2>\n" + bar_plot(rows_of(r, false), "predicted", "measured",
                                          [](double v) { return strf("%.0f samples/s", v); });
  h += "<p class=\"note\">The planner's order, best first. Measured: the global batch over the median step time of a "
       "short run (after a warm-up step), the slowest rank's.</p>\n";
  h += "<h2>Memory per rank</h2>\n" + bar_plot(rows_of(r, true), "plan (the fullest rank)", "measured peak (any rank)",
                                               [](double v) { return format_bytes(v); });
  return h + "</body>\n</html>\n";
}

}  // namespace sat
