// SVG plots for saturate's self-contained HTML reports (tune.html, plan.html, report.html):
// axes with round ticks (linear, bytes, log2), a framed plot with series, bands, markers,
// reference lines and a legend. No scripts, fonts or styles from elsewhere.
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/alloc.h"
#include "core/text.h"

namespace sat::plot {

using Pts = std::vector<std::pair<double, double>>;

inline bool pos(double v) { return std::isfinite(v) && v > 0; }

// Three significant digits and an SI suffix: 1234 -> "1.23k"; a dash when not a number.
inline std::string si(double v) {
  if (!std::isfinite(v)) return "&ndash;";
  const char* suffix[] = {"", "k", "M", "G", "T"};
  int k = 0;
  while (std::fabs(v) >= 999.5 && k < 4) { v /= 1000; ++k; }
  return strf("%.3g%s", v, suffix[k]);
}

// printf of one number, a dash when it is not finite.
inline std::string dec(const char* f, double v) { return std::isfinite(v) ? strf(f, v) : "&ndash;"; }

// One plot axis. Linear axes run over round ticks (1-2-5 steps; byte axes in KiB, MiB, ...
// as the data needs); log2 axes put a tick on powers of two.
struct Axis {
  bool log2 = false, bytes = false;
  double lo = 0, hi = 1, step = 1;  // in axis space (log2 of the value on a log2 axis)
  double unit = 1;                  // bytes: the power of 1024 the ticks are written in
  double frac(double v) const { return ((log2 ? std::log2(v) : v) - lo) / (hi - lo); }
  std::vector<double> ticks() const {  // by index, so a step lost in rounding cannot loop
    std::vector<double> t;
    double first = std::ceil(lo / step - 1e-9);
    for (double a; t.size() < 50 && (a = (first + double(t.size())) * step) <= hi + 1e-9 * step;)
      t.push_back(log2 ? std::exp2(a) : a);
    return t;
  }
  std::string label(double v) const {
    if (std::fabs(v) < 1e-9 * step) return "0";
    if (!bytes) return log2 ? strf("%.0f", v) : si(v);
    const char* names[] = {" B", " KiB", " MiB", " GiB", " TiB"};
    return strf("%g", v / unit) + names[int(std::lround(std::log2(unit) / 10))];
  }
};

// A linear axis over [lo, hi] widened to whole ticks; an axis of training `steps` is widened
// by 3% on each side instead and never ticks between two steps.
inline Axis linear(double lo, double hi, bool bytes, bool steps = false) {
  if (!(hi > lo)) hi = lo + 1, lo = lo >= 1 ? lo - 1 : lo;
  Axis a;
  a.bytes = bytes;
  while (bytes && a.unit < 0x1p40 && std::max(std::fabs(lo), std::fabs(hi)) >= a.unit * 1024) a.unit *= 1024;
  double raw = (hi - lo) / a.unit / 5, e = std::pow(10, std::floor(std::log10(raw))), f = raw / e;  // 1-2-5 steps
  a.step = std::max(steps ? 1.0 : 0.0, (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * e * a.unit);
  a.lo = steps ? lo - 0.03 * (hi - lo) : std::floor(lo / a.step) * a.step;
  a.hi = steps ? hi + 0.03 * (hi - lo) : std::max(std::ceil(hi / a.step) * a.step, a.lo + a.step);
  return a;
}

inline Axis log2_axis(double lo, double hi) {  // lo, hi > 0
  Axis a;
  a.log2 = true;
  a.lo = std::floor(std::log2(lo));
  a.hi = std::ceil(std::log2(hi));
  if (a.hi - a.lo < 1) a.lo = std::max(0.0, a.lo - 1), a.hi = a.lo + 2;  // no micro-batch below 1
  a.step = std::max(1.0, std::ceil((a.hi - a.lo) / 12));
  a.lo -= 0.3, a.hi += 0.3;  // keeps the end points off the frame
  return a;
}

constexpr const char *kBlue = "#1f6fb4", *kGreen = "#2a9d4b", *kOrange = "#e07b00", *kRed = "#d62728",
                      *kGrey = "#777", *kPurple = "#7b3fa0";
// A white outline under the labels on lines, so they stay legible where they cross a curve.
constexpr const char* kHalo = "paint-order=\"stroke\" stroke=\"#fff\" stroke-width=\"3\"";

// An SVG plot: frame, grid, ticks and axis labels on construction; series, reference
// lines and legend entries on request. Points that are not finite, not positive in y, or
// not positive in x on a log2 axis are left out.
struct Plot {
  static constexpr double W = 720, H = 330, L = 72, R = 24, T = 46, B = 50;
  Axis x, y;
  std::string s;
  double legend_x = L;

  double px(double v) const { return L + x.frac(v) * (W - L - R); }
  double py(double v) const { return H - B - y.frac(v) * (H - T - B); }
  bool ok(double a, double b) const { return std::isfinite(a) && pos(b) && (!x.log2 || a > 0); }

  Plot(Axis xa, Axis ya, const std::string& xlabel, const std::string& ylabel) : x(std::move(xa)), y(std::move(ya)) {
    s = strf("<svg viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
            "font-size=\"12\" style=\"max-width:100%%;height:auto\">\n", W, H, W, H);
    s += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#fcfcfc\" stroke=\"#999\"/>\n", L, T,
             W - L - R, H - T - B);
    for (double t : x.ticks())
      s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e2e2e2\"/>"
               "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
               px(t), T, px(t), H - B, px(t), H - B + 16, x.label(t).c_str());
    for (double t : y.ticks())
      s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e2e2e2\"/>"
               "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
               L, py(t), W - R, py(t), L - 6, py(t) + 4, y.label(t).c_str());
    s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", L + (W - L - R) / 2, H - 12,
             html_escape(xlabel).c_str());
    s += strf("<text transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
             T + (H - T - B) / 2, html_escape(ylabel).c_str());
  }
  // A marker: o filled circle, h hollow circle, s square.
  static std::string marker(double X, double Y, const char* colour, char shape, double r = 4) {
    if (shape == 's')
      return strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>", X - r, Y - r, 2 * r,
                 2 * r, colour);
    return strf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"%s\" stroke=\"%s\" stroke-width=\"1.5\"/>", X, Y, r,
               shape == 'h' ? "#fff" : colour, colour);
  }
  // A legend entry: a line sample (unless `dash` is null), a marker (unless `shape` is 0) or both.
  void legend(const std::string& label, const char* colour, const char* dash, char shape = 'o') {
    if (dash)
      s += strf("<line x1=\"%.1f\" y1=\"14\" x2=\"%.1f\" y2=\"14\" stroke=\"%s\" stroke-width=\"2\" "
               "stroke-dasharray=\"%s\"/>", legend_x, legend_x + 22, colour, dash);
    if (shape) s += marker(legend_x + 11, 14, colour, shape);
    s += strf("<text x=\"%.1f\" y=\"18\">%s</text>\n", legend_x + 27, html_escape(label).c_str());
    legend_x += 42 + 6.6 * double(label.size());
  }
  void line(Pts p, const char* colour, const char* dash = "") {
    std::erase_if(p, [&](auto& q) { return !ok(q.first, q.second); });
    std::sort(p.begin(), p.end());
    if (p.size() < 2) return;
    s += strf("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"%s\" points=\"", colour,
             dash);
    for (auto& [a, b] : p) s += strf("%.1f,%.1f ", px(a), py(b));
    s += "\"/>\n";
  }
  // Error bars: x, low, high (left out unless 0 < low <= high, all finite).
  void bars(const std::vector<std::array<double, 3>>& b, const char* colour) {
    for (auto& [a, lo, hi] : b) {
      if (!ok(a, lo) || !pos(hi) || lo > hi) continue;
      const double X = px(a), Y0 = py(std::max(lo, y.lo)), Y1 = py(std::min(hi, y.hi));
      s += strf("<g><title>%s: %s to %s (95%%)</title><path d=\"M%.1f %.1fV%.1fM%.1f %.1fh8M%.1f %.1fh8\" "
               "stroke=\"%s\" stroke-width=\"1.3\" fill=\"none\"/></g>\n",
               x.label(a).c_str(), y.label(lo).c_str(), y.label(hi).c_str(), X, Y0, Y1, X - 4, Y0, X - 4, Y1,
               colour);
    }
  }
  // A shaded band between low and high along x (points not all positive are left out).
  void band(const std::vector<std::array<double, 3>>& b, const char* colour) {
    std::vector<std::array<double, 3>> in;
    for (auto& q : b)
      if (ok(q[0], q[1]) && pos(q[2]) && q[1] <= q[2]) in.push_back(q);
    if (in.size() < 2) return;
    s += strf("<polygon fill=\"%s\" fill-opacity=\"0.15\" stroke=\"none\" points=\"", colour);
    for (auto& q : in) s += strf("%.1f,%.1f ", px(q[0]), py(std::min(q[2], y.hi)));
    for (size_t k = in.size(); k-- > 0;) s += strf("%.1f,%.1f ", px(in[k][0]), py(std::max(in[k][1], y.lo)));
    s += "\"/>\n";
  }
  void dots(const Pts& p, const char* colour, char shape = 'o', double r = 4) {
    for (auto& [a, b] : p)
      if (ok(a, b))
        s += "<g><title>" + x.label(a) + ": " + y.label(b) + "</title>" + marker(px(a), py(b), colour, shape, r) +
             "</g>\n";
  }
  // The label (if any) sits at the left end of the frame, above the line or `below` it.
  void hline(double v, const char* colour, const char* dash, const std::string& label, bool below = false) {
    if (!std::isfinite(v) || y.frac(v) < 0 || y.frac(v) > 1) return;
    s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
             "stroke-dasharray=\"%s\"/><text x=\"%.1f\" y=\"%.1f\" fill=\"%s\" %s>%s</text>\n",
             L, py(v), W - R, py(v), colour, dash, L + 4, below ? py(v) + 15 : py(v) - 5, colour, kHalo,
             html_escape(label).c_str());
  }
  // row 0: the label above the frame; row 1: just inside its top edge.
  void vline(double v, const char* colour, const char* dash, const std::string& label, int row) {
    if (!ok(v, 1) || x.frac(v) < 0 || x.frac(v) > 1) return;
    double X = px(v);
    bool right = x.frac(v) > 0.75;
    s += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\" "
             "stroke-dasharray=\"%s\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"%s\" "
             "font-weight=\"bold\" %s>%s</text>\n",
             X, T, X, H - B, colour, dash, right ? X - 4 : X + 4, row ? T + 14 : T - 6, right ? "end" : "start",
             colour, kHalo, html_escape(label).c_str());
  }
  // Closes the plot, with `empty` written across it when nothing could be drawn.
  std::string done(bool drawn, const char* empty) const {
    return s + (drawn ? "" : strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#999\">%s</text>\n",
                                 L + (W - L - R) / 2, T + (H - T - B) / 2, empty)) + "</svg>\n";
  }
};

inline double top_of(const Pts& p, double other = 0) {
  double m = pos(other) ? other : 0;
  for (auto& q : p) if (pos(q.second)) m = std::max(m, q.second);
  return m;
}

}  // namespace sat::plot
