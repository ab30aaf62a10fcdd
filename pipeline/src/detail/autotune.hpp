#pragma once
// The autotuner (autotune.cpp): `concurrency: auto` and `prefetch_depth: auto` while a run or
// pull session goes. It measures the stages on the supervisor's ticks (a pull session's: the
// caller's next()), asks decide() for one change a window and moves the gates.

#include <oneapi/tbb/flow_graph.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "detail/tuner.hpp"
#include "flowfeed/batch.hpp"
#include "flowfeed/build_plan.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed::detail {

class Chain;
class Recorder;
class RunCounters;

/// How often the tuner measures: the supervisor's tick in run(), the most often next() ticks it
/// in a pull session.
inline constexpr std::chrono::milliseconds kTunerTick{5};

/// The tuner's state during one run.
struct TuneState {
  /// The window being measured.
  struct Window {
    bool open = false;
    std::uint64_t ns = 0;                         // when it began
    std::uint64_t finished = 0;                   // batches finished then
    std::vector<std::uint64_t> items, busy_ns;    // per stage, then
    std::uint64_t ticks = 0, occupied_ticks = 0;  // async train: ticks it was occupied
    std::uint64_t caller_wait_ns = 0;             // pull mode: the caller's wait in next(), then
  };
  /// The last raise of a stage's bodies, until a later window judges it.
  struct Raise {
    std::size_t sample = ~std::size_t{0};  // the sample it raised, if any
    int from = 0;                          // its bodies (all copies) before
    double capacity_before = 0;            // what they gave, batches/s
    double rate_before = 0;                // the batches/s it ran at then
  };
  std::uint64_t start_ns = 0;
  Window window;
  std::uint64_t last_tick_ns = 0;     // pull mode: ticks ride on next()
  std::vector<Saturation> saturated;  // per tuner sample
  Raise raise;
  std::uint64_t settle_until = 0;  // after a change, the window opens once this many finished
  TunerDecision::Kind last_kind = TunerDecision::Kind::none;
  std::size_t last_stage = 0;
  double settled_s = 0;  // when the last change was made
  std::uint64_t settled_batches = 0;
  std::string state;        // the last note (settled or limit)
  bool fed_before = false;  // a window found the train node fed
  bool at_limit = false;    // the last decision made (not a change) was a limit
  std::vector<TuningDecision> log;
  bool print = false;
  bool bar = false;
};

class Autotuner {
 public:
  /// Tunes below the maxima of `plan` (the thread budget, the depth the pools hold, each auto
  /// node's bodies).
  Autotuner(const PipelineConfig& config, const BuildPlan& plan, Chain& chain,
            const RunCounters& counters, Recorder& recorder)
      : config_(config), plan_(plan), chain_(chain), counters_(counters), recorder_(recorder) {}

  /// Start of a run: whether the tuner runs in it (something is auto).
  void begin_run();
  bool active() const noexcept { return tuning_; }
  /// Whether the depth gate moves in this run (`prefetch_depth: auto`).
  bool tunes_depth() const noexcept { return tuning_ && config_.pipeline.auto_prefetch_depth; }
  /// Start of the measured part of a run (the supervisor's thread ticks from then on); `print`:
  /// each decision is said on stderr (`bar`: under a status bar).
  void begin(bool print, bool bar, std::uint64_t start_ns);
  /// The in-flight bound the run starts with.
  int start_depth() const noexcept;
  /// The head limiter of the run: its depth gate when the depth is tuned.
  void attach_depth(tbb::flow::limiter_node<Batch*, int>& limiter);
  /// One supervisor tick: measures, and when a window is complete decides and applies. In pull
  /// mode `caller_wait_ns` is how long the caller has waited inside next() so far: the caller's
  /// loop is the train step.
  void tick(std::uint64_t now, std::optional<std::uint64_t> caller_wait_ns = std::nullopt);
  /// Pull mode: tick() at most every kTunerTick, from the caller's thread.
  void pull_tick(std::uint64_t now, std::uint64_t caller_wait_ns);
  /// Pull mode: the caller holds `held` batches and asks for another; raises the in-flight
  /// bound above what it holds (else none could come). Returns the slots to hand the limiter
  /// now (0: none).
  int hold(std::size_t held, std::uint64_t now);
  /// What a finished batch hands the head limiter: 1, or the depth gate's figure while it tunes.
  int depth_release() noexcept { return tunes_depth() ? depth_gate_.on_finished() : 1; }
  /// The report's tuning section and the nodes' settled concurrency.
  void fill(RunReport& report) const;

 private:
  /// Keeps a decision for the report (a run that keeps changing keeps its first ones); a change
  /// also moves the settled time.
  void keep_decision(TuningDecision entry, bool change);

  const PipelineConfig& config_;
  const BuildPlan& plan_;
  Chain& chain_;
  const RunCounters& counters_;
  Recorder& recorder_;
  // The run now: whether the tuner runs, the depth gate, and the tuner's run state.
  bool tuning_ = false;
  Gate depth_gate_;
  int start_depth_ = 1;
  TuneState tune_;
};

}  // namespace flowfeed::detail
