#pragma once
// The built pipeline's private state, shared by its rooms: pipeline.cpp (facade, BuildContext,
// build, report), graph.cpp (wiring, per-batch work, epoch ends), run.cpp (run loop and its
// supervisor) and session.cpp (pull mode).

#include <oneapi/tbb/concurrent_queue.h>
#include <oneapi/tbb/flow_graph.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "detail/recorder.hpp"
#include "detail/run_cursor.hpp"
#include "detail/tuner.hpp"
#include "flowfeed/checkpoint.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed::detail {

using Clock = std::chrono::steady_clock;

/// The message of an exception, whatever its type.
std::string what_of(const std::exception_ptr& e);

/// The TBB arena's size: `pipeline.threads`, else the core count.
int arena_threads(const PipelineConfig& config);

/// One node and its counters.
struct Stage {
  NodeSpec spec;
  std::unique_ptr<Node> node;
  std::string label;      // node 'load' (synthetic, configs/x.yaml:7)
  std::size_t index = 0;  // in chain order
  int device = -1;        // the branch's device; -1: a shared stage (before the upload node)
  int branch = -1;        // which `pipeline.devices` branch; -1: shared
  // The layout batches have when they reach this stage, and when they leave it (another one only
  // after BuildContext::change_layout).
  const BatchLayout* layout = nullptr;
  const BatchLayout* out_layout = nullptr;
  std::atomic<std::uint64_t> items{0};
  std::atomic<std::uint64_t> busy_ns{0};
  std::atomic<std::uint64_t> failures{0};
  std::atomic<int> active{0};
  // An asynchronous train node: batches that left the stage before it, and batches that reached
  // it. When they are equal no batch waits for it, and it flushes (AsynchronousNode::flush).
  std::atomic<std::uint64_t> queued{0};
  std::atomic<std::uint64_t> arrived{0};
  // `concurrency: auto` on a synchronous node other than the train node: built at the thread
  // budget (spec.concurrency), run at the gate's effective concurrency while the tuner runs.
  bool tunable = false;
  Gate gate;

  void clear() {
    queued = 0;
    arrived = 0;
    items = 0;
    busy_ns = 0;
    failures = 0;
    active = 0;
  }
};

/// The flow-graph nodes of one run (or session) and the contexts their completions read; they
/// must outlive the graph's run. Members are destroyed in reverse order: the chain first, the
/// head last.
struct Wiring {
  using AsyncNode = tbb::flow::async_node<Batch*, Batch*, tbb::flow::queueing>;
  struct AsyncContext {
    AsyncNode::gateway_type* gateway = nullptr;
    Stage* stage = nullptr;
    PipelineImpl* impl = nullptr;
  };
  std::unique_ptr<tbb::flow::input_node<Batch*>> source;
  std::unique_ptr<tbb::flow::limiter_node<Batch*, int>> limiter;
  std::vector<std::unique_ptr<tbb::flow::graph_node>> nodes;
  std::vector<std::unique_ptr<AsyncContext>> contexts;
};

/// Thrown through a node's setup when `prefetch_depth: auto` pools do not fit the memory budget at
/// the depth tried: the pipeline is built again at `depth`, the most that the claims seen allow.
struct DepthRetry {
  int depth = 0;
};

/// How often the tuner measures: the supervisor's tick in run(), the most often next() ticks it
/// in a pull session.
inline constexpr std::chrono::milliseconds kTunerTick{5};

/// The tuner's state during one run (autotune.cpp).
struct TuneState {
  std::uint64_t start_ns = 0;
  bool window_open = false;
  std::uint64_t window_ns = 0;                  // when the window began
  std::uint64_t window_finished = 0;            // consumed_ then
  std::vector<std::uint64_t> items, busy_ns;    // per stage, then
  std::uint64_t ticks = 0, occupied_ticks = 0;  // async train: ticks it was occupied
  std::uint64_t caller_wait_ns = 0;             // pull mode: the caller's wait in next(), then
  std::uint64_t last_tick_ns = 0;               // pull mode: ticks ride on next()
  std::vector<Saturation> saturated;            // per tuner sample
  std::size_t raised = ~std::size_t{0};         // the sample the last change raised, if any
  int raised_from = 0;                          // its bodies (all copies) before
  double capacity_before = 0;                   // what they gave, batches/s
  double rate_before = 0;                       // the batches/s it ran at then
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

/// Heard by the wiring when a body is about to rethrow a failure (pull mode wakes its caller).
using OnThrow = std::function<void(std::exception_ptr)>;

class PipelineImpl {
 public:
  // pipeline.cpp: build and report.
  /// `auto_depth`: with `prefetch_depth: auto`, the depth to size pools for (0: the cap); the
  /// constructor throws DepthRetry when a smaller one is needed to fit the memory budget.
  PipelineImpl(PipelineConfig config, const Registry& registry, int auto_depth = 0);
  /// Replaces the stages from the upload node on by one copy per `pipeline.devices` entry, each a
  /// node of its own made from the same spec, named `name@device`.
  void replicate_branches(const Registry& registry);
  /// The figures run() and a session share: totals, nodes, pools (not the train figures).
  RunReport base_report(double seconds, bool interrupted) const;
  /// Adds the per-branch figures to a report of a run with several branches.
  void fill_branch_report(RunReport& report, double seconds) const;

