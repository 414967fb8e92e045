#include "profile/run_report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/io.h"
#include "core/plot.h"
#include "core/text.h"

namespace sat {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace plot;

json read_json(const fs::path& p) {
  std::error_code ec;
  SAT_CHECK(fs::exists(p, ec), "saturate report: ", p.string(), " not found (expected a run's --out directory)");
  const std::string text = read_input_file("saturate report", p.string());
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    fail("saturate report: ", p.string(), " is not valid JSON: ", e.what());
  }
}

double num(const json& j, const char* key, double dflt = NAN) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : dflt;
}

struct Metrics {
  Pts loss, rate;  // per step
  Pts val_loss;    // the steps evaluated during training (--eval-every)
};

Metrics read_metrics(const fs::path& p) {
  std::error_code ec;
  SAT_CHECK(fs::exists(p, ec), "saturate report: ", p.string(), " not found (expected a run's --out directory)");
  std::istringstream f(read_input_file("saturate report", p.string()));
  Metrics m;
  int64_t line_no = 0;
  for (std::string line; std::getline(f, line);) {
    ++line_no;
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    SAT_CHECK(!j.is_discarded() && j.is_object(), "saturate report: ", p.string(), " line ", line_no,
              " is not a JSON object");
    const double step = num(j, "step");
    if (!std::isfinite(step)) continue;
    m.loss.push_back({step, num(j, "loss")});
    m.rate.push_back({step, num(j, "samples_per_second")});
    if (j.contains("val_loss")) m.val_loss.push_back({step, num(j, "val_loss")});
  }
  return m;
}

// ---- traces --------------------------------------------------------------------------

struct Span {
  double t0, t1;
  std::string name, what;  // what: the action ("0F3") or the collective's group
};

// One rank's traced step: its schedule's actions, its collectives, its memory in use.
struct RankStep {
  int rank = 0;
  double t0 = 0, t1 = 0;  // the ProfilerStep span (seconds)
  std::vector<Span> actions, comm;
  Pts memory;  // (seconds, bytes allocated)
  double reserved = 0, peak = 0;
};

// The ranks' traces of step `step` (the first step every file set has when step < 0).
struct Traces {
  int64_t step = -1;
  std::vector<RankStep> ranks;
  std::string problem;  // why there is no timeline, when there is none
};

std::vector<json> trace_files(const fs::path& dir, std::string& problem) {
  std::vector<json> out;
  std::error_code ec;
  std::vector<fs::path> paths;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().string().ends_with(".pt.trace.json")) paths.push_back(e.path());
  if (ec) problem = "the trace directory " + dir.string() + " cannot be read: " + ec.message();
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    json j = json::parse(read_input_file("saturate report", p.string()), nullptr, false);
    if (j.is_discarded() || !j.contains("traceEvents")) {
      problem = p.string() + " is not a trace file";
      continue;
    }
    out.push_back(std::move(j));
  }
  if (out.empty() && problem.empty()) problem = "no trace files in " + dir.string();
  return out;
}

// The step's events of one file, or nothing when the file does not hold that step.
bool rank_step(const json& file, int64_t step, RankStep& r) {
  const std::string name = strf("ProfilerStep#%lld", (long long)step);
  std::map<int, std::string> tracks;
  for (const json& e : file["traceEvents"])
    if (e.value("ph", "") == "M" && e.value("name", "") == "thread_name") tracks[e.value("tid", 0)] = e["args"].value("name", "");
  bool found = false;
  for (const json& e : file["traceEvents"])
    if (e.value("ph", "") == "X" && e.value("name", "") == name) {
      r.t0 = num(e, "ts") * 1e-6, r.t1 = r.t0 + num(e, "dur") * 1e-6, found = true;
    }
  if (!found) return false;
  r.rank = file.contains("distributedInfo") ? file["distributedInfo"].value("rank", 0) : 0;
  for (const json& e : file["traceEvents"]) {
    const double t = num(e, "ts") * 1e-6;
    if (!(t >= r.t0 && t <= r.t1)) continue;
    const std::string ph = e.value("ph", ""), track = tracks[e.value("tid", 0)];
    const json args = e.value("args", json::object());
    if (ph == "X" && args.contains("action")) {
      r.actions.push_back({t, t + num(e, "dur") * 1e-6, e.value("name", ""), args.value("action", "")});
    } else if (ph == "X" && track.starts_with("comm ")) {
      r.comm.push_back({t, t + num(e, "dur") * 1e-6, e.value("name", ""), track.substr(5)});
    } else if (ph == "i" && e.value("name", "") == "[memory]") {
      r.memory.push_back({t, num(args, "Total Allocated")});
      r.reserved = std::max(r.reserved, num(args, "Total Reserved", 0));
      r.peak = std::max(r.peak, num(args, "Total Allocated", 0));
    }
  }
  return true;
}

