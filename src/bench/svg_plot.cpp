#include "cuda_agent/bench/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

namespace cuda_agent::bench {
namespace {

constexpr double kWidth = 760, kHeight = 460;
constexpr double kLeft = 80, kRight = kWidth - 30, kTop = 80, kBottom = kHeight - 70;
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

std::string n2(double v) { return fmt::format("{:.2f}", v); }

std::string open_svg(const std::string& title) {
  std::string s = "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n";
  s += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0:g}\" height=\"{1:g}\" "
      "viewBox=\"0 0 {0:g} {1:g}\" font-family=\"sans-serif\" font-size=\"12\">\n",
      kWidth, kHeight);
  s += fmt::format("<title>{}</title>\n", xml_escape(title));
  s += fmt::format("<rect x=\"0\" y=\"0\" width=\"{:g}\" height=\"{:g}\" fill=\"#ffffff\"/>\n", kWidth, kHeight);
  s += fmt::format("<text x=\"{:g}\" y=\"28\" text-anchor=\"middle\" font-size=\"16\" font-weight=\"bold\">{}</text>\n",
                   kWidth / 2, xml_escape(title));
  return s;
}

std::string text(double x, double y, const std::string& body, const char* anchor = "middle", const char* extra = "") {
  return fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"{}\"{}>{}</text>\n", n2(x), n2(y), anchor, extra,
                     xml_escape(body));
}

std::string line(double x1, double y1, double x2, double y2, const char* stroke, const char* extra = "") {
  return fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\"{}/>\n", n2(x1), n2(y1), n2(x2),
                     n2(y2), stroke, extra);
}

std::string y_axis_title(const std::string& label) {
  const double cy = (kTop + kBottom) / 2;
  return fmt::format("<text x=\"20\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 20 {0})\">{1}</text>\n",
                     n2(cy), xml_escape(label));
}

// Quantile by linear interpolation between sorted values (numpy's default).
double quantile(const std::vector<double>& sorted, double q) {
  const double pos = q * (sorted.size() - 1);
  const size_t i = static_cast<size_t>(std::floor(pos));
  if (i + 1 >= sorted.size()) return sorted.back();
  return sorted[i] + (pos - i) * (sorted[i + 1] - sorted[i]);
}

std::string power_of_two_label(int k) { return fmt::format("{:g}x", std::ldexp(1.0, k)); }

double nice_step(double range, int max_ticks) {
  for (double decade = 1e-3; decade < 1e12; decade *= 10)
    for (double m : {1.0, 2.0, 5.0})
      if (range / (m * decade) <= max_ticks) return m * decade;
  return range;
}

}  // namespace

std::string xml_escape(std::string_view t) {
  std::string out;
  out.reserve(t.size());
  for (char c : t) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        if (u < 0x20 && c != '\t' && c != '\n' && c != '\r') break;  // not allowed in XML 1.0
        out += c;
    }
  }
  return out;
}

