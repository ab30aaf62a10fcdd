#pragma once
// The tuner of `concurrency: auto` and `prefetch_depth: auto` (docs/AUTOTUNE.md). Its decision is
// a pure function of a snapshot of what each stage did over a window (decide()), so that the same
// measurements always give the same decision; Tuner keeps the windows and the decisions made, and
// Gate moves an effective bound below a limiter_node's fixed threshold without blocking a thread.

#include <oneapi/tbb/flow_graph.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed::detail {

/// What one stage did over a window.
struct StageSample {
  std::string name;
  bool tunable = false;       // `concurrency: auto` on a synchronous node other than the train node
  bool train = false;         // the train node (the last one)
  bool asynchronous = false;  // busy counts submit() only (a train node's: its occupancy)
  int concurrency = 1;        // effective now
  int max_concurrency = 1;    // the built node's (the thread budget for a tunable one)
  std::uint64_t items = 0;    // batches it finished in the window
  double busy_s = 0;          // time in its bodies in the window, summed over bodies
  // The change before this window raised it from `raised_from` bodies, which gave
  // `capacity_before` batches/s (bodies over time per batch); 0: it was not raised.
  int raised_from = 0;
  double capacity_before = 0;
  bool saturated = false;  // a raise gave (almost) no more capacity: it gets no more bodies
};

/// The pipeline over a window, as decide() sees it.
struct TunerSnapshot {
  double window_s = 0;
  int depth = 1;                        // effective in-flight bound
  int max_depth = 1;                    // the depth the pools were sized for
  bool depth_tunable = false;           // prefetch_depth: auto
  bool depth_capped_by_memory = false;  // max_depth is what pipeline.memory_budget allows
  int thread_budget = 1;                // most bodies at once over the synchronous nodes
  bool ordered = true;                  // a sequencer holds batches that finished out of order
  bool fed_before = false;              // an earlier window found the train node fed
  std::vector<StageSample> stages;      // in chain order, the train node last
  std::string train_label = "the train node";  // the last stage, as decisions name it
};

/// One decision: a knob's change, a limit that stops the tuning, or nothing.
struct TunerDecision {
  enum class Kind { none, concurrency, depth, limit, settled };
  Kind kind = Kind::none;
  std::size_t stage = 0;  // for concurrency
  int from = 0;
  int to = 0;
  std::string why;
  bool saturate = false;  // the stage's last raise gained (almost) nothing: mark it saturated
};

/// The share of the window the train node may wait for data and still count as fed.
inline constexpr double kTunerTargetWait = 0.05;
/// Between the target and this share of waiting the figures may be noise: decide() acts on them
/// only over a window of kTunerLongWindow train batches. Once the train node was fed, it acts
/// only above this share (the picture changed), over such a window. "Fed" itself is declared
/// over such a window.
inline constexpr double kTunerActWait = 0.10;
inline constexpr std::uint64_t kTunerLongWindow = 64;
/// Bodies (and in-flight slots) planned above what the service times need, for their spread.
inline constexpr double kTunerHeadroom = 1.25;
/// A raise from c to c' bodies should multiply a stage's capacity by c'/c; one that gains less
/// than this share of that (its bodies share what they run on: the cores, a disk) saturates it.
inline constexpr double kTunerGainShare = 0.25;
/// A raise is judged once the stage ran at least this share of the bodies it added at once (its
/// busy time over the window): before that, too few batches in flight kept them idle.
inline constexpr double kTunerInUseShare = 0.5;

/// A saturated stage's rate is judged again once it moves by this factor, over long windows.
inline constexpr double kTunerChangedRate = 1.5;

/// A stage that decide() found saturated: it keeps `bodies` and gets no more until the rate it
/// gives there moves by kTunerChangedRate (the picture changed: a cost that rose while the raise
/// was judged, a cold part of the data set). Its rate, not its time per batch: the bodies of a
/// stage that shares the cores take longer a batch the more of them run, at the same rate.
struct Saturation {
  bool on = false;
  int bodies = 0;   // the bodies it keeps (all copies)
  double rate = 0;  // batches/s to compare with; 0: the first long window at `bodies` sets it

  /// From the decision that found it (its `saturate`): back to the bodies before the raise, the
  /// rate it ran at then (`rate_before`); keeping the raise, the rate its first long window gives.
  static Saturation of(const TunerDecision& d, int concurrency, double rate_before);
  /// A window of the stage: `items` finished over `window_s` at `concurrency` bodies. Only a long
  /// window at the bodies it keeps is judged. Returns whether it is still saturated.
  bool recheck(int concurrency, std::uint64_t items, double window_s, bool long_window);
};

/// A concurrency decision for a node copied into `copies` branches (its figures the sums of all
/// copies) as the bodies of each copy: a raise within `room` more bodies in all (the thread
/// budget's), rounded up per copy; a fall rounded up too. A raise with no room for one more body in
/// every copy becomes a limit; a fall that leaves each copy's count as it is, settled.
TunerDecision per_copy(TunerDecision d, int copies, int room);

/// Decides the one change to make after a window (or none), from the model of service times:
/// the train node's time per batch sets the rate to reach; a stage of time s at that rate X
/// needs X × s bodies; the batches in flight must cover every stage's bodies and the ones
/// queued between them. Pure: the same snapshot gives the same decision.
TunerDecision decide(const TunerSnapshot& snapshot);

/// Moves the effective bound of a limiter_node<Batch*, int> between 1 and its threshold. The
/// threshold never changes; the slots above the effective bound are held back: taken at the
/// start (a negative decrement, which the limiter applies in full while its count is 0) or, when
/// the bound falls, kept back from the next finished batches. A raise is handed out with the
/// next finished batch's decrement. No thread ever waits.
class Gate {
 public:
  /// Before the graph runs: `limiter` has `threshold` slots, `effective` of them usable.
  void attach(tbb::flow::limiter_node<Batch*, int>& limiter, int threshold, int effective);
  /// The usable slots now (the tuner's thread).
  int effective() const noexcept { return effective_.load(std::memory_order_relaxed); }
  /// Sets the usable slots (the tuner's thread), 1..threshold.
  void set(int effective) noexcept;
  /// What a finished batch puts into the limiter's decrementer: 1, less any slot held back, plus
  /// any raise not yet handed out. Thread-safe.
  int on_finished() noexcept;
  /// A raise not yet handed out, to put into the limiter's decrementer now (when no batch may
  /// finish to carry it: a pull session's caller holds every batch in flight). Thread-safe.
  int take_pending() noexcept;

 private:
  std::atomic<int> effective_{1};
  std::atomic<int> withhold_{0};  // slots to keep back from the next finished batches
  std::atomic<int> pending_{0};   // slots to hand out with the next finished batch
  int threshold_ = 1;
};

}  // namespace flowfeed::detail