  // autotune.cpp: `concurrency: auto` and `prefetch_depth: auto`.
  /// At build: the thread budget, the maxima of auto nodes and the depth to size pools for.
  void resolve_auto(int auto_depth);
  /// The stages each tuner sample stands for, in chain order: a shared stage alone, a node copied
  /// into every branch (`pipeline.devices`) as all its copies.
  std::vector<std::vector<std::size_t>> sample_groups() const;
  /// Whether the tuner runs (something is auto): in run() on the supervisor's ticks, in a pull
  /// session on the caller's next() calls.
  bool tunes() const noexcept;
  /// After a claim failed with `prefetch_depth: auto`: throws DepthRetry when a smaller depth
  /// fits the claims seen so far (`kind`, `bytes`, a pool of `count` buffers; 0: not a pool).
  void retry_smaller_depth(MemoryKind kind, std::uint64_t bytes, std::size_t count);
  /// Counts a successful claim (per-depth when a pool of k × prefetch_depth buffers).
  void note_claim(MemoryKind kind, std::uint64_t bytes, std::size_t count);
  /// Start of a run (the supervisor's thread calls tune_tick from then on).
  void tune_begin(const RunOptions& options, std::uint64_t start_ns);
  /// Keeps a decision for the report (a run that keeps changing keeps its first ones); a change
  /// also moves the settled time.
  void keep_decision(TuningDecision entry, bool change);
  /// One supervisor tick: measures, and when a window is complete decides and applies. In pull
  /// mode `caller_wait_ns` is how long the caller has waited inside next() so far: the caller's
  /// loop is the train step.
  void tune_tick(std::uint64_t now, std::optional<std::uint64_t> caller_wait_ns = std::nullopt);
  /// Pull mode: the caller holds `held` batches and asks for another; raises the in-flight
  /// bound above what it holds (else none could come). Returns the slots to hand the limiter
  /// now (0: none).
  int tune_hold(std::size_t held, std::uint64_t now);
  /// What a finished batch hands the head limiter: 1, or the depth gate's figure while it tunes.
  int depth_release() noexcept {
    return tuning_ && config_.pipeline.auto_prefetch_depth ? depth_gate_.on_finished() : 1;
  }
  /// The report's tuning section and the nodes' settled concurrency.
  void tune_fill(RunReport& report) const;

  // run.cpp: the run loop.
  RunReport run(const RunOptions& options);

  // The per-run state both run() and start() begin with, and the checks both end with.
  /// Throws ConfigError when the chain does not fit the mode (run() needs a train node last,
  /// start() none), then resets every per-run counter, the stages and the pools, and sets the
  /// source to the start (pipeline.resume_from) with `options`' stop_after and checkpoints.
  void begin_run(bool pull, const RunOptions& options = {});
  /// Starts the recorder for a run or a session (`options`' stats, trace and progress; `threads`
  /// the arena's), then the tuner when it runs, and sets the in-flight bound the recorder shows.
  void begin_recording(const RunOptions& options, int threads);
  /// Batches a whole run takes from the source (the rest from a resumed checkpoint, at most
  /// RunOptions::stop_after).
  std::uint64_t expected_batches() const;
  /// Empty when every batch that left the source arrived at `end` (and as many as expected);
  /// else the "run lost batches" message.
  std::string lost_batches(const std::string& end) const;
  /// "run stalled: no `what` for N s (pipeline.stall_timeout_s): <where>".
  std::string stall_message(const std::string& what) const;

