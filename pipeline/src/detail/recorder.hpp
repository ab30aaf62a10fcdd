#pragma once
// What a run records besides items and busy time: per-node counters on the hot path (lock-free),
// a monitor thread that samples them and prints progress, and per-batch timestamps for a Trace.
// The pipeline calls enter()/leave() around node bodies; docs/REPORT.md defines every figure.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/gauge.hpp"
#include "flowfeed/range_hooks.hpp"
#include "flowfeed/stats.hpp"
#include "flowfeed/trace.hpp"

namespace flowfeed::detail {

/// Timestamps of one batch at one node; Batch::times_ points at the batch's row (one per node).
struct StageTimes {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
  std::uint32_t thread = 0;
  std::int32_t stream = -1;
};

/// A small id of the calling thread (0, 1, 2, ... in order of first use in this process).
std::uint32_t current_thread_index() noexcept;

/// Steady-clock nanoseconds.
inline std::uint64_t now_ns() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

/// Hot-path counters of one node, on a cache line of their own.
struct alignas(64) NodeProbe {
  std::atomic<std::uint64_t> started{0};     // bodies entered (skipped batches too)
  std::atomic<std::uint64_t> passed{0};      // batches that left the node (async: completed)
  std::atomic<std::uint64_t> queue_high{0};  // max of (arrived - started)
};

/// Monitor-thread accumulators of one node (seconds).
struct NodeSampled {
  double wait_input = 0;
  double wait_output = 0;
  double wait_cpu = 0;
  double pending = 0;
};

class Recorder {
 public:
  Recorder() = default;
  ~Recorder();
  Recorder(const Recorder&) = delete;
  Recorder& operator=(const Recorder&) = delete;

  /// Build time: the nodes in chain order and the batch objects (each gets its timestamp row).
  void configure(std::vector<TraceNode> nodes, int prefetch_depth, bool ordered, RangeHooks hooks,
                 const std::vector<std::unique_ptr<Batch>>& batches);

  struct RunSetup {
    bool stats = true;
    Trace* trace = nullptr;
    bool progress = false;
    bool bar = false;
    double progress_interval_s = 0;
    std::uint64_t expected = 0;   // batches in the whole run
    std::uint64_t per_epoch = 0;  // batches per epoch
    int epochs = 1;
    int threads = 1;
    const std::atomic<std::uint64_t>* produced = nullptr;  // batches the source emitted
    const std::atomic<std::uint64_t>* consumed = nullptr;  // batches that finished
    std::vector<std::pair<std::string, Gauge*>> gauges;
    std::string config;
  };
  /// Build time, after configure(): nodes [begin, end of chain) are `branches` copies of `len`
  /// nodes (upload to train), one after another; batch seq goes to copy seq % branches.
  void set_branches(std::size_t begin, std::size_t len, std::size_t branches) noexcept {
    branch_begin_ = begin;
    branch_len_ = len;
    branches_ = branches;
  }
  /// Clears the counters, starts the monitor thread when stats or progress are asked for.
  void begin_run(RunSetup setup, std::uint64_t start_ns);
  /// Stops the monitor thread and closes the trace (end_ns: when the run ended). Safe to call
  /// twice.
  void end_run(std::uint64_t end_ns);

  /// Right before a node body (asynchronous: before submit()), on its thread.
  void enter(std::size_t node, Batch& b, std::uint64_t t) noexcept {
    if (hooks_.begin) hooks_.begin(hooks_.context, names_[node].c_str(), b.seq);
    if (!counting_) return;
    probes_[node].started.fetch_add(1, std::memory_order_relaxed);
    if (tracing_) {
      StageTimes& st = b.times_[node];
      st.start = t;
      st.thread = current_thread_index();
    }
  }
  /// Right after a synchronous node body returned (or threw), on its thread.
  void leave(std::size_t node, Batch& b, std::uint64_t t) noexcept {
    if (hooks_.end) hooks_.end(hooks_.context);
    complete(node, b, t);
  }
  /// After an asynchronous node's submit() returned, on the thread that called it.
  void submitted() noexcept {
    if (hooks_.end) hooks_.end(hooks_.context);
  }
  /// When an asynchronous node's work completed (any thread), before the batch moves on.
  void complete(std::size_t node, Batch& b, std::uint64_t t) noexcept {
    if (!counting_) return;
    if (tracing_) {
      StageTimes& st = b.times_[node];
      st.end = t;
      st.stream = b.sync.stream_index();
    }
    if (in_order_ && train_node(successor(node, b.seq))) {
      // Ordered runs: mark the batch as available to the sequencer before the train node.
      in_order_[b.seq % in_order_size_].store(b.seq + 1, std::memory_order_relaxed);
    }
    const std::uint64_t passed = probes_[node].passed.fetch_add(1, std::memory_order_relaxed) + 1;
    const std::size_t next = successor(node, b.seq);
    if (next < count_) {
      // Past the shared stages a branch receives only its share.
      const std::uint64_t arrived = branch_entry(next) ? branch_share(passed, next) : passed;
      const std::uint64_t started = probes_[next].started.load(std::memory_order_relaxed);
      if (arrived > started) note_queue(probes_[next], arrived - started);
    }
  }
  /// After the source emitted a batch or one finished: the limiter may have admitted one more to
  /// the first node.
  void admission(std::uint64_t produced, std::uint64_t consumed) noexcept {
    if (!counting_) return;
    const std::uint64_t admitted =
        std::min(produced, consumed + depth_.load(std::memory_order_relaxed));
    const std::uint64_t started = probes_[0].started.load(std::memory_order_relaxed);
    if (admitted > started) note_queue(probes_[0], admitted - started);
  }
  /// On the train node's thread when a batch finished, before the batch is reset.
  void finish(const Batch& b) noexcept {
    if (tracing_) collect(b);
  }

