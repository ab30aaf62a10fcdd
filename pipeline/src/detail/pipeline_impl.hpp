#pragma once
// The built pipeline behind the facade: its owned parts and the rooms that use them.
// pipeline.cpp (facade, build, report), build_context.cpp (what a node's setup sees), graph.cpp
// (wiring, per-batch work, epoch ends), run.cpp (run loop and its supervisor), session.cpp (pull
// mode), resume_value.cpp (resume from values). The parts, each with its own state: chain.hpp
// (stages, layouts, pools, budget, batch slots), autotune.hpp, sequence.hpp (sampler, resume
// point, cursor, checkpoints), run_counters.hpp, recorder.hpp (stats, trace, progress).

#include <oneapi/tbb/flow_graph.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "detail/autotune.hpp"
#include "detail/chain.hpp"
#include "detail/plan.hpp"
#include "detail/recorder.hpp"
#include "detail/run_counters.hpp"
#include "detail/sequence.hpp"
#include "flowfeed/pipeline.hpp"

namespace flowfeed::detail {

using Clock = std::chrono::steady_clock;

/// The message of an exception, whatever its type.
std::string what_of(const std::exception_ptr& e);

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

/// Heard by the wiring when a body is about to rethrow a failure (pull mode wakes its caller).
using OnThrow = std::function<void(std::exception_ptr)>;

class PipelineImpl {
 public:
  // pipeline.cpp: build and report.
  /// Plans (BuildPlan, the depth of `prefetch_depth: auto` in closed form), then sets every node
  /// up as the plan gives it; each node's setup() runs once.
  PipelineImpl(PipelineConfig config, const Registry& registry);
  PipelineImpl(const PipelineImpl&) = delete;
  PipelineImpl& operator=(const PipelineImpl&) = delete;
  /// The validated config, as written.
  const PipelineConfig& config() const noexcept { return config_; }
  /// What the build resolved: batch size, threads, thread budget, depth, each node's bodies.
  const BuildPlan& plan() const noexcept { return plan_; }
  /// The figures run() and a session share: totals, nodes, pools (not the train figures).
  RunReport base_report(double seconds, bool interrupted) const;
  /// Adds the per-branch figures to a report of a run with several branches.
  void fill_branch_report(RunReport& report, double seconds) const;
  std::size_t free_buffers() const;
  std::size_t total_buffers() const;

  // The parts.
  Chain& chain() noexcept { return chain_; }
  const Chain& chain() const noexcept { return chain_; }
  const Sequence& sequence() const noexcept { return sequence_; }
  Autotuner& tuner() noexcept { return tuner_; }
  const RunCounters& counters() const noexcept { return counters_; }
  /// A live figure a node asked for (BuildContext::gauge); the same name gives the same gauge.
  Gauge& gauge(const std::string& name);

  // Requests and cancellation (any thread; a signal handler may store them).
  void request_stop() noexcept { stop_.store(true); }
  void request_abort() noexcept {
    stop_.store(true);
    abort_.store(true);
  }
  bool stop_requested() const noexcept { return stop_.load(); }
  bool abort_requested() const noexcept { return abort_.load(); }
  /// start() clears a stop or abort request made before it (run() keeps one until it ends).
  void clear_requests() noexcept {
    stop_ = false;
    abort_ = false;
  }
  /// Lets bodies in a long wait return (BuildContext::cancelled()): the graph is cancelled.
  void cancel() noexcept { cancel_.store(true); }
  bool cancelled() const noexcept { return cancel_.load(); }
  const std::atomic<bool>& cancel_flag() const noexcept { return cancel_; }

  // One run or session at a time.
  bool running() const noexcept { return running_; }
  SessionState* session() const noexcept { return pull_; }
  /// A pull session starts (`session` set) or ends (null).
  void set_session(SessionState* session) noexcept {
    pull_ = session;
    running_ = session != nullptr;
  }

