// Hand-written SVG charts for the bench report: no dependencies, standalone SVG 1.1 documents
// (XML declaration, xmlns, version="1.1", width/height and a viewBox), text as <text> elements
// with every label XML-escaped, and a legend. Output is deterministic: the same input gives
// the same bytes (point jitter comes from the point's index, not a random source).
//
// Thread-safe (pure functions).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cuda_agent::bench {

// One column of the strip plot: a label ("L1") and the speedups (x, > 0) of its points.
struct SpeedupGroup {
  std::string label;
  std::vector<double> speedups;
};

// A strip plot with a box per group of log2(speedup): points jittered horizontally, a box from
// the first to the third quartile (linear interpolation) with a line at the median, whiskers
// from the minimum to the maximum, and a dashed line at 1.0x. The y axis is log2 with ticks at
// powers of two labelled in "x" units (0.5x, 1x, 2x). Speedups that are not finite or not > 0
// are skipped; a group without points shows "no data". Each column is labelled with its label
// and the number of points.
std::string speedup_strip_svg(const std::vector<SpeedupGroup>& groups, const std::string& title,
                              const std::string& y_label = "speedup vs eager (log scale)");

// One line of a line chart: (x, y) points, drawn in the order given.
struct Curve {
  std::string label;
  std::vector<std::pair<double, double>> points;
};

// A dotted vertical line at `x` with a label beside its top ("p = 1" on a fast_p chart).
struct XMarker {
  double x = 0;
  std::string label;
};

// A line chart of curves whose y values are fractions in [0, 1] (drawn as 0%..100%, ticks every
// 20%), over a linear x axis from 0 to the largest x; when every x is a whole number (steps) the
// x ticks are whole numbers too. Each point gets a marker with a <title> tooltip; the legend is a
// row under the title; `marker`, when given and inside the axis, draws its line. Colours follow
// the order of `curves`. Non-finite points are skipped.
std::string fraction_curves_svg(const std::vector<Curve>& curves, const std::string& title,
                                const std::string& x_label, const std::string& y_label,
                                const std::optional<XMarker>& marker = std::nullopt);

// A line chart of curves over linear axes, the y range fitted to the data and widened to whole
// ticks of a 1-2-5 step, labelled with that step's decimals (0.10, 0.12; 450, 500) (training
// curves: reward, KL, losses). Same conventions as fraction_curves_svg otherwise.
std::string line_chart_svg(const std::vector<Curve>& curves, const std::string& title, const std::string& x_label,
                           const std::string& y_label);

// `text` with &, <, >, " and ' replaced by entities and characters that XML 1.0 forbids
// (control characters other than tab, newline and carriage return) dropped.
std::string xml_escape(std::string_view text);

}  // namespace cuda_agent::bench
