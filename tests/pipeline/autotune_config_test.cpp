// The autotune keys (`auto`, pipeline.thread_budget, pipeline.memory_budget): their bad values
// are errors with their position, `--set` and the builder set them as YAML does, fixed values
// stay untuned, and a budget below one batch in flight is a config error naming the key.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "flowfeed/builder.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/registry.hpp"
#include "tests/error_of.hpp"
#include "tests/pipeline/autotune_chain.hpp"

namespace flowfeed {
namespace {

using namespace test::autotune;

TEST(Autotune, ABudgetBelowOneBatchInFlightIsAConfigErrorNamingTheKey) {
  EXPECT_EQ(
      test::error_of<ConfigError>([&] { run_yaml(chain(10, 0, "", 0, ", memory_budget: 10K")); }),
      "auto.yaml:3:5: pipeline.prefetch_depth, pipeline.batch_size: pool 'load.host' (1 "
      "buffers of 16.2 KiB) needs 16.2 KiB of host memory, and 10.0 KiB is available "
      "(pipeline.memory_budget.host; the process would be killed for want of memory "
      "mid-run) lower pipeline.prefetch_depth, pipeline.batch_size");
}

TEST(Autotune, AutoIsAcceptedFromSetAndFixedValuesStayUntuned) {
  Registry registry = builtin_registry();
  const std::string yaml = chain(10, 0, "", 0);
  const PipelineConfig c = load_config_string(
      yaml, registry, {"pipeline.prefetch_depth=8", "nodes.load.concurrency=3"}, "auto.yaml");
  EXPECT_FALSE(c.pipeline.auto_prefetch_depth);
  EXPECT_EQ(c.pipeline.prefetch_depth, 8);
  EXPECT_FALSE(c.nodes[0].auto_concurrency);
  EXPECT_EQ(c.nodes[0].concurrency, 3);
  Pipeline pipeline(c, registry);
  const RunReport r = pipeline.run();
  EXPECT_FALSE(r.tuning.active);
  EXPECT_TRUE(r.tuning.decisions.empty());
}

TEST(Autotune, TheBuilderSetsTheSameKnobs) {
  Registry registry = builtin_registry();
  Pipeline pipeline = PipelineBuilder()
                          .batch_size(64)
                          .auto_prefetch_depth()
                          .memory_budget(std::uint64_t{64} << 20)
                          .threads(4)
                          .thread_budget(4)
                          .device(DeviceChoice::host)
                          .load("synthetic", {{"batches", 60}, {"sample_shape", {64}}})
                          .auto_concurrency()
                          .train("sleep", {{"ms", 1.0}})
                          .build(registry);
  const RunReport r = pipeline.run();
  EXPECT_EQ(r.batches, 60u);
  EXPECT_TRUE(r.tuning.active);
  EXPECT_EQ(r.tuning.thread_budget, 4);
  EXPECT_EQ(r.tuning.host_budget_bytes, std::uint64_t{64} << 20);
  // Pools for 2 × (4 threads + 2 nodes) batches.
  EXPECT_EQ(r.tuning.max_prefetch_depth, 12);
  expect_within_budget(r);
}

std::string config_error(const std::string& yaml) {
  Registry registry = builtin_registry();
  return test::error_of<ConfigError>([&] { load_config_string(yaml, registry, {}, "auto.yaml"); });
}

TEST(Autotune, TheNewKeysBadValuesAreErrorsWithTheirPosition) {
  EXPECT_EQ(config_error("pipeline: { prefetch_depth: lots }\n"
                         "nodes:\n"
                         "  - { name: load, type: synthetic, concurrency: fast }\n"
                         "  - { name: train, type: discard }\n"),
            "auto.yaml:1:29: pipeline.prefetch_depth: expected an int or auto, got 'lots'\n"
            "auto.yaml:3:49: nodes[0].concurrency: expected an int or auto, got 'fast'");
  EXPECT_EQ(config_error("pipeline:\n"
                         "  memory_budget: { host: lots, hots: 1G, device: 120% }\n"
                         "  thread_budget: -1\n"
                         "nodes:\n"
                         "  - { name: load, type: synthetic }\n"
                         "  - { name: train, type: discard }\n"),
            "auto.yaml:3:18: pipeline.thread_budget: -1 is out of range (must be between 0 and "
            "4096)\n"
            "auto.yaml:2:26: pipeline.memory_budget.host: expected a byte count above 0 "
            "(1073741824, 512M, 16G) or a share of what is available (50%), got 'lots'\n"
            "auto.yaml:2:32: pipeline.memory_budget.hots: unknown key (did you mean 'host'?)\n"
            "auto.yaml:2:50: pipeline.memory_budget.device: expected a byte count above 0 "
            "(1073741824, 512M, 16G) or a share of what is available (50%), got '120%'");
}

TEST(Autotune, MemoryBudgetTakesBytesOrAShare) {
  Registry registry = builtin_registry();
  const PipelineConfig c = load_config_string(
      "pipeline: { memory_budget: { host: 25%, device: 16G }, thread_budget: 4 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic }\n"
      "  - { name: train, type: discard }\n",
      registry, {}, "auto.yaml");
  EXPECT_DOUBLE_EQ(c.pipeline.memory_budget.host.share, 0.25);
  EXPECT_EQ(c.pipeline.memory_budget.device.bytes, std::uint64_t{16} << 30);
  EXPECT_EQ(c.pipeline.thread_budget, 4);
  const std::string plain =
      "nodes:\n  - { name: load, type: synthetic }\n  - { name: train, type: discard }\n";
  const PipelineConfig h =
      load_config_string("pipeline: { memory_budget: 2G }\n" + plain, registry, {}, "auto.yaml");
  EXPECT_EQ(h.pipeline.memory_budget.host.bytes, std::uint64_t{2} << 30);
  EXPECT_FALSE(h.pipeline.memory_budget.device.set());
  const PipelineConfig d =
      load_config_string(plain, registry, {"pipeline.memory_budget.device=50%"}, "auto.yaml");
  EXPECT_DOUBLE_EQ(d.pipeline.memory_budget.device.share, 0.5);
  EXPECT_FALSE(d.pipeline.memory_budget.host.set());
}

}  // namespace
}  // namespace flowfeed