int64_t first_step(const json& file) {
  int64_t best = -1;
  for (const json& e : file["traceEvents"]) {
    const std::string n = e.value("name", "");
    if (e.value("ph", "") == "X" && n.starts_with("ProfilerStep#")) {
      const int64_t s = std::atoll(n.c_str() + 13);
      if (best < 0 || s < best) best = s;
    }
  }
  return best;
}

Traces read_traces(const fs::path& dir) {
  Traces t;
  const std::vector<json> files = trace_files(dir, t.problem);
  if (files.empty()) return t;
  // The earliest step of each file; the latest of those is in every rank's first window.
  for (const json& f : files) t.step = std::max(t.step, first_step(f));
  std::map<int, RankStep> by_rank;
  for (const json& f : files) {
    RankStep r;
    if (rank_step(f, t.step, r) && !by_rank.count(r.rank)) by_rank[r.rank] = std::move(r);
  }
  for (auto& [k, r] : by_rank) t.ranks.push_back(std::move(r));
  if (t.ranks.empty()) t.problem = strf("no trace file holds ProfilerStep#%lld", (long long)t.step);
  return t;
}

// ---- pictures ------------------------------------------------------------------------

const char* action_colour(const std::string& action) {
  if (action.find("SEND") != std::string::npos || action.find("RECV") != std::string::npos) return "#b8b8b8";
  if (action.find('F') != std::string::npos && action.find("GRAD") == std::string::npos) return kBlue;
  if (action.find('B') != std::string::npos) return kGreen;
  if (action == "REDUCE_GRAD") return kOrange;
  return kPurple;  // OPTIMIZER
}

std::string rect(double x, double y, double w, double h, const char* fill, const std::string& title) {
  return strf("<g><title>%s</title><rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"/></g>\n",
              html_escape(title).c_str(), x, y, std::max(w, 0.6), h, fill);
}

// Every rank's step on one time axis (ms from the earliest start): a row of its actions
// and, under it, a thinner row of its collectives and transfers.
std::string timeline_svg(const Traces& t) {
  constexpr double W = 720, L = 70, R = 16, T = 30, row = 34, B = 44;
  double t0 = INFINITY, t1 = -INFINITY;
  for (const RankStep& r : t.ranks) t0 = std::min(t0, r.t0), t1 = std::max(t1, r.t1);
  const Axis x = linear(0, (t1 - t0) * 1e3, false);
  auto px = [&](double s) { return L + x.frac((s - t0) * 1e3) * (W - L - R); };
  const double H = T + row * double(t.ranks.size()) + B;
  std::string s = strf("<svg viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                       "font-size=\"12\" style=\"max-width:100%%;height:auto\">\n", W, H, W, H);
  for (double v : x.ticks()) {
    const double X = L + x.frac(v) * (W - L - R);
    s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e2e2e2\"/><text x=\"%.1f\" y=\"%.1f\" "
              "text-anchor=\"middle\">%s</text>\n", X, T - 4, X, H - B + 4, X, H - B + 20, x.label(v).c_str());
  }
  s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">ms from the step's start</text>\n", L + (W - L - R) / 2,
            H - 8);
  for (size_t k = 0; k < t.ranks.size(); ++k) {
    const RankStep& r = t.ranks[k];
    const double y = T + row * double(k);
    s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">rank %d</text>\n", L - 8, y + 16, r.rank);
    for (const Span& a : r.actions)
      s += rect(px(a.t0), y, px(a.t1) - px(a.t0), 20, action_colour(a.what),
                strf("%s: %.3f ms", a.what.c_str(), (a.t1 - a.t0) * 1e3));
    for (const Span& c : r.comm)
      s += rect(px(c.t0), y + 22, px(c.t1) - px(c.t0), 7, kRed,
                strf("%s (%s): %.3f ms", c.name.c_str(), c.what.c_str(), (c.t1 - c.t0) * 1e3));
  }
  double lx = L;
  for (auto [label, colour] : std::vector<std::pair<const char*, const char*>>{
           {"forward", kBlue}, {"backward", kGreen}, {"send/receive", "#b8b8b8"}, {"gradient reduction", kOrange},
           {"optimizer", kPurple}, {"collectives (thin row)", kRed}}) {
    s += strf("<rect x=\"%.1f\" y=\"6\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" y=\"16\">%s</text>\n",
              lx, colour, lx + 16, label);
    lx += 26 + 6.4 * double(std::string(label).size());
  }
  return s + "</svg>\n";
}

