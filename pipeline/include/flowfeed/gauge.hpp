#pragma once
/// \file
/// Live figures a node publishes while the pipeline runs (e.g. the training loss), shown by the
/// progress display.

#include <atomic>
#include <limits>

namespace flowfeed {

/// A live figure a node publishes while the pipeline runs (e.g. the training loss), shown by the
/// progress display. Get one from BuildContext::gauge() in setup(); set() is a relaxed atomic
/// store, cheap enough to call from process() for every batch.
class Gauge {
 public:
  void set(double value) noexcept { value_.store(value, std::memory_order_relaxed); }
  /// The last value set, or NaN when none was set since the run started.
  double get() const noexcept { return value_.load(std::memory_order_relaxed); }
  void clear() noexcept { set(std::numeric_limits<double>::quiet_NaN()); }

 private:
  std::atomic<double> value_{std::numeric_limits<double>::quiet_NaN()};
};

}  // namespace flowfeed
