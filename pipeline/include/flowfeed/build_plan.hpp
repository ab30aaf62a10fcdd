#pragma once
/// \file
/// The build plan: what a pipeline resolved from its validated config before allocating anything
/// (Pipeline::plan()). The config itself stays as written; every figure the build decided is here.

#include <cstddef>
#include <vector>

#include "flowfeed/batch.hpp"

namespace flowfeed {

/// Where a batch's bytes are as it leaves a node (and so as it reaches the next): the tier whose
/// lease holds them and that lease's memory. The planner decides it once for every edge of the
/// chain from the nodes' port contracts (Node::port), before any setup(); a node reads its edges
/// from its context (BuildContext::input, output) and never looks at a batch to find out.
struct EdgeMemory {
  Tier tier = Tier::host;                  ///< the batch's lease that holds the bytes
  MemoryKind kind = MemoryKind::pageable;  ///< that lease's memory
  /// Some of a batch's bytes may sit outside its buffer, in Batch::external ranges (page-locked
  /// memory of the loader's own) that the upload node copies from where they are. Only the edges
  /// from the loader to an upload node that copies them (Port::copies_external_bytes), through
  /// staging nodes that pass batches through, carry them; each batch's list says which bytes (it
  /// may be empty).
  bool external = false;
  bool operator==(const EdgeMemory&) const = default;
};

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
  /// The memory each built node hands batches on in, in chain order (a node copied into every
  /// `pipeline.devices` branch once per copy); a node's input is its predecessor's entry (a
  /// branch's first node follows the last shared one). Entry 0 is what the loader fills.
  std::vector<EdgeMemory> memory;
};

}  // namespace flowfeed
