// Wiring and per-batch work: the flow-graph nodes of a run or session, what each body does with a
// batch (run a stage, count, trace, fail), the source and the end of a batch, and epoch ends.

#include <algorithm>

#include "detail/pipeline_impl.hpp"
#include "flowfeed/drop_log.hpp"

namespace flowfeed::detail {

namespace {

bool is_dropped_batch(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const BatchDroppedError&) {
    return true;
  } catch (...) {
    return false;
  }
}

bool is_data_error(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const DataError&) {
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
  stage.failures.fetch_add(1, std::memory_order_relaxed);
  std::string message = stage.label + " batch " + std::to_string(batch.seq) + " (epoch " +
                        std::to_string(batch.epoch) + "): " + what_of(error);
  if (config_.pipeline.on_error == OnError::skip && is_dropped_batch(error)) {
    // The node dropped, counted and reported each of the batch's samples already.
    skipped_.fetch_add(1);
    batch.skipped = true;
    batch.error = nullptr;
    return;
  }
  if (config_.pipeline.on_error == OnError::skip && is_data_error(error)) {
    std::uint64_t n = skipped_.fetch_add(1) + 1;
    if (n > static_cast<std::uint64_t>(config_.pipeline.max_skipped)) {
      cancel_.store(true);
      throw NodeError(message + " (" + std::to_string(n) + (n == 1 ? " batch" : " batches") +
                          " skipped, more than pipeline.max_skipped = " +
                          std::to_string(config_.pipeline.max_skipped) + ")",
                      stage.spec.name, stage.spec.type, static_cast<long long>(batch.seq));
    }
    skipped_samples_.fetch_add(batch.rows(), std::memory_order_relaxed);
    batch.skipped = true;
    batch.error = nullptr;
    std::lock_guard<std::mutex> lock(warn_mutex_);
    if (warnings_.size() < 20) warnings_.push_back("skipped: " + message);
    return;
  }
  // Lets bodies still running elsewhere (a long wait) end early: the graph is about to cancel.
  cancel_.store(true);
  throw NodeError(message, stage.spec.name, stage.spec.type, static_cast<long long>(batch.seq));
}

void PipelineImpl::run_stage(Stage& stage, Batch& batch) {
  const std::uint64_t t0 = now_ns();
  recorder_.enter(stage.index, batch, t0);
  if (batch.skipped) {
    recorder_.leave(stage.index, batch, t0);
    return;
  }
  mark(batch, static_cast<int>(stage.index));
  stage.active.fetch_add(1, std::memory_order_relaxed);
  try {
    stage.node->process(batch);
  } catch (...) {
    mark(batch, -1);
    const std::uint64_t t1 = now_ns();
    stage.active.fetch_sub(1, std::memory_order_relaxed);
    stage.busy_ns.fetch_add(t1 - t0, std::memory_order_relaxed);
    recorder_.leave(stage.index, batch, t1);
    on_failure(stage, batch, std::current_exception());
    return;
  }
  const std::uint64_t t1 = now_ns();
  stage.busy_ns.fetch_add(t1 - t0, std::memory_order_relaxed);
  stage.items.fetch_add(1, std::memory_order_relaxed);
  mark(batch, -1);
  stage.active.fetch_sub(1, std::memory_order_relaxed);
  recorder_.leave(stage.index, batch, t1);
}

Batch* PipelineImpl::next_batch(tbb::flow_control& fc) {
  // Batches a resumed unordered run had finished out of order are not delivered again.
  while (source_skip_ < start_.skip.size() && start_.skip[source_skip_] <= source_pos_) {
    if (start_.skip[source_skip_] == source_pos_) ++source_pos_;
    ++source_skip_;
  }
  if (stop_.load(std::memory_order_relaxed) || abort_.load(std::memory_order_relaxed) ||
      source_pos_ >= sequence_end() || (stop_after_ > 0 && source_seq_ >= stop_after_)) {
    fc.stop();
    return nullptr;
  }
  const std::uint64_t per_epoch = sampler_->batches_per_epoch();
  const auto epoch = static_cast<std::uint32_t>(source_pos_ / per_epoch);
  const std::uint64_t index = source_pos_ % per_epoch;
  if (epoch != order_epoch_) {
    source_order_ = sampler_->epoch_order(epoch);
    order_epoch_ = epoch;
  }
  Batch* b = nullptr;
  if (!free_batches_.try_pop(b)) {
    throw std::logic_error("no free batch slot: the in-flight bound was broken");
  }
  b->seq = source_seq_++;
  b->layout = &layout_;  // a transform may have pointed it at its own layout last time
  b->epoch = epoch;
  b->index_in_epoch = index;
  sampler_->batch_samples(source_order_, index, b->samples);
  ++source_pos_;
  const std::uint64_t produced = produced_.fetch_add(1, std::memory_order_relaxed) + 1;
  recorder_.admission(produced, consumed_.load(std::memory_order_relaxed));
  return b;
}

std::uint64_t PipelineImpl::finish_batch(Batch* b) {
  cursor_.finish(b->epoch * sampler_->batches_per_epoch() + b->index_in_epoch);
  if (!b->skipped) {
    // Only batches that reached a device buffer were uploaded (a resident run's batches carry only
    // indices).
    if (b->device) bytes_.fetch_add(upload_layout_->bytes(b->rows()), std::memory_order_relaxed);
    samples_.fetch_add(b->rows(), std::memory_order_relaxed);
  }
  recorder_.finish(*b);
  b->reset();
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  const std::uint64_t consumed = consumed_.fetch_add(1, std::memory_order_relaxed) + 1;
  free_batches_.push(b);
  recorder_.admission(produced_.load(std::memory_order_relaxed), consumed);
  return consumed;
}

void PipelineImpl::reclaim() {
  // Every batch object (and so every lease) comes back, wherever the graph left it.
  free_batches_.clear();
  for (auto& b : batches_) {
    b->reset();
    free_batches_.push(b.get());
  }
}

std::string PipelineImpl::stuck_stage() const {
  // The oldest batch a node holds is the one the others wait for.
  int stuck = -1;
  std::uint64_t oldest = 0;
  for (std::size_t i = 0; i < batches_.size(); ++i) {
    const int stage = slot_stage_[i].load(std::memory_order_acquire);
    const std::uint64_t seq = slot_seq_[i].load(std::memory_order_relaxed);
    if (stage >= 0 && (stuck < 0 || seq < oldest)) {
      stuck = stage;
      oldest = seq;
    }
  }
  if (stuck >= 0) {
    return stages_[static_cast<std::size_t>(stuck)]->label + " is still processing batch " +
           std::to_string(oldest) + " (epoch " +
           std::to_string((start_.first + oldest) / sampler_->batches_per_epoch()) + ")";
  }
  for (std::size_t i = 1; i < stages_.size(); ++i) {
    if (stages_[i]->items.load() < stages_[i - 1]->items.load()) {
      return stages_[i]->label + " has stopped taking batches";
    }
  }
  return stages_.front()->label + " is not producing batches";
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
      g, static_cast<std::size_t>(config_.pipeline.prefetch_depth));
  make_edge(*wiring.source, *wiring.limiter);
  // prefetch_depth: auto: the pools hold prefetch_depth batches; the tuner moves how many of
  // them may be in flight.
  if (tuning_ && config_.pipeline.auto_prefetch_depth) {
    depth_gate_.attach(*wiring.limiter, config_.pipeline.prefetch_depth, start_depth_);
  }
  return *wiring.limiter;
}

