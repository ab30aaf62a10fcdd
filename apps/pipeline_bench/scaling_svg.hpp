#pragma once
/// \file
/// The scaling scenario's plot: throughput against prefetch_depth and against load concurrency,
/// as hand-written SVG.

#include <cstddef>
#include <string>
#include <vector>

namespace flowfeed::bench {

/// One line of the plot: a config swept over one parameter.
struct ScalingSeries {
  std::string config;  ///< e.g. "load_bound"
  std::string sweep;   ///< "prefetch_depth" or "load concurrency" (one panel each)
  std::vector<int> x;
  std::vector<double> y;  ///< batches/s
};

/// The knee: the first point reaching 95% of the best value (0 for an empty series).
std::size_t knee_index(const std::vector<double>& y);

/// Writes the plot: a panel per sweep, a polyline per config, the knee of every prefetch_depth
/// series marked (a circle of class "knee" and its label). Throws std::runtime_error when the
/// file cannot be written.
void write_scaling_svg(const std::string& path, const std::vector<ScalingSeries>& series);

}  // namespace flowfeed::bench
