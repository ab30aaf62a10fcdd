#pragma once
// The host chain the autotune tests tune (synthetic, an optional transform, staging, upload and a
// sleep train step, all on the host), a run of it, and what its report says of the tuning.

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed::test::autotune {

/// A chain of host nodes: synthetic (load_ms), an optional delay transform, staging, upload and a
/// sleep train step; 8 threads so that sleeping bodies are not short of workers on 2 cores.
inline std::string chain(int batches, double load_ms, const std::string& transform, double train_ms,
                         const std::string& pipeline_extra = "") {
  return fmt::format(
      "pipeline: {{ epochs: 1, batch_size: 64, prefetch_depth: auto, threads: 8, device: host{} "
      "}}\n"
      "nodes:\n"
      "  - {{ name: load, type: synthetic, concurrency: auto, params: {{ batches: {}, "
      "sample_shape: [64], delay_ms: {:g} }} }}\n"
      "{}"
      "  - {{ name: stage, type: host_staging, concurrency: 2 }}\n"
      "  - {{ name: upload, type: host_upload }}\n"
      "  - {{ name: train, type: sleep, params: {{ ms: {:g} }} }}\n",
      pipeline_extra, batches, load_ms, transform, train_ms);
}

inline RunReport run_yaml(const std::string& yaml) {
  Registry registry = builtin_registry();
  Pipeline pipeline(load_config_string(yaml, registry, {}, "auto.yaml"), registry);
  return pipeline.run();
}

/// Memory stayed inside what was allocated at build, and that inside the budget.
inline void expect_within_budget(const RunReport& r) {
  const int depth = r.tuning.max_prefetch_depth;
  EXPECT_TRUE(r.tuning.active);
  EXPECT_TRUE(r.tuning.within_budget);
  EXPECT_EQ(r.allocations_after_build, 0u);
  EXPECT_LE(r.max_in_flight, depth);
  EXPECT_LE(r.tuning.host_pool_bytes, r.tuning.host_budget_bytes);
  for (const PoolReport& p : r.pools) {
    EXPECT_EQ(p.buffers, static_cast<std::size_t>(depth)) << p.name;
    EXPECT_LE(p.high_water, static_cast<std::size_t>(depth)) << p.name;
  }
}

/// Bodies of node `i` that keep the train node busy, from the run's own figures: its time per
/// batch over the train node's (a loaded machine makes both slower).
inline double needed(const RunReport& r, std::size_t i) {
  const NodeReport& n = r.nodes[i];
  const NodeReport& train = r.nodes.back();
  return (n.busy_seconds / static_cast<double>(n.items)) /
         (train.busy_seconds / static_cast<double>(train.items));
}

/// The run stayed within its budgets, at a thread budget of `bodies`, and its first decision
/// raised the loader from its first body.
inline TuningDecision first_load_raise(const RunReport& r, int bodies) {
  expect_within_budget(r);
  EXPECT_EQ(r.tuning.thread_budget, bodies);
  if (r.tuning.decisions.empty()) {
    ADD_FAILURE() << "no decision\n" << r.to_table();
    return {};
  }
  const TuningDecision& first = r.tuning.decisions.front();
  EXPECT_EQ(first.knob, "nodes.load.concurrency");
  EXPECT_EQ(first.from, 1);
  return first;
}

inline int settled(const RunReport& r, const std::string& knob) {
  auto it = r.tuning.settled.find(knob);
  return it == r.tuning.settled.end() ? -1 : it->second;
}

}  // namespace flowfeed::test::autotune
