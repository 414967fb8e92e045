// plan.html, the page `saturate plan --out DIR` writes for a person to read: the request and
// the search, the best layouts as a table (the ones `saturate train` would refuse marked),
// every layout timed as throughput against memory per device, the best layout's memory as
// live at its peak against the device's, and its simulated pipeline. Self-contained: inline
// CSS and SVG, no scripts, nothing fetched.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/alloc.h"
#include "core/plot.h"
#include "core/text.h"
#include "plan/planner.h"
#include "train/validate.h"

namespace sat {
namespace {

const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1180px;margin:1.5em auto;padding:0 1em}
body{color:#222;line-height:1.45}
h1{font-size:1.45em;margin-bottom:.3em;overflow-wrap:anywhere}h2{font-size:1.15em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.85em}td,th{padding:3px 6px;text-align:right;border-bottom:1px solid #ddd}
th{background:#f2f2f2;white-space:nowrap}td.l{text-align:left}td.m{font-family:monospace;text-align:left}
table.meta td{text-align:left;border:none;padding:1px 12px 1px 0}table.meta td:first-child{color:#666;white-space:nowrap}
tr.chosen td{background:#fff1dc;font-weight:bold}td.no{color:#b00;font-weight:bold}td.yes{color:#2a7d3b}
.choice{background:#fff6e8;border-left:5px solid #e07b00;padding:.5em 1.1em;margin:1.2em 0}
.choice .big{font-size:1.05em;font-family:monospace;overflow-wrap:anywhere}.reason{font-style:italic;margin:.3em 0}
.none{background:#fdecec;border-left:5px solid #d62728;padding:.5em 1.1em;margin:1.2em 0}
.note{color:#555;font-size:.9em;max-width:760px}ul.refusals{font-size:.88em;color:#8a1010;margin:.4em 0}
span.sw{display:inline-block;width:12px;height:12px;vertical-align:-1px;border:1px solid #0003}
)";

// Distinct neighbours, dark and light in turn (no red: red is the device's memory): the
// bar's segments follow each other in this order.
const char* kPalette[] = {"#1f77b4", "#aec7e8", "#2ca02c", "#98df8a", "#9467bd", "#c5b0d5", "#ff7f0e", "#ffd8a8",
                          "#8c564b", "#c49c94", "#e377c2", "#f7c6e3", "#7f7f7f", "#c7c7c7", "#17becf", "#bcbd22"};
const char* colour(size_t i) { return kPalette[i % (sizeof kPalette / sizeof *kPalette)]; }
// Text on a colour "#rrggbb": white on the dark ones, black on the light.
const char* ink(const char* c) {
  const long v = std::strtol(c + 1, nullptr, 16);
  return 0.299 * double(v >> 16) + 0.587 * double((v >> 8) & 255) + 0.114 * double(v & 255) < 150 ? "#fff" : "#000";
}

Device device_of(const PlanRequest& r) { return r.hw.gpu ? Device::cuda : Device::cpu; }
double rate(const Prediction& x, bool tokens) { return tokens ? x.tokens_per_second : x.samples_per_second; }
const char* rate_unit(bool tokens) { return tokens ? "tokens/s" : "samples/s"; }

std::string meta(const PlanResult& p, const PlanRequest& r, double limit) {
  auto row = [](const char* k, const std::string& v) { return str_cat("<tr><td>", k, "</td><td>", v, "</td></tr>\n"); };
  const DType prec = r.hw.gpu ? r.precision : DType::f32;
  std::string s = "<table class=\"meta\">\n";
  s += row("model", html_escape(r.model.name) + strf(": %.4g parameters, %.4g FLOPs per sample (forward + backward)",
                                                     p.model_parameters, p.model_flops_per_sample));
  s += row("devices", strf("%d &times; %s (%s), %d per node; %s of memory each%s; %.4g TFLOP/s peak %s", r.gpus,
                           html_escape(r.hw.name).c_str(), html_escape(r.hw.source).c_str(), r.gpus_per_node,
                           format_bytes(limit).c_str(), r.memory_limit > 0 ? " (--memory-limit)" : "",
                           r.hw.peak(prec) / 1e12, dtype_name(prec)));
  s += row("global batch", strf("%lld samples per optimizer step", (long long)r.global_batch) +
                               (p.tokens_per_sample ? strf(" of %lld tokens", (long long)p.tokens_per_sample) : "") +
                               strf("; precision %s, optimizer %s", dtype_name(prec), html_escape(r.optimizer).c_str()));
  s += row("engine", html_escape(r.engine.name + ": " + r.engine.description));
  s += row("search", strf("%lld layouts in %.2f s: %lld over the memory, %lld slower than the best by a lower bound, "
                          "%zu simulated", (long long)p.layouts, p.seconds, (long long)p.over_memory,
                          (long long)p.slower, p.considered.size()));
  return s + "</table>\n";
}

// The verdict: the best layout and why, or that nothing fits and what the smallest needs.
std::string verdict(const PlanResult& p) {
  if (p.best.empty() || !p.best[0].fits) {
    std::string s = "<div class=\"none\"><p><b>No layout fits.</b>";
    if (const Prediction* m = p.best.empty() ? (p.smallest ? &*p.smallest : nullptr) : &p.best[0])
      s += strf(" %s needs %s per device (%s).", html_escape(m->layout.str()).c_str(),
                format_bytes(m->memory_bytes).c_str(),
                m->memory_exact ? "exact plan" : m->memory_formula ? "published formulas" : "estimate");
    return s + " More devices, a smaller micro-batch or global batch, recomputation or a higher ZeRO stage would be "
               "needed.</p></div>\n";
  }
  const Prediction& b = p.best[0];
  return "<div class=\"choice\"><div class=\"big\">" + html_escape(b.layout.str()) + "</div><p class=\"reason\">" +
         html_escape(p.why) + "</p>" +
         strf("<p class=\"note\">Step %.4g s = compute %.4g s on the busiest stage (tensor-parallel collectives %.3g s) + "
              "bubble %.1f%% + exposed data-parallel %.3g s + optimizer %.3g s.</p></div>\n",
              b.step_seconds, b.compute_seconds, b.tp_comm_seconds, 100 * b.bubble_fraction, b.dp_exposed_seconds,
              b.optimizer_seconds);
}

// The reported layouts, one row each, every field in its column; the best highlighted and
// what `saturate train` would refuse on this device today listed under the table.
std::string layouts_table(const PlanResult& p, Device d, const ModelConfig& model, bool tokens) {
  std::string s = "<table class=\"layouts\">\n<tr><th>#</th><th>dp</th><th>tp</th><th>pp</th><th>schedule</th>"
                  "<th>v</th><th>recompute</th><th>sp</th><th>zero</th><th>micro &times; accum</th>"
                  "<th>memory/GPU</th><th>step (s)</th><th>" + std::string(rate_unit(tokens)) +
                  "</th><th>TFLOP/s/GPU</th><th>MFU</th><th>bubble</th><th>train</th></tr>\n";
  std::string notes;
  for (size_t i = 0; i < p.best.size(); ++i) {
    const Prediction& x = p.best[i];
    const Layout& l = x.layout;
    const std::vector<std::string> why = refusals(l, d, &model);
    for (const std::string& w : why) notes += strf("<li>#%zu: %s</li>\n", i + 1, html_escape(w).c_str());
    s += strf("<tr class=\"layout%s\"><td>%zu</td><td>%d</td><td>%d</td><td>%d</td><td class=\"l\">%s</td><td>%d</td>"
              "<td class=\"l\">%s</td><td class=\"l\">%s</td><td>%d</td><td>%lld &times; %lld</td><td>%s%s</td>",
              i == 0 && x.fits ? " chosen" : "", i + 1, l.dp, l.tp, l.pp,
              l.pp == 1 ? "none" : pipe_schedule_name(l.pp_schedule), l.virtual_stages, recompute_name(l.recompute),
              l.sequence_parallel ? "on" : "off", l.zero, (long long)l.batch, (long long)l.accum,
              x.memory_exact ? "" : "~", format_bytes(x.memory_bytes).c_str());
    s += "<td>" + plot::dec("%.4g", x.step_seconds) + "</td><td>" + plot::si(rate(x, tokens)) + "</td><td>" +
         plot::dec("%.1f", x.tflops_per_gpu) + "</td><td>" + plot::dec("%.1f%%", 100 * x.mfu) + "</td><td>" +
         plot::dec("%.1f%%", 100 * x.bubble_fraction) + "</td>";
    s += why.empty() ? "<td class=\"yes\">runs</td></tr>\n"
                     : strf("<td class=\"no\" title=\"see below\">refuses (%zu)</td></tr>\n", why.size());
  }
  s += "</table>\n";
  if (!notes.empty())
    s += "<p class=\"note\">What <code>saturate train</code> refuses in them on this device today (the planner "
         "predicts what the design would do):</p>\n<ul class=\"refusals\">\n" + notes + "</ul>\n";
  return s;
}

// Throughput against memory per device of every layout timed (memory estimated), the
// reported ones numbered as in the table (at their exact memory), the device's memory a line.
std::string scatter(const PlanResult& p, double limit, bool tokens) {
  double xmax = limit, ymax = 0;
  for (const auto* v : {&p.considered, &p.best})
    for (const Prediction& x : *v)
      if (std::isfinite(x.memory_bytes) && std::isfinite(rate(x, tokens)))
        xmax = std::max(xmax, x.memory_bytes), ymax = std::max(ymax, rate(x, tokens));
  if (!(ymax > 0)) return "<p class=\"note\">No layout was timed.</p>\n";
  plot::Plot g(plot::linear(0, xmax * 1.12, true), plot::linear(0, ymax * 1.04, false),
               "memory per device (the peak of the fullest rank)",
               str_cat(tokens ? "tokens" : "samples", " per second, all devices"));
  g.legend("layout timed (memory estimated)", plot::kBlue, nullptr, 'o');
  g.legend("reported, # as in the table (memory planned)", plot::kOrange, nullptr, 'h');
  g.legend("best", plot::kRed, nullptr, 'h');
  for (const Prediction& x : p.considered)
    if (g.ok(x.memory_bytes, rate(x, tokens)))
      g.s += strf("<g><title>%s: %s (estimate), %s %s</title><circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\" "
                  "fill-opacity=\"0.45\"/></g>\n", html_escape(x.layout.str()).c_str(),
                  format_bytes(x.memory_bytes).c_str(), plot::si(rate(x, tokens)).c_str(), rate_unit(tokens),
                  g.px(x.memory_bytes), g.py(rate(x, tokens)), x.fits ? plot::kBlue : plot::kGrey);
  g.vline(limit, plot::kRed, "6 4", "device memory " + format_bytes(limit), 1);
  // The reported layouts: circled, their numbers in a column right of every point (where
  // nothing is drawn: layouts estimated over the memory are not simulated), each joined to
  // its point by a line.
  double right = 0, top = plot::Plot::H;
  for (const Prediction& x : p.best)
    if (g.ok(x.memory_bytes, rate(x, tokens)))
      right = std::max(right, g.px(x.memory_bytes)), top = std::min(top, g.py(rate(x, tokens)));
  const double lx = std::min(std::max(right, g.px(limit)) + 22, plot::Plot::W - plot::Plot::R - 16);
  for (size_t i = p.best.size(); i-- > 0;) {
    const Prediction& x = p.best[i];
    if (!g.ok(x.memory_bytes, rate(x, tokens))) continue;
    const double X = g.px(x.memory_bytes), Y = g.py(rate(x, tokens));
    const double ly = std::min(top + 4 + 15 * double(i), plot::Plot::H - plot::Plot::B - 4);
    const char* c = i == 0 ? plot::kRed : plot::kOrange;
    g.s += strf("<g><title>#%zu %s: %s (planned), %s %s</title><line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" "
                "y2=\"%.1f\" stroke=\"%s\" stroke-width=\"0.8\"/><circle cx=\"%.1f\" cy=\"%.1f\" r=\"%d\" "
                "fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/><text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\" "
                "fill=\"%s\" %s>#%zu</text></g>\n", i + 1, html_escape(x.layout.str()).c_str(),
                format_bytes(x.memory_bytes).c_str(), plot::si(rate(x, tokens)).c_str(), rate_unit(tokens), X, Y, lx - 2,
                ly - 4, c, X, Y, i == 0 ? 7 : 5, c, lx, ly, c, plot::kHalo, i + 1);
  }
  return g.done(true, "");
}

// A rank's memory as live at its peak: one stacked bar of its rows against the device's
// memory on a byte axis, and the rows as a legend with their values.
std::string memory_bar(const Prediction& b, double limit) {
  double total = 0;
  for (const MemoryRow& m : b.memory_rows) total += m.bytes;
  const double W = 720, L = 12, R = 24, T = 30, h = 40, H = T + h + 46;
  const plot::Axis ax = plot::linear(0, std::max(limit, total), true);
  auto X = [&](double v) { return L + (W - L - R) * ax.frac(v); };
  std::string s = strf("<svg viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                       "font-size=\"12\" style=\"max-width:100%%;height:auto\">\n", W, H, W, H);
  for (double t : ax.ticks())
    s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#bbb\"/><text x=\"%.1f\" y=\"%.1f\" "
              "text-anchor=\"middle\">%s</text>\n", X(t), T + h, X(t), T + h + 5, X(t), T + h + 18, ax.label(t).c_str());
  double at = 0;
  for (size_t i = 0; i < b.memory_rows.size(); ++i) {
    const MemoryRow& m = b.memory_rows[i];
    const double x0 = X(at), w = X(at + m.bytes) - x0;
    s += strf("<g class=\"seg\"><title>%s: %s</title><rect x=\"%.2f\" y=\"%.0f\" width=\"%.2f\" height=\"%.0f\" "
              "fill=\"%s\"/>", html_escape(m.what).c_str(), format_bytes(m.bytes).c_str(), x0, T, w, h, colour(i));
    if (w > 58)
      s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"11\" fill=\"%s\">%s</text>", x0 + w / 2,
                T + h / 2 + 4, ink(colour(i)), format_bytes(m.bytes).c_str());
    s += "</g>\n";
    at += m.bytes;
  }
  const bool right = ax.frac(limit) > 0.6;
  s += strf("<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\" "
            "stroke-dasharray=\"6 4\"/><text x=\"%.1f\" y=\"%.0f\" text-anchor=\"%s\" fill=\"%s\" font-weight=\"bold\">"
            "device memory %s</text>\n", X(limit), T - 8, X(limit), T + h + 4, plot::kRed, right ? X(limit) - 4 : X(limit) + 4,
            T - 12, right ? "end" : "start", plot::kRed, format_bytes(limit).c_str());
  s += strf("<text x=\"%.1f\" y=\"%.0f\" font-weight=\"bold\">this rank: %s</text>\n", L, T - 12,
            format_bytes(total).c_str());
  s += strf("<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">bytes per device</text>\n</svg>\n",
            L + (W - L - R) / 2, H - 6);
  std::string t = "<table class=\"legend\">\n<tr><th></th><th style=\"text-align:left\">held at the peak</th>"
                  "<th>bytes</th><th>of the device</th></tr>\n";
  for (size_t i = 0; i < b.memory_rows.size(); ++i)
    t += strf("<tr><td><span class=\"sw\" style=\"background:%s\"></span></td><td class=\"l\">%s</td><td>%s</td>"
              "<td>%.1f%%</td></tr>\n", colour(i), html_escape(b.memory_rows[i].what).c_str(),
              format_bytes(b.memory_rows[i].bytes).c_str(), 100 * b.memory_rows[i].bytes / limit);
  t += strf("<tr><td></td><td class=\"l\"><b>total</b></td><td><b>%s</b></td><td><b>%.1f%%</b></td></tr>\n",
            format_bytes(total).c_str(), 100 * total / limit);
  if (limit > total)
    t += strf("<tr><td></td><td class=\"l\">left free</td><td>%s</td><td>%.1f%%</td></tr>\n",
              format_bytes(limit - total).c_str(), 100 * (limit - total) / limit);
  return s + t + "</table>\n";
}

// The best layout's simulated pipeline: one row per stage, forwards and backwards as boxes
// on a time axis, the gaps the bubble.
std::string timeline(const ScheduleSim& sim) {
  if (sim.spans.empty() || !(sim.makespan > 0)) return "";
  const int P = int(sim.spans.size());
  const double W = 720, L = 78, R = 24, T = 30, row = std::clamp(360.0 / P, 6.0, 24.0), B = 46, H = T + row * P + B;
  const plot::Axis ax = plot::linear(0, sim.makespan, false);
  auto X = [&](double v) { return L + (W - L - R) * ax.frac(v); };
  const double unit = (ax.hi - ax.lo) / (W - L - R);  // seconds per pixel
  std::string s = strf("<svg viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                       "font-size=\"12\" style=\"max-width:100%%;height:auto\">\n", W, H, W, H);
  s += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fcfcfc\" stroke=\"#999\"/>\n", L, T,
            W - L - R, row * P);
  for (double t : ax.ticks())
    s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e2e2e2\"/><text x=\"%.1f\" y=\"%.1f\" "
              "text-anchor=\"middle\">%s</text>\n", X(t), T, X(t), T + row * P, X(t), T + row * P + 16,
              ax.label(t).c_str());
  // Stage labels that do not overlap: "stage s" on a short pipeline, else numbers under an axis label.
  const bool short_pipe = P <= 4;
  const int every = int(std::ceil(13 / row));
  for (int r = 0; r < P; ++r) {
    if (r % every == 0 || r == P - 1)
      s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" font-size=\"11\">%s%d</text>\n", L - 6,
                T + row * r + row / 2 + 4, short_pipe ? "stage " : "", r);
    // Runs of the same kind closer than half a pixel are one box: a long step stays light.
    const auto& spans = sim.spans[size_t(r)];
    for (size_t i = 0; i < spans.size();) {
      size_t j = i + 1;
      while (j < spans.size() && spans[j].action.kind == spans[i].action.kind && spans[j].start - spans[j - 1].end < unit / 2)
        ++j;
      s += strf("<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>stage %d: %s .. %s</title>"
                "</rect>\n", X(spans[i].start), T + row * r + 1, std::max(X(spans[j - 1].end) - X(spans[i].start), 0.3),
                row - 2, spans[i].action.kind == ActionKind::forward ? plot::kBlue : plot::kGreen, r,
                spans[i].action.str().c_str(), spans[j - 1].action.str().c_str());
      i = j;
    }
  }
  s += strf("<rect x=\"%.1f\" y=\"8\" width=\"14\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" y=\"18\">forward</text>"
            "<rect x=\"%.1f\" y=\"8\" width=\"14\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" y=\"18\">backward</text>"
            "<text x=\"%.1f\" y=\"18\">white: idle, the bubble (%.1f%% of the step)</text>\n",
            L, plot::kBlue, L + 19, L + 90, plot::kGreen, L + 109, L + 190, 100 * sim.bubble_fraction);
  s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">time within one optimizer step (s); the step takes %.4g s"
            "</text>\n", L + (W - L - R) / 2, H - 8, sim.makespan);
  if (!short_pipe)
    s += strf("<text transform=\"translate(18 %.1f) rotate(-90)\" text-anchor=\"middle\">pipeline stage</text>\n",
              T + row * P / 2);
  return s + "</svg>\n";
}

}  // namespace

std::string plan_html(const PlanResult& p, const PlanRequest& r) {
  const double limit = r.memory_limit > 0 ? r.memory_limit : r.hw.memory_bytes;
  const bool tokens = p.tokens_per_sample > 0;
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" "
                  "content=\"width=device-width, initial-scale=1\">\n<title>saturate plan: " +
                  html_escape(r.model.name) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  s += strf("<h1>Layout plan: %s on %d &times; %s</h1>\n", html_escape(r.model.name).c_str(), r.gpus,
            html_escape(r.hw.name).c_str());
  s += meta(p, r, limit) + verdict(p);
  if (!p.best.empty()) {
    s += "<h2>The fastest layouts</h2>\n" + layouts_table(p, device_of(r), r.model, tokens);
    s += "<p class=\"note\">Memory/GPU is the most any rank needs, from its exact plan, or the engine's published "
         "formulas under --engine (~: an estimate). MFU is the "
         "model's FLOPs (forward and backward, without recomputation) per second per device over the device's peak; "
         "bubble, the pipeline's idle share in the simulated schedule.</p>\n";
  }
  s += strf("<h2>Every layout simulated (%zu): throughput against memory</h2>\n", p.considered.size());
  s += scatter(p, limit, tokens);
  s += "<p class=\"note\">Each dot is a layout the search simulated, at its estimated memory per device (layouts "
       "estimated over the device's memory are not simulated). Hover a dot for its layout.</p>\n";
  const Prediction* m = !p.best.empty() ? &p.best[0] : p.smallest ? &*p.smallest : nullptr;
  if (m && !m->memory_rows.empty()) {
    s += strf("<h2>Memory of the %s layout: pipeline stage %d, the fullest rank, %s</h2>\n",
              p.best.empty() ? "smallest" : "best", m->memory_stage,
              m->memory_exact     ? "as live at its peak (exact plan)"
              : m->memory_formula ? "term by term at its peak (published formulas)"
                                  : "by kind (estimate)");
    s += memory_bar(*m, limit);
  }
  if (!p.best.empty() && !p.timeline.spans.empty())
    s += "<h2>Pipeline timeline of the best layout (simulated)</h2>\n" + timeline(p.timeline);
  return s + "</body>\n</html>\n";
}

}  // namespace sat
