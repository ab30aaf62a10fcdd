// Pull mode: Pipeline::start() and Session. The graph is the same chain as run()'s without the
// train node; its last node hands batches to the caller through a small ring under a mutex, and
// the caller's release() puts the limiter's decrement back into the graph. Threads: the caller's
// (next/release only), the session's TBB arena workers (every node body; one of them waits on
// the graph inside an enqueued task, running node tasks meanwhile), and CUDA's callback threads.

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <condition_variable>
#include <thread>

#include "detail/pipeline_impl.hpp"
#include "flowfeed/drop_log.hpp"

namespace flowfeed {

namespace detail {

/// What the graph task and the caller's thread share. The graph task holds a reference until it
/// has destroyed the graph, so the caller may drop the session at any time.
struct PullShared {
  using Deliver = tbb::flow::async_node<Batch*, int, tbb::flow::queueing>;

  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Batch*> ring;  // delivered, not yet taken; never more than prefetch_depth
  std::size_t head = 0;
  std::size_t count = 0;
  Deliver::gateway_type* gateway = nullptr;
  tbb::flow::graph* graph = nullptr;
  std::exception_ptr error;
  bool source_done = false;   // the source has emitted its last batch
  bool finished = false;      // the graph task is over (graph destroyed)
  std::uint64_t arrived = 0;  // batches that reached the end of the chain, skipped ones too

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!error) error = std::move(e);
    cv.notify_all();
  }
  void push(Batch* b) {
    ring[(head + count) % ring.size()] = b;
    ++count;
  }
  Batch* pop() {
    Batch* b = ring[head];
    head = (head + 1) % ring.size();
    --count;
    return b;
  }
};

/// Builds the pull graph in the calling thread's arena, runs it to the end and destroys it. Every
/// body reports its failure to `s` before it rethrows, so next() wakes at once (wait_for_all
/// returns only after the caller gave back the batches it holds).
void run_pull_graph(PipelineImpl& impl, PullShared& s) {
  using namespace tbb::flow;
  graph g;
  Wiring wiring;
  limiter_node<Batch*, int>& limiter = impl.wire_head(
      g, wiring,
      [&s] {
        std::lock_guard<std::mutex> lock(s.mutex);
        s.source_done = true;
        s.cv.notify_all();
      },
      [&s](std::exception_ptr e) { s.fail(std::move(e)); });
  sender<Batch*>* tail = impl.wire_stages(
      g, &limiter, 0, impl.chain().size(), [&s](std::exception_ptr e) { s.fail(std::move(e)); },
      wiring);
  tail = impl.wire_order(g, tail, wiring);
  // Serial, so that batches enter the ring in the order the sequencer emits them. The body only
  // takes a short lock; the caller's release() completes the async work (the limiter decrement).
  PullShared::Deliver deliver(g, serial,
                              [&impl, &s](Batch* b, PullShared::Deliver::gateway_type& gw) {
                                if (b->skipped) {
                                  impl.finish_batch(b);
                                  {
                                    std::lock_guard<std::mutex> lock(s.mutex);
                                    ++s.arrived;
                                    s.cv.notify_all();
                                  }
                                  gw.try_put(impl.depth_release());
                                  return;
                                }
                                gw.reserve_wait();
                                std::lock_guard<std::mutex> lock(s.mutex);
                                s.gateway = &gw;
                                s.push(b);
                                ++s.arrived;
                                s.cv.notify_all();
                              });
  make_edge(*tail, deliver);
  make_edge(deliver, limiter.decrementer());

  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.graph = &g;
  }
  wiring.source->activate();
  try {
    g.wait_for_all();
  } catch (...) {
    s.fail(std::current_exception());
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.graph = nullptr;
}

/// A session's state: what Session holds behind its pointer.
class SessionState {
 public:
  PipelineImpl* impl = nullptr;
  std::shared_ptr<PullShared> shared;
  std::unique_ptr<tbb::global_control> parallelism;
  std::unique_ptr<tbb::task_arena> arena;
  std::vector<Batch*> held;
  std::exception_ptr error;  // what next() throws, again on every call
  bool ended = false;        // no more batches will come
  bool aborted = false;      // request_abort() cancelled the graph
  bool closed = false;       // drained; the pipeline is free for another run
  Clock::time_point started;
  std::uint64_t wait_ns = 0;
  RunReport final_report;

