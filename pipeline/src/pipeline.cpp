#include "flowfeed/pipeline.hpp"

#include <oneapi/tbb/concurrent_queue.h>
#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <iostream>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "detail/recorder.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count());
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
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

  void clear() {
    queued = 0;
    arrived = 0;
    items = 0;
    busy_ns = 0;
    failures = 0;
    active = 0;
  }
};

}  // namespace

class Pipeline::Impl {
 public:
  Impl(PipelineConfig config, const Registry& registry);
  RunReport run(const RunOptions& options);

  PipelineConfig config_;
  std::vector<std::unique_ptr<Stage>> stages_;
  LoaderNode* loader_ = nullptr;
  BatchLayout layout_;
  // Layouts made by BuildContext::change_layout, and the one batches have at the upload node (what
  // bytes_uploaded counts).
  std::vector<std::unique_ptr<BatchLayout>> changed_layouts_;
  const BatchLayout* upload_layout_ = &layout_;
  std::unique_ptr<Sampler> sampler_;
  std::vector<std::unique_ptr<BufferPool>> pools_;
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
  std::uint32_t source_epoch_ = 0;
  std::size_t source_index_ = 0;
  std::uint64_t source_seq_ = 0;
  std::vector<std::uint32_t> source_order_;
  std::mutex warn_mutex_;
  std::vector<std::string> warnings_;
  detail::Recorder recorder_;  // stats, trace, progress
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
  /// Replaces the stages from the upload node on by one copy per `pipeline.devices` entry, each a
  /// node of its own made from the same spec, named `name@device`.
  void replicate_branches(const Registry& registry);
  /// Batches of `epoch` that branch `branch` takes (seq % branches_ == branch; all with one).
  std::uint64_t branch_share(int branch, std::uint32_t epoch) const;
  /// Counts a finished batch of `epoch` for branch `branch`'s train node and runs its end_epoch()
  /// for every epoch, in order, whose batches have all finished.
  void end_finished_epochs(Stage& train, int branch, std::uint32_t epoch);
  struct Wiring;
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
  /// Adds the per-branch figures to a report of a run with several branches.
  void fill_branch_report(RunReport& report, double seconds) const;

  void mark(const Batch& batch, int stage) noexcept {
    const std::size_t slot = slot_of_.find(&batch)->second;
    slot_seq_[slot].store(batch.seq, std::memory_order_relaxed);
    slot_stage_[slot].store(stage, std::memory_order_release);
  }

  // Pull mode (Pipeline::start, Session): the session running now, if any. Defined at the end.
  Session::State* pull_ = nullptr;
  /// Throws ConfigError when the chain does not fit the mode (run() needs a train node last,
  /// start() none).
  void check_run_mode(bool pull) const;
  /// The figures run() and a session share: totals, nodes, pools (not the train figures).
  RunReport base_report(double seconds, bool interrupted) const;

  void on_failure(Stage& stage, Batch& batch, std::exception_ptr error);
  void run_stage(Stage& stage, Batch& batch);
  /// The nodes wire_stages() made, and the contexts their completions read; they must outlive
  /// the graph's run.
  /// Chains stages [begin, end) after `tail` in `g`: a function_node per synchronous stage, an
  /// async_node plus a check node (it rethrows completion errors on a TBB thread) per
  /// asynchronous one. Returns the new tail. `on_throw`, when set, hears every failure a body is
  /// about to rethrow (pull mode wakes its caller with it). An asynchronous train stage is told
  /// to flush() whenever no batch waits for it. `passed`, when set, counts the batches that
  /// leave the last stage of the range.
  tbb::flow::sender<Batch*>* wire_stages(tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail,
                                         std::size_t begin, std::size_t end,
                                         const std::function<void(std::exception_ptr)>& on_throw,
                                         Wiring& out, std::atomic<std::uint64_t>* passed = nullptr);
  void note_in_flight() noexcept {
    const int n = in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
    int m = max_in_flight_.load(std::memory_order_relaxed);
    while (n > m && !max_in_flight_.compare_exchange_weak(m, n)) {
    }
  }
  Batch* next_batch(tbb::flow_control& fc);
  void finish_batch(Batch* batch);
  void reclaim();
  std::string stuck_stage() const;
};

