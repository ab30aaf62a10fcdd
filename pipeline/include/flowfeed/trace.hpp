#pragma once
/// \file
/// Per-batch timelines of a run and the pictures made from them: an SVG timeline (one lane per node
/// and per CUDA stream, a bar per batch) and a Chrome trace-event JSON file (Perfetto,
/// chrome://tracing).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

namespace flowfeed {

namespace detail {
class Recorder;  ///< pipeline/src/detail/recorder.hpp (private)
}  // namespace detail

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
      -1;  ///< Batch::sync.stream_index() after the node (a CUDA upload sets it), else -1
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
  /// Writes one of the two to a file, chosen by `svg`, whole or not at all (see output.hpp);
  /// throws Error with the reason when the file cannot be written, or once `*stop` is true
  /// (OutputFile).
  void save(const std::string& path, bool svg, const std::atomic<bool>* stop = nullptr) const;

 private:
  // The pipeline's recorder fills the trace while a run goes.
  friend class detail::Recorder;
  /// Starts a run of `nodes`.
  void begin(std::vector<TraceNode> nodes, std::string config);
  /// Keeps or skips one finished batch; `spans` holds one span per node. Allocation-free.
  void add(const TraceSpan* spans) noexcept;
  void end(double seconds) noexcept { seconds_ = seconds; }

  std::size_t max_batches_;
  std::vector<TraceNode> nodes_;
  std::vector<TraceSpan> spans_;
  std::uint64_t seen_ = 0;
  std::uint64_t stride_ = 1;
  double seconds_ = 0;
  std::string config_;
};

/// Escapes text for SVG (XML) text and attribute values: & < > " become entities, control
/// characters other than newline and tab are dropped. The one escaper of flowfeed's pictures.
std::string escape_svg(std::string_view text);

}  // namespace flowfeed