  /// Returns a batch to the graph: buffers back to their pools, one decrement to the limiter.
  void give_back(Batch* b) {
    PullShared::Deliver::gateway_type* gw;
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      gw = shared->gateway;
    }
    impl->finish_batch(b);
    gw->try_put(impl->depth_release());
    gw->release_wait();
  }

  /// The tuner's tick on the caller's thread, at most every kTunerTick; `waiting_ns`: how long the
  /// caller has been waiting in this next() call so far.
  void tune(std::uint64_t waiting_ns) {
    if (!impl->tuner().active() || impl->cancelled()) return;
    impl->tuner().pull_tick(detail::now_ns(), wait_ns + waiting_ns);
  }

  /// Before the caller waits for a batch: a depth the tuner keeps at or below the batches the
  /// caller holds would let none come.
  void raise_past_held() {
    const int slots = impl->tuner().hold(held.size(), detail::now_ns());
    if (slots <= 0) return;
    PullShared::Deliver::gateway_type* gw;
    {
      std::lock_guard<std::mutex> lock(shared->mutex);
      gw = shared->gateway;
    }
    if (gw) gw->try_put(slots);
  }

  RunReport make_report(double seconds, bool complete, bool interrupted) const;
  void close() noexcept;
};

RunReport SessionState::make_report(double seconds, bool complete, bool interrupted) const {
  const PipelineImpl& p = *impl;
  RunReport report = p.base_report(seconds, interrupted);
  report.threads = std::max(p.plan().threads, 1);
  // The caller's loop is the train step: it stalls while it waits inside next().
  const double waited = static_cast<double>(wait_ns) * 1e-9;
  report.train.stall_fraction = seconds > 0 ? std::min(1.0, waited / seconds) : 0;
  report.extra["caller_wait_seconds"] = waited;
  report.warnings = p.counters().warnings();  // before finish(): a node may add its own
  if (complete) impl->finish_nodes(report);
  impl->tuner().fill(report);
  return report;
}

void SessionState::close() noexcept {
  if (closed) return;
  PipelineImpl& p = *impl;
  const bool interrupted = p.stop_requested() || p.abort_requested() || !ended;
  p.request_stop();
  // Batches the caller still holds and ones it never took go back; the graph can only finish
  // once every delivered batch was given back.
  for (Batch* b : held) give_back(b);
  held.clear();
  {
    std::unique_lock<std::mutex> lock(shared->mutex);
    for (;;) {
      while (shared->count > 0) {
        Batch* b = shared->pop();
        lock.unlock();
        give_back(b);
        lock.lock();
      }
      if (shared->finished) break;
      shared->cv.wait(lock);
    }
    if (shared->error && !error) error = shared->error;
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  p.end_recording();
  arena.reset();
  parallelism.reset();
  p.quiesce_nodes();
  if (!error && !interrupted) {
    const std::string lost = p.lost_batches("the end of the pipeline");
    if (!lost.empty()) error = std::make_exception_ptr(Error(lost));
  }
  try {
    final_report = make_report(seconds, !error && !interrupted, interrupted);
    // Once the monitor has stopped: the sampled figures are final.
    p.fill_recording(final_report, true);
    if (!error && !interrupted) check_something_delivered(final_report);
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  p.reclaim();
  p.set_session(nullptr);
  closed = true;
}

}  // namespace detail

using detail::Clock;
using detail::PipelineImpl;
using detail::SessionState;

Session::Session(std::unique_ptr<SessionState> state) noexcept : state_(std::move(state)) {}
Session::Session(Session&& other) noexcept = default;
Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    if (state_) state_->close();
    state_ = std::move(other.state_);
  }
  return *this;
}
Session::~Session() {
  if (state_) state_->close();
}

Batch* Session::next() {
  if (!state_) throw std::logic_error("Session::next on a moved-from session");
  SessionState& st = *state_;
  if (st.error) std::rethrow_exception(st.error);
  if (st.ended || st.closed) return nullptr;
  PipelineImpl& p = *st.impl;
  const std::size_t depth = static_cast<std::size_t>(p.plan().prefetch_depth);
  if (st.held.size() >= depth) {
    std::string batches;
    for (const Batch* b : st.held) {
      batches += (batches.empty() ? "batch " : ", batch ") + std::to_string(b->seq) + " (epoch " +
                 std::to_string(b->epoch) + ")";
    }
    throw std::logic_error("Session::next: the caller holds all " + std::to_string(depth) +
                           " batches the pipeline may have in flight (pipeline.prefetch_depth): " +
                           batches + "; no other batch can come, release() one first");
  }
  detail::PullShared& s = *st.shared;
  const double timeout = p.config().pipeline.stall_timeout_s;
  const auto t0 = Clock::now();
  const bool tuning = p.tuner().active();
  if (tuning) {
    st.raise_past_held();
    st.tune(0);
  }
  Batch* out = nullptr;
  constexpr int kSpins = 64;
  int spins = 0;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    for (;;) {
      if (s.error) {
        st.error = s.error;
        break;
      }
      if (p.abort_requested()) {
        // Cancel at once: what is in flight never arrives, and what did is not handed out any
        // more; close() gives it back.
        if (s.graph) s.graph->cancel();
        p.cancel();  // after the cancel: lets bodies in a long wait return
        st.aborted = true;
        st.ended = true;
        break;
      }
      if (s.count > 0) {
        out = s.pop();
        break;
      }
      if (s.finished || (s.source_done && s.arrived == p.counters().produced())) {
        st.ended = true;
        break;
      }
      const auto now = Clock::now();
      if (timeout > 0 && std::chrono::duration<double>(now - t0).count() > timeout) {
        s.error = std::make_exception_ptr(Error(p.stall_message("batch")));
        if (s.graph) s.graph->cancel();
        p.cancel();
        continue;
      }
      if (spins < kSpins) {
        // A batch is usually microseconds away: yielding first (to the workers that make it)
        // avoids a sleep and a wake-up per batch.
        ++spins;
        lock.unlock();
        std::this_thread::yield();
        lock.lock();
        continue;
      }
      if (tuning) {
        lock.unlock();
        st.tune(static_cast<std::uint64_t>(
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count()));
        lock.lock();
        if (s.count > 0 || s.error || s.finished) continue;
      }
      // Short slices: request_abort() from a signal handler cannot notify.
      s.cv.wait_for(lock, tuning ? detail::kTunerTick : std::chrono::milliseconds(50));
    }
  }
  st.wait_ns += static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count());
  if (out) {
    st.held.push_back(out);
    return out;
  }
  if (st.error) std::rethrow_exception(st.error);
  if (st.held.empty()) {
    st.close();
    if (st.error) std::rethrow_exception(st.error);
  }
  return nullptr;
}