namespace {

/// The TBB arena's size: `pipeline.threads`, else the core count.
int arena_threads(const PipelineConfig& config) {
  return config.pipeline.threads > 0 ? config.pipeline.threads : tbb::info::default_concurrency();
}

class Context final : public BuildContext {
 public:
  Context(Pipeline::Impl& impl, Stage& stage) : impl_(impl), stage_(stage) {}
  const NodeSpec& spec() const override { return stage_.spec; }
  Backend backend() const override { return impl_.config_.backend; }
  int device_id() const override {
    return stage_.device >= 0 ? stage_.device : impl_.config_.pipeline.device_id;
  }
  int replicas() const override { return stage_.branch >= 0 ? impl_.branches_ : 1; }
  int replica() const override { return std::max(stage_.branch, 0); }
  std::size_t batch_size() const override { return impl_.layout_.batch_size(); }
  int prefetch_depth() const override { return impl_.config_.pipeline.prefetch_depth; }
  const BatchLayout& layout() const override { return *stage_.layout; }
  const BatchLayout& change_layout(std::vector<TensorSpec> tensors) override {
    if (stage_.spec.role != Role::transform || stage_.out_layout != stage_.layout) {
      throw std::logic_error("change_layout: only a transform may change the layout, once");
    }
    impl_.changed_layouts_.push_back(
        std::make_unique<BatchLayout>(std::move(tensors), impl_.layout_.batch_size()));
    stage_.out_layout = impl_.changed_layouts_.back().get();
    return *stage_.out_layout;
  }
  const LoaderNode& loader() const override { return *impl_.loader_; }
  int threads() const override { return arena_threads(impl_.config_); }
  bool after_staging() const override {
    for (std::size_t i = 0; i < stage_.index && i < impl_.stages_.size(); ++i) {
      if (impl_.stages_[i]->spec.role == Role::staging) return true;
    }
    return false;
  }
  BufferPool& make_pool(const std::string& name, MemoryKind kind, std::size_t count,
                        std::size_t bytes, Allocator allocator) override {
    impl_.pools_.push_back(std::make_unique<BufferPool>(stage_.spec.name + "." + name, kind, count,
                                                        bytes, std::move(allocator)));
    return *impl_.pools_.back();
  }
  std::uint64_t batches_per_epoch() const override {
    if (!impl_.sampler_)
      throw std::logic_error("batches_per_epoch is not known in the loader's setup");
    return impl_.sampler_->batches_per_epoch();
  }
  bool ordered() const override { return impl_.config_.pipeline.ordered; }
  int epochs() const override { return impl_.config_.pipeline.epochs; }
  const std::atomic<bool>& cancelled() const override { return impl_.cancel_; }
  const SamplerOptions& sampler_options() const override { return impl_.config_.sampler; }
  const PipelineOptions& pipeline_options() const override { return impl_.config_.pipeline; }
  Gauge& gauge(const std::string& name) override {
    for (auto& g : impl_.gauges_) {
      if (g.first == name) return *g.second;
    }
    impl_.gauges_.emplace_back(name, std::make_unique<Gauge>());
    return *impl_.gauges_.back().second;
  }

 private:
  Pipeline::Impl& impl_;
  Stage& stage_;
};

std::string where_declared(const NodeSpec& spec) {
  return spec.type +
         (spec.loc.file.empty() ? "" : ", " + SourceLoc{spec.loc.file, spec.loc.line, 0}.str());
}

/// type.create(spec) for `stage`; a failure names the stage (its label, name and type).
std::unique_ptr<Node> create_node(const NodeType& type, const NodeSpec& spec, const Stage& stage) {
  try {
    return type.create(spec);
  } catch (const Error& e) {
    // Data errors while opening files name the file; add the node for context.
    if (dynamic_cast<const DataError*>(&e)) throw DataError(stage.label + ": " + e.what());
    if (dynamic_cast<const ConfigError*>(&e)) throw;
    throw NodeError(stage.label + ": " + e.what(), stage.spec.name, stage.spec.type, -1);
  } catch (const std::exception& e) {
    throw NodeError(stage.label + ": " + e.what(), stage.spec.name, stage.spec.type, -1);
  }
}

}  // namespace

Pipeline::Impl::Impl(PipelineConfig config, const Registry& registry) : config_(std::move(config)) {
  if (config_.nodes.empty())
    throw ConfigError({config_.file + ": nodes: the pipeline has no nodes"});
  for (const auto& spec : config_.nodes) {
    const NodeType* type = registry.find(spec.type);
    if (!type || !type->create) {
      throw ConfigError({spec.loc.str() + ": node '" + spec.name + "': type '" + spec.type +
                         "' is not registered (was the config validated with this registry?)"});
    }
    auto stage = std::make_unique<Stage>();
    stage->spec = spec;
    stage->label = "node '" + spec.name + "' (" + where_declared(spec) + ")";
    stage->index = stages_.size();
    stage->node = create_node(*type, spec, *stage);
    stages_.push_back(std::move(stage));
  }
  if (config_.pipeline.devices.size() > 1) replicate_branches(registry);
  loader_ = dynamic_cast<LoaderNode*>(stages_.front()->node.get());
  if (!loader_) {
    throw ConfigError({config_.nodes.front().loc.str() + ": node '" + config_.nodes.front().name +
                       "': type '" + config_.nodes.front().type +
                       "' does not implement LoaderNode (the first node must be a loader)"});
  }
  std::size_t batch_size = config_.pipeline.batch_size;
  std::size_t preferred = loader_->preferred_batch_size();
  if (batch_size != 0 && preferred != 0 && preferred != batch_size) {
    throw ConfigError({config_.nodes.front().loc.str() + ": nodes[0].params.batch_size: " +
                       std::to_string(preferred) + " differs from pipeline.batch_size " +
                       std::to_string(batch_size) + " (set one of them)"});
  }
  if (batch_size == 0) batch_size = preferred ? preferred : 64;
  config_.pipeline.batch_size = batch_size;
  layout_ = BatchLayout(loader_->sample_tensors(), batch_size);
  auto setup = [this](Stage& stage) {
    stage.layout = stage.out_layout = layout_into(stage.index);
    if (stage.spec.role == Role::upload && stage.branch <= 0) upload_layout_ = stage.layout;
    Context context(*this, stage);
    try {
      stage.node->setup(context);
    } catch (const ConfigError&) {
      throw;
    } catch (const DataError& e) {
      throw DataError(stage.label + ": " + e.what());
    } catch (const std::exception& e) {
      throw NodeError(stage.label + ": " + e.what(), stage.spec.name, stage.spec.type, -1);
    }
  };
  // The loader is set up first: it may learn the data set's size only then.
  setup(*stages_.front());
  sampler_ = std::make_unique<Sampler>(config_.sampler, loader_->size(), batch_size);
  if (sampler_->batches_per_epoch() == 0) {
    throw ConfigError({config_.file + ": pipeline.batch_size: the data set gives no batch (" +
                       std::to_string(sampler_->shard_size()) + " samples in this shard, batch " +
                       std::to_string(batch_size) +
                       (config_.sampler.drop_last ? ", drop_last" : "") +
                       ") use a smaller batch or keep the last partial batch"});
  }
  for (std::size_t i = 1; i < stages_.size(); ++i) setup(*stages_[i]);
  // One batch object per in-flight slot, plus the one the source holds while the limiter is shut.
  const int slots = config_.pipeline.prefetch_depth + 1;
  for (int i = 0; i < slots; ++i) {
    auto b = std::make_unique<Batch>();
    b->samples.reserve(batch_size);
    b->layout = &layout_;
    free_batches_.push(b.get());
    slot_of_.emplace(b.get(), batches_.size());
    batches_.push_back(std::move(b));
  }
  slot_stage_ = std::make_unique<std::atomic<int>[]>(batches_.size());
  slot_seq_ = std::make_unique<std::atomic<std::uint64_t>[]>(batches_.size());
  source_order_.reserve(sampler_->shard_size());
  std::vector<TraceNode> trace_nodes;
  for (const auto& s : stages_) {
    trace_nodes.push_back({s->spec.name, s->spec.type, role_name(s->spec.role), s->spec.concurrency,
                           s->node->asynchronous()});
  }
  recorder_.configure(std::move(trace_nodes), config_.pipeline.prefetch_depth,
                      config_.pipeline.ordered, registry.range_hooks(), batches_);
  if (branches_ > 1) {
    recorder_.set_branches(branch_begin_, branch_len_, static_cast<std::size_t>(branches_));
  }
  allocations_at_build_ = allocation_count();
}

