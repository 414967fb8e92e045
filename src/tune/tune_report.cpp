// The tuner's reports: tune.json (every number the tuner measured; non-finite values as
// null) and one self-contained HTML page with inline SVG plots: no scripts, fonts, styles
// or images from elsewhere, so it opens offline and can be attached to a ticket.
#include <algorithm>
#include <array>
#include <fstream>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/alloc.h"
#include "core/error.h"
#include "core/json.h"
#include "core/plot.h"
#include "core/text.h"
#include "tune/tune.h"

namespace sat {
namespace {

using ojson = nlohmann::ordered_json;
using namespace plot;

ojson num(double v) { return std::isfinite(v) ? ojson(v) : ojson(nullptr); }
ojson pos_num(double v) { return std::isfinite(v) && v > 0 ? ojson(v) : ojson(nullptr); }  // 0: not known

std::string i64(int64_t v) { return strf("%lld", (long long)v); }
std::string bytes_or_dash(size_t b) { return b ? format_bytes(double(b)) : "&ndash;"; }

// Micro-batches on a log2 axis, from every candidate, the choice and the largest fit.
Axis micro_axis(const TuneResult& r) {
  double lo = INFINITY, hi = 0;
  auto add = [&](double v) { if (pos(v)) lo = std::min(lo, v), hi = std::max(hi, v); };
  for (auto& c : r.candidates) add(double(c.micro_batch));
  add(double(r.choice.micro_batch));
  add(double(r.max_micro_batch));
  return hi > 0 ? log2_axis(lo, hi) : log2_axis(1, 1);
}

void mark_choice(Plot& p, const TuneResult& r) {
  p.vline(double(r.max_micro_batch), kGrey, "2,3", "max fits " + i64(r.max_micro_batch), 1);
  p.vline(double(r.choice.micro_batch), kOrange, "", "chosen " + i64(r.choice.micro_batch), 0);
}

// The knee line sits at (1 - knee) x the noise-aware best (the reference's figure), or
// the highest point when there is no reference.
double reference_of(const TuneResult& r, bool good) {
  for (auto& c : r.candidates)
    if (c.probed && c.micro_batch == r.throughput_noise.reference) return good ? c.goodput : c.samples_per_second;
  return 0;
}

std::string throughput_plot(const TuneResult& r) {
  bool good = r.objective == "goodput";
  Pts thr, gp, chosen, pred;
  std::vector<std::array<double, 3>> err;
  for (auto& c : r.candidates) {
    if (pos(c.predicted_samples_per_second)) pred.push_back({double(c.micro_batch), c.predicted_samples_per_second});
    if (!c.probed) continue;
    thr.push_back({double(c.micro_batch), c.samples_per_second});
    err.push_back({double(c.micro_batch), c.samples_per_second_low, c.samples_per_second_high});
    gp.push_back({double(c.micro_batch), c.goodput});
    if (c.micro_batch == r.choice.micro_batch)
      chosen.push_back({double(c.micro_batch), good ? c.goodput : c.samples_per_second});
  }
  double best = reference_of(r, good);
  if (!pos(best)) best = top_of(good ? gp : thr);
  double top = std::max({top_of(thr), good ? top_of(gp) : 0, top_of(pred)});
  for (auto& e : err) top = std::max(top, std::isfinite(e[2]) && e[2] < 2 * top ? e[2] : 0);
  Plot p(micro_axis(r), linear(0, top > 0 ? top * 1.1 : 1, false), "micro-batch per rank (log2 scale)",
         "samples / s (all ranks)");
  p.legend("throughput (95% interval)", kBlue, "");
  if (good) p.legend("goodput (throughput x statistical efficiency)", kGreen, "6,3");
  if (!pred.empty()) p.legend("predicted (cost model)", kGrey, "2,3", 0);
  p.legend("chosen", kOrange, nullptr);
  if (best > 0 && pos(1 - r.knee))
    p.hline((1 - r.knee) * best, kGrey, "6,4",
            strf("knee: %g%% of the noise-aware best%s", 100 * (1 - r.knee), good ? " goodput" : ""), true);
  mark_choice(p, r);
  p.line(pred, kGrey, "2,3");
  p.bars(err, kBlue);
  p.line(thr, kBlue);
  p.dots(thr, kBlue);
  if (good) p.line(gp, kGreen, "6,3"), p.dots(gp, kGreen);
  p.dots(chosen, kOrange, 'o', 6);
  return p.done(top > 0, "no throughput measured");
}

std::string memory_plot(const TuneResult& r) {
  Pts pred, over, peak;
  for (auto& c : r.candidates) {
    (c.fits ? pred : over).push_back({double(c.micro_batch), double(c.predicted_memory_bytes)});
    if (c.probed) peak.push_back({double(c.micro_batch), double(c.measured_peak_bytes)});
  }
  Pts all = pred;
  all.insert(all.end(), over.begin(), over.end());
  double top = std::max(top_of(all, double(r.budget)), top_of(peak));
  Plot p(micro_axis(r), linear(0, top > 0 ? top * 1.1 : 1, true), "micro-batch per rank (log2 scale)",
         "bytes per rank");
  p.legend("predicted (memory plan)", kBlue, "");
  p.legend("measured peak", kGreen, nullptr, 's');
  if (!over.empty()) p.legend("predicted, over the budget", kRed, nullptr, 'h');
  if (r.budget) p.hline(double(r.budget), kRed, "", "budget " + format_bytes(double(r.budget)));
  mark_choice(p, r);
  p.line(all, kBlue);
  p.dots(pred, kBlue);
  p.dots(over, kRed, 'h');
  p.dots(peak, kGreen, 's');
  return p.done(top > 0, "no memory figures");
}

std::string noise_plot(const TuneResult& r) {
  Pts est;
  std::vector<std::array<double, 3>> iv;
  double lo = INFINITY, hi = -INFINITY;
  for (auto& n : r.noise) {
    est.push_back({double(n.step), n.estimate});
    iv.push_back({double(n.step), n.low, n.high});
    lo = std::min(lo, double(n.step)), hi = std::max(hi, double(n.step));
  }
  // The axis holds the estimates and the final interval; earlier, wider intervals are cut.
  const NoiseInterval& f = r.noise_interval;
  double top = top_of(est, r.noise_scale);
  if (f.measurable && pos(f.high)) top = std::max(top, f.high);
  Plot p(linear(lo, hi, false, true), linear(0, top > 0 ? top * 1.15 : 1, false), "training step",
         "B_simple (samples)");
  p.legend("estimate so far (95% interval)", kPurple, "");
  if (pos(r.noise_scale) && f.measurable) {
    p.legend("final: B_simple = " + si(r.noise_scale) + " (" + si(f.low) + " to " + si(f.high) + ")", kOrange, "6,4",
             0);
    p.hline(r.noise_scale, kOrange, "6,4", "");
    p.hline(f.low, kOrange, "1,3", "");
    p.hline(f.high, kOrange, "1,3", "");
  }
  p.band(iv, kPurple);
  p.line(est, kPurple);
  p.dots(est, kPurple);
  return p.done(top > 0, "not measurable yet");
}

const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:780px;margin:2em auto;padding:0 1em}
body{color:#222;line-height:1.45}
h1{font-size:1.5em;margin-bottom:.3em}h2{font-size:1.15em;margin-top:1.8em}
table{border-collapse:collapse;font-size:.9em}td,th{padding:3px 9px;text-align:right;border-bottom:1px solid #ddd}
table.meta td{text-align:left;border:none;padding:1px 12px 1px 0}table.meta td:first-child{color:#666}
th{background:#f2f2f2}tr.chosen td{background:#fff1dc;font-weight:bold}
.choice{background:#fff6e8;border-left:5px solid #e07b00;padding:.6em 1.1em;margin:1.4em 0}
.choice .big{font-size:1.25em}.reason{font-style:italic}.note{color:#555;font-size:.92em}
)";

}  // namespace

std::string tune_json(const TuneResult& r) {
  ojson j = {{"model", r.model}, {"data", r.data}, {"device", r.device}, {"world_size", r.world},
             {"memory_budget_bytes", uint64_t(r.budget)}, {"budget_source", r.budget_source},
             {"max_micro_batch", r.max_micro_batch}, {"max_predicted_bytes", uint64_t(r.max_predicted_bytes)},
             {"confirm_peak_bytes", uint64_t(r.confirm_peak_bytes)}, {"failed_allocations", r.failed_allocations},
             {"objective", r.objective}, {"knee", num(r.knee)},
             {"requested_global_batch", r.requested_global_batch ? ojson(r.requested_global_batch) : ojson(nullptr)}};
  j["candidates"] = ojson::array();
  for (auto& c : r.candidates) {
    ojson timings = ojson::array();
    for (auto& t : c.timings)
      timings.push_back({{"round", t.round}, {"samples_per_second", num(t.samples_per_second)},
                         {"step_time_iqr_fraction", num(t.iqr_fraction)}, {"steps", t.steps}});
    j["candidates"].push_back(
        {{"micro_batch", c.micro_batch}, {"predicted_memory_bytes", uint64_t(c.predicted_memory_bytes)},
         {"measured_peak_bytes", uint64_t(c.measured_peak_bytes)}, {"samples_per_second", num(c.samples_per_second)},
         {"samples_per_second_low", pos_num(c.samples_per_second_low)},
         {"samples_per_second_high", pos_num(c.samples_per_second_high)},
         {"step_time_iqr_fraction", c.probed ? num(c.step_time_iqr_fraction) : ojson(nullptr)},
         {"ratio_to_best", pos_num(c.ratio_to_best)}, {"ratio_to_best_low", pos_num(c.ratio_to_best_low)},
         {"ratio_to_best_high", pos_num(c.ratio_to_best_high)},
         {"predicted_samples_per_second", pos_num(c.predicted_samples_per_second)},
         {"statistical_efficiency", num(c.statistical_efficiency)}, {"goodput", num(c.goodput)},
         {"timed_steps", c.timed_steps}, {"timings", timings}, {"probed", c.probed}, {"fits", c.fits}});
  }
  const TuneChoice& ch = r.choice;
  j["choice"] = {{"micro_batch", ch.micro_batch}, {"accum", ch.accum}, {"global_batch", ch.global_batch},
                 {"zero", ch.zero}, {"recompute", recompute_name(ch.recompute)},
                 {"lr", num(ch.lr)}, {"lr_rule", ch.lr_rule}, {"warmup_fraction", num(ch.warmup_fraction)},
                 {"reason", ch.reason}};
  j["levers"] = ojson::array();
  for (auto& l : r.levers)
    j["levers"].push_back({{"name", l.name}, {"zero", l.zero}, {"recompute", recompute_name(l.recompute)},
                           {"max_micro_batch", l.max_micro_batch}, {"micro_batch", l.micro_batch},
                           {"predicted_memory_bytes", uint64_t(l.predicted_memory_bytes)},
                           {"measured_peak_bytes", uint64_t(l.measured_peak_bytes)},
                           {"samples_per_second", num(l.samples_per_second)}});
  const NoiseInterval& ni = r.noise_interval;
  j["noise_scale"] = r.noise_scale != 0 ? num(r.noise_scale) : ojson(nullptr);
  j["noise_scale_low"] = ni.measurable ? num(ni.low) : ojson(nullptr);
  j["noise_scale_high"] = ni.measurable ? num(ni.high) : ojson(nullptr);
  j["noise_scale_reason"] =
      ni.measurable || ni.reason.empty() ? ojson(nullptr) : ojson("not measurable yet: " + ni.reason);
  j["noise_b_small"] = r.noise_b_small;
  j["noise_b_big"] = r.noise_b_big;
  j["noise"] = ojson::array();
  for (auto& n : r.noise)
    j["noise"].push_back({{"step", n.step}, {"small_sq", num(n.small_sq)}, {"big_sq", num(n.big_sq)},
                          {"b_small", n.b_small}, {"b_big", n.b_big}, {"estimate", pos_num(n.estimate)},
                          {"low", pos_num(n.low)}, {"high", pos_num(n.high)}});
  j["probes"] = r.probes;
  const ThroughputNoise& tn = r.throughput_noise;
  j["throughput_noise"] = {{"step_time_iqr_fraction", num(tn.step_time_iqr_fraction)},
                           {"round_to_round_fraction", num(tn.round_to_round)}, {"rounds", tn.rounds},
                           {"remeasured_probes", tn.remeasured}, {"settled", tn.settled},
                           {"reference_micro_batch", tn.reference}, {"rule", tn.rule}};
  j["tuning_seconds"] = num(r.tuning_seconds);
  // Names come from the user: invalid UTF-8 is replaced rather than thrown on.
  return j.dump(2, ' ', false, ojson::error_handler_t::replace) + "\n";
}

std::string tune_html(const TuneResult& r) {
  const TuneChoice& ch = r.choice;
  auto row = [](const char* k, const std::string& v) {
    return std::string("<tr><td>") + k + "</td><td>" + v + "</td></tr>\n";
  };
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>saturate tune: " +
                  html_escape(r.model) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  h += "<h1>Batch-size tuning: " + html_escape(r.model) + "</h1>\n<table class=\"meta\">\n";
  h += row("model", html_escape(r.model)) + row("data", html_escape(r.data)) + row("device", html_escape(r.device));
  h += row("ranks", strf("%d", r.world));
  h += row("memory budget", format_bytes(double(r.budget)) + " per rank (" + html_escape(r.budget_source) + ")");
  h += row("largest fitting micro-batch",
           i64(r.max_micro_batch) + " (plan " + bytes_or_dash(r.max_predicted_bytes) +
               ", confirming step peaked at " + bytes_or_dash(r.confirm_peak_bytes) + ")");
  h += row("objective", html_escape(r.objective) + ", knee " + dec("%g%%", 100 * r.knee));
  if (r.requested_global_batch) h += row("requested global batch", i64(r.requested_global_batch));
  h += row("tuning", strf("%d timed probes in ", r.probes) + dec("%.1f s", r.tuning_seconds));
  const ThroughputNoise& tn = r.throughput_noise;
  h += row("throughput noise",
           "step times' interquartile range " + dec("%.1f%%", 100 * tn.step_time_iqr_fraction) +
               " of their median (median over the probes); " +
               strf("%d round%s of re-measurement (%d probes)", tn.rounds, tn.rounds == 1 ? "" : "s", tn.remeasured) +
               (tn.rounds ? ", rounds disagreeing by " + dec("%.1f%%", 100 * tn.round_to_round) : std::string()) +
               "; " + (tn.settled ? "settled" : "not settled: the budget of rounds ran out") +
               (tn.reference ? "; noise-aware best: micro-batch " + i64(tn.reference) : std::string()));
  h += row("allocations refused by the budget", strf("%d", r.failed_allocations));
  h += "</table>\n";

  h += "<div class=\"choice\">\n<div class=\"big\">micro-batch <b>" + i64(ch.micro_batch) +
       "</b> &times; accumulation <b>" + i64(ch.accum) + "</b> &times; " +
       strf("%d rank%s", r.world, r.world == 1 ? "" : "s") + " = global batch <b>" +
       i64(ch.global_batch) + "</b></div>\n";
  h += "<p>learning rate <b>" + dec("%.4g", ch.lr) + "</b> &middot; scaling rule: " + html_escape(ch.lr_rule) +
       " &middot; warm-up " +
       (ch.warmup_fraction > 0 ? strf("%.3g%% of the steps (linear)", 100 * ch.warmup_fraction) : std::string("none")) +
       "</p>\n<p class=\"reason\">" + html_escape(ch.reason) + "</p>\n</div>\n";

  h += "<h2>Throughput</h2>\n" + throughput_plot(r);
  h += "<p class=\"note\">Timed probes only, each point over its rounds with its 95% interval (from the spread of "
       "the step times and the scatter between rounds). The dashed line is the knee threshold under the noise-aware "
       "best: the tuner takes the smallest micro-batch whose " + html_escape(r.objective) + " is within it with 95% "
       "confidence, or the best itself when the rounds cannot tell.</p>\n";
  h += "<h2>Memory</h2>\n" + memory_plot(r);
  h += "<p class=\"note\">Circles: the memory plan (hollow red: over the budget); squares: the peak measured while "
       "probing.</p>\n";
  const NoiseInterval& ni = r.noise_interval;
  if (!r.noise.empty() || !ni.reason.empty()) {
    h += "<h2>Gradient noise scale</h2>\n";
    if (ni.measurable)
      h += "<p>B<sub>simple</sub> = <b>" + si(r.noise_scale) + "</b>, 95% interval " + si(ni.low) + " to " +
           si(ni.high) + " (" + strf("%zu", r.noise.size()) + " steps, batches " + i64(r.noise_b_small) + " and " +
           i64(r.noise_b_big) + ")</p>\n";
    else
      h += "<p><b>gradient noise scale: not measurable yet</b>: " + html_escape(ni.reason) +
           (r.noise_b_big ? " (" + strf("%zu", r.noise.size()) + " steps, batches " + i64(r.noise_b_small) + " and " +
                                i64(r.noise_b_big) + ")"
                          : std::string()) +
           "</p>\n";
  }
  if (!r.noise.empty()) {
    h += noise_plot(r);
    h += "<p class=\"note\">The simple noise scale B<sub>simple</sub> = tr(&Sigma;) / |G|&sup2; compares the "
         "variance of per-sample gradients with the squared norm of the true gradient, estimated from the gradient "
         "norms at two batch sizes. Batches well below B<sub>simple</sub> use samples efficiently (twice the batch, "
         "nearly half the steps); well above it, returns diminish: more samples per step buy hardly fewer steps.";
    if (pos(r.noise_scale) && ch.global_batch > 0)
      h += " The chosen global batch of " + i64(ch.global_batch) + " is " +
           strf("%.2g", double(ch.global_batch) / r.noise_scale) + "&times; B<sub>simple</sub>.";
    h += "</p>\n";
  }

  bool predicted = false;
  for (auto& c : r.candidates) predicted = predicted || pos(c.predicted_samples_per_second);
  h += "<h2>Candidates</h2>\n<table>\n<tr><th>micro-batch</th><th>predicted memory</th><th>measured peak</th>"
       "<th>samples/s (95% interval)</th><th>vs the best (95% interval)</th><th>step-time IQR</th><th>probes</th>" +
       std::string(predicted ? "<th>predicted samples/s</th>" : "") +
       "<th>statistical efficiency</th><th>goodput</th><th>timed steps</th><th>probed</th><th>fits</th></tr>\n";
  for (auto& c : r.candidates) {
    std::string no = "&ndash;";
    auto range = [&](double v, double lo, double hi, const char* f) {
      return c.probed && pos(v) ? dec(f, v) + " (" + dec(f, lo) + "&ndash;" + dec(f, hi) + ")" : no;
    };
    h += c.micro_batch == ch.micro_batch ? "<tr class=\"chosen\">" : "<tr>";
    std::vector<std::string> cells = {
        i64(c.micro_batch), format_bytes(double(c.predicted_memory_bytes)), bytes_or_dash(c.measured_peak_bytes),
        range(c.samples_per_second, c.samples_per_second_low, c.samples_per_second_high, "%.0f"),
        range(c.ratio_to_best, c.ratio_to_best_low, c.ratio_to_best_high, "%.3f"),
        c.probed ? dec("%.1f%%", 100 * c.step_time_iqr_fraction) : no, strf("%zu", c.timings.size())};
    if (predicted) cells.push_back(pos(c.predicted_samples_per_second) ? si(c.predicted_samples_per_second) : no);
    for (const std::string& v : {dec("%.3f", c.statistical_efficiency), c.probed ? si(c.goodput) : no,
                                 strf("%d", c.timed_steps), std::string(c.probed ? "yes" : "no"),
                                 std::string(c.fits ? "yes" : "no")})
      cells.push_back(v);
    for (auto& v : cells) h += "<td>" + v + "</td>";
    h += "</tr>\n";
  }
  h += "</table>\n</body>\n</html>\n";
  return h;
}

TuneChoice read_tune_choice(const std::string& path, int64_t max_batch, int world) {
  const JsonRef doc = JsonRef::parse_file(path);
  const JsonValue& j = doc.value();
  auto number = [&](const JsonValue& c, const char* key, double fallback, bool required) {
    if (!c.contains(key)) {
      SAT_CHECK(!required, path, ": choice.", key, " is missing");
      return fallback;
    }
    SAT_CHECK(c[key].is_number(), path, ": choice.", key, " is not a number");
    return c[key].get<double>();
  };
  auto whole = [&](double x, const char* key, double lo, double hi) {
    SAT_CHECK(std::isfinite(x) && x == std::floor(x) && x >= lo && x <= hi, path, ": choice.", key, " ", x,
              " is not a whole number from ", lo, " to ", hi);
    return x;
  };
  auto text = [&](const JsonValue& c, const char* key, const char* fallback) {
    if (!c.contains(key)) return std::string(fallback);
    SAT_CHECK(c[key].is_string(), path, ": choice.", key, " is not a string");
    return c[key].get<std::string>();
  };
  SAT_CHECK(j.is_object() && j.contains("choice") && j["choice"].is_object(), path, ": no \"choice\" object");
  const JsonValue& c = j["choice"];
  TuneChoice t;
  t.micro_batch = int64_t(whole(number(c, "micro_batch", 0, true), "micro_batch", 1, double(max_batch)));
  t.accum = int64_t(whole(number(c, "accum", 0, true), "accum", 1, double(1 << 20)));
  const double lr = number(c, "lr", 0, true);
  SAT_CHECK(std::isfinite(lr) && lr > 0 && lr < 1e6, path, ": choice.lr ", lr, " is not a positive number");
  t.lr = float(lr);
  t.zero = int(whole(number(c, "zero", 0, false), "zero", 0, 3));  // caches written before the levers have none
  const std::string recompute = text(c, "recompute", "none");
  SAT_CHECK(recompute == "none" || recompute == "selective" || recompute == "full", path, ": choice.recompute '",
            recompute, "' is not none, selective or full");
  t.recompute = parse_recompute(recompute);
  t.reason = text(c, "reason", "");
  t.lr_rule = text(c, "lr_rule", "");
  t.warmup_fraction = number(c, "warmup_fraction", 0, true);
  SAT_CHECK(t.warmup_fraction >= 0 && t.warmup_fraction <= 1, path, ": choice.warmup_fraction ", t.warmup_fraction,
            " is not from 0 to 1");
  t.global_batch = t.micro_batch * t.accum * world;  // at most 2^24 * 2^20 * world: no overflow
  return t;
}

}  // namespace sat