  // sequence.cpp, resume_value.cpp: checkpoints.
  Checkpoint checkpoint() const { return sequence_.checkpoint(); }
  Checkpoint checkpoint(NodeStates& states) const { return sequence_.checkpoint(chain_, states); }
  void save_checkpoint(const std::string& dir) const { sequence_.save_checkpoint(chain_, dir); }
  void save_checkpoint(CheckpointDir& dir) const { sequence_.save_checkpoint(chain_, dir); }
  /// Pipeline::resume().
  void resume(const Checkpoint& checkpoint, const NodeStates& states, const std::string& where);

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
  /// The recorder's end of a run (`final`: the monitor has stopped, the figures are final).
  void end_recording() { recorder_.end_run(now_ns()); }
  void fill_recording(RunReport& report, bool final) { recorder_.fill(report, final); }
  /// Empty when every batch that left the source arrived at `end` (and as many as expected);
  /// else the "run lost batches" message.
  std::string lost_batches(const std::string& end) const;
  /// "run stalled: no `what` for N s (pipeline.stall_timeout_s): <where>".
  std::string stall_message(const std::string& what) const;
  /// Every node's quiesce(), after the graph stopped.
  void quiesce_nodes() noexcept;
  /// Every node's finish(report), after a run that ended normally.
  void finish_nodes(RunReport& report);

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
  /// Returns the batch's buffers and slot and counts it done (the resume cursor); returns the
  /// batches finished so far in the run.
  std::uint64_t finish_batch(Batch* batch);
  /// Every batch object (and so every lease) back, wherever the graph left it.
  void reclaim() { chain_.reclaim(); }
  /// What a finished batch hands the head limiter.
  int depth_release() noexcept { return tuner_.depth_release(); }

 private:
  // graph.cpp.
  /// Branch `branch`'s stages [begin, last) after `tail`, a sequencer when ordered, and its train
  /// stage `last`: a serial function_node (after an async_node and its check node when the train
  /// node is asynchronous) that finishes each batch, ends epochs and decrements `limiter`.
  void wire_branch(tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail, std::size_t begin,
                   std::size_t last, int branch, tbb::flow::limiter_node<Batch*, int>& limiter,
                   Wiring& wiring);
  /// Batches of `epoch` that branch `branch` takes (seq % branches == branch; all with one).
  std::uint64_t branch_share(int branch, std::uint32_t epoch) const;
  /// Counts a finished batch of `epoch` for branch `branch`'s train node and runs its end_epoch()
  /// for every epoch, in order, whose batches have all finished.
  void end_finished_epochs(Stage& train, int branch, std::uint32_t epoch);
  /// Ends the epochs of `branch` whose batches have all finished.
  void end_ready_epochs(Stage& train, int branch);
  /// After the graph: ends a stream's epochs whose end the source found after their last batch.
  void end_streams_last_epochs();
  void on_failure(Stage& stage, Batch& batch, std::exception_ptr error);
  void run_stage(Stage& stage, Batch& batch);
  Batch* next_batch(tbb::flow_control& fc);
  /// Where a stalled run is stuck: the node holding the oldest batch, else the first that stopped.
  std::string stuck_stage() const;

  const PipelineConfig config_;
  BuildPlan plan_;  // set in the constructor, before anything is allocated; not changed after
  Chain chain_;
  Sequence sequence_;
  RunCounters counters_;
  Recorder recorder_;  // stats, trace, progress
  Autotuner tuner_{config_, plan_, chain_, counters_, recorder_};
  std::vector<std::pair<std::string, std::unique_ptr<Gauge>>> gauges_;
  std::uint64_t allocations_at_build_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<bool> abort_{false};
  // Set while a run is being cancelled; nodes poll it through BuildContext::cancelled().
  std::atomic<bool> cancel_{false};
  bool running_ = false;
  SessionState* pull_ = nullptr;  // pull mode (Pipeline::start, Session): the session now
};

}  // namespace flowfeed::detail
