#pragma once
/// \file
/// Training figures read from a run report, shared by pipeline_runner (--compare-resident) and
/// pipeline_bench (resident_vs_streamed) so that both compute the comparison the same way.

#include <cstddef>
#include <map>
#include <string>

#include "flowfeed/stats.hpp"

namespace flowfeed::apps {

/// The value of `key` in one row of `TrainReport::epochs`, or -1 when the row lacks it.
inline double epoch_figure(const std::map<std::string, double>& row, const char* key) {
  auto it = row.find(key);
  return it == row.end() ? -1.0 : it->second;
}

/// Training steps per second over the epochs after the first (which includes warm-up: CUDA graph
/// capture, first-touch page faults), or over the whole run when there is one epoch.
inline double steady_steps_per_second(const RunReport& report) {
  double steps = 0, seconds = 0;
  for (std::size_t i = report.train.epochs.size() > 1 ? 1 : 0; i < report.train.epochs.size();
       ++i) {
    steps += epoch_figure(report.train.epochs[i], "steps");
    seconds += epoch_figure(report.train.epochs[i], "seconds");
  }
  return seconds > 0 ? steps / seconds : report.train.steps_per_second;
}

/// A streamed run against its resident baseline (the same config through resident_config()).
struct ResidentComparison {
  double streamed_steady = 0;  ///< steps/s after the first epoch
  double resident_steady = 0;
  double steady_ratio = 0;    ///< streamed / resident (0 when the resident rate is 0)
  double streamed_whole = 0;  ///< steps/s over the whole run
  double resident_whole = 0;
  double whole_ratio = 0;
};

inline ResidentComparison compare_resident(const RunReport& streamed, const RunReport& resident) {
  ResidentComparison c;
  c.streamed_steady = steady_steps_per_second(streamed);
  c.resident_steady = steady_steps_per_second(resident);
  c.steady_ratio = c.resident_steady > 0 ? c.streamed_steady / c.resident_steady : 0.0;
  c.streamed_whole = streamed.train.steps_per_second;
  c.resident_whole = resident.train.steps_per_second;
  c.whole_ratio = c.resident_whole > 0 ? c.streamed_whole / c.resident_whole : 0.0;
  return c;
}

}  // namespace flowfeed::apps
