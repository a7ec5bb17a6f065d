#include "lineage/plot/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "lineage/core/error.h"

namespace lineage::plot {

namespace {

// Tableau's ten colours (matplotlib's default cycle): distinct, and readable on white.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr double kLeft = 64, kTop = 34, kBottom = 48, kLegendWidth = 220;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

std::string tick_label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

// Round ticks (1, 2 or 5 times a power of ten) covering [lo, hi], about five of them.
std::vector<double> linear_ticks(double lo, double hi) {
  const double raw = (hi - lo) / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5 ? mag : raw / mag < 3.5 ? 2 * mag : raw / mag < 7.5 ? 5 * mag : 10 * mag;
  std::vector<double> t;
  for (double x = std::ceil(lo / step - 1e-9) * step; x <= hi + step * 1e-9; x += step) t.push_back(x);
  return t;
}

std::vector<double> log_ticks(double lo, double hi, double base) {
  std::vector<double> t;
  const double l = std::log(base);
  for (double e = std::ceil(std::log(lo) / l - 1e-9); e <= std::log(hi) / l + 1e-9; e += 1) t.push_back(std::pow(base, e));
  return t;
}

struct Axis {
  double lo, hi, px0, px1;
  bool log;
  double map(double v) const {
    const double a = log ? std::log(v) : v, b0 = log ? std::log(lo) : lo, b1 = log ? std::log(hi) : hi;
    return px0 + (a - b0) / (b1 - b0) * (px1 - px0);
  }
};

// The data's range of x or y over finite points (y only where finite), as [lo, hi].
std::pair<double, double> data_range(std::span<const PlotSeries> series, bool want_x) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& s : series)
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      const double v = want_x ? x : y;
      lo = std::min(lo, v), hi = std::max(hi, v);
    }
  return {lo, hi};
}

Axis make_x(const PlotSpec& s, std::span<const PlotSeries> series, double px0, double px1) {
  auto [lo, hi] = s.x_min < s.x_max ? std::pair{s.x_min, s.x_max} : data_range(series, true);
  LINEAGE_CHECK(std::isfinite(lo) && std::isfinite(hi), "svg_line_plot: no finite point and no x range");
  LINEAGE_CHECK(!s.log_x || (lo > 0 && s.log_x_base > 1), "svg_line_plot: log x needs x > 0, found ", lo);
  if (lo == hi) lo = s.log_x ? lo / 2 : lo - 1, hi = s.log_x ? hi * 2 : hi + 1;
  return {lo, hi, px0, px1, s.log_x};
}

Axis make_y(const PlotSpec& s, std::span<const PlotSeries> series, double px0, double px1) {
  auto [lo, hi] = s.y_min < s.y_max ? std::pair{s.y_min, s.y_max} : data_range(series, false);
  LINEAGE_CHECK(std::isfinite(lo) && std::isfinite(hi), "svg_line_plot: no finite point and no y range");
  if (!(s.y_min < s.y_max)) {
    const double pad = lo == hi ? std::max(1.0, std::abs(lo)) * 0.05 : (hi - lo) * 0.05;
    lo -= pad, hi += pad;
  }
  return {lo, hi, px0, px1, false};  // px0 is the bottom: SVG's y grows downwards
}