// The memory each rank's plan holds over the traced step, with the plan's total, the run's
// measured peak and the budget.
std::string memory_svg(const Traces& t, double measured_peak, double budget) {
  double t0 = INFINITY, t1 = -INFINITY, hi = std::max(measured_peak, budget);
  for (const RankStep& r : t.ranks) {
    t0 = std::min(t0, r.t0), t1 = std::max(t1, r.t1);
    hi = std::max({hi, r.reserved, r.peak});
  }
  Plot p(linear(0, (t1 - t0) * 1e3, false), linear(0, hi * 1.05, true), "ms from the step's start",
         "bytes in use (the plan's, at the real times)");
  const char* colours[] = {kBlue, kGreen, kOrange, kPurple, kRed, kGrey};
  bool drawn = false;
  for (size_t k = 0; k < t.ranks.size(); ++k) {
    const RankStep& r = t.ranks[k];
    Pts steps;  // a step function: each value holds until the next sample
    for (size_t i = 0; i < r.memory.size(); ++i) {
      const double x = (r.memory[i].first - t0) * 1e3;
      if (i) steps.push_back({x, r.memory[i - 1].second});
      steps.push_back({x, r.memory[i].second});
    }
    drawn |= steps.size() >= 2;
    p.line(steps, colours[k % 6]);
    p.legend(strf("rank %d", r.rank), colours[k % 6], "");
  }
  if (!t.ranks.empty()) p.hline(t.ranks[0].reserved, kGrey, "6 4", "the plan (rank 0)", true);
  if (measured_peak > 0) p.hline(measured_peak, kRed, "2 3", "measured peak (rank 0)");
  if (budget > 0) p.hline(budget, kOrange, "8 3", "memory budget");
  return p.done(drawn, "no memory records in the traced step");
}

// Every rank's mean step split by where its time went (summary.json's step_breakdown).
std::string breakdown_svg(const json& ranks) {
  static const std::pair<const char*, const char*> parts[] = {
      {"compute", kBlue},      {"tp_comm", kRed},   {"grad_sync", kOrange}, {"pipeline_wait", "#b8b8b8"},
      {"data", kGreen},        {"optimizer", kPurple}, {"other", "#dddddd"}};
  constexpr double W = 720, L = 70, R = 16, T = 30, row = 26, B = 44;
  double hi = 0;
  for (const json& k : ranks) hi = std::max(hi, num(k, "step_seconds", 0) * 1e3);
  const Axis x = linear(0, hi, false);
  const double H = T + row * double(ranks.size()) + B;
  std::string s = strf("<svg viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
                       "font-size=\"12\" style=\"max-width:100%%;height:auto\">\n", W, H, W, H);
  auto px = [&](double ms) { return L + x.frac(ms) * (W - L - R); };
  for (double v : x.ticks())
    s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e2e2e2\"/><text x=\"%.1f\" y=\"%.1f\" "
              "text-anchor=\"middle\">%s</text>\n", px(v), T - 4, px(v), H - B + 4, px(v), H - B + 20, x.label(v).c_str());
  s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">ms per step (mean of the measured steps)</text>\n",
            L + (W - L - R) / 2, H - 8);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const json& k = ranks[i];
    const json b = k.value("step_breakdown", json::object());
    const double y = T + row * double(i);
    s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">rank %d</text>\n", L - 8, y + 14, k.value("rank", 0));
    double at = 0;
    for (auto [key, colour] : parts) {
      const double ms = num(b, key, 0) * 1e3;
      if (ms <= 0) continue;
      s += rect(px(at), y, px(at + ms) - px(at), 18, colour, strf("rank %d %s: %.3f ms", k.value("rank", 0), key, ms));
      at += ms;
    }
  }
  double lx = L;
  for (auto [key, colour] : parts) {
    s += strf("<rect x=\"%.1f\" y=\"6\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" y=\"16\">%s</text>\n",
              lx, colour, lx + 16, key);
    lx += 26 + 6.4 * double(std::string(key).size());
  }
  return s + "</svg>\n";
}