  /// The in-flight bound now (the tuner's effective prefetch_depth); configure() sets the maximum.
  void set_depth(int depth) noexcept {
    depth_.store(static_cast<std::uint64_t>(std::max(depth, 1)), std::memory_order_relaxed);
  }

  /// Adds the recorded figures and the verdict to a report whose node list is in chain order.
  void fill(RunReport& report, bool pull = false) const;

 private:
  /// The node a batch goes to after `node`; count_ after a train node.
  std::size_t successor(std::size_t node, std::uint64_t seq) const noexcept {
    if (branches_ == 1) return node + 1;
    if (node + 1 == branch_begin_) return branch_begin_ + (seq % branches_) * branch_len_;
    if (node >= branch_begin_ && (node + 1 - branch_begin_) % branch_len_ == 0) return count_;
    return node + 1;
  }
  /// True for the train node (with several branches: each branch's last node).
  bool train_node(std::size_t node) const noexcept {
    if (node >= count_) return false;
    if (branches_ == 1) return node + 1 == count_;
    return node >= branch_begin_ && (node + 1 - branch_begin_) % branch_len_ == 0;
  }
  /// True for the first node of a branch (several branches only).
  bool branch_entry(std::size_t node) const noexcept {
    return branches_ > 1 && node >= branch_begin_ && (node - branch_begin_) % branch_len_ == 0;
  }
  /// Of the first `passed` batches past the shared stages, about how many went to the branch that
  /// `entry` starts (batch seq goes to branch seq % branches_).
  std::uint64_t branch_share(std::uint64_t passed, std::size_t entry) const noexcept {
    const std::uint64_t b = (entry - branch_begin_) / branch_len_;
    return passed / branches_ + (passed % branches_ > b ? 1 : 0);
  }

  static void note_queue(NodeProbe& probe, std::uint64_t queued) noexcept {
    std::uint64_t high = probe.queue_high.load(std::memory_order_relaxed);
    while (queued > high &&
           !probe.queue_high.compare_exchange_weak(high, queued, std::memory_order_relaxed)) {
    }
  }
  void collect(const Batch& b) noexcept;
  void stop_monitor();
  void monitor();
  void sample(double dt);
  void print_progress(std::uint64_t t, bool last);

  std::vector<TraceNode> nodes_;
  std::vector<std::string> names_;
  std::unique_ptr<NodeProbe[]> probes_;
  std::size_t count_ = 0;  // nodes
  // `pipeline.devices` branches: nodes [branch_begin_, count_) are branches_ copies of
  // branch_len_ nodes each, one after another.
  std::size_t branch_begin_ = 0;
  std::size_t branch_len_ = 0;
  std::uint64_t branches_ = 1;
  // Ordered runs with a node before the train node: slot seq % size holds seq + 1 once batch seq
  // has left that node, so the monitor can tell whether the train's next batch is there.
  std::unique_ptr<std::atomic<std::uint64_t>[]> in_order_;
  std::size_t in_order_size_ = 0;
  std::vector<StageTimes> times_;        // one row of nodes_.size() per batch object
  std::atomic<std::uint64_t> depth_{1};  // the effective in-flight bound (the tuner moves it)
  bool ordered_ = false;
  RangeHooks hooks_;

  bool counting_ = false;
  bool counted_ = false;  // counting_ during the last run (for fill())
  bool tracing_ = false;
  RunSetup setup_;
  std::uint64_t start_ns_ = 0;
  std::vector<TraceSpan> scratch_;  // one batch's spans, filled on the train thread

  // Monitor thread and what only it writes (read after it joined).
  struct Monitor {
    std::thread thread;
    std::mutex mutex;
    std::condition_variable wake;
    bool stop = false;
    std::vector<NodeSampled> sampled;
    std::vector<std::uint64_t> sample_started;
    std::vector<std::uint64_t> sample_passed;
    double full_seconds = 0;
    double sampled_seconds = 0;
    bool bar_drawn = false;
  };
  Monitor monitor_;
};

}  // namespace flowfeed::detail
