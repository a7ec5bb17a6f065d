// Room plot/: SVG line plots shared by training (the loss curve) and the studies; its own room so
// that both can use it while neither depends on the other. Uses core only.
//
// A small, dependency-free line-plot writer: series of (x, y) points on linear or logarithmic x,
// axes with round ticks, labels and a legend, as one standalone SVG element (it can be saved as a
// .svg file or inlined in an HTML page). Used by `lineage study` and the training loss curve.
#pragma once

#include <span>
#include <string>
#include <utility>
#include <vector>

namespace lineage::plot {

struct PlotSeries {
  std::string label;                              // the legend's text
  std::vector<std::pair<double, double>> points;  // (x, y) in drawing order; a non-finite y breaks the line
  bool dashed = false;
  std::string colour = {};  // any SVG colour ("#d62728"); empty: the palette's next one
};

struct PlotSpec {
  std::string title, x_label, y_label;
  bool log_x = false;
  double log_x_base = 10;  // with log_x: ticks at the integer powers of this base (2 or 10)
  // Axis ranges; a min not below its max means "from the data" (y then padded by 5 % each side).
  double x_min = 0, x_max = 0, y_min = 0, y_max = 0;
  int width = 720, height = 420;  // pixels, the legend included
  std::string id = "plot";        // prefix of the element ids: unique per page when several plots share one
};

// The plot as an <svg> element with its xmlns, no external assets. Series without a colour take the
// fixed palette's colours in order (dashed ones too). Contract: with log_x every x is > 0 and log_x_base > 1; the
// range is non-empty (at least one finite point or an explicit range).
std::string svg_line_plot(const PlotSpec& spec, std::span<const PlotSeries> series);

// Text for an XML / HTML element or attribute: & < > " escaped.
std::string xml_escape(const std::string& s);

}  // namespace lineage::plot