void Session::release(Batch* batch) {
  if (!state_) throw std::logic_error("Session::release on a moved-from session");
  SessionState& st = *state_;
  auto it = std::find(st.held.begin(), st.held.end(), batch);
  if (it == st.held.end()) {
    throw std::logic_error(st.closed ? "Session::release: the session is closed (its pipeline was "
                                       "destroyed or the session ended); its batches are gone"
                                     : "Session::release: this batch was not handed out by this "
                                       "session's next(), or was released already");
  }
  st.held.erase(it);
  st.give_back(batch);
  if (st.ended && st.held.empty()) st.close();
}

Checkpoint Session::checkpoint() const {
  if (!state_) throw std::logic_error("Session::checkpoint on a moved-from session");
  return state_->impl->checkpoint();
}

std::size_t Session::held() const noexcept {
  return state_ ? state_->held.size() : 0;
}
bool Session::finished() const noexcept {
  return !state_ || state_->ended || state_->closed;
}

RunReport Session::report() const {
  if (!state_) throw std::logic_error("Session::report on a moved-from session");
  if (state_->closed) return state_->final_report;
  const PipelineImpl& p = *state_->impl;
  return state_->make_report(std::chrono::duration<double>(Clock::now() - state_->started).count(),
                             false, p.stop_requested() || p.abort_requested());
}

Session Pipeline::start() {
  PipelineImpl& p = *impl_;
  if (p.running()) {
    throw std::logic_error(
        "Pipeline::start: the pipeline is already running (one run or session "
        "at a time)");
  }
  p.begin_run(true);
  // start() clears a stop or abort request made before it (run() keeps one; see request_stop).
  p.clear_requests();

  auto state = std::make_unique<SessionState>();
  state->impl = &p;
  state->shared = std::make_shared<detail::PullShared>();
  state->shared->ring.assign(static_cast<std::size_t>(p.plan().prefetch_depth), nullptr);
  const int threads = std::max(p.plan().threads, 1);
  // No slot is kept for an external thread: the caller never enters the arena, so all `threads`
  // slots go to workers.
  state->parallelism = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, static_cast<std::size_t>(threads) + 1);
  // The caller's thread never joins the arena, so without a worker nothing would ever run (an
  // application's own global_control may hold parallelism to 1; the smallest limit wins).
  const std::size_t allowed =
      tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism);
  if (allowed < 2) {
    throw Error(
        "Pipeline::start: pull mode needs at least one TBB worker thread, and a "
        "tbb::global_control limits parallelism to " +
        std::to_string(allowed) +
        " (the caller's thread does not run nodes in pull mode) raise the limit, or use "
        "Pipeline::run()");
  }
  state->arena = std::make_unique<tbb::task_arena>(threads, 0);
  // The nodes' sampled figures, the verdict and the tuner, as in run() (no progress line: the
  // caller owns the terminal). Before the graph is wired: its head limiter starts at the tuner's
  // first depth.
  p.begin_recording(RunOptions{}, threads);
  state->started = Clock::now();
  p.set_session(state.get());
  // The graph is built, run and destroyed inside this task, so it lives in the session's arena,
  // and the caller's thread is never inside wait_for_all.
  state->arena->enqueue([impl = &p, shared = state->shared] {
    try {
      detail::run_pull_graph(*impl, *shared);
    } catch (...) {
      shared->fail(std::current_exception());
    }
    std::lock_guard<std::mutex> lock(shared->mutex);
    shared->finished = true;
    shared->cv.notify_all();
  });
  return Session(std::move(state));
}

void Pipeline::end_session() noexcept {
  if (impl_ && impl_->session()) impl_->session()->close();
}

}  // namespace flowfeed