// The facade (Pipeline), the BuildContext nodes are set up with, the build (nodes, pools, batch
// slots) and the report's figures. The graph lives in graph.cpp, the run loop in run.cpp and pull
// mode in session.cpp.

#include "flowfeed/pipeline.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "detail/build_context.hpp"
#include "detail/pipeline_impl.hpp"
#include "detail/plan.hpp"
#include "flowfeed/memory_budget.hpp"

namespace flowfeed {

namespace detail {

namespace {

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

}  // namespace

PipelineImpl::PipelineImpl(PipelineConfig config, const Registry& registry)
    : config_(std::move(config)) {
  // Plan: the nodes, and what the config resolves to (the config itself stays as written).
  chain_.create(config_, registry);
  plan_ = resolve_plan(config_, chain_);
  const NodeSpec& loader_spec = config_.nodes.front();
  const std::size_t batch_size = plan_.batch_size;
  chain_.set_layout(BatchLayout(chain_.loader().sample_tensors(), batch_size));
  if (!chain_.layout().checked_capacity()) {
    std::string tensors;
    for (const auto& t : chain_.layout().tensors()) {
      std::string shape;
      for (auto d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      tensors += (tensors.empty() ? "" : ", ") + t.name + " [" + shape + "] " + dtype_name(t.dtype);
    }
    throw ConfigError({loader_spec.loc.str() + ": nodes[0].params: a batch of " +
                       std::to_string(batch_size) + " samples of " + tensors +
                       " would take more than 16 EiB (its size overflows 64 bits) use a smaller "
                       "sample shape or pipeline.batch_size"});
  }
  // Pools and data sets are checked against what the machine offers as they are claimed, before
  // each is allocated. Device memory is checked for a pipeline on one device.
  MemoryAvailable available =
      available_memory(config_.backend == Backend::cuda && config_.pipeline.devices.size() <= 1
                           ? registry.device_free_memory(config_.pipeline.device_id)
                           : std::nullopt);
  apply_memory_budget(available, config_.pipeline.memory_budget,
                      config_.pipeline.auto_prefetch_depth);
  chain_.open_budget(std::move(available));
  // With prefetch_depth: auto the depth is solved once the loader has claimed what it holds: its
  // per-batch pools wait for it.
  bool depth_solved = !config_.pipeline.auto_prefetch_depth;
  const BuildScope scope{config_,
                         plan_,
                         depth_solved,
                         chain_,
                         sequence_,
                         cancel_,
                         [this](const std::string& name) -> Gauge& { return gauge(name); }};
  auto setup = [this, &scope](Stage& stage) {
    stage.set_layout(chain_.layout_into(stage.index()));
    if (stage.spec().role == Role::upload && stage.branch() <= 0) {
      chain_.set_upload_layout(stage.layout());
    }
    StageContext context(scope, stage);
    try {
      stage.node().setup(context);
    } catch (const std::exception&) {
      rethrow_at_build(stage);
    }
  };
  // Each node's port contract, then one walk over the chain that assigns each edge its memory,
  // before anything is set up: nodes read their edges instead of looking at batches.
  std::vector<Port> ports;
  for (const auto& stage : chain_.stages()) {
    const StageContext context(scope, *stage);
    try {
      ports.push_back(stage->node().port(context));
    } catch (const std::exception& e) {
      throw NodeError(stage->label() + ": " + e.what(), stage->spec().name, stage->spec().type, -1);
    }
  }
  MemoryAssignment assigned = assign_memory(chain_, ports);
  plan_.memory = std::move(assigned.memory);
  chain_.set_fill(ports.front().fills, std::move(assigned.fill));
  // The loader is set up first: it may learn the data set's size only then.
  setup(chain_.front());
  if (chain_.loader().size() == kUnknownSize &&
      (config_.sampler.shuffle || config_.sampler.world > 1)) {
    throw ConfigError({loader_spec.loc.str() + ": nodes[0]: '" + loader_spec.type +
                       "' reads a stream of unknown length, in order (sampler.shuffle: " +
                       (config_.sampler.shuffle ? "true" : "false") +
                       ", sampler.world: " + std::to_string(config_.sampler.world) +
                       ") set sampler.shuffle: false and run one process"});
  }
  sequence_.open(config_.sampler, chain_.loader().size(), batch_size, config_.pipeline.epochs,
                 chain_.loader().shard_starts());
  const Sampler& sampler = sequence_.sampler();
  if (!depth_solved) {
    // The depth in closed form: what the budget holds (the loader's data sets), the sampling
    // order, the loader's per-batch pools and what the other nodes declare (Node::plan).
    MemoryPlan memory;
    memory.fixed(MemoryKind::pageable, sampling_order_bytes(sampler));
    for (const Chain::Deferred& d : chain_.deferred_pools()) {
      if (d.owns_memory) memory.per_batch(d.pool->kind(), d.pool->buffer_bytes());
    }
    plan_stages(config_, plan_, chain_, memory);
    plan_.prefetch_depth = memory.solve(chain_.budget(), plan_.depth_cap);
    plan_.depth_capped_by_memory = plan_.prefetch_depth < plan_.depth_cap;
    depth_solved = true;
    for (const Chain::Deferred& d : chain_.deferred_pools()) {
      if (!d.owns_memory) continue;
      claim_pool(chain_.budget(), loader_spec, d.pool->name(), d.pool->kind(),
                 static_cast<std::size_t>(plan_.prefetch_depth), d.pool->buffer_bytes());
    }
    chain_.allocate_deferred(static_cast<std::size_t>(plan_.prefetch_depth));
  }
  // Claimed before the first order is made (a stream has none).
  if (!sampler.stream()) chain_.budget().claim(sampling_order_claim(loader_spec, sampler));
  if (sampler.batches_per_epoch() == 0) {
    throw ConfigError({config_.file + ": pipeline.batch_size: the data set gives no batch (" +
                       std::to_string(sampler.shard_size()) + " samples in this shard, batch " +
                       std::to_string(batch_size) +
                       (config_.sampler.drop_last ? ", drop_last" : "") +
                       ") use a smaller batch or keep the last partial batch"});
  }
  // Allocate: every other node, as the plan gives it.
  for (std::size_t i = 1; i < chain_.size(); ++i) setup(chain_.stage(i));
  if (!config_.pipeline.resume_from.empty()) sequence_.resume_from_checkpoint(config_, chain_);
  const int depth = plan_.prefetch_depth;
  sequence_.reset_cursor(static_cast<std::size_t>(depth));
  // One batch object per in-flight slot, plus the one the source holds while the limiter is shut.
  chain_.make_slots(depth + 1, batch_size);
  sequence_.reserve_order();
  std::vector<TraceNode> trace_nodes;
  for (const auto& s : chain_.stages()) {
    trace_nodes.push_back({s->spec().name, s->spec().type, role_name(s->spec().role), s->bodies(),
                           s->node().asynchronous()});
  }
  recorder_.configure(std::move(trace_nodes), depth, config_.pipeline.ordered,
                      registry.range_hooks(), chain_.batches());
  if (chain_.branches() > 1) {
    recorder_.set_branches(chain_.branch_begin(), chain_.branch_len(),
                           static_cast<std::size_t>(chain_.branches()));
  }
  allocations_at_build_ = allocation_count();
}

Gauge& PipelineImpl::gauge(const std::string& name) {
  for (auto& g : gauges_) {
    if (g.first == name) return *g.second;
  }
  gauges_.emplace_back(name, std::make_unique<Gauge>());
  return *gauges_.back().second;
}

std::size_t PipelineImpl::free_buffers() const {
  std::size_t n = 0;
  for (const auto& p : chain_.pools()) n += p->available();
  return n;
}

std::size_t PipelineImpl::total_buffers() const {
  std::size_t n = 0;
  for (const auto& p : chain_.pools()) n += p->count();
  return n;
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
  report.skipped_batches = counters_.skipped();
  report.skipped_samples = counters_.skipped_samples();
  report.batches = counters_.consumed() - report.skipped_batches - counters_.past_end();
  report.samples = counters_.samples();
  report.bytes_uploaded = counters_.bytes();
  report.seconds = seconds;
  report.batches_per_second = seconds > 0 ? static_cast<double>(report.batches) / seconds : 0;
  report.samples_per_second = seconds > 0 ? static_cast<double>(report.samples) / seconds : 0;
  report.prefetch_depth = plan_.prefetch_depth;
  report.max_in_flight = counters_.max_in_flight();
  report.allocations_after_build = allocation_count() - allocations_at_build_;
  report.interrupted = interrupted;
  for (const auto& s : chain_.stages()) {
    NodeReport n;
    n.name = s->spec().name;
    n.type = s->spec().type;
    n.role = role_name(s->spec().role);
    n.concurrency = s->bodies();
    n.items = s->items();
    n.busy_seconds = static_cast<double>(s->busy_ns()) * 1e-9;
    n.utilization = seconds > 0 ? n.busy_seconds / (seconds * n.concurrency) : 0;
    n.failures = s->failures();
    report.nodes.push_back(n);
  }
  for (const auto& p : chain_.pools()) {
    report.pools.push_back({p->name(), memory_kind_name(p->kind()), p->count(),
                            p->count() * p->buffer_bytes(), p->high_water(), p->acquisitions()});
    if (p->kind() == MemoryKind::device) report.device_pool_bytes += p->count() * p->buffer_bytes();
  }
  return report;
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
    const Stage& train = chain_.train_stage(static_cast<int>(b));
    const RunCounters::Branch counted = counters_.branch(static_cast<int>(b));
    BranchReport r;
    r.branch = static_cast<int>(b);
    r.device = devices[b];
    r.batches = counted.batches;
    r.samples = counted.samples;
    r.bytes_uploaded = counted.bytes;
    r.train_busy_seconds = static_cast<double>(train.busy_ns()) * 1e-9;
    stall += seconds > 0 ? std::max(0.0, 1.0 - r.train_busy_seconds / seconds) : 0;
    report.branches.push_back(r);
  }
  // Each branch's train node waits for its own batches: the mean of their stalls.
  report.train.stall_fraction = stall / static_cast<double>(devices.size());
}

}  // namespace detail

Pipeline::Pipeline(PipelineConfig config, const Registry& registry)
    : impl_(std::make_unique<detail::PipelineImpl>(std::move(config), registry)) {}
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
  impl_->request_stop();
}
void Pipeline::request_abort() noexcept {
  impl_->request_abort();
}
const PipelineConfig& Pipeline::config() const noexcept {
  return impl_->config();
}
const BuildPlan& Pipeline::plan() const noexcept {
  return impl_->plan();
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
  return impl_->free_buffers();
}
std::size_t Pipeline::total_buffers() const {
  return impl_->total_buffers();
}

}  // namespace flowfeed
