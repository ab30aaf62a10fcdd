// The facade (Pipeline), the BuildContext nodes are set up with, the build (nodes, pools, batch
// slots) and the report's figures. The graph lives in graph.cpp, the run loop in run.cpp and pull
// mode in session.cpp.

#include "flowfeed/pipeline.hpp"

#include <fmt/format.h>
#include <oneapi/tbb/info.h>

#include <algorithm>
#include <limits>

#include "detail/pipeline_impl.hpp"
#include "flowfeed/memory_budget.hpp"

namespace flowfeed {

namespace detail {

/// The TBB arena's size: `pipeline.threads`, else the core count.
int arena_threads(const PipelineConfig& config) {
  return config.pipeline.threads > 0 ? config.pipeline.threads : tbb::info::default_concurrency();
}

namespace {

class Context final : public BuildContext {
 public:
  Context(PipelineImpl& impl, Stage& stage) : impl_(impl), stage_(stage) {}
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
  Tier fill_tier() const override {
    const bool staged =
        stage_.index == 0 ? impl_.fill_memory_.has_value() : impl_.fill_pool_ != nullptr;
    return staged ? Tier::staging : Tier::host;
  }
  bool takes_external_bytes() const override {
    if (stage_.index != 0) return false;
    for (std::size_t i = 1; i < impl_.stages_.size(); ++i) {
      const Stage& next = *impl_.stages_[i];
      if (next.spec.role == Role::staging && impl_.fill_memory_) continue;  // passes through
      return next.spec.role == Role::upload && next.node->copies_external_bytes();
    }
    return false;
  }
  BufferPool& make_fill_pool(const std::string& name) override {
    if (stage_.index != 0) throw std::logic_error("make_fill_pool is for the loader's setup");
    if (!impl_.fill_memory_) return BuildContext::make_fill_pool(name);
    impl_.fill_pool_ = &make_batch_pool(name, impl_.fill_memory_->kind, layout().capacity(),
                                        impl_.fill_memory_->allocator);
    return *impl_.fill_pool_;
  }
  BufferPool& make_pool(const std::string& name, MemoryKind kind, std::size_t count,
                        std::size_t bytes, Allocator allocator) override {
    const std::string pool = stage_.spec.name + "." + name;
    if (allocator.owns_memory) {
      const auto total = checked_mul(count, bytes);
      // The buffers' count follows pipeline.prefetch_depth, their size a batch's bytes.
      const std::string keys = "pipeline.prefetch_depth, pipeline.batch_size";
      if (!total) {
        throw ConfigError({stage_.spec.loc.str() + ": " + keys + ": pool '" + pool + "' (" +
                           std::to_string(count) + " buffers of " + std::to_string(bytes) +
                           " bytes) would take more than 16 EiB lower " + keys});
      }
      try {
        impl_.budget_->claim({kind, *total,
                              "pool '" + pool + "' (" + std::to_string(count) + " buffers of " +
                                  format_bytes(bytes) + ")",
                              stage_.spec.loc.str(), keys});
      } catch (const ConfigError&) {
        impl_.retry_smaller_depth(kind, *total, count);
        throw;
      }
      impl_.note_claim(kind, *total, count);
    }
    impl_.pools_.push_back(
        std::make_unique<BufferPool>(pool, kind, count, bytes, std::move(allocator)));
    return *impl_.pools_.back();
  }
  void claim_memory(MemoryKind kind, std::uint64_t bytes, const std::string& what,
                    const std::string& keys) override {
    try {
      impl_.budget_->claim(
          {kind, bytes, what + " of node '" + stage_.spec.name + "'", stage_.spec.loc.str(), keys});
    } catch (const ConfigError&) {
      impl_.retry_smaller_depth(kind, bytes, 0);
      throw;
    }
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
  PipelineImpl& impl_;
  Stage& stage_;
};

/// The bytes of an epoch's sampling order, 4 a sample: the permutation of the whole data set (and
/// this rank's strided copy of it when world > 1) beside the order the source holds (reserved at
/// build), so 2^32 windows take 32 GiB when an epoch starts, even in a run stopped after a few
/// batches. UINT64_MAX past 2^64.
std::uint64_t sampling_order_bytes(const Sampler& sampler) {
  const std::uint64_t copies = sampler.options().world == 1 ? 1 : 2;
  const std::optional<std::uint64_t> entries =
      checked_add(sampler.dataset_size(), sampler.shard_size() * copies);
  const std::optional<std::uint64_t> bytes =
      entries ? checked_mul(*entries, sizeof(std::uint32_t)) : std::nullopt;
  // order: shards also holds each data shard's start and, while an order is made, its place.
  const std::uint64_t shards = sampler.data_shards() > 1 ? sampler.data_shards() * 12 : 0;
  const std::optional<std::uint64_t> total = bytes ? checked_add(*bytes, shards) : std::nullopt;
  return total ? *total : std::numeric_limits<std::uint64_t>::max();
}

/// The claim of `sampling_order_bytes` for the loader `loader`.
MemoryClaim sampling_order_claim(const NodeSpec& loader, const Sampler& sampler) {
  const std::string keys = "nodes." + loader.name + ".params (the data set's size)";
  const std::string held = sampler.options().world == 1
                               ? std::string("twice while an epoch's order replaces the last")
                               : fmt::format("and this rank's {} twice", sampler.shard_size());
  return {MemoryKind::pageable, sampling_order_bytes(sampler),
          fmt::format("the sampling order of node '{}' ({}: {} samples x 4 bytes, {}{})",
                      loader.name, loader.type, sampler.dataset_size(), held,
                      sampler.data_shards() > 1
                          ? fmt::format(", and {} shards x 12 bytes", sampler.data_shards())
                          : std::string()),
          loader.loc.str(), keys};
}

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

PipelineImpl::PipelineImpl(PipelineConfig config, const Registry& registry, int auto_depth)
    : config_(std::move(config)) {
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
  if (!layout_.checked_capacity()) {
    std::string tensors;
    for (const auto& t : layout_.tensors()) {
      std::string shape;
      for (auto d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      tensors += (tensors.empty() ? "" : ", ") + t.name + " [" + shape + "] " + dtype_name(t.dtype);
    }
    throw ConfigError({config_.nodes.front().loc.str() + ": nodes[0].params: a batch of " +
                       std::to_string(batch_size) + " samples of " + tensors +
                       " would take more than 16 EiB (its size overflows 64 bits) use a smaller "
                       "sample shape or pipeline.batch_size"});
  }
  // Pools and data sets are checked against what the machine offers as they are claimed, before
  // each is allocated. Device memory is checked for a pipeline on one device.
  resolve_auto(auto_depth);
  MemoryAvailable available =
      available_memory(config_.backend == Backend::cuda && config_.pipeline.devices.size() <= 1
                           ? registry.device_free_memory(config_.pipeline.device_id)
                           : std::nullopt);
  apply_memory_budget(available, config_.pipeline.memory_budget,
                      config_.pipeline.auto_prefetch_depth);
  budget_.emplace(std::move(available));
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
  // The loader's reads land in the memory of the first staging or upload node after it, when
  // that node takes batches in place (transforms between them work on whichever tier is newest).
  for (std::size_t i = 1; i < stages_.size(); ++i) {
    const Role role = stages_[i]->spec.role;
    if (role == Role::transform) continue;
    if (role == Role::staging || role == Role::upload) {
      Context context(*this, *stages_[i]);
      try {
        fill_memory_ = stages_[i]->node->fill_memory(context);
      } catch (const std::exception& e) {
        throw NodeError(stages_[i]->label + ": " + e.what(), stages_[i]->spec.name,
                        stages_[i]->spec.type, -1);
      }
    }
    break;
  }
  // The loader is set up first: it may learn the data set's size only then.
  setup(*stages_.front());
  sampler_ = std::make_unique<Sampler>(config_.sampler, loader_->size(), batch_size,
                                       loader_->shard_starts());
  // Claimed before the first order is made (ConfigError when it does not fit; with
  // prefetch_depth: auto the pools shrink to make room, as for any claim).
  try {
    budget_->claim(sampling_order_claim(config_.nodes.front(), *sampler_));
  } catch (const ConfigError&) {
    retry_smaller_depth(MemoryKind::pageable, sampling_order_bytes(*sampler_), 0);
    throw;
  }
  if (sampler_->batches_per_epoch() == 0) {
    throw ConfigError({config_.file + ": pipeline.batch_size: the data set gives no batch (" +
                       std::to_string(sampler_->shard_size()) + " samples in this shard, batch " +
                       std::to_string(batch_size) +
                       (config_.sampler.drop_last ? ", drop_last" : "") +
                       ") use a smaller batch or keep the last partial batch"});
  }
  for (std::size_t i = 1; i < stages_.size(); ++i) setup(*stages_[i]);
  if (!config_.pipeline.resume_from.empty()) resume_from_checkpoint();
  cursor_.reset(start_.first, start_.skip,
                static_cast<std::size_t>(config_.pipeline.prefetch_depth));
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

RunReport PipelineImpl::base_report(double seconds, bool interrupted) const {
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

// `pipeline.devices`: one upload → train branch per device. The stages before the upload node are
// shared; batch `seq` goes to branch seq % N, so the branches take disjoint shares of each epoch
// that together cover it, the same for every run.

void PipelineImpl::replicate_branches(const Registry& registry) {
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

void PipelineImpl::fill_branch_report(RunReport& report, double seconds) const {
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

}  // namespace detail

Pipeline::Pipeline(PipelineConfig config, const Registry& registry) {
  // prefetch_depth: auto sizes pools for the most the memory budget allows: a build that finds
  // them too large is made again at the depth the claims it saw allow (a smaller one each time).
  int depth = 0;
  for (;;) {
    try {
      impl_ = std::make_unique<detail::PipelineImpl>(config, registry, depth);
      return;
    } catch (const detail::DepthRetry& retry) {
      depth = retry.depth;
    }
  }
}
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
Checkpoint Pipeline::checkpoint() const {
  return impl_->checkpoint();
}
void Pipeline::save_checkpoint(const std::string& dir) const {
  impl_->save_checkpoint(dir);
}
void Pipeline::save_checkpoint(CheckpointDir& dir) const {
  impl_->save_checkpoint(dir);
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
