#pragma once
// What a node's setup() sees (build_context.cpp): the BuildContext of one stage of a pipeline
// being built.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "detail/chain.hpp"
#include "detail/sequence.hpp"
#include "flowfeed/build_plan.hpp"
#include "flowfeed/node.hpp"

namespace flowfeed::detail {

/// What every stage's context reads and adds to while the pipeline is built.
struct BuildScope {
  const PipelineConfig& config;
  const BuildPlan& plan;
  /// False while the loader is set up with `prefetch_depth: auto`: its per-batch pools wait.
  const bool& depth_solved;
  Chain& chain;
  const Sequence& sequence;
  const std::atomic<bool>& cancelled;
  std::function<Gauge&(const std::string&)> gauge;
};

/// Claims `count` buffers of `bytes` for pool `pool` of node `spec` against `budget`
/// (ConfigError naming pipeline.prefetch_depth and pipeline.batch_size when they do not fit).
void claim_pool(MemoryBudget& budget, const NodeSpec& spec, const std::string& pool,
                MemoryKind kind, std::size_t count, std::size_t bytes);

class StageContext final : public BuildContext {
 public:
  StageContext(const BuildScope& scope, Stage& stage) : scope_(scope), stage_(stage) {}
  const NodeSpec& spec() const override;
  Backend backend() const override;
  int device_id() const override;
  int replicas() const override;
  int replica() const override;
  std::size_t batch_size() const override;
  int prefetch_depth() const override;
  const BatchLayout& layout() const override;
  const BatchLayout& change_layout(std::vector<TensorSpec> tensors) override;
  const LoaderNode& loader() const override;
  int threads() const override;
  const EdgeMemory& input() const override;
  const EdgeMemory& output() const override;
  BufferPool& make_fill_pool(const std::string& name) override;
  BufferPool& make_pool(const std::string& name, MemoryKind kind, std::size_t count,
                        std::size_t bytes, Allocator allocator) override;
  BufferPool& make_batch_pool(const std::string& name, MemoryKind kind, std::size_t bytes,
                              Allocator allocator) override;
  void claim_memory(MemoryKind kind, std::uint64_t bytes, const std::string& what,
                    const std::string& keys) override;
  std::uint64_t batches_per_epoch() const override;
  bool ordered() const override;
  int epochs() const override;
  const std::atomic<bool>& cancelled() const override;
  const SamplerOptions& sampler_options() const override;
  const PipelineOptions& pipeline_options() const override;
  Gauge& gauge(const std::string& name) override;

 private:
  /// What stage `index` hands batches on in (BuildPlan::memory).
  const EdgeMemory& edge(std::size_t index) const;
  const BuildScope& scope_;
  Stage& stage_;
};

}  // namespace flowfeed::detail
