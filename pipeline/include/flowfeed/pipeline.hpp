#pragma once
/// \file
/// A built pipeline: nodes, pools and the oneTBB flow graph that runs them.

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "flowfeed/build_plan.hpp"
#include "flowfeed/checkpoint.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/session.hpp"
#include "flowfeed/stats.hpp"
#include "flowfeed/trace.hpp"

namespace flowfeed {

namespace detail {
class PipelineImpl;  ///< pipeline/src/detail/pipeline_impl.hpp (private)
}  // namespace detail

/// The saved state of the nodes that keep some (Node::has_state): node name -> (its type, the
/// bytes Node::save_state wrote). What a checkpoint directory holds in its node files, as values.
using NodeStates = std::map<std::string, std::pair<std::string, std::string>>;

/// Options for one run.
struct RunOptions {
  /// Print progress to stderr every so often: epoch, batches, rate, ETA and the nodes' gauges
  /// (e.g. loss).
  bool progress = false;
  /// With progress: redraw one status line in place (for a terminal) instead of printing lines.
  bool progress_bar = false;
  /// Seconds between progress updates; 0: 0.1 for the bar, 1 for lines.
  double progress_interval_s = 0;
  /// Sample each node's state (every 1 ms, on a monitor thread) for the wait figures, count queue
  /// high-water marks and diagnose the bottleneck. Off: the report has items, busy time,
  /// utilization and train stall only, and each batch skips a few atomic counter updates.
  bool stats = true;
  /// Record per-batch spans into this trace (cleared first) for --timeline / --trace; null: off.
  Trace* trace = nullptr;
  /// Called after each epoch with the report so far (from the supervising thread).
  std::function<void(const RunReport&, std::uint32_t epoch)> on_epoch;
  /// With checkpoint_every: the checkpoint directory (Pipeline::save_checkpoint). run() opens it
  /// (a CheckpointDir: refused when it holds files that are not the checkpoint's own, or another
  /// writer holds it) before the run starts and holds it until the next run or the pipeline's end.
  std::string checkpoint_dir;
  /// With checkpoint_every: a checkpoint directory the caller holds open, used instead of
  /// checkpoint_dir (the runner opens it before the build, and writes the last checkpoint there
  /// after the run). Not owned; it must outlive the run.
  CheckpointDir* checkpoint = nullptr;
  /// Write a checkpoint to the checkpoint directory after every this many batches of the run
  /// finished the train step (on its thread, between two batches); 0: never.
  std::uint64_t checkpoint_every = 0;
  /// Admit only this many batches, then end the run normally once they finished (a run of a
  /// fixed number of steps, e.g. before a planned restart); 0: every batch of every epoch.
  std::uint64_t stop_after = 0;
};

/// A pipeline built from a validated config: every node is created and every pool allocated in the
/// constructor, so run() allocates nothing. Runs one at a time; run() may be called again after it
/// returned or threw.
class Pipeline {
 public:
  /// Builds the nodes and pools. Throws ConfigError, DataError (a data file is bad) or CudaError.
  Pipeline(PipelineConfig config, const Registry& registry);
  /// Ends an active session first (see Session), then frees every node and pool. Not while run()
  /// is running.
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;
  /// Moves the built pipeline (nodes, pools); not while it runs.
  Pipeline(Pipeline&& other) noexcept;
  /// Moves the built pipeline (nodes, pools); not while either runs.
  Pipeline& operator=(Pipeline&& other) noexcept;

  /// Runs every epoch and returns the report. Throws NodeError for the first node failure (the run
  /// is cancelled, every buffer returned), or Error when the run stalled or lost batches. After
  /// request_stop() it returns early with `report.interrupted` set. Throws ConfigError when the
  /// config has `mode: pull` (such a pipeline is stepped with start()).
  RunReport run(const RunOptions& options = {});

  /// Starts a run in pull mode and returns at once: the caller's loop takes batches with
  /// Session::next() and gives them back with Session::release() (see session.hpp). The config
  /// must have `pipeline.mode: pull` and so no train node: the caller is the train step. Throws
  /// ConfigError otherwise, std::logic_error while a run or another session is active.
  Session start();

  /// Asks the running pipeline to stop admitting batches and drain the ones in flight. Safe to call
  /// from any thread and from a signal handler (it only stores to an atomic). A request made while
  /// no run is in progress applies to the next run(), which then stops at once (start() clears
  /// it); run() clears it when it ends.
  void request_stop() noexcept;
  /// Asks the running pipeline to cancel at once: the graph is cancelled (within ~20 ms by run()'s
  /// supervisor, at the next Session::next() in pull mode) and then BuildContext::cancelled() is
  /// set so that a body blocked in a long wait can return; run() returns with
  /// `report.interrupted` set. Safe from any thread and from a signal handler.
  void request_abort() noexcept;

  /// The run's position: what the train step (in pull mode, the caller's release()) finished,
  /// never what was merely prefetched; batches in flight now are delivered again after a resume.
  /// Before the first run: where it starts (pipeline.resume_from, else the beginning). Safe from
  /// any thread, also while a run is in progress. See checkpoint.hpp.
  Checkpoint checkpoint() const;
  /// Writes checkpoint() and every node's state (Node::has_state) into `dir` atomically as a set,
  /// through the CheckpointDir the last run() holds for `dir`, else one opened for the write (a
  /// ConfigError when `dir` is not the checkpoint's own, or another writer holds it). Call it
  /// between runs, or in a pull session between next() and release(). Error: a write failed.
  void save_checkpoint(const std::string& dir) const;
  /// What save_checkpoint() writes, as values instead of files (Python's `state_dict()`):
  /// checkpoint(), and the state of every node that has one into `states` (cleared first). The
  /// same times as save_checkpoint(). pipeline/src/resume_value.cpp.
  Checkpoint checkpoint(NodeStates& states) const;
  /// Continues from a checkpoint held as values, as `pipeline.resume_from` does from a directory
  /// (Python's `load_state_dict()`): checks that `checkpoint` continues this pipeline's sample
  /// order (resume_point(): the same messages, `where` first) and lies inside this run
  /// (`cursor.epoch` not past pipeline.epochs, `cursor.finished_ahead` inside the run), loads each
  /// stateful node's state from `states`, and makes every later run start there. Between runs
  /// only (std::logic_error while a run or session is active). Throws ConfigError naming the
  /// field; every check is made before anything changes (a node whose load_state() throws may
  /// keep part of its state, as at build).
  void resume(const Checkpoint& checkpoint, const NodeStates& states, const std::string& where);
  /// save_checkpoint() into a directory the caller holds open (CheckpointDir::write).
  void save_checkpoint(CheckpointDir& dir) const;

  /// The validated config the pipeline was built from, as written (`batch_size: 0`,
  /// `prefetch_depth: auto` and `concurrency: auto` stay so; plan() has what they resolved to).
  const PipelineConfig& config() const noexcept;
  /// What the build resolved and sized everything for: the batch size, the threads and thread
  /// budget, the depth the pools hold, each node's most bodies and the memory of each edge of the
  /// chain (build_plan.hpp).
  const BuildPlan& plan() const noexcept;
  /// Pools' free buffers right now; after a run every pool is full (tests check it).
  std::size_t free_buffers() const;
  /// Buffers in all pools.
  std::size_t total_buffers() const;

 private:
  void end_session() noexcept;
  std::unique_ptr<detail::PipelineImpl> impl_;
};

}  // namespace flowfeed