std::string speedup_strip_svg(const std::vector<SpeedupGroup>& groups, const std::string& title,
                              const std::string& y_label) {
  // log2 of the usable speedups of each group, and the range they span (1.0x always inside).
  std::vector<std::vector<double>> logs(groups.size());
  double lo = -1, hi = 1;
  for (size_t g = 0; g < groups.size(); ++g)
    for (double s : groups[g].speedups)
      if (std::isfinite(s) && s > 0) {
        const double v = std::clamp(std::log2(s), -60.0, 60.0);
        logs[g].push_back(v);
        lo = std::min(lo, v), hi = std::max(hi, v);
      }
  const int k_lo = static_cast<int>(std::floor(lo)), k_hi = static_cast<int>(std::ceil(hi));
  const double y_lo = k_lo, y_hi = k_hi;
  auto ymap = [&](double v) { return kBottom - (v - y_lo) / (y_hi - y_lo) * (kBottom - kTop); };

  std::string s = open_svg(title);
  // Legend, in one row under the title.
  double lx = kLeft;
  s += fmt::format("<circle cx=\"{}\" cy=\"50\" r=\"4\" fill=\"{}\" fill-opacity=\"0.75\"/>\n", n2(lx + 5), kPalette[0]);
  s += text(lx + 14, 54, "correct result", "start");
  lx += 120;
  s += fmt::format("<rect x=\"{}\" y=\"43\" width=\"14\" height=\"14\" fill=\"#dbe9f6\" stroke=\"#555555\"/>\n", n2(lx));
  s += line(lx, 50, lx + 14, 50, "#222222", " stroke-width=\"2\"");
  s += text(lx + 20, 54, "quartiles (box), median (line)", "start");
  lx += 205;
  s += line(lx, 50, lx + 18, 50, "#555555");
  s += text(lx + 24, 54, "min to max (whiskers)", "start");
  lx += 170;
  s += line(lx, 50, lx + 24, 50, "#d62728", " stroke-dasharray=\"6 4\" stroke-width=\"1.5\"");
  s += text(lx + 30, 54, "1.0x (same as eager)", "start");

  // Axes, grid and ticks in "x" units.
  const int step = std::max(1, static_cast<int>(std::ceil((k_hi - k_lo) / 8.0)));
  for (int k = k_lo; k <= k_hi; ++k) {
    if ((k - k_lo) % step != 0 && k != 0) continue;
    const double y = ymap(k);
    s += line(kLeft, y, kRight, y, "#e5e5e5");
    s += line(kLeft - 5, y, kLeft, y, "#333333");
    s += text(kLeft - 8, y + 4, power_of_two_label(k), "end");
  }
  s += line(kLeft, kTop, kLeft, kBottom, "#333333");
  s += line(kLeft, kBottom, kRight, kBottom, "#333333");
  s += y_axis_title(y_label);
  s += text((kLeft + kRight) / 2, kHeight - 18, "level");

  const size_t n = std::max<size_t>(groups.size(), 1);
  const double cw = (kRight - kLeft) / n;
  const double bw = std::min(cw * 0.5, 120.0);
  if (groups.empty()) s += text((kLeft + kRight) / 2, (kTop + kBottom) / 2, "no data", "middle", " fill=\"#777777\"");
  for (size_t g = 0; g < groups.size(); ++g) {
    const double cx = kLeft + cw * (g + 0.5);
    s += text(cx, kBottom + 20, fmt::format("{} (n={})", groups[g].label, logs[g].size()));
    if (logs[g].empty()) {
      s += text(cx, (kTop + kBottom) / 2, "no data", "middle", " fill=\"#777777\"");
      continue;
    }
    std::vector<double> sorted = logs[g];
    std::sort(sorted.begin(), sorted.end());
    const double q1 = quantile(sorted, 0.25), med = quantile(sorted, 0.5), q3 = quantile(sorted, 0.75);
    s += line(cx, ymap(sorted.front()), cx, ymap(q1), "#555555");
    s += line(cx, ymap(q3), cx, ymap(sorted.back()), "#555555");
    s += line(cx - bw / 4, ymap(sorted.front()), cx + bw / 4, ymap(sorted.front()), "#555555");
    s += line(cx - bw / 4, ymap(sorted.back()), cx + bw / 4, ymap(sorted.back()), "#555555");
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#dbe9f6\" stroke=\"#555555\"/>\n",
                     n2(cx - bw / 2), n2(ymap(q3)), n2(bw), n2(std::max(ymap(q1) - ymap(q3), 0.5)));
    s += line(cx - bw / 2, ymap(med), cx + bw / 2, ymap(med), "#222222", " stroke-width=\"2\"");
    for (size_t j = 0; j < logs[g].size(); ++j) {
      // Deterministic jitter: the golden-ratio sequence spreads points evenly over the band.
      const double frac = std::fmod((j + 1) * 0.6180339887498949, 1.0) - 0.5;
      const double v = logs[g][j];
      s += fmt::format(
          "<circle cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"{}\" fill-opacity=\"0.75\"><title>{}</title></circle>\n",
          n2(cx + frac * bw * 0.9), n2(ymap(v)), kPalette[0], xml_escape(fmt::format("{:.3g}x", std::exp2(v))));
    }
  }
  s += line(kLeft, ymap(0), kRight, ymap(0), "#d62728", " stroke-dasharray=\"6 4\" stroke-width=\"1.5\"");
  s += "</svg>\n";
  return s;
}

