#include "scaling_svg.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "flowfeed/trace.hpp"
#include "flowfeed/output.hpp"

namespace flowfeed::bench {

std::size_t knee_index(const std::vector<double>& y) {
  if (y.empty()) return 0;
  const double best = *std::max_element(y.begin(), y.end());
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (y[i] >= 0.95 * best) return i;
  }
  return 0;
}

namespace {

std::string num(double v) {
  return fmt::format("{:.1f}", v);
}

}  // namespace

void write_scaling_svg(const std::string& path, const std::vector<ScalingSeries>& series) {
  std::vector<std::string> sweeps, configs;
  for (const auto& s : series) {
    if (std::find(sweeps.begin(), sweeps.end(), s.sweep) == sweeps.end()) sweeps.push_back(s.sweep);
    if (std::find(configs.begin(), configs.end(), s.config) == configs.end()) {
      configs.push_back(s.config);
    }
  }
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
  constexpr double kPanelW = 420, kPanelH = 300, kLeft = 70, kTop = 50, kGap = 90;
  const double width = kLeft + sweeps.size() * (kPanelW + kGap);
  const double height = kTop + kPanelH + 110;
  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << num(width) << "\" height=\""
      << num(height) << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
      << "<title>flowfeed pipeline_bench scaling: batches/s vs prefetch_depth and load "
         "concurrency</title>\n"
      << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  for (std::size_t p = 0; p < sweeps.size(); ++p) {
    const double x0 = kLeft + p * (kPanelW + kGap), y0 = kTop;
    int xmax = 1;
    double ymax = 0;
    for (const auto& s : series) {
      if (s.sweep != sweeps[p]) continue;
      for (int v : s.x) xmax = std::max(xmax, v);
      for (double v : s.y) ymax = std::max(ymax, v);
    }
    ymax = ymax > 0 ? ymax * 1.1 : 1;
    const double lx = std::log2(static_cast<double>(xmax));
    auto px = [&](int x) {
      return x0 + (lx > 0 ? std::log2(static_cast<double>(x)) / lx : 0.5) * kPanelW;
    };
    auto py = [&](double y) { return y0 + kPanelH - y / ymax * kPanelH; };
    svg << "<g class=\"panel\">\n"
        << "<text x=\"" << num(x0 + kPanelW / 2) << "\" y=\"" << num(y0 - 20)
        << "\" text-anchor=\"middle\" font-size=\"14\">batches/s vs " << escape_svg(sweeps[p])
        << "</text>\n"
        << "<rect x=\"" << num(x0) << "\" y=\"" << num(y0) << "\" width=\"" << num(kPanelW)
        << "\" height=\"" << num(kPanelH) << "\" fill=\"none\" stroke=\"#444\"/>\n";
    for (int i = 0; i <= 4; ++i) {
      const double v = ymax * i / 4;
      svg << "<line x1=\"" << num(x0) << "\" x2=\"" << num(x0 + kPanelW) << "\" y1=\"" << num(py(v))
          << "\" y2=\"" << num(py(v)) << "\" stroke=\"#ddd\"/>\n"
          << "<text x=\"" << num(x0 - 6) << "\" y=\"" << num(py(v) + 4) << "\" text-anchor=\"end\">"
          << num(v).substr(0, num(v).size() - 2) << "</text>\n";
    }
    for (int x = 1; x <= xmax; x *= 2) {
      svg << "<text x=\"" << num(px(x)) << "\" y=\"" << num(y0 + kPanelH + 16)
          << "\" text-anchor=\"middle\">" << x << "</text>\n";
    }
    svg << "<text x=\"" << num(x0 + kPanelW / 2) << "\" y=\"" << num(y0 + kPanelH + 36)
        << "\" text-anchor=\"middle\">" << escape_svg(sweeps[p]) << " (log scale)</text>\n";
    for (const auto& s : series) {
      if (s.sweep != sweeps[p] || s.x.empty()) continue;
      const std::size_t ci = static_cast<std::size_t>(
          std::find(configs.begin(), configs.end(), s.config) - configs.begin());
      const char* color = colors[ci % 4];
      svg << "<polyline class=\"series\" data-config=\"" << escape_svg(s.config)
          << "\" fill=\"none\" stroke=\"" << color << "\" stroke-width=\"2\" points=\"";
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        svg << (i ? " " : "") << num(px(s.x[i])) << "," << num(py(s.y[i]));
      }
      svg << "\"/>\n";
      for (std::size_t i = 0; i < s.x.size(); ++i) {
        svg << "<circle cx=\"" << num(px(s.x[i])) << "\" cy=\"" << num(py(s.y[i]))
            << "\" r=\"3\" fill=\"" << color << "\"/>\n";
      }
      if (s.sweep == "prefetch_depth") {
        const std::size_t k = knee_index(s.y);
        svg << "<circle class=\"knee\" data-config=\"" << escape_svg(s.config) << "\" data-depth=\""
            << s.x[k] << "\" cx=\"" << num(px(s.x[k])) << "\" cy=\"" << num(py(s.y[k]))
            << "\" r=\"8\" fill=\"none\" stroke=\"black\" stroke-width=\"2\"/>\n"
            << "<text class=\"knee-label\" x=\"" << num(px(s.x[k]) + 10) << "\" y=\""
            << num(py(s.y[k]) + 16 + 14 * ci) << "\">knee: depth " << s.x[k] << "</text>\n";
      }
    }
    svg << "</g>\n";
  }
  // Legend.
  for (std::size_t ci = 0; ci < configs.size(); ++ci) {
    const double lx = kLeft + ci * 200, ly = kTop + kPanelH + 70;
    svg << "<line x1=\"" << num(lx) << "\" x2=\"" << num(lx + 30) << "\" y1=\"" << num(ly)
        << "\" y2=\"" << num(ly) << "\" stroke=\"" << colors[ci % 4] << "\" stroke-width=\"2\"/>\n"
        << "<text x=\"" << num(lx + 36) << "\" y=\"" << num(ly + 4) << "\">"
        << escape_svg(configs[ci]) << "</text>\n";
  }
  svg << "<text x=\"" << num(kLeft + configs.size() * 200) << "\" y=\"" << num(kTop + kPanelH + 74)
      << "\">circle: knee (smallest depth reaching 95% of the best)</text>\n"
      << "</svg>\n";
  write_output_file(path, svg.str(), "scaling chart");
}

}  // namespace flowfeed::bench