void Pipeline::Impl::on_failure(Stage& stage, Batch& batch, std::exception_ptr error) {
  stage.failures.fetch_add(1, std::memory_order_relaxed);
  std::string message = stage.label + " batch " + std::to_string(batch.seq) + " (epoch " +
                        std::to_string(batch.epoch) + "): " + what_of(error);
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

void Pipeline::Impl::run_stage(Stage& stage, Batch& batch) {
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

Batch* Pipeline::Impl::next_batch(tbb::flow_control& fc) {
  if (stop_.load(std::memory_order_relaxed) || abort_.load(std::memory_order_relaxed) ||
      source_epoch_ >= static_cast<std::uint32_t>(config_.pipeline.epochs)) {
    fc.stop();
    return nullptr;
  }
  if (source_index_ == 0) source_order_ = sampler_->epoch_order(source_epoch_);
  Batch* b = nullptr;
  if (!free_batches_.try_pop(b)) {
    throw std::logic_error("no free batch slot: the in-flight bound was broken");
  }
  b->seq = source_seq_++;
  b->layout = &layout_;  // a transform may have pointed it at its own layout last time
  b->epoch = source_epoch_;
  b->index_in_epoch = source_index_;
  sampler_->batch_samples(source_order_, source_index_, b->samples);
  if (++source_index_ == sampler_->batches_per_epoch()) {
    source_index_ = 0;
    ++source_epoch_;
  }
  const std::uint64_t produced = produced_.fetch_add(1, std::memory_order_relaxed) + 1;
  recorder_.admission(produced, consumed_.load(std::memory_order_relaxed));
  return b;
}

void Pipeline::Impl::finish_batch(Batch* b) {
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
}

void Pipeline::Impl::reclaim() {
  // Every batch object (and so every lease) comes back, wherever the graph left it.
  free_batches_.clear();
  for (auto& b : batches_) {
    b->reset();
    free_batches_.push(b.get());
  }
}

std::string Pipeline::Impl::stuck_stage() const {
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
           std::to_string(oldest / sampler_->batches_per_epoch()) + ")";
  }
  for (std::size_t i = 1; i < stages_.size(); ++i) {
    if (stages_[i]->items.load() < stages_[i - 1]->items.load()) {
      return stages_[i]->label + " has stopped taking batches";
    }
  }
  return stages_.front()->label + " is not producing batches";
}

RunReport Pipeline::Impl::base_report(double seconds, bool interrupted) const {
  RunReport report;
  report.config = config_.file;
  report.device = config_.backend == Backend::cuda
                      ? "cuda:" + std::to_string(config_.pipeline.device_id)
                      : "host";
  report.device_reason = config_.device_reason;
  report.epochs = config_.pipeline.epochs;
  report.rank = config_.sampler.rank;
  report.world = config_.sampler.world;
  report.rank_source = config_.launch_source;
  report.skipped_batches = skipped_.load();
  report.skipped_samples = skipped_samples_.load();
  report.batches = consumed_.load() - report.skipped_batches;
  report.samples = samples_.load();
  report.bytes_uploaded = bytes_.load();
  report.seconds = seconds;
  report.batches_per_second = seconds > 0 ? static_cast<double>(report.batches) / seconds : 0;
  report.samples_per_second = seconds > 0 ? static_cast<double>(report.samples) / seconds : 0;
  report.prefetch_depth = config_.pipeline.prefetch_depth;
  report.max_in_flight = max_in_flight_.load();
  report.allocations_after_build = allocation_count() - allocations_at_build_;
  report.interrupted = interrupted;
  for (const auto& s : stages_) {
    NodeReport n;
    n.name = s->spec.name;
    n.type = s->spec.type;
    n.role = role_name(s->spec.role);
    n.concurrency = s->spec.concurrency;
    n.items = s->items.load();
    n.busy_seconds = static_cast<double>(s->busy_ns.load()) * 1e-9;
    n.utilization = seconds > 0 ? n.busy_seconds / (seconds * n.concurrency) : 0;
    n.failures = s->failures.load();
    report.nodes.push_back(n);
  }
  for (const auto& p : pools_) {
    report.pools.push_back({p->name(), memory_kind_name(p->kind()), p->count(),
                            p->count() * p->buffer_bytes(), p->high_water(), p->acquisitions()});
    if (p->kind() == MemoryKind::device) report.device_pool_bytes += p->count() * p->buffer_bytes();
  }
  return report;
}

struct Pipeline::Impl::Wiring {
  using AsyncNode = tbb::flow::async_node<Batch*, Batch*, tbb::flow::queueing>;
  struct AsyncContext {
    AsyncNode::gateway_type* gateway = nullptr;
    Stage* stage = nullptr;
    Impl* impl = nullptr;
  };
  std::vector<std::unique_ptr<tbb::flow::graph_node>> nodes;
  std::vector<std::unique_ptr<AsyncContext>> contexts;
};

tbb::flow::sender<Batch*>* Pipeline::Impl::wire_stages(
    tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail, std::size_t begin, std::size_t end,
    const std::function<void(std::exception_ptr)>& on_throw, Wiring& out,
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
      auto node = std::make_unique<function_node<Batch*, Batch*>>(
          g, conc, [this, st, first, reporting, count](Batch* b) {
            if (first) note_in_flight();
            reporting([&] { run_stage(*st, *b); });
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

RunReport Pipeline::Impl::run(const RunOptions& options) {
  if (running_) throw std::logic_error("Pipeline::run is already running");
  check_run_mode(false);
  running_ = true;
  struct Running {
    bool& flag;
    ~Running() { flag = false; }
  } running_guard{running_};

  for (auto& s : stages_) {
    s->clear();
    s->node->begin_run();
  }
  for (auto& p : pools_) p->reset_counters();
  in_flight_ = 0;
  max_in_flight_ = 0;
  produced_ = consumed_ = skipped_ = skipped_samples_ = bytes_ = samples_ = 0;
  source_epoch_ = 0;
  source_index_ = 0;
  source_seq_ = 0;
  epoch_done_.assign(static_cast<std::size_t>(branches_),
                     std::vector<std::uint64_t>(static_cast<std::size_t>(config_.pipeline.epochs)));
  next_epoch_end_.assign(static_cast<std::size_t>(branches_), 0);
  for (int b = 0; branches_ > 1 && b < branches_; ++b) {
    branch_batches_[b] = 0;
    branch_samples_[b] = 0;
    branch_bytes_[b] = 0;
  }
  warnings_.clear();
  // stop_ and abort_ are cleared when a run ends, not here: a request made just before run() (a
  // signal while the pipeline was being built) must not be lost.
  cancel_ = false;
  for (std::size_t i = 0; i < batches_.size(); ++i) slot_stage_[i] = -1;

  const int threads = arena_threads(config_);
  tbb::global_control parallelism(tbb::global_control::max_allowed_parallelism,
                                  static_cast<std::size_t>(std::max(threads, 1)) + 1);
  tbb::task_arena arena(threads);

  const std::uint64_t per_epoch = sampler_->batches_per_epoch();
  const std::uint64_t expected = per_epoch * static_cast<std::uint64_t>(config_.pipeline.epochs);
  std::exception_ptr failure;
  std::atomic<tbb::flow::graph*> graph_ptr{nullptr};
  std::atomic<bool> cancelled_by_us{false};
  std::string stall_message;

  detail::Recorder::RunSetup record;
  record.stats = options.stats;
  record.trace = options.trace;
  record.progress = options.progress;
  record.bar = options.progress_bar;
  record.progress_interval_s = options.progress_interval_s;
  record.expected = expected;
  record.per_epoch = per_epoch;
  record.epochs = config_.pipeline.epochs;
  record.threads = threads;
  record.produced = &produced_;
  record.consumed = &consumed_;
  for (auto& g : gauges_) record.gauges.emplace_back(g.first, g.second.get());
  record.config = config_.file;

  // The supervisor does no pipeline work: it turns abort requests and stalls into graph::cancel()
  // (which a signal handler may not call). The recorder's monitor samples and prints progress.
  std::mutex sup_mutex;
  std::condition_variable sup_cv;
  bool done = false;
  const auto t_start = Clock::now();
  recorder_.begin_run(std::move(record), now_ns());
  std::thread supervisor([&] {
    std::uint64_t last_progress = ~0ull;
    auto last_change = Clock::now();
    std::unique_lock<std::mutex> lock(sup_mutex);
    while (!done) {
      sup_cv.wait_for(lock, std::chrono::milliseconds(20));
      if (done) break;
      tbb::flow::graph* g = graph_ptr.load();
      if (!g) continue;
      // Cancel first, then release bodies waiting on cancel_: a released body must find the graph
      // cancelled, or the batch it held would still travel on.
      if (abort_.load() && !cancelled_by_us.exchange(true)) {
        g->cancel();
        cancel_.store(true);
      }
      // A cancelled graph waits for every outstanding asynchronous batch: a train node that
      // holds some back must let them go (again each tick: one may have arrived since).
      if (cancel_.load()) {
        for (const auto& s : stages_) {
          if (s->spec.role == Role::train && s->node->asynchronous()) {
            static_cast<AsynchronousNode*>(s->node.get())->flush();
          }
        }
      }
      std::uint64_t progress = consumed_.load();
      for (const auto& s : stages_) progress += s->items.load();
      auto now = Clock::now();
      if (progress != last_progress) {
        last_progress = progress;
        last_change = now;
      } else if (config_.pipeline.stall_timeout_s > 0 &&
                 std::chrono::duration<double>(now - last_change).count() >
                     config_.pipeline.stall_timeout_s &&
                 !cancelled_by_us.exchange(true)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g", config_.pipeline.stall_timeout_s);
        stall_message = "run stalled: no progress for " + std::string(buf) +
                        " s (pipeline.stall_timeout_s): " + stuck_stage();
        g->cancel();
        cancel_.store(true);
      }
    }
  });

  arena.execute([&] {
    using namespace tbb::flow;
    graph g;
    input_node<Batch*> source(g, [this](tbb::flow_control& fc) { return next_batch(fc); });
    limiter_node<Batch*, int> limiter(g, static_cast<std::size_t>(config_.pipeline.prefetch_depth));
    make_edge(source, limiter);
    Wiring wiring;
    wire_branches(g, limiter, wiring);

    graph_ptr = &g;
    source.activate();
    try {
      g.wait_for_all();
    } catch (...) {
      failure = std::current_exception();
    }
    // Under the supervisor's lock: it must not cancel a graph that is going out of scope.
    std::lock_guard<std::mutex> lock(sup_mutex);
    graph_ptr = nullptr;
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  {
    std::lock_guard<std::mutex> lock(sup_mutex);
    done = true;
  }
  sup_cv.notify_all();
  supervisor.join();
  recorder_.end_run(now_ns());

  for (auto& s : stages_) s->node->quiesce();
  const std::uint64_t produced = produced_.load();
  const std::uint64_t consumed = consumed_.load();
  reclaim();
  const bool interrupted = stop_.load() || abort_.load();
  stop_ = false;
  abort_ = false;

  if (failure) std::rethrow_exception(failure);
  if (!stall_message.empty()) throw Error(stall_message);
  if (!interrupted && (consumed != expected || produced != expected)) {
    throw Error("run lost batches: " + std::to_string(consumed) + " of " +
                std::to_string(expected) + " reached the train node (" + std::to_string(produced) +
                " left the source) — a node dropped or held a batch");
  }

  RunReport report = base_report(seconds, interrupted);
  report.threads = threads;
  const double train_busy = report.nodes.back().busy_seconds;
  report.train.stall_fraction = seconds > 0 ? std::max(0.0, 1.0 - train_busy / seconds) : 0;
  report.warnings = warnings_;  // before finish(): a node may add its own (a dropped sample)
  for (auto& s : stages_) s->node->finish(report);
  if (branches_ > 1) fill_branch_report(report, seconds);
  recorder_.fill(report);
  return report;
}

// ---------------------------------------------------------------------------------------------
// `pipeline.devices`: one upload → train branch per device. The stages before the upload node are
// shared; batch `seq` goes to branch seq % N, so the branches take disjoint shares of each epoch
// that together cover it, the same for every run.

void Pipeline::Impl::replicate_branches(const Registry& registry) {
  const std::vector<int>& devices = config_.pipeline.devices;
  std::size_t upload = 0;
  while (upload < stages_.size() && stages_[upload]->spec.role != Role::upload) ++upload;
  if (upload == stages_.size()) {
    throw ConfigError({config_.file + ": pipeline.devices: " + std::to_string(devices.size()) +
                       " devices replicate the chain from its upload node on, and this chain has "
                       "none add an upload node before the train node"});
  }
  branches_ = static_cast<int>(devices.size());
  branch_begin_ = upload;
  branch_len_ = stages_.size() - upload;
  std::vector<std::unique_ptr<Stage>> originals;
  for (std::size_t i = upload; i < stages_.size(); ++i) originals.push_back(std::move(stages_[i]));
  stages_.resize(upload);
  for (std::size_t b = 0; b < devices.size(); ++b) {
    // [0, 0] runs two branches on one device: the second one's names get a suffix.
    const auto repeats =
        std::count(devices.begin(), devices.begin() + static_cast<long>(b), devices[b]);
    const std::string suffix = "@" + std::to_string(devices[b]) +
                               (repeats > 0 ? "." + std::to_string(repeats) : std::string());
    for (auto& original : originals) {
      auto stage = std::make_unique<Stage>();
      stage->spec = original->spec;
      stage->spec.name += suffix;
      stage->label = "node '" + stage->spec.name + "' (" + where_declared(stage->spec) + ")";
      stage->index = stages_.size();
      stage->device = devices[b];
      stage->branch = static_cast<int>(b);
      stage->node = b == 0 ? std::move(original->node)
                           : create_node(*registry.find(stage->spec.type), original->spec, *stage);
      stages_.push_back(std::move(stage));
    }
  }
  branch_batches_ = std::make_unique<std::atomic<std::uint64_t>[]>(devices.size());
  branch_samples_ = std::make_unique<std::atomic<std::uint64_t>[]>(devices.size());
  branch_bytes_ = std::make_unique<std::atomic<std::uint64_t>[]>(devices.size());
}

const BatchLayout* Pipeline::Impl::layout_into(std::size_t index) const {
  if (index == 0) return &layout_;
  // Each branch's first stage follows the last shared stage.
  const bool branch_head =
      branches_ > 1 && index >= branch_begin_ && (index - branch_begin_) % branch_len_ == 0;
  return stages_[branch_head ? branch_begin_ - 1 : index - 1]->out_layout;
}

std::uint64_t Pipeline::Impl::branch_share(int branch, std::uint32_t epoch) const {
  const std::uint64_t n = static_cast<std::uint64_t>(branches_);
  const std::uint64_t b = static_cast<std::uint64_t>(branch);
  // Sequence numbers below x that go to branch b.
  auto below = [n, b](std::uint64_t x) { return x / n + (x % n > b ? 1 : 0); };
  const std::uint64_t per_epoch = sampler_->batches_per_epoch();
  return below((epoch + 1ull) * per_epoch) - below(epoch * per_epoch);
}

void Pipeline::Impl::wire_branches(tbb::flow::graph& g,
                                   tbb::flow::limiter_node<Batch*, int>& limiter, Wiring& wiring) {
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

void Pipeline::Impl::wire_branch(tbb::flow::graph& g, tbb::flow::sender<Batch*>* tail,
                                 std::size_t begin, std::size_t last, int branch,
                                 tbb::flow::limiter_node<Batch*, int>& limiter, Wiring& wiring) {
  using namespace tbb::flow;
  Stage* train = stages_[last].get();
  tail = wire_stages(g, tail, begin, last, {}, wiring, &train->queued);
  if (config_.pipeline.ordered) {
    // Branch b of N takes seq b, b+N, b+2N, ...: seq / N numbers them 0, 1, 2, ...
    const auto n = static_cast<std::uint64_t>(branches_);
    auto sequencer = std::make_unique<sequencer_node<Batch*>>(
        g, [n](Batch* b) -> std::size_t { return static_cast<std::size_t>(b->seq / n); });
    make_edge(*tail, *sequencer);
    tail = sequencer.get();
    wiring.nodes.push_back(std::move(sequencer));
  }
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
        finish_batch(b);
        end_finished_epochs(*train, branch, epoch);
        return 1;
      });
  make_edge(*tail, *finish);
  make_edge(*finish, limiter.decrementer());
  wiring.nodes.push_back(std::move(finish));
}

void Pipeline::Impl::end_finished_epochs(Stage& train, int branch, std::uint32_t epoch) {
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

void Pipeline::Impl::fill_branch_report(RunReport& report, double seconds) const {
  const std::vector<int>& devices = config_.pipeline.devices;
  if (config_.backend == Backend::cuda) {
    // A device node may have named its GPU ("cuda:1 (NVIDIA H200)"): keep the name.
    const std::size_t name = report.device.find(" (");
    const std::string model = name == std::string::npos ? "" : report.device.substr(name);
    report.device = "cuda:";
    for (std::size_t b = 0; b < devices.size(); ++b) {
      report.device += (b ? "," : "") + std::to_string(devices[b]);
    }
    report.device += model;
  }
  double stall = 0;
  for (std::size_t b = 0; b < devices.size(); ++b) {
    const Stage& train = *stages_[branch_begin_ + (b + 1) * branch_len_ - 1];
    BranchReport r;
    r.branch = static_cast<int>(b);
    r.device = devices[b];
    r.batches = branch_batches_[b].load();
    r.samples = branch_samples_[b].load();
    r.bytes_uploaded = branch_bytes_[b].load();
    r.train_busy_seconds = static_cast<double>(train.busy_ns.load()) * 1e-9;
    stall += seconds > 0 ? std::max(0.0, 1.0 - r.train_busy_seconds / seconds) : 0;
    report.branches.push_back(r);
  }
  // Each branch's train node waits for its own batches: the mean of their stalls.
  report.train.stall_fraction = stall / static_cast<double>(devices.size());
}

Pipeline::Pipeline(PipelineConfig config, const Registry& registry)
    : impl_(std::make_unique<Impl>(std::move(config), registry)) {}
Pipeline::~Pipeline() {
  end_session();
}
Pipeline::Pipeline(Pipeline&& other) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&& other) noexcept {
  end_session();
  impl_ = std::move(other.impl_);
  return *this;
}
RunReport Pipeline::run(const RunOptions& options) {
  return impl_->run(options);
}
void Pipeline::request_stop() noexcept {
  impl_->stop_.store(true);
}
void Pipeline::request_abort() noexcept {
  impl_->stop_.store(true);
  impl_->abort_.store(true);
}
const PipelineConfig& Pipeline::config() const noexcept {
  return impl_->config_;
}
std::size_t Pipeline::free_buffers() const {
  std::size_t n = 0;
  for (const auto& p : impl_->pools_) n += p->available();
  return n;
}
std::size_t Pipeline::total_buffers() const {
  std::size_t n = 0;
  for (const auto& p : impl_->pools_) n += p->count();
  return n;
}

}  // namespace flowfeed

// ---------------------------------------------------------------------------------------------
// Pull mode: Pipeline::start() and Session. The graph is the same chain as run()'s without the
// train node; its last node hands batches to the caller through a small ring under a mutex, and
// the caller's release() puts the limiter's decrement back into the graph. Threads: the caller's
// (next/release only), the session's TBB arena workers (every node body; one of them waits on
// the graph inside an enqueued task, running node tasks meanwhile), and CUDA's callback threads.

namespace flowfeed {

namespace {

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
void run_pull_graph(Pipeline::Impl& impl, PullShared& s) {
  using namespace tbb::flow;
  graph g;
  input_node<Batch*> source(g, [&impl, &s](tbb::flow_control& fc) -> Batch* {
    try {
      Batch* b = impl.next_batch(fc);
      if (!b) {
        std::lock_guard<std::mutex> lock(s.mutex);
        s.source_done = true;
        s.cv.notify_all();
      }
      return b;
    } catch (...) {
      s.fail(std::current_exception());
      throw;
    }
  });
  limiter_node<Batch*, int> limiter(g,
                                    static_cast<std::size_t>(impl.config_.pipeline.prefetch_depth));
  make_edge(source, limiter);

  Pipeline::Impl::Wiring wiring;
  sender<Batch*>* tail = impl.wire_stages(
      g, &limiter, 0, impl.stages_.size(), [&s](std::exception_ptr e) { s.fail(std::move(e)); },
      wiring);
  std::unique_ptr<sequencer_node<Batch*>> sequencer;
  if (impl.config_.pipeline.ordered) {
    sequencer = std::make_unique<sequencer_node<Batch*>>(
        g, [](Batch* b) -> std::size_t { return static_cast<std::size_t>(b->seq); });
    make_edge(*tail, *sequencer);
    tail = sequencer.get();
  }
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
                                  gw.try_put(1);
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
  source.activate();
  try {
    g.wait_for_all();
  } catch (...) {
    s.fail(std::current_exception());
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.graph = nullptr;
}

}  // namespace

class Session::State {
 public:
  Pipeline::Impl* impl = nullptr;
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
    gw->try_put(1);
    gw->release_wait();
  }

  RunReport make_report(double seconds, bool complete, bool interrupted) const;
  void close() noexcept;
};

RunReport Session::State::make_report(double seconds, bool complete, bool interrupted) const {
  const Pipeline::Impl& p = *impl;
  RunReport report = p.base_report(seconds, interrupted);
  // The caller's loop is the train step: it stalls while it waits inside next().
  const double waited = static_cast<double>(wait_ns) * 1e-9;
  report.train.stall_fraction = seconds > 0 ? std::min(1.0, waited / seconds) : 0;
  report.extra["caller_wait_seconds"] = waited;
  {
    std::lock_guard<std::mutex> lock(const_cast<Pipeline::Impl&>(p).warn_mutex_);
    report.warnings = p.warnings_;  // before finish(): a node may add its own (a dropped sample)
  }
  if (complete) {
    for (auto& s : p.stages_) s->node->finish(report);
  }
  return report;
}

void Session::State::close() noexcept {
  if (closed) return;
  Pipeline::Impl& p = *impl;
  const bool interrupted = p.stop_.load() || p.abort_.load() || !ended;
  p.stop_.store(true);
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
  arena.reset();
  parallelism.reset();
  for (auto& s : p.stages_) s->node->quiesce();
  const std::uint64_t per_epoch = p.sampler_->batches_per_epoch();
  const std::uint64_t expected = per_epoch * static_cast<std::uint64_t>(p.config_.pipeline.epochs);
  const std::uint64_t produced = p.produced_.load();
  const std::uint64_t consumed = p.consumed_.load();
  if (!error && !interrupted && (consumed != expected || produced != expected)) {
    error = std::make_exception_ptr(
        Error("run lost batches: " + std::to_string(consumed) + " of " + std::to_string(expected) +
              " reached the end of the pipeline (" + std::to_string(produced) +
              " left the source) — a node dropped or held a batch"));
  }
  try {
    final_report = make_report(seconds, !error && !interrupted, interrupted);
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  p.reclaim();
  p.running_ = false;
  p.pull_ = nullptr;
  closed = true;
}

Session::Session(std::unique_ptr<State> state) noexcept : state_(std::move(state)) {}
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
  State& st = *state_;
  if (st.error) std::rethrow_exception(st.error);
  if (st.ended || st.closed) return nullptr;
  Pipeline::Impl& p = *st.impl;
  const std::size_t depth = static_cast<std::size_t>(p.config_.pipeline.prefetch_depth);
  if (st.held.size() >= depth) {
    throw std::logic_error(
        "Session::next: the caller holds all " + std::to_string(depth) +
        " batches the pipeline may have in flight (pipeline.prefetch_depth), so no other batch can "
        "come; release() one first");
  }
  PullShared& s = *st.shared;
  const double timeout = p.config_.pipeline.stall_timeout_s;
  const auto t0 = Clock::now();
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
      if (p.abort_.load()) {
        // Cancel at once: what is in flight never arrives, and what did is not handed out any
        // more; close() gives it back.
        if (s.graph) s.graph->cancel();
        p.cancel_.store(true);  // after the cancel: lets bodies in a long wait return
        st.aborted = true;
        st.ended = true;
        break;
      }
      if (s.count > 0) {
        out = s.pop();
        break;
      }
      if (s.finished || (s.source_done && s.arrived == p.produced_.load())) {
        st.ended = true;
        break;
      }
      const auto now = Clock::now();
      if (timeout > 0 && std::chrono::duration<double>(now - t0).count() > timeout) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g", timeout);
        s.error =
            std::make_exception_ptr(Error("run stalled: no batch for " + std::string(buf) +
                                          " s (pipeline.stall_timeout_s): " + p.stuck_stage()));
        if (s.graph) s.graph->cancel();
        p.cancel_.store(true);
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
      // Short slices: request_abort() from a signal handler cannot notify.
      s.cv.wait_for(lock, std::chrono::milliseconds(50));
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
  State& st = *state_;
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

std::size_t Session::held() const noexcept {
  return state_ ? state_->held.size() : 0;
}
bool Session::finished() const noexcept {
  return !state_ || state_->ended || state_->closed;
}

RunReport Session::report() const {
  if (!state_) throw std::logic_error("Session::report on a moved-from session");
  if (state_->closed) return state_->final_report;
  const Pipeline::Impl& p = *state_->impl;
  return state_->make_report(std::chrono::duration<double>(Clock::now() - state_->started).count(),
                             false, p.stop_.load() || p.abort_.load());
}

void Pipeline::Impl::check_run_mode(bool pull) const {
  const bool config_pull = config_.pipeline.mode == RunMode::pull;
  auto set_at = config_.option_locs.find("pipeline.mode");
  const std::string where = set_at != config_.option_locs.end()  ? set_at->second.str()
                            : !config_.pipeline_loc.file.empty() ? config_.pipeline_loc.str()
                                                                 : config_.file;
  if (pull && !config_pull) {
    throw ConfigError({where +
                       ": pipeline.mode: Pipeline::start() hands batches to the caller's "
                       "loop, and this pipeline has mode: run (its train node '" +
                       stages_.back()->spec.name +
                       "' takes them) set pipeline.mode: pull and "
                       "remove the train node, or call Pipeline::run()"});
  }
  if (!pull && config_pull) {
    throw ConfigError({where + ": pipeline.mode: this pipeline has mode: pull (no train node; a "
                               "C++ loop takes its batches) step it with Pipeline::start(), or set "
                               "pipeline.mode: run and add a train node"});
  }
  // A config assembled in C++ without validate_config may still break the chain's end.
  const Stage& last = *stages_.back();
  for (std::size_t i = 0; i < stages_.size(); ++i) {
    const NodeSpec& spec = stages_[i]->spec;
    const std::string node_where = spec.loc.str() + ": nodes[" + std::to_string(i) + "].type: ";
    if (pull && spec.role == Role::train) {
      throw ConfigError({node_where + "'" + spec.name +
                         "' is a train node, and a pipeline with "
                         "mode: pull has none (the caller's loop is the train step) remove it, "
                         "or set pipeline.mode: run"});
    }
    if (!pull && &spec == &last.spec && spec.role != Role::train) {
      throw ConfigError({node_where + "the last node must be a train node, '" + spec.name +
                         "' is a " + role_name(spec.role) +
                         " node (add a train-role node such as checksum, sleep or mlp)"});
    }
  }
}

Session Pipeline::start() {
  Impl& p = *impl_;
  if (p.running_) {
    throw std::logic_error(
        "Pipeline::start: the pipeline is already running (one run or session "
        "at a time)");
  }
  p.check_run_mode(true);
  for (auto& s : p.stages_) {
    s->clear();
    s->node->begin_run();
  }
  for (auto& pool : p.pools_) pool->reset_counters();
  p.in_flight_ = 0;
  p.max_in_flight_ = 0;
  p.produced_ = p.consumed_ = p.skipped_ = p.skipped_samples_ = p.bytes_ = p.samples_ = 0;
  p.source_epoch_ = 0;
  p.source_index_ = 0;
  p.source_seq_ = 0;
  p.warnings_.clear();
  p.stop_ = false;
  p.abort_ = false;
  p.cancel_ = false;
  for (std::size_t i = 0; i < p.batches_.size(); ++i) p.slot_stage_[i] = -1;

  auto state = std::make_unique<Session::State>();
  state->impl = &p;
  state->shared = std::make_shared<PullShared>();
  state->shared->ring.assign(static_cast<std::size_t>(p.config_.pipeline.prefetch_depth), nullptr);
  const int threads = std::max(arena_threads(p.config_), 1);
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
  state->started = Clock::now();
  p.running_ = true;
  p.pull_ = state.get();
  // The graph is built, run and destroyed inside this task, so it lives in the session's arena,
  // and the caller's thread is never inside wait_for_all.
  state->arena->enqueue([impl = &p, shared = state->shared] {
    try {
      run_pull_graph(*impl, *shared);
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
  if (impl_ && impl_->pull_) impl_->pull_->close();
}

}  // namespace flowfeed
