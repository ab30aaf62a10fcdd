#pragma once
// What the observe tests share (observe_report_test.cpp, observe_trace_test.cpp): running YAML
// with a registry or the built-in one, a run's bottleneck, a node's report, a host chain.

#include <gtest/gtest.h>

#include <sstream>
#include <stdexcept>
#include <string>

#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"

namespace flowfeed::observe_test {

inline RunReport run_yaml(const std::string& yaml, const Registry& registry,
                          RunOptions options = {}) {
  Pipeline pipeline(load_config_string(yaml, registry), registry);
  return pipeline.run(options);
}

/// Options that record the run into `trace`.
inline RunOptions traced_into(Trace* trace) {
  RunOptions options;
  options.trace = trace;
  return options;
}

/// Runs `yaml` with the built-in types.
inline RunReport run_builtin(const std::string& yaml, RunOptions options = {}) {
  return run_yaml(yaml, builtin_registry(), options);
}

/// The run names `bottleneck` as its bottleneck, and its verdict starts with `verdict_start`.
inline void expect_bound_by(const RunReport& r, const std::string& bottleneck,
                            const std::string& verdict_start) {
  EXPECT_EQ(r.bottleneck, bottleneck);
  EXPECT_EQ(r.verdict.rfind(verdict_start, 0), 0u) << r.verdict;
}

inline const NodeReport& node(const RunReport& report, const std::string& name) {
  for (const auto& n : report.nodes) {
    if (n.name == name) return n;
  }
  throw std::runtime_error("no node " + name);
}

// Four host nodes; `load_ms` per batch at `load_conc`, `train_ms` per train step.
inline std::string chain_yaml(int batches, double load_ms, int load_conc, double train_ms,
                              int depth = 8, int threads = 4) {
  std::ostringstream y;
  y << "pipeline: { epochs: 1, batch_size: 16, prefetch_depth: " << depth
    << ", threads: " << threads << ", device: host }\n"
    << "nodes:\n"
    << "  - { name: load, type: synthetic, concurrency: " << load_conc
    << ", params: { batches: " << batches << ", sample_shape: [32], delay_ms: " << load_ms
    << " } }\n"
    << "  - { name: stage, type: host_staging }\n"
    << "  - { name: upload, type: host_upload }\n"
    << "  - { name: train, type: sleep, params: { ms: " << train_ms << " } }\n";
  return y.str();
}

}  // namespace flowfeed::observe_test