tbb::flow::sender<Batch*>* PipelineImpl::wire_order(tbb::flow::graph& g,
                                                    tbb::flow::sender<Batch*>* tail,
                                                    Wiring& wiring) {
  if (!config_.pipeline.ordered) return tail;
  // Branch b of N takes seq b, b+N, b+2N, ...: seq / N numbers them 0, 1, 2, ...
  const auto n = static_cast<std::uint64_t>(branches_);
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
    Stage* st = stages_[i].get();
    const std::size_t conc = static_cast<std::size_t>(st->spec.concurrency);
    const bool first = i == 0;
    std::atomic<std::uint64_t>* count = i + 1 == end ? passed : nullptr;
    if (!st->node->asynchronous()) {
      // concurrency: auto: a limiter of the node's most bodies before it, of which the tuner
      // lets `effective` through (fed by a queue_node: a limiter must not reject a discarding
      // node's output); each body hands its slot back when it is done.
      limiter_node<Batch*, int>* gate = nullptr;
      if (tuning_ && st->tunable) {
        auto queue = std::make_unique<queue_node<Batch*>>(g);
        auto limiter = std::make_unique<limiter_node<Batch*, int>>(g, conc);
        make_edge(*tail, *queue);
        make_edge(*queue, *limiter);
        st->gate.attach(*limiter, static_cast<int>(conc), 1);
        gate = limiter.get();
        tail = limiter.get();
        out.nodes.push_back(std::move(queue));
        out.nodes.push_back(std::move(limiter));
      }
      auto node = std::make_unique<function_node<Batch*, Batch*>>(
          g, conc, [this, st, first, reporting, count, gate](Batch* b) {
            if (first) note_in_flight();
            reporting([&] { run_stage(*st, *b); });
            if (gate) gate->decrementer().try_put(st->gate.on_finished());
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
    const bool flushes = st->spec.role == Role::train;
    auto node = std::make_unique<AsyncNode>(
        g, conc, [this, c, first, flushes](Batch* b, AsyncNode::gateway_type& gw) {
          if (first) note_in_flight();
          const std::uint64_t t0 = now_ns();
          auto* async = static_cast<AsynchronousNode*>(c->stage->node.get());
          // A train node that holds batches back completes them when no other batch can come.
          auto arrived = [&] {
            if (!flushes) return;
            Stage& t = *c->stage;
            const std::uint64_t n = t.arrived.fetch_add(1, std::memory_order_acq_rel) + 1;
            if (t.queued.load(std::memory_order_acquire) <= n) async->flush();
          };
          recorder_.enter(c->stage->index, *b, t0);
          if (b->skipped) {
            recorder_.submitted();
            recorder_.complete(c->stage->index, *b, t0);
            gw.try_put(b);
            arrived();
            return;
          }
          // Outstanding device work counts as processing, so that a stall names a completion
          // that never comes.
          mark(*b, static_cast<int>(c->stage->index));
          gw.reserve_wait();
          Completion done(
              [](void* context, Batch* batch, std::exception_ptr error) noexcept {
                auto* ac = static_cast<Wiring::AsyncContext*>(context);
                if (error) batch->error = std::move(error);
                ac->stage->items.fetch_add(1, std::memory_order_relaxed);
                ac->impl->mark(*batch, -1);
                ac->impl->recorder_.complete(ac->stage->index, *batch, now_ns());
                ac->gateway->try_put(batch);
                ac->gateway->release_wait();
              },
              c, b);
          try {
            async->submit(*b, done);
          } catch (...) {
            b->error = std::current_exception();
            mark(*b, -1);
            recorder_.submitted();
            recorder_.complete(c->stage->index, *b, now_ns());
            gw.try_put(b);
            gw.release_wait();
            arrived();
            c->stage->busy_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
            return;
          }
          // The batch may have moved on already: touch only the node's own counters.
          recorder_.submitted();
          arrived();
          c->stage->busy_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
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

const BatchLayout* PipelineImpl::layout_into(std::size_t index) const {
  if (index == 0) return &layout_;
  // Each branch's first stage follows the last shared stage.
  const bool branch_head =
      branches_ > 1 && index >= branch_begin_ && (index - branch_begin_) % branch_len_ == 0;
  return stages_[branch_head ? branch_begin_ - 1 : index - 1]->out_layout;
}

std::uint64_t PipelineImpl::branch_share(int branch, std::uint32_t epoch) const {
  const std::uint64_t n = static_cast<std::uint64_t>(branches_);
  const std::uint64_t b = static_cast<std::uint64_t>(branch);
  // Sequence numbers below x that go to branch b.
  auto below = [n, b](std::uint64_t x) { return x / n + (x % n > b ? 1 : 0); };
  const std::uint64_t per_epoch = sampler_->batches_per_epoch();
  // The run's batches of this epoch have the seqs [first, last): fewer in a resumed epoch.
  return below(run_batches_before((epoch + 1ull) * per_epoch)) -
         below(run_batches_before(epoch * per_epoch));
}

void PipelineImpl::wire_branches(tbb::flow::graph& g, tbb::flow::limiter_node<Batch*, int>& limiter,
                                 Wiring& wiring) {
  using namespace tbb::flow;
  if (branches_ == 1) {
    wire_branch(g, &limiter, 0, stages_.size() - 1, 0, limiter, wiring);
    return;
  }
  const auto n = static_cast<std::size_t>(branches_);
  sender<Batch*>* shared = wire_stages(g, &limiter, 0, branch_begin_, {}, wiring);
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
    const std::size_t begin = branch_begin_ + b * branch_len_;
    wire_branch(g, entries[b], begin, begin + branch_len_ - 1, static_cast<int>(b), limiter,
                wiring);
  }
}

void PipelineImpl::wire_branch(tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail,
                               std::size_t begin, std::size_t last, int branch,
                               tbb::flow::limiter_node<Batch*, int>& limiter, Wiring& wiring) {
  using namespace tbb::flow;
  Stage* train = stages_[last].get();
  tail = wire_stages(g, tail, begin, last, {}, wiring, &train->queued);
  tail = wire_order(g, tail, wiring);
  // The train node: a serial function_node, or (asynchronous) an async_node whose completions
  // reach a serial node that finishes them. Either way a finished batch decrements the limiter.
  const bool async_train = train->node->asynchronous();
  if (async_train) tail = wire_stages(g, tail, last, last + 1, {}, wiring);
  const bool first = last == 0;
  auto finish = std::make_unique<function_node<Batch*, int>>(
      g, serial, [this, train, branch, async_train, first](Batch* b) {
        if (!async_train) {
          if (first) note_in_flight();
          run_stage(*train, *b);
        }
        if (branches_ > 1 && !b->skipped) {
          const auto i = static_cast<std::size_t>(branch);
          branch_batches_[i].fetch_add(1, std::memory_order_relaxed);
          branch_samples_[i].fetch_add(b->rows(), std::memory_order_relaxed);
          if (b->device) {
            branch_bytes_[i].fetch_add(upload_layout_->bytes(b->rows()), std::memory_order_relaxed);
          }
        }
        const std::uint32_t epoch = b->epoch;
        const std::uint64_t finished = finish_batch(b);
        end_finished_epochs(*train, branch, epoch);
        if (checkpoint_every_ > 0 && finished % checkpoint_every_ == 0) {
          save_checkpoint(*checkpoint_dir_);
        }
        return depth_release();
      });
  make_edge(*tail, *finish);
  make_edge(*finish, limiter.decrementer());
  wiring.nodes.push_back(std::move(finish));
}

void PipelineImpl::end_finished_epochs(Stage& train, int branch, std::uint32_t epoch) {
  std::vector<std::uint64_t>& done = epoch_done_[static_cast<std::size_t>(branch)];
  std::size_t& next = next_epoch_end_[static_cast<std::size_t>(branch)];
  ++done[epoch];
  // In order, each after all of its batches: an asynchronous train node may complete the first
  // batches of the next epoch before the last of this one.
  while (next < done.size() &&
         done[next] == branch_share(branch, static_cast<std::uint32_t>(next))) {
    const auto ending = static_cast<std::uint32_t>(next++);
    const std::uint64_t t0 = now_ns();
    try {
      train.node->end_epoch(ending);
    } catch (...) {
      train.failures.fetch_add(1);
      cancel_.store(true);
      throw NodeError(train.label + " end of epoch " + std::to_string(ending) + ": " +
                          what_of(std::current_exception()),
                      train.spec.name, train.spec.type, -1);
    }
    train.busy_ns.fetch_add(now_ns() - t0, std::memory_order_relaxed);
  }
}

}  // namespace flowfeed::detail