std::string run_plots(const Metrics& m) {
  double hi_loss = top_of(m.loss), hi_rate = top_of(m.rate);
  const double first = m.loss.empty() ? 0 : m.loss.front().first, last = m.loss.empty() ? 1 : m.loss.back().first;
  const bool val = !m.val_loss.empty();
  hi_loss = top_of(m.val_loss, hi_loss);
  Plot loss(linear(first, last, false, true), linear(0, hi_loss * 1.05, false), "step", val ? "loss" : "training loss");
  loss.line(m.loss, kBlue);
  if (val) {  // the validation curve on the same axes, each evaluation marked
    loss.line(m.val_loss, kOrange);
    loss.dots(m.val_loss, kOrange, 'o', 3.5);
    loss.legend("training loss", kBlue, "", 0);
    loss.legend("validation loss (--eval-every)", kOrange, "", 'o');
  }
  Plot rate(linear(first, last, false, true), linear(0, hi_rate * 1.05, false), "step", "samples per second");
  rate.line(m.rate, kGreen);
  return "<h2>Loss</h2>\n" + loss.done(m.loss.size() >= 2, "fewer than two steps") + "<h2>Throughput</h2>\n" +
         rate.done(m.rate.size() >= 2, "fewer than two steps");
}

const char* kStyle = R"(
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:780px;margin:2em auto;padding:0 1em}
body{color:#222;line-height:1.45}h1{font-size:1.5em;margin-bottom:.3em}h2{font-size:1.15em;margin-top:1.8em}
table.meta td{text-align:left;border:none;padding:1px 12px 1px 0}table.meta td:first-child{color:#666}
.note{color:#555;font-size:.92em}
)";

// summary.json's "validation": the last evaluation, and the best one kept (--keep-best).
std::string validation_text(const json& v) {
  std::string t = strf("every %d steps", v.value("every", 0));
  if (v.contains("last") && v["last"].is_object()) {
    const json& l = v["last"];
    t += strf(", val_loss %.4f at step %d", num(l, "val_loss"), l.value("step", 0));
    if (l.contains("val_accuracy")) t += strf(" (accuracy %.2f%%)", 100 * num(l, "val_accuracy"));
  }
  if (v.contains("best") && v["best"].is_object() && v["best"].value("step", json()).is_number())
    t += strf("; best %s %.4f at step %d (its checkpoint: %s/)", v["best"].value("metric", "").c_str(),
              num(v["best"], "value"), v["best"].value("step", 0),
              fs::path(v["best"].value("dir", "")).filename().string().c_str());
  return t;
}

std::string meta_table(const json& s) {
  auto row = [](const std::string& k, const std::string& v) {
    return "<tr><td>" + html_escape(k) + "</td><td>" + html_escape(v) + "</td></tr>\n";
  };
  const json lay = s.value("layout", json::object());
  std::string h = "<table class=\"meta\">\n";
  h += row("model", s.value("model", "?") + strf(" (%.4g parameters)", num(s, "parameters", 0)));
  h += row("data", s.value("data", "?"));
  h += row("layout", strf("%d rank(s): dp %d x tp %d x pp %d", s.value("world_size", 1), lay.value("dp", 1),
                          lay.value("tp", 1), lay.value("pp", 1)) +
                         (lay.value("cp", 1) > 1 ? strf(" x cp %d", lay.value("cp", 1)) : "") +
                         (lay.value("ep", 1) > 1 ? strf(", experts over %d ranks", lay.value("ep", 1)) : "") +
                         (lay.value("pp", 1) > 1 ? ", " + s.value("pp_schedule", "") + " schedule" : ""));
  h += row("batch", strf("micro-batch %d x %d accumulation, global %d", s.value("batch", 0), s.value("accum", 0),
                         s.value("global_batch", 0)));
  h += row("steps", strf("%d, %.1f samples/s (warm-up excluded)", s.value("steps", 0), num(s, "samples_per_second", 0)));
  h += row("loss", strf("%.4f at the end", num(s, "final_train_loss")) +
                       (s.contains("test_accuracy") ? strf(", test accuracy %.2f%%", 100 * num(s, "test_accuracy")) : ""));
  if (s.contains("validation")) h += row("validation", validation_text(s["validation"]));
  h += row("memory", "predicted " + format_bytes(num(s, "predicted_memory_bytes", 0)) + ", measured peak " +
                         format_bytes(num(s, "peak_memory_bytes", 0)) + " (rank 0)");
  if (s.contains("ranks") && s["ranks"].is_array() && !s["ranks"].empty()) {
    const json& r0 = s["ranks"][0];
    const double step = num(r0, "step_seconds", 0), data = num(r0.value("step_breakdown", json::object()), "data", 0);
    if (step > 0)
      h += row("data wait", strf("%.2f%% of the step waiting for the next batch (rank 0, warm-up excluded)",
                                 100 * data / step));
  }
  return h + "</table>\n";
}

}  // namespace

std::string run_report_html(const std::string& run_dir) {
  const fs::path dir(run_dir);
  SAT_CHECK(fs::is_directory(dir), "saturate report: ", run_dir, " is not a directory (expected a run's --out directory)");
  const json s = read_json(dir / "summary.json");
  const std::string status = s.is_object() ? s.value("status", "complete") : "";
  SAT_CHECK(!s.is_object() || status == "complete", "saturate report: ", (dir / "summary.json").string(),
            " is the mark of a run that did not finish (status ", status, "): its metrics.jsonl holds the steps it did");
  SAT_CHECK(s.is_object() && s.contains("model") && s.contains("ranks"), "saturate report: ",
            (dir / "summary.json").string(), " is not a run's summary (no model or ranks)");
  const Metrics m = read_metrics(dir / "metrics.jsonl");
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>saturate run: " +
                  html_escape(s.value("model", "")) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  h += "<h1>Training run: " + html_escape(s.value("model", "")) + "</h1>\n" + meta_table(s);
  h += run_plots(m);
  h += "<h2>Where the step time goes, per rank</h2>\n" + breakdown_svg(s["ranks"]);
  h += "<p class=\"note\">compute: forward and backward; tp_comm: the tensor-parallel layers' collectives (apart "
       "with --profile); grad_sync: the gradient reduction's exposed part; pipeline_wait: waiting for other stages "
       "(bubble and transfers); data: the loader; other: the rest of the step.</p>\n";
  if (s.contains("trace_dir")) {
    const Traces t = read_traces(s.value("trace_dir", ""));
    if (t.ranks.empty()) {
      h += "<h2>One traced step</h2>\n<p class=\"note\">" + html_escape(t.problem) + "</p>\n";
    } else {
      h += strf("<h2>One traced step (ProfilerStep#%lld), every rank</h2>\n", (long long)t.step) + timeline_svg(t);
      h += "<h2>Memory over that step</h2>\n" +
           memory_svg(t, num(s, "peak_memory_bytes", 0), num(s, "memory_budget_bytes", 0));
      h += "<p class=\"note\">The bytes the memory plan holds at each layer call and schedule action, at the times "
           "they ran: persistent state plus the step's buffers live then.</p>\n";
    }
  } else {
    h += "<p class=\"note\">No traces: run with --trace DIR for a timeline of one step and memory over it.</p>\n";
  }
  return h + "</body>\n</html>\n";
}

std::string write_run_report(const std::string& run_dir) {
  const std::string html = run_report_html(run_dir);
  const std::string path = (fs::path(run_dir) / "report.html").string();
  write_file_atomic("saturate report", path, html);
  return path;
}

}  // namespace sat