  // graph.cpp: wiring and per-batch work.
  /// The source (an input_node emitting batches) and the limiter (prefetch_depth) of `g`. The
  /// source calls `on_source_done` once it emitted its last batch, and `on_throw` before it
  /// rethrows a failure.
  tbb::flow::limiter_node<Batch*, int>& wire_head(tbb::flow::graph& g, Wiring& wiring,
                                                  std::function<void()> on_source_done = {},
                                                  OnThrow on_throw = {});
  /// Chains stages [begin, end) after `tail` in `g`: a function_node per synchronous stage, an
  /// async_node plus a check node (it rethrows completion errors on a TBB thread) per
  /// asynchronous one. Returns the new tail. `on_throw`, when set, hears every failure a body is
  /// about to rethrow. An asynchronous train stage is told to flush() whenever no batch waits
  /// for it. `passed`, when set, counts the batches that leave the last stage of the range.
  tbb::flow::sender<Batch*>* wire_stages(tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail,
                                         std::size_t begin, std::size_t end,
                                         const OnThrow& on_throw, Wiring& out,
                                         std::atomic<std::uint64_t>* passed = nullptr);
  /// With `pipeline.ordered`, a sequencer after `tail` (batches numbered seq / branches) and
  /// returns it; else returns `tail`.
  tbb::flow::sender<Batch*>* wire_order(tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail,
                                        Wiring& wiring);
  /// run()'s graph after the limiter: the stages before the upload node, then per branch (one
  /// without `pipeline.devices`) its stages, a sequencer (ordered) and its train node.
  void wire_branches(tbb::flow::graph& g, tbb::flow::limiter_node<Batch*, int>& limiter,
                     Wiring& wiring);
  /// Branch `branch`'s stages [begin, last) after `tail`, a sequencer when ordered, and its train
  /// stage `last`: a serial function_node (after an async_node and its check node when the train
  /// node is asynchronous) that finishes each batch, ends epochs and decrements `limiter`.
  void wire_branch(tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail, std::size_t begin,
                   std::size_t last, int branch, tbb::flow::limiter_node<Batch*, int>& limiter,
                   Wiring& wiring);
  /// The layout of the batches stage `index` receives: its predecessor's output layout.
  const BatchLayout* layout_into(std::size_t index) const;
  /// Batches of `epoch` that branch `branch` takes (seq % branches_ == branch; all with one).
  std::uint64_t branch_share(int branch, std::uint32_t epoch) const;
  /// Counts a finished batch of `epoch` for branch `branch`'s train node and runs its end_epoch()
  /// for every epoch, in order, whose batches have all finished.
  void end_finished_epochs(Stage& train, int branch, std::uint32_t epoch);
  void on_failure(Stage& stage, Batch& batch, std::exception_ptr error);
  void run_stage(Stage& stage, Batch& batch);
  Batch* next_batch(tbb::flow_control& fc);
  /// Returns the batch's buffers and slot and counts it done (the resume cursor); returns the
  /// batches finished so far in the run.
  std::uint64_t finish_batch(Batch* batch);
  /// Every batch object (and so every lease) back, wherever the graph left it.
  void reclaim();
  /// Where a stalled run is stuck: the node holding the oldest batch, else the first that stopped.
  std::string stuck_stage() const;

  void mark(const Batch& batch, int stage) noexcept {
    const std::size_t slot = slot_of_.find(&batch)->second;
    slot_seq_[slot].store(batch.seq, std::memory_order_relaxed);
    slot_stage_[slot].store(stage, std::memory_order_release);
  }
  void note_in_flight() noexcept {
    const int n = in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
    int m = max_in_flight_.load(std::memory_order_relaxed);
    while (n > m && !max_in_flight_.compare_exchange_weak(m, n)) {
    }
  }

  PipelineConfig config_;
  std::vector<std::unique_ptr<Stage>> stages_;
  LoaderNode* loader_ = nullptr;
  BatchLayout layout_;
  std::optional<MemoryBudget> budget_;  ///< what pools and data sets claimed, during the build
  // Autotune: the thread budget, whether pools were sized below the cap to fit the memory budget,
  // the bytes of the pools that scale with prefetch_depth (host, device), the depth gate and the
  // tuner's run state.
  int thread_budget_ = 1;
  bool depth_capped_ = false;
  int depth_wanted_ = 0;
  std::uint64_t scaled_host_ = 0;
  std::uint64_t scaled_device_ = 0;
  bool tuning_ = false;  // in the run now
  Gate depth_gate_;
  int start_depth_ = 1;
  TuneState tune_;
  // Layouts made by BuildContext::change_layout, and the one batches have at the upload node (what
  // bytes_uploaded counts).
  std::vector<std::unique_ptr<BatchLayout>> changed_layouts_;
  const BatchLayout* upload_layout_ = &layout_;
  std::unique_ptr<Sampler> sampler_;
  std::vector<std::unique_ptr<BufferPool>> pools_;
  // The memory of the node after the loader that takes its batches without a copy, and the
  // loader's pool of it once made (BuildContext::fill_tier / make_fill_pool).
  std::optional<FillMemory> fill_memory_;
  BufferPool* fill_pool_ = nullptr;
  std::vector<std::unique_ptr<Batch>> batches_;
  tbb::concurrent_queue<Batch*> free_batches_;
  std::uint64_t allocations_at_build_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> abort_{false};
  // Set while a run is being cancelled; nodes poll it through BuildContext::cancelled().
  std::atomic<bool> cancel_{false};
  bool running_ = false;

