#pragma once
/// \file
/// Pull mode: the caller's own training loop takes batches from a running pipeline one by one.
///
///     flowfeed::Session session = pipeline.start();
///     while (flowfeed::Batch* batch = session.next()) {
///       flowfeed::cuda::wait_ready(batch->sync, stream);  // flowfeed/cuda/handoff.hpp
///       train_step(batch->data(flowfeed::Tier::device), stream);
///       flowfeed::cuda::release_after(batch->sync, stream);
///       session.release(batch);
///     }
///     flowfeed::RunReport report = session.report();

#include <cstddef>
#include <memory>

#include "flowfeed/batch.hpp"
#include "flowfeed/checkpoint.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

class Pipeline;  ///< pipeline.hpp
namespace detail {
class SessionState;  ///< pipeline/src/session.cpp (private)
}  // namespace detail

/// A pipeline running in pull mode, made by Pipeline::start(). The graph runs on the pipeline's
/// own TBB worker threads; the caller's thread only takes finished batches (next()) and gives
/// them back (release()). It never runs a node.
///
/// The config says `pipeline.mode: pull` and ends before the train role (load → … → upload →
/// transform*): the caller's loop is the train step. The in-flight bound holds as in run(): at most
/// `prefetch_depth` batches are between the source and release(), the ones the caller holds
/// included, so a caller may hold several batches at once (e.g. to overlap steps) but never all of
/// them while it asks for another.
///
/// Ending: next() returns null once every batch of every epoch was handed out (or after
/// Pipeline::request_stop(), once the batches in flight were; after request_abort(), at once).
/// Destroying the session before that stops admitting batches, drains the ones in flight and
/// returns every buffer; batches the caller still holds become invalid. The pipeline must outlive
/// the session (if it does not, its destructor ends the session first).
///
/// Threads: the session's TBB arena has `pipeline.threads` workers (default: one per core) that
/// run every node body; one of them waits on the graph inside a task enqueued in that arena and
/// runs node tasks while it waits. CUDA's threads (or an upload node's completion thread) finish
/// device copies. The caller's thread only waits in next() (yielding briefly, then sleeping) and
/// puts the limiter's decrement back into the graph in release(). No other thread is started.
///
/// Thread-safety: use a session from one thread at a time. Pipeline::request_stop() and
/// request_abort() may be called from any thread or a signal handler.
class Session {
 public:
  /// Takes over `other`'s run; `other` may then only be destroyed or assigned to.
  Session(Session&& other) noexcept;
  /// Ends this session's run (as the destructor does), then takes over `other`'s.
  Session& operator=(Session&& other) noexcept;
  /// Stops and drains the pipeline if it is still running (see the class comment). Never throws.
  ~Session();

  /// Blocks until the next batch is ready and returns it, in sequence order when
  /// `pipeline.ordered`. The batch's buffers are leases the caller borrows until release(): read
  /// the newest tier (`data(Tier::device)` after an upload node). On the CUDA backend keep to the
  /// device hand-off (flowfeed/cuda/handoff.hpp): cuda::wait_ready(batch->sync, stream) before
  /// reading `device`, cuda::release_after(batch->sync, stream) after your last kernel reading it.
  ///
  /// Returns null at the end (again on every later call). Rethrows a node's failure as the
  /// NodeError that run() would have thrown (and again on later calls); throws Error when the run
  /// stalled (`pipeline.stall_timeout_s`, counted while next() waits) or lost batches; throws
  /// std::logic_error, naming the held batches, when the caller already holds `prefetch_depth`
  /// batches (none could come).
  Batch* next();
  /// Gives a batch from next() back: its buffers return to their pools and one more batch may
  /// enter the pipeline. Does not wait for the device (on CUDA call cuda::release_after first).
  /// Throws std::logic_error for a batch this session did not hand out or already released.
  void release(Batch* batch);

  /// The position of the session's run: the batches the caller released (the ones it holds or
  /// has not taken yet are delivered again after a resume). Pipeline::save_checkpoint() writes it.
  Checkpoint checkpoint() const;

  /// Batches the caller holds (handed out by next(), not yet released).
  std::size_t held() const noexcept;
  /// True once next() has returned null or the session was closed.
  bool finished() const noexcept;
  /// The run's figures. Complete (node finish() figures included) once next() returned null;
  /// before that, the counts so far. `train.stall_fraction` is the share of the session's time
  /// the caller spent waiting inside next().
  RunReport report() const;

 private:
  friend class Pipeline;
  explicit Session(std::unique_ptr<detail::SessionState> state) noexcept;
  std::unique_ptr<detail::SessionState> state_;
};

}  // namespace flowfeed
