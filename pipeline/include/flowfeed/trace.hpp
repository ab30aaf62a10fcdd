#pragma once
/// \file
/// Per-batch timelines of a run and the pictures made from them: an SVG timeline (one lane per node
/// and per CUDA stream, a bar per batch) and a Chrome trace-event JSON file (Perfetto,
/// chrome://tracing). Also the hooks through which a node family (e.g. CUDA's NVTX) sees every node
/// body, and the gauges a node publishes for the progress display.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <limits>
#include <string>
#include <vector>

namespace flowfeed {

/// One node of a traced pipeline.
struct TraceNode {
  std::string name;
  std::string type;
  std::string role;
  int concurrency = 1;
  bool asynchronous = false;  ///< spans run from submit() to the completion
};

/// One batch's passage through one node. Times are seconds since the run started.
struct TraceSpan {
  std::uint64_t seq = 0;
  std::uint32_t epoch = 0;
  std::uint16_t node = 0;  ///< index into Trace::nodes()
  std::int16_t stream =
      -1;  ///< Batch::stream_index after the node (a CUDA upload sets it), else -1
  std::uint32_t thread = 0;  ///< the thread that ran the body (asynchronous: that called submit())
  double start = 0;          ///< body entered (asynchronous: submit() called)
  double end = 0;            ///< body returned (asynchronous: the completion was called)
};

/// What the SVG timeline draws.
struct TimelineOptions {
  int width = 1200;  ///< picture width in pixels
  /// Above this many bars (spans) the lanes show per-column occupancy instead of single bars, so a
  /// long run stays a small file.
  std::size_t max_bars = 6000;
  std::string title;  ///< default: the config file name
};

/// The recorded timeline of one run: pass a Trace through RunOptions::trace and the run fills it
/// (it is cleared first). Recording happens on the train node's thread when a batch finishes, into
/// storage allocated when the run starts. A run with more batches than max_batches() keeps an even
/// sample: every stride()-th finished batch, where the stride doubles each time the storage fills.
/// Not thread-safe; read it after run() returned (or threw: the batches that finished are there).
class Trace {
 public:
  explicit Trace(std::size_t max_batches = 32768);

  std::size_t max_batches() const noexcept { return max_batches_; }
  const std::vector<TraceNode>& nodes() const noexcept { return nodes_; }
  /// Spans of the kept batches, in the order the batches finished; each batch's nodes in chain
  /// order.
  const std::vector<TraceSpan>& spans() const noexcept { return spans_; }
  /// Batches that finished during the run (kept or not).
  std::uint64_t batches_seen() const noexcept { return seen_; }
  /// Every stride()-th finished batch was kept (1: all of them).
  std::uint64_t stride() const noexcept { return stride_; }
  /// Wall time of the run in seconds.
  double seconds() const noexcept { return seconds_; }
  const std::string& config() const noexcept { return config_; }

  /// Writes the Chrome trace-event JSON (one track per node and thread, and per node and stream
  /// for asynchronous nodes; an "X" event per batch and node).
  void write_chrome_trace(std::ostream& out) const;
  /// Writes the SVG timeline.
  void write_timeline_svg(std::ostream& out, const TimelineOptions& options = {}) const;
  /// Writes one of the two to a file, chosen by `svg`; throws Error when the file cannot be
  /// written.
  void save(const std::string& path, bool svg) const;

  /// Recording interface for the pipeline (not for users): starts a run of `nodes`.
  void begin(std::vector<TraceNode> nodes, std::string config);
  /// Keeps or skips one finished batch; `spans` holds one span per node. Allocation-free.
  void add(const TraceSpan* spans) noexcept;
  void end(double seconds) noexcept { seconds_ = seconds; }

 private:
  std::size_t max_batches_;
  std::vector<TraceNode> nodes_;
  std::vector<TraceSpan> spans_;
  std::uint64_t seen_ = 0;
  std::uint64_t stride_ = 1;
  double seconds_ = 0;
  std::string config_;
};

/// Callbacks the pipeline calls around every node body: `begin` right before it (for an
/// asynchronous node: before submit()), `end` right after it, on the same thread. A node family
/// installs them through Registry::set_range_hooks (the CUDA family: NVTX ranges), so pipeline/
/// needs no CUDA header. They must be thread-safe, cheap, and not throw. Null pointers: nothing.
struct RangeHooks {
  void (*begin)(void* context, const char* node, std::uint64_t seq) noexcept = nullptr;
  void (*end)(void* context) noexcept = nullptr;
  void* context = nullptr;
};

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

/// A small id of the calling thread (0, 1, 2, ... in order of first use in this process).
std::uint32_t current_thread_index() noexcept;

}  // namespace flowfeed
