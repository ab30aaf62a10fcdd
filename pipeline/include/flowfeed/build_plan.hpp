#pragma once
/// \file
/// The build plan: what a pipeline resolved from its validated config before allocating anything
/// (Pipeline::plan()). The config itself stays as written; every figure the build decided is here.

#include <cstddef>
#include <vector>

namespace flowfeed {

/// Made once per pipeline, before any pool is allocated, and never changed after.
struct BuildPlan {
  /// Samples per batch: `pipeline.batch_size`, else the loader's preferred size, else 64.
  std::size_t batch_size = 0;
  /// TBB worker threads that run node bodies (`pipeline.threads`, else the core count).
  int threads = 1;
  /// Most node bodies the tuner lets run at once (`pipeline.thread_budget`, else derived from the
  /// threads and the fixed nodes' bodies; docs/AUTOTUNE.md).
  int thread_budget = 1;
  /// The most batches in flight the pipeline would size pools for: `pipeline.prefetch_depth`, or
  /// with `prefetch_depth: auto` twice the thread budget plus the nodes (at most 4096).
  int depth_cap = 1;
  /// The batches in flight the pools were sized for: depth_cap, or with `prefetch_depth: auto` the
  /// most the memory budget allows (solved in closed form from the pools the nodes declared).
  int prefetch_depth = 1;
  /// True when the memory budget, not depth_cap, decided prefetch_depth.
  bool depth_capped_by_memory = false;
  /// Bodies each built node may run at once, in chain order (a node copied into every
  /// `pipeline.devices` branch once per copy): its `concurrency`, or for `concurrency: auto` the
  /// thread budget less the fixed nodes' bodies.
  std::vector<int> concurrency;
};

}  // namespace flowfeed
