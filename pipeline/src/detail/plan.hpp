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