namespace {

// The y axis of a line chart: fractions (0%..100%, values clamped) or a range fitted to the data
// and widened to whole ticks.
struct YAxis {
  bool fraction = true;
  double lo = 0, hi = 1, step = 0.2;
};

// Decimals that show a tick step exactly: 0.05 -> 2, 0.2 -> 1, 5 -> 0.
int decimals_for(double step) { return std::max(0, static_cast<int>(std::ceil(-std::log10(step) - 1e-9))); }

// "0.0984" on a 0.02 step reads "0.10"; trailing zeros of one step's decimals stay (0.10, 0.12).
std::string tick_label(double v, double step) {
  if (std::fabs(v) < step * 1e-6) v = 0;  // no "-0.00"
  return fmt::format("{:.{}f}", v, decimals_for(step));
}

std::string curves_svg(const std::vector<Curve>& curves, const std::string& title, const std::string& x_label,
                       const std::string& y_label, const YAxis& axis, const std::optional<XMarker>& marker) {
  double x_max = 0;
  bool whole_x = true;  // steps, counts: ticks at whole numbers only
  for (const Curve& c : curves)
    for (const auto& [x, y] : c.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        x_max = std::max(x_max, x);
        whole_x = whole_x && x == std::round(x);
      }
  if (x_max <= 0) x_max = 1;
  auto xmap = [&](double x) { return kLeft + x / x_max * (kRight - kLeft); };
  auto ymap = [&](double y) {
    return kBottom - std::clamp((y - axis.lo) / (axis.hi - axis.lo), 0.0, 1.0) * (kBottom - kTop);
  };

  std::string s = open_svg(title);
  const int y_ticks = static_cast<int>(std::lround((axis.hi - axis.lo) / axis.step));
  for (int i = 0; i <= y_ticks; ++i) {
    const double v = axis.lo + axis.step * i;
    const double y = ymap(v);
    s += line(kLeft, y, kRight, y, "#e5e5e5");
    s += line(kLeft - 5, y, kLeft, y, "#333333");
    s += text(kLeft - 8, y + 4, axis.fraction ? fmt::format("{:g}%", std::round(v * 1000) / 10) : tick_label(v, axis.step),
              "end");
  }
  const double step = whole_x ? std::max(1.0, nice_step(x_max, 10)) : nice_step(x_max, 10);
  for (int i = 0; i * step <= x_max * (1 + 1e-9); ++i) {
    const double x = xmap(i * step);
    s += line(x, kBottom, x, kBottom + 5, "#333333");
    s += text(x, kBottom + 20, fmt::format("{:g}", i * step));
  }
  s += line(kLeft, kTop, kLeft, kBottom, "#333333");
  s += line(kLeft, kBottom, kRight, kBottom, "#333333");
  if (marker && marker->x > 0 && marker->x < x_max) {
    s += line(xmap(marker->x), kTop, xmap(marker->x), kBottom, "#888888", " stroke-dasharray=\"2 3\"");
    s += text(xmap(marker->x) + 4, kTop + 12, marker->label, "start", " fill=\"#666666\"");
  }
  s += y_axis_title(y_label);
  s += text((kLeft + kRight) / 2, kHeight - 18, x_label);

  for (size_t c = 0; c < curves.size(); ++c) {
    const char* color = kPalette[c % kPaletteSize];
    std::string pts;
    std::string markers;
    for (const auto& [x, y] : curves[c].points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      pts += fmt::format("{}{},{}", pts.empty() ? "" : " ", n2(xmap(x)), n2(ymap(y)));
      const std::string tip = axis.fraction ? fmt::format("{}: {} {:g}, {:.1f}%", curves[c].label, x_label, x, 100 * y)
                                            : fmt::format("{}: {} {:g}, {:.4g}", curves[c].label, x_label, x, y);
      markers += fmt::format("<circle cx=\"{}\" cy=\"{}\" r=\"3.5\" fill=\"{}\"><title>{}</title></circle>\n",
                             n2(xmap(x)), n2(ymap(y)), color, xml_escape(tip));
    }
    if (!pts.empty())
      s += fmt::format("<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", pts, color);
    s += markers;
  }
  // Legend: one row between the title and the plot, where it hides no data.
  double lx = kLeft;
  for (size_t c = 0; c < curves.size(); ++c) {
    s += line(lx, 50, lx + 24, 50, kPalette[c % kPaletteSize], " stroke-width=\"2\"");
    s += text(lx + 30, 54, curves[c].label, "start");
    lx += 30 + 7.0 * static_cast<double>(curves[c].label.size()) + 24;
  }
  if (curves.empty()) s += text((kLeft + kRight) / 2, (kTop + kBottom) / 2, "no data", "middle", " fill=\"#777777\"");
  s += "</svg>\n";
  return s;
}

}  // namespace

std::string fraction_curves_svg(const std::vector<Curve>& curves, const std::string& title, const std::string& x_label,
                                const std::string& y_label, const std::optional<XMarker>& marker) {
  return curves_svg(curves, title, x_label, y_label, YAxis{}, marker);
}

std::string line_chart_svg(const std::vector<Curve>& curves, const std::string& title, const std::string& x_label,
                           const std::string& y_label) {
  double lo = 0, hi = 0;
  bool any = false;
  for (const Curve& c : curves)
    for (const auto& [x, y] : c.points)
      if (std::isfinite(x) && std::isfinite(y)) {
        lo = any ? std::min(lo, y) : y;
        hi = any ? std::max(hi, y) : y;
        any = true;
      }
  if (!any) lo = 0, hi = 1;
  if (hi - lo < 1e-12) {  // a flat line: a band around it
    const double pad = std::max(std::fabs(lo) * 0.1, 1e-3);
    lo -= pad;
    hi += pad;
  }
  // Whole ticks of a 1-2-5 step, about five of them, around the data.
  YAxis axis{false, 0, 0, nice_step(hi - lo, 5)};
  axis.lo = std::floor(lo / axis.step + 1e-9) * axis.step;
  axis.hi = std::ceil(hi / axis.step - 1e-9) * axis.step;
  if (axis.hi <= axis.lo) axis.hi = axis.lo + axis.step;
  return curves_svg(curves, title, x_label, y_label, axis, std::nullopt);
}

}  // namespace cuda_agent::bench
