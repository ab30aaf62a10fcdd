// What a node's setup() sees: the BuildContext of one stage of the pipeline being built. Pools
// are claimed against the memory budget before they are allocated, and belong to the chain.

#include "detail/build_context.hpp"

#include <algorithm>
#include <stdexcept>

#include "flowfeed/error.hpp"
#include "flowfeed/memory_budget.hpp"

namespace flowfeed::detail {

const NodeSpec& StageContext::spec() const {
  return stage_.spec();
}
Backend StageContext::backend() const {
  return scope_.config.backend;
}
int StageContext::device_id() const {
  return stage_.device() >= 0 ? stage_.device() : scope_.config.pipeline.device_id;
}
int StageContext::replicas() const {
  return stage_.branch() >= 0 ? scope_.chain.branches() : 1;
}
int StageContext::replica() const {
  return std::max(stage_.branch(), 0);
}
std::size_t StageContext::batch_size() const {
  return scope_.plan.batch_size;
}
int StageContext::prefetch_depth() const {
  if (!scope_.depth_solved) {
    throw std::logic_error(
        "prefetch_depth is not known in the loader's setup with prefetch_depth: auto (it is "
        "solved from what the loader claims); make per-batch pools with make_batch_pool");
  }
  return scope_.plan.prefetch_depth;
}
const BatchLayout& StageContext::layout() const {
  return *stage_.layout();
}
const BatchLayout& StageContext::change_layout(std::vector<TensorSpec> tensors) {
  return scope_.chain.change_layout(stage_, std::move(tensors));
}
const LoaderNode& StageContext::loader() const {
  return scope_.chain.loader();
}
int StageContext::threads() const {
  return scope_.plan.threads;
}
const EdgeMemory& StageContext::input() const {
  if (stage_.index() == 0) throw std::logic_error("input: the loader takes no batches in");
  return edge(scope_.chain.predecessor(stage_.index()));
}
const EdgeMemory& StageContext::output() const {
  return edge(stage_.index());
}
const EdgeMemory& StageContext::edge(std::size_t index) const {
  if (index >= scope_.plan.memory.size()) {
    throw std::logic_error(
        "input, output: the edges are not planned yet (Node::port is read first)");
  }
  return scope_.plan.memory[index];
}
BufferPool& StageContext::make_fill_pool(const std::string& name) {
  Chain& chain = scope_.chain;
  if (stage_.index() != 0 || !chain.loader_fills()) {
    throw std::logic_error(
        "make_fill_pool is for the setup of a loader whose port fills (Port::fills in "
        "Node::port)");
  }
  if (!chain.fill_memory()) return BuildContext::make_fill_pool(name);
  return make_batch_pool(name, chain.fill_memory()->kind, layout().capacity(),
                         chain.fill_memory()->allocator);
}
void claim_pool(MemoryBudget& budget, const NodeSpec& spec, const std::string& pool,
                MemoryKind kind, std::size_t count, std::size_t bytes) {
  const auto total = checked_mul(count, bytes);
  // The buffers' count follows pipeline.prefetch_depth, their size a batch's bytes.
  const std::string keys = "pipeline.prefetch_depth, pipeline.batch_size";
  if (!total) {
    throw ConfigError({spec.loc.str() + ": " + keys + ": pool '" + pool + "' (" +
                       std::to_string(count) + " buffers of " + std::to_string(bytes) +
                       " bytes) would take more than 16 EiB lower " + keys});
  }
  budget.claim(
      {kind, *total,
       "pool '" + pool + "' (" + std::to_string(count) + " buffers of " + format_bytes(bytes) + ")",
       spec.loc.str(), keys});
}

BufferPool& StageContext::make_pool(const std::string& name, MemoryKind kind, std::size_t count,
                                    std::size_t bytes, Allocator allocator) {
  const std::string pool = stage_.spec().name + "." + name;
  if (allocator.owns_memory)
    claim_pool(scope_.chain.budget(), stage_.spec(), pool, kind, count, bytes);
  return scope_.chain.add_pool(
      std::make_unique<BufferPool>(pool, kind, count, bytes, std::move(allocator)));
}
BufferPool& StageContext::make_batch_pool(const std::string& name, MemoryKind kind,
                                          std::size_t bytes, Allocator allocator) {
  if (scope_.depth_solved) {
    return make_pool(name, kind, static_cast<std::size_t>(scope_.plan.prefetch_depth), bytes,
                     std::move(allocator));
  }
  // The loader's, before the depth is solved: claimed and allocated once it is.
  const bool owns = allocator.owns_memory;
  return scope_.chain.add_deferred_pool(
      std::make_unique<BufferPool>(stage_.spec().name + "." + name, kind, 0, bytes,
                                   std::move(allocator)),
      owns);
}
void StageContext::claim_memory(MemoryKind kind, std::uint64_t bytes, const std::string& what,
                                const std::string& keys) {
  scope_.chain.budget().claim(
      {kind, bytes, what + " of node '" + stage_.spec().name + "'", stage_.spec().loc.str(), keys});
}
std::uint64_t StageContext::batches_per_epoch() const {
  if (!scope_.sequence.opened()) {
    throw std::logic_error("batches_per_epoch is not known in the loader's setup");
  }
  return scope_.sequence.batches_per_epoch();
}
bool StageContext::ordered() const {
  return scope_.config.pipeline.ordered;
}
int StageContext::epochs() const {
  return scope_.config.pipeline.epochs;
}
const std::atomic<bool>& StageContext::cancelled() const {
  return scope_.cancelled;
}
const SamplerOptions& StageContext::sampler_options() const {
  return scope_.config.sampler;
}
const PipelineOptions& StageContext::pipeline_options() const {
  return scope_.config.pipeline;
}
Gauge& StageContext::gauge(const std::string& name) {
  return scope_.gauge(name);
}

}  // namespace flowfeed::detail