void axes(std::string& o, const PlotSpec& s, const Axis& x, const Axis& y) {
  const double bottom = y.px0, top = y.px1, left = x.px0, right = x.px1;
  o += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(right - left) + "\" height=\"" +
       num(bottom - top) + "\" fill=\"none\" stroke=\"#444\"/>\n";
  const auto xt = s.log_x ? log_ticks(x.lo, x.hi, s.log_x_base) : linear_ticks(x.lo, x.hi);
  for (double t : xt) {
    const double p = x.map(t);
    o += "<line x1=\"" + num(p) + "\" y1=\"" + num(top) + "\" x2=\"" + num(p) + "\" y2=\"" + num(bottom) +
         "\" stroke=\"#ddd\"/>\n<text x=\"" + num(p) + "\" y=\"" + num(bottom + 16) + "\" text-anchor=\"middle\">" +
         tick_label(t) + "</text>\n";
  }
  for (double t : linear_ticks(y.lo, y.hi)) {
    const double p = y.map(t);
    o += "<line x1=\"" + num(left) + "\" y1=\"" + num(p) + "\" x2=\"" + num(right) + "\" y2=\"" + num(p) +
         "\" stroke=\"#ddd\"/>\n<text x=\"" + num(left - 6) + "\" y=\"" + num(p + 4) + "\" text-anchor=\"end\">" +
         tick_label(t) + "</text>\n";
  }
  o += "<text x=\"" + num((left + right) / 2) + "\" y=\"" + num(bottom + 36) + "\" text-anchor=\"middle\">" +
       xml_escape(s.x_label) + "</text>\n";
  o += "<text transform=\"translate(16," + num((top + bottom) / 2) + ") rotate(-90)\" text-anchor=\"middle\">" +
       xml_escape(s.y_label) + "</text>\n";
  o += "<text x=\"" + num((left + right) / 2) + "\" y=\"20\" text-anchor=\"middle\" font-weight=\"bold\">" +
       xml_escape(s.title) + "</text>\n";
}

// One polyline per unbroken run of finite points inside the plotted x range, clipped to the frame.
void lines(std::string& o, const PlotSeries& s, const std::string& colour, const Axis& x, const Axis& y,
           const std::string& clip_id) {
  const std::string style = "fill=\"none\" stroke=\"" + colour + "\" stroke-width=\"2\"" +
                            (s.dashed ? " stroke-dasharray=\"6 4\"" : "") + " clip-path=\"url(#" + clip_id + ")\"";
  std::string run;
  int n = 0;
  const auto flush = [&] {
    if (n == 1) o += "<circle cx=\"" + run.substr(0, run.find(',')) + "\" cy=\"" + run.substr(run.find(',') + 1) +
                     "\" r=\"2.5\" fill=\"" + colour + "\"/>\n";
    if (n > 1) o += "<polyline " + style + " points=\"" + run + "\"/>\n";
    run.clear(), n = 0;
  };
  for (const auto& [px, py] : s.points) {
    if (!std::isfinite(px) || !std::isfinite(py) || (x.log && px <= 0)) {
      flush();
      continue;
    }
    run += (n++ ? " " : "") + num(x.map(px)) + "," + num(y.map(py));
  }
  flush();
}

}  // namespace

std::string xml_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '&') r += "&amp;";
    else if (c == '<') r += "&lt;";
    else if (c == '>') r += "&gt;";
    else if (c == '"') r += "&quot;";
    else r += c;
  }
  return r;
}

std::string svg_line_plot(const PlotSpec& spec, std::span<const PlotSeries> series) {
  const double right = spec.width - kLegendWidth, bottom = spec.height - kBottom;
  const Axis x = make_x(spec, series, kLeft, right), y = make_y(spec, series, bottom, kTop);
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(spec.width) +
                  "\" height=\"" + std::to_string(spec.height) + "\" viewBox=\"0 0 " + std::to_string(spec.width) +
                  " " + std::to_string(spec.height) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const std::string clip_id = xml_escape(spec.id) + "-frame";
  o += "<defs><clipPath id=\"" + clip_id + "\"><rect x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" +
       num(right - kLeft) + "\" height=\"" + num(bottom - kTop) + "\"/></clipPath></defs>\n";
  axes(o, spec, x, y);
  for (size_t i = 0; i < series.size(); ++i) {
    const std::string colour = series[i].colour.empty() ? kPalette[i % std::size(kPalette)] : xml_escape(series[i].colour);
    lines(o, series[i], colour, x, y, clip_id);
    const double ly = kTop + 8 + 18 * double(i), lx = right + 14;
    o += "<line x1=\"" + num(lx) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(lx + 24) + "\" y2=\"" + num(ly) +
         "\" stroke=\"" + colour + "\" stroke-width=\"2\"" + (series[i].dashed ? " stroke-dasharray=\"6 4\"" : "") +
         "/>\n<text x=\"" + num(lx + 30) + "\" y=\"" + num(ly + 4) + "\">" + xml_escape(series[i].label) + "</text>\n";
  }
  return o + "</svg>\n";
}

}  // namespace lineage::plot