  // Per-run state.
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  std::atomic<std::uint64_t> produced_{0};
  std::atomic<std::uint64_t> consumed_{0};
  std::atomic<std::uint64_t> skipped_{0};
  std::atomic<std::uint64_t> skipped_samples_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> samples_{0};
  // Per train node (one per `pipeline.devices` branch): its finished batches of each epoch, and
  // the first epoch whose end_epoch() has not run.
  std::vector<std::vector<std::uint64_t>> epoch_done_;
  std::vector<std::size_t> next_epoch_end_;
  std::uint64_t source_seq_ = 0;
  std::vector<std::uint32_t> source_order_;
  std::uint32_t order_epoch_ = ~0u;  // the epoch source_order_ holds

  // resume.cpp: exact resume (checkpoint.hpp). Batches are numbered in this rank's sequence
  // (epoch x batches_per_epoch + index in the epoch); a run starts at start_
  // (pipeline.resume_from, else 0), and cursor_ keeps which of its batches finished.
  /// Loads the checkpoint pipeline.resume_from names and the nodes' states from it (at build).
  void resume_from_checkpoint();
  /// Prepares the source and the cursor for a run or session from start_, with `options`'
  /// stop_after and periodic checkpoints.
  void begin_sequence(const RunOptions& options);
  /// One past the last batch of the last epoch.
  std::uint64_t sequence_end() const {
    return sampler_->batches_per_epoch() * static_cast<std::uint64_t>(config_.pipeline.epochs);
  }
  /// Batches the source emits in this run before sequence index x.
  std::uint64_t run_batches_before(std::uint64_t x) const;
  /// Pipeline::checkpoint() and save_checkpoint().
  Checkpoint checkpoint() const;
  void save_checkpoint(const std::string& dir) const;
  void save_checkpoint(CheckpointDir& dir) const;
  ResumePoint start_;
  std::uint64_t resumed_steps_ = 0;
  RunCursor cursor_;
  std::uint64_t source_pos_ = 0;  // the next candidate for the source
  std::size_t source_skip_ = 0;   // start_.skip entries passed
  std::uint64_t stop_after_ = 0;  // RunOptions::stop_after of the run
  std::uint64_t checkpoint_every_ = 0;
  CheckpointDir* checkpoint_dir_ = nullptr;        // where checkpoint_every writes
  std::unique_ptr<CheckpointDir> own_checkpoint_;  // one run() opened from checkpoint_dir
  mutable std::mutex checkpoint_mutex_;
  std::mutex warn_mutex_;
  std::vector<std::string> warnings_;
  Recorder recorder_;  // stats, trace, progress
  std::vector<std::pair<std::string, std::unique_ptr<Gauge>>> gauges_;
  // Which stage is processing each batch object (-1: none) and that batch's seq, so that a stall
  // names the oldest stuck batch and where it is stuck. Indexed by the batch's slot.
  std::unordered_map<const Batch*, std::size_t> slot_of_;
  std::unique_ptr<std::atomic<int>[]> slot_stage_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> slot_seq_;

  // `pipeline.devices` branches: with more than one, stages_ holds the shared stages (before the
  // upload node), then each branch's copies of the rest of the chain, branch after branch.
  int branches_ = 1;
  std::size_t branch_begin_ = 0;  // index of branch 0's upload stage
  std::size_t branch_len_ = 0;    // stages per branch (upload .. train)
  std::unique_ptr<std::atomic<std::uint64_t>[]> branch_batches_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> branch_samples_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> branch_bytes_;

  // Pull mode (Pipeline::start, Session): the session running now, if any.
  SessionState* pull_ = nullptr;
};

}  // namespace flowfeed::detail
