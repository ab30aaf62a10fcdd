// Wiring and per-batch work: the flow-graph nodes of a run or session, what each body does with a
// batch (run a stage, count, trace, fail), the source and the end of a batch, and epoch ends.

#include <algorithm>

#include "detail/pipeline_impl.hpp"
#include "flowfeed/drop_log.hpp"

namespace flowfeed::detail {

namespace {

/// True when `e` holds an `Error` of type E (a dropped batch, a data error).
template <class E>
bool holds(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const E&) {
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

void PipelineImpl::on_failure(Stage& stage, Batch& batch, std::exception_ptr error) {
  if (cancel_.load() && holds<RunCancelled>(error)) {
    // The body gave up because the run is being cancelled: the failure (or the stop) that
    // cancelled it is the run's error, and a batch that gave up first must not take its place.
    batch.skipped = true;
    batch.error = nullptr;
    return;
  }
  stage.add_failure();
  std::string message = stage.label() + " batch " + std::to_string(batch.seq) + " (epoch " +
                        std::to_string(batch.epoch) + "): " + what_of(error);
  if (config_.pipeline.on_error == OnError::skip && holds<BatchDroppedError>(error)) {
    // The node dropped, counted and reported each of the batch's samples already.
    counters_.count_skipped();
    batch.skipped = true;
    batch.error = nullptr;
    return;
  }
  if (config_.pipeline.on_error == OnError::skip && holds<DataError>(error)) {
    const std::uint64_t n = counters_.count_skipped();
    if (n > static_cast<std::uint64_t>(config_.pipeline.max_skipped)) {
      cancel_.store(true);
      throw NodeError(message + " (" + std::to_string(n) + (n == 1 ? " batch" : " batches") +
                          " skipped, more than pipeline.max_skipped = " +
                          std::to_string(config_.pipeline.max_skipped) + ")",
                      stage.spec().name, stage.spec().type, static_cast<long long>(batch.seq));
    }
    counters_.count_skipped_samples(batch.rows());
    batch.skipped = true;
    batch.error = nullptr;
    counters_.warn("skipped: " + message);
    return;
  }
  // Lets bodies still running elsewhere (a long wait) end early: the graph is about to cancel.
  cancel_.store(true);
  throw NodeError(message, stage.spec().name, stage.spec().type, static_cast<long long>(batch.seq));
}

void PipelineImpl::run_stage(Stage& stage, Batch& batch) {
  const std::uint64_t t0 = now_ns();
  recorder_.enter(stage.index(), batch, t0);
  if (batch.skipped) {
    recorder_.leave(stage.index(), batch, t0);
    return;
  }
  chain_.mark(batch, static_cast<int>(stage.index()));
  stage.body_started();
  try {
    stage.node().process(batch);
  } catch (...) {
    chain_.mark(batch, -1);
    const std::uint64_t t1 = now_ns();
    stage.body_ended();
    stage.add_busy(t1 - t0);
    recorder_.leave(stage.index(), batch, t1);
    on_failure(stage, batch, std::current_exception());
    return;
  }
  const std::uint64_t t1 = now_ns();
  stage.add_busy(t1 - t0);
  stage.add_item();
  // A stream's batch past the end of its epoch's data, or past stop_after, is dropped.
  if (stage.index() == 0 && !batch.past_end && !sequence_.keep(batch)) {
    batch.past_end = true;
    batch.skipped = true;
  }
  chain_.mark(batch, -1);
  stage.body_ended();
  recorder_.leave(stage.index(), batch, t1);
}

Batch* PipelineImpl::next_batch(tbb::flow_control& fc) {
  if (stop_.load(std::memory_order_relaxed) || abort_.load(std::memory_order_relaxed) ||
      sequence_.exhausted()) {
    fc.stop();
    return nullptr;
  }
  Batch* b = chain_.take_free();
  if (!b) throw std::logic_error("no free batch slot: the in-flight bound was broken");
  b->layout = &chain_.layout();  // a transform may have pointed it at its own layout last time
  sequence_.assign(*b);
  const std::uint64_t produced = counters_.count_produced();
  recorder_.admission(produced, counters_.consumed());
  return b;
}

std::uint64_t PipelineImpl::finish_batch(Batch* b) {
  sequence_.finish(*b);
  recorder_.finish(*b);
  const std::uint64_t consumed =
      counters_.count_finished(*b, chain_.upload_layout().bytes(b->rows()));
  b->reset();
  chain_.put_free(b);
  recorder_.admission(counters_.produced(), consumed);
  return consumed;
}

std::string PipelineImpl::stuck_stage() const {
  // The oldest batch a node holds is the one the others wait for.
  if (const auto held = chain_.oldest_held()) {
    return chain_.stage(held->stage).label() + " is still processing batch " +
           std::to_string(held->seq) + " (epoch " +
           std::to_string(sequence_.epoch_of_run_batch(held->seq)) + ")";
  }
  for (std::size_t i = 1; i < chain_.size(); ++i) {
    if (chain_.stage(i).items() < chain_.stage(i - 1).items()) {
      return chain_.stage(i).label() + " has stopped taking batches";
    }
  }
  return chain_.front().label() + " is not producing batches";
}

tbb::flow::limiter_node<Batch*, int>& PipelineImpl::wire_head(tbb::flow::graph& g, Wiring& wiring,
                                                              std::function<void()> on_source_done,
                                                              OnThrow on_throw) {
  using namespace tbb::flow;
  wiring.source = std::make_unique<input_node<Batch*>>(
      g, [this, on_source_done, on_throw](tbb::flow_control& fc) -> Batch* {
        try {
          Batch* b = next_batch(fc);
          if (!b && on_source_done) on_source_done();
          return b;
        } catch (...) {
          if (on_throw) on_throw(std::current_exception());
          throw;
        }
      });
  wiring.limiter = std::make_unique<limiter_node<Batch*, int>>(
      g, static_cast<std::size_t>(plan_.prefetch_depth));
  make_edge(*wiring.source, *wiring.limiter);
  tuner_.attach_depth(*wiring.limiter);
  return *wiring.limiter;
}

tbb::flow::sender<Batch*>* PipelineImpl::wire_order(tbb::flow::graph& g,
                                                    tbb::flow::sender<Batch*>* tail,
                                                    Wiring& wiring) {
  if (!config_.pipeline.ordered) return tail;
  // Branch b of N takes seq b, b+N, b+2N, ...: seq / N numbers them 0, 1, 2, ...
  const auto n = static_cast<std::uint64_t>(chain_.branches());
  auto sequencer = std::make_unique<tbb::flow::sequencer_node<Batch*>>(
      g, [n](Batch* b) -> std::size_t { return static_cast<std::size_t>(b->seq / n); });
  tbb::flow::make_edge(*tail, *sequencer);
  tail = sequencer.get();
  wiring.nodes.push_back(std::move(sequencer));
  return tail;
}

tbb::flow::sender<Batch*>* PipelineImpl::wire_stages(tbb::flow::graph& g,
                                                     tbb::flow::sender<Batch*>* tail,
                                                     std::size_t begin, std::size_t end,
                                                     const OnThrow& on_throw, Wiring& out,
                                                     std::atomic<std::uint64_t>* passed) {
  using namespace tbb::flow;
  using AsyncNode = Wiring::AsyncNode;
  // Runs f; tells on_throw about what it throws, then rethrows it.
  auto reporting = [on_throw](auto&& f) {
    if (!on_throw) return f();
    try {
      return f();
    } catch (...) {
      on_throw(std::current_exception());
      throw;
    }
  };
  for (std::size_t i = begin; i < end; ++i) {
    Stage* st = &chain_.stage(i);
    const std::size_t conc = static_cast<std::size_t>(st->bodies());
    const bool first = i == 0;
    std::atomic<std::uint64_t>* count = i + 1 == end ? passed : nullptr;
    if (!st->node().asynchronous()) {
      // concurrency: auto: a limiter of the node's most bodies before it, of which the tuner
      // lets `effective` through (fed by a queue_node: a limiter must not reject a discarding
      // node's output); each body hands its slot back when it is done.
      limiter_node<Batch*, int>* gate = nullptr;
      if (tuner_.active() && st->tunable()) {
        auto queue = std::make_unique<queue_node<Batch*>>(g);
        auto limiter = std::make_unique<limiter_node<Batch*, int>>(g, conc);
        make_edge(*tail, *queue);
        make_edge(*queue, *limiter);
        st->gate().attach(*limiter, static_cast<int>(conc), 1);
        gate = limiter.get();
        tail = limiter.get();
        out.nodes.push_back(std::move(queue));
        out.nodes.push_back(std::move(limiter));
      }
      auto node = std::make_unique<function_node<Batch*, Batch*>>(
          g, conc, [this, st, first, reporting, count, gate](Batch* b) {
            if (first) counters_.note_in_flight();
            reporting([&] { run_stage(*st, *b); });
            if (gate) gate->decrementer().try_put(st->gate().on_finished());
            if (count) count->fetch_add(1, std::memory_order_acq_rel);
            return b;
          });
      make_edge(*tail, *node);
      tail = node.get();
      out.nodes.push_back(std::move(node));
      continue;
    }
    auto ctx = std::make_unique<Wiring::AsyncContext>();
    ctx->stage = st;
    ctx->impl = this;
    Wiring::AsyncContext* c = ctx.get();
    const bool flushes = st->spec().role == Role::train;
    auto node = std::make_unique<AsyncNode>(
        g, conc, [this, c, first, flushes](Batch* b, AsyncNode::gateway_type& gw) {
          if (first) counters_.note_in_flight();
          const std::uint64_t t0 = now_ns();
          auto* async = static_cast<AsynchronousNode*>(&c->stage->node());
          // A train node that holds batches back completes them when no other batch can come.
          auto arrived = [&] {
            if (!flushes) return;
            Stage& t = *c->stage;
            const std::uint64_t n = t.arrive();
            if (t.queued() <= n) async->flush();
          };
          recorder_.enter(c->stage->index(), *b, t0);
          if (b->skipped) {
            recorder_.submitted();
            recorder_.complete(c->stage->index(), *b, t0);
            gw.try_put(b);
            arrived();
            return;
          }
          // Outstanding device work counts as processing, so that a stall names a completion
          // that never comes.
          chain_.mark(*b, static_cast<int>(c->stage->index()));
          gw.reserve_wait();
          Completion done(
              [](void* context, Batch* batch, std::exception_ptr error) noexcept {
                auto* ac = static_cast<Wiring::AsyncContext*>(context);
                if (error) batch->error = std::move(error);
                ac->stage->add_item();
                ac->impl->chain_.mark(*batch, -1);
                ac->impl->recorder_.complete(ac->stage->index(), *batch, now_ns());
                ac->gateway->try_put(batch);
                ac->gateway->release_wait();
              },
              c, b);
          try {
            async->submit(*b, done);
          } catch (...) {
            b->error = std::current_exception();
            chain_.mark(*b, -1);
            recorder_.submitted();
            recorder_.complete(c->stage->index(), *b, now_ns());
            gw.try_put(b);
            gw.release_wait();
            arrived();
            c->stage->add_busy(now_ns() - t0);
            return;
          }
          // The batch may have moved on already: touch only the node's own counters.
          recorder_.submitted();
          arrived();
          c->stage->add_busy(now_ns() - t0);
        });
    // Set once, before the graph runs: completions read it from other threads.
    c->gateway = &node->gateway();
    make_edge(*tail, *node);
    // Completions only flag failures; this node rethrows them on a TBB thread, in the graph.
    auto check = std::make_unique<function_node<Batch*, Batch*>>(
        g, unlimited, [this, st, reporting, count](Batch* b) {
          if (b->error) {
            std::exception_ptr e = std::move(b->error);
            b->error = nullptr;
            reporting([&] { on_failure(*st, *b, e); });
          }
          if (count) count->fetch_add(1, std::memory_order_acq_rel);
          return b;
        });
    make_edge(*node, *check);
    tail = check.get();
    out.nodes.push_back(std::move(node));
    out.nodes.push_back(std::move(check));
    out.contexts.push_back(std::move(ctx));
  }
  return tail;
}

std::uint64_t PipelineImpl::branch_share(int branch, std::uint32_t epoch) const {
  const std::uint64_t n = static_cast<std::uint64_t>(chain_.branches());
  const std::uint64_t b = static_cast<std::uint64_t>(branch);
  // Sequence numbers below x that go to branch b.
  auto below = [n, b](std::uint64_t x) { return x / n + (x % n > b ? 1 : 0); };
  if (sequence_.stream()) {
    // Not known while the source may still emit batches of the epoch.
    const auto seqs = sequence_.stream_epoch_seqs(epoch);
    return seqs ? below(seqs->second) - below(seqs->first) : ~0ull;
  }
  const std::uint64_t per_epoch = sequence_.batches_per_epoch();
  // The run's batches of this epoch have the seqs [first, last): fewer in a resumed epoch.
  return below(sequence_.run_batches_before((epoch + 1ull) * per_epoch)) -
         below(sequence_.run_batches_before(epoch * per_epoch));
}

void PipelineImpl::wire_branches(tbb::flow::graph& g, tbb::flow::limiter_node<Batch*, int>& limiter,
                                 Wiring& wiring) {
  using namespace tbb::flow;
  if (chain_.branches() == 1) {
    wire_branch(g, &limiter, 0, chain_.size() - 1, 0, limiter, wiring);
    return;
  }
  const auto n = static_cast<std::size_t>(chain_.branches());
  sender<Batch*>* shared = wire_stages(g, &limiter, 0, chain_.branch_begin(), {}, wiring);
  // Each branch starts at a queue_node, which never rejects: the router puts into it directly.
  std::vector<queue_node<Batch*>*> entries;
  for (std::size_t b = 0; b < n; ++b) {
    auto entry = std::make_unique<queue_node<Batch*>>(g);
    entries.push_back(entry.get());
    wiring.nodes.push_back(std::move(entry));
  }
  auto router =
      std::make_unique<function_node<Batch*, continue_msg>>(g, unlimited, [entries, n](Batch* b) {
        entries[static_cast<std::size_t>(b->seq % n)]->try_put(b);
        return continue_msg();
      });
  make_edge(*shared, *router);
  wiring.nodes.push_back(std::move(router));
  for (std::size_t b = 0; b < n; ++b) {
    const std::size_t begin = chain_.branch_begin() + b * chain_.branch_len();
    wire_branch(g, entries[b], begin, begin + chain_.branch_len() - 1, static_cast<int>(b), limiter,
                wiring);
  }
}

void PipelineImpl::wire_branch(tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail,
                               std::size_t begin, std::size_t last, int branch,
                               tbb::flow::limiter_node<Batch*, int>& limiter, Wiring& wiring) {
  using namespace tbb::flow;
  Stage* train = &chain_.stage(last);
  tail = wire_stages(g, tail, begin, last, {}, wiring, &train->queued_counter());
  tail = wire_order(g, tail, wiring);
  // The train node: a serial function_node, or (asynchronous) an async_node whose completions
  // reach a serial node that finishes them. Either way a finished batch decrements the limiter.
  const bool async_train = train->node().asynchronous();
  if (async_train) tail = wire_stages(g, tail, last, last + 1, {}, wiring);
  const bool first = last == 0;
  auto finish = std::make_unique<function_node<Batch*, int>>(
      g, serial, [this, train, branch, async_train, first](Batch* b) {
        if (!async_train) {
          if (first) counters_.note_in_flight();
          run_stage(*train, *b);
        }
        if (chain_.branches() > 1 && !b->skipped) {
          counters_.count_branch(branch, *b, chain_.upload_layout().bytes(b->rows()));
        }
        const std::uint32_t epoch = b->epoch;
        const std::uint64_t finished = finish_batch(b);
        end_finished_epochs(*train, branch, epoch);
        sequence_.checkpoint_after(chain_, finished);
        return depth_release();
      });
  make_edge(*tail, *finish);
  make_edge(*finish, limiter.decrementer());
  wiring.nodes.push_back(std::move(finish));
}

void PipelineImpl::end_finished_epochs(Stage& train, int branch, std::uint32_t epoch) {
  counters_.count_epoch_batch(branch, epoch);
  end_ready_epochs(train, branch);
}

void PipelineImpl::end_streams_last_epochs() {
  if (!sequence_.stream()) return;
  // A stream's epoch ends where the source finds its data's end (or stop_after), which it may
  // find after every batch of the epoch has finished: the run's end ends such an epoch.
  for (int b = 0; b < chain_.branches(); ++b) end_ready_epochs(chain_.train_stage(b), b);
}

void PipelineImpl::end_ready_epochs(Stage& train, int branch) {
  // In order, each after all of its batches: an asynchronous train node may complete the first
  // batches of the next epoch before the last of this one.
  auto share = [this, branch](std::uint32_t e) { return branch_share(branch, e); };
  while (const std::optional<std::uint32_t> ending = counters_.take_ended_epoch(branch, share)) {
    const std::uint64_t t0 = now_ns();
    try {
      train.node().end_epoch(*ending);
    } catch (...) {
      train.add_failure();
      cancel_.store(true);
      throw NodeError(train.label() + " end of epoch " + std::to_string(*ending) + ": " +
                          what_of(std::current_exception()),
                      train.spec().name, train.spec().type, -1);
    }
    train.add_busy(now_ns() - t0);
  }
}

}  // namespace flowfeed::detail
