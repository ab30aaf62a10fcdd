#pragma once
// Plan, then allocate (plan.cpp): the resolve step that makes the BuildPlan from the validated
// config and the created chain, and the closed-form depth of `prefetch_depth: auto` from what the
// nodes declared (the loader's per-batch pools, the others' Node::plan).

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "flowfeed/build_plan.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/node.hpp"

namespace flowfeed::detail {

class Chain;

/// The TBB arena's size: `pipeline.threads`, else the core count.
int arena_threads(const PipelineConfig& config);

/// Resolves everything but the depth of `prefetch_depth: auto` (prefetch_depth is depth_cap
/// then): the batch size (ConfigError when the loader's differs from pipeline.batch_size), the
/// threads, the thread budget, the depth cap and each stage's most bodies. Marks the tunable
/// stages of `chain` with their bodies.
BuildPlan resolve_plan(const PipelineConfig& config, Chain& chain);

/// What the walk over the nodes' ports decided (assign_memory).
struct MemoryAssignment {
  /// What each stage hands batches on in, in chain order (BuildPlan::memory).
  std::vector<EdgeMemory> memory;
  /// The memory the loader's make_fill_pool allocates: the in-place memory of the first node
  /// after it that is not a transform, when the loader fills and that node offers some.
  std::optional<FillMemory> fill;
};

/// Walks the chain once, in order, and assigns each edge its memory from the stages' ports
/// (`ports[i]` is stage i's Node::port): the loader's from its port and the first staging or
/// upload node's in-place memory; a transform's is its input's; a staging node passes batches it
/// receives in Tier::staging through, else its buffers are of its in-place memory's kind; an
/// upload node's is device memory; Batch::external ranges travel from a loader to an upload node
/// that copies them, through staging nodes that pass batches through.
MemoryAssignment assign_memory(const Chain& chain, const std::vector<Port>& ports);

/// The memory the build will claim besides what the budget holds already: per batch in flight
/// (scales with the depth) and fixed, host and device apart.
class MemoryPlan {
 public:
  void per_batch(MemoryKind kind, std::uint64_t bytes) noexcept;
  void fixed(MemoryKind kind, std::uint64_t bytes) noexcept;
  /// The most batches in flight, at most `cap`, whose per-batch bytes fit `budget` beside what it
  /// holds and the fixed bytes; 1 when not even one fits (the claims then say what does not).
  int solve(const MemoryBudget& budget, int cap) const noexcept;

 private:
  std::uint64_t per_batch_host_ = 0;
  std::uint64_t per_batch_device_ = 0;
  std::uint64_t fixed_host_ = 0;
  std::uint64_t fixed_device_ = 0;
};

/// Calls Node::plan for every stage after the loader, in chain order, into `memory`: the layouts
/// the transforms declare are what the stages after them are planned with.
void plan_stages(const PipelineConfig& config, const BuildPlan& plan, const Chain& chain,
                 MemoryPlan& memory);

}  // namespace flowfeed::detail
