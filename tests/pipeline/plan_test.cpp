// Plan, then allocate: the validated config stays as written, the BuildPlan has what the build
// resolved, and `prefetch_depth: auto` is solved in closed form from the pools the nodes declare,
// so that every node is set up once.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>

#include "flowfeed/builder.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

TEST(BuildPlan, TheConfigStaysAsValidatedAndThePlanHasWhatTheBuildResolved) {
  Registry registry = builtin_registry();
  const PipelineConfig validated = load_config_string(
      "pipeline: { epochs: 1, prefetch_depth: auto, threads: 4, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: auto, params: { batches: 8, "
      "sample_shape: [16] } }\n"
      "  - { name: stage, type: host_staging, concurrency: 2 }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: discard }\n",
      registry, {}, "plan.yaml");
  Pipeline pipeline(validated, registry);
  const PipelineConfig& c = pipeline.config();
  // As written: no batch size, an automatic depth and concurrency.
  EXPECT_EQ(c.pipeline.batch_size, validated.pipeline.batch_size);
  EXPECT_EQ(c.pipeline.batch_size, 0u);
  EXPECT_TRUE(c.pipeline.auto_prefetch_depth);
  EXPECT_EQ(c.pipeline.prefetch_depth, validated.pipeline.prefetch_depth);
  ASSERT_EQ(c.nodes.size(), validated.nodes.size());
  for (std::size_t i = 0; i < c.nodes.size(); ++i) {
    EXPECT_EQ(c.nodes[i].concurrency, validated.nodes[i].concurrency) << c.nodes[i].name;
    EXPECT_EQ(c.nodes[i].auto_concurrency, validated.nodes[i].auto_concurrency);
  }
  // What the build resolved: the default batch, 4 threads, the auto loader at the budget less the
  // fixed bodies (staging 2, upload 1, train 1), pools for twice (budget + nodes).
  const BuildPlan& plan = pipeline.plan();
  EXPECT_EQ(plan.batch_size, 64u);
  EXPECT_EQ(plan.threads, 4);
  EXPECT_EQ(plan.thread_budget, 4 + 4);
  EXPECT_EQ(plan.concurrency, (std::vector<int>{4, 2, 1, 1}));
  EXPECT_EQ(plan.depth_cap, 2 * (8 + 4));
  EXPECT_EQ(plan.prefetch_depth, plan.depth_cap);
  EXPECT_FALSE(plan.depth_capped_by_memory);
  const RunReport r = pipeline.run();
  EXPECT_EQ(r.batches, 8u);
  EXPECT_EQ(r.tuning.max_prefetch_depth, plan.prefetch_depth);
  EXPECT_EQ(r.nodes[1].concurrency, 2);
  // Running changes nothing either.
  EXPECT_EQ(pipeline.config().pipeline.batch_size, 0u);
}

/// A transform that counts its plan() and setup() calls and makes one per-batch pool of `bytes`.
class CountingTransform final : public Node {
 public:
  CountingTransform(std::size_t bytes, std::atomic<int>& plans, std::atomic<int>& setups,
                    bool declares)
      : bytes_(bytes), plans_(plans), setups_(setups), declares_(declares) {}
  void plan(PlanContext& plan) const override {
    ++plans_;
    if (declares_) plan.batch_pool(MemoryKind::pageable, bytes_);
  }
  void setup(BuildContext& context) override {
    ++setups_;
    depth_ = context.prefetch_depth();
    pool_ = &context.make_batch_pool("scratch", MemoryKind::pageable, bytes_, Allocator::host());
  }
  void process(Batch&) override { Lease held = pool_->acquire(); }
  int depth() const { return depth_; }

 private:
  std::size_t bytes_;
  std::atomic<int>& plans_;
  std::atomic<int>& setups_;
  bool declares_;
  BufferPool* pool_ = nullptr;
  int depth_ = 0;
};

Pipeline counting_pipeline(std::uint64_t host_budget, std::atomic<int>& plans,
                           std::atomic<int>& setups, CountingTransform*& transform,
                           bool declares = true,
                           std::source_location where = std::source_location::current()) {
  Registry registry = builtin_registry();
  auto node = std::make_unique<CountingTransform>(100'000, plans, setups, declares);
  transform = node.get();
  return PipelineBuilder()
      .batch_size(64)
      .auto_prefetch_depth()
      .memory_budget(host_budget)
      .threads(4)
      .device(DeviceChoice::host)
      .load("synthetic", {{"batches", 120}, {"sample_shape", {64}}})
      .transform(std::move(node), where)
      .stage("host_staging")
      .upload("host_upload")
      .train("discard")
      .build(registry);
}

TEST(BuildPlan, ABudgetThatForcesASmallerDepthSetsEveryNodeUpOnceAtTheClosedFormDepth) {
  // A batch is 64 x (64 float32 + an int32) = 16640 bytes: the loader's, the staging and the
  // upload pools hold one each per batch in flight, the transform 100000 bytes. The sampling
  // order holds 7680 samples x 4 bytes twice. The budget leaves room for 5 batches (and 1000
  // bytes); the cap is 2 x (4 threads + 5 fixed bodies + 5 nodes) = 28.
  const std::uint64_t per_batch = 3 * 16640 + 100'000;
  const std::uint64_t order = 7680 * 4 * 2;
  std::atomic<int> plans{0};
  std::atomic<int> setups{0};
  CountingTransform* transform = nullptr;
  Pipeline pipeline = counting_pipeline(order + 5 * per_batch + 1000, plans, setups, transform);
  EXPECT_EQ(plans.load(), 1);
  EXPECT_EQ(setups.load(), 1);
  const BuildPlan& plan = pipeline.plan();
  EXPECT_EQ(plan.depth_cap, 28);
  EXPECT_EQ(plan.prefetch_depth, 5);
  EXPECT_TRUE(plan.depth_capped_by_memory);
  EXPECT_EQ(transform->depth(), 5);
  EXPECT_EQ(pipeline.total_buffers(), 4u * 5);
  const RunReport r = pipeline.run();
  EXPECT_EQ(r.batches, 120u);
  EXPECT_EQ(r.tuning.max_prefetch_depth, 5);
  EXPECT_TRUE(r.tuning.within_budget);
  EXPECT_EQ(r.tuning.host_pool_bytes, 5 * per_batch + order);
}

TEST(BuildPlan, APoolANodeDidNotDeclareIsClaimedAtTheSolvedDepthAndNamedWhenItDoesNotFit) {
  // The same budget, the transform's pool not declared: the depth is solved without it (the
  // three declared pools fit 15 batches beside the sampling order), and its claim does not fit
  // beside them.
  const std::uint64_t order = 7680 * 4 * 2;
  std::atomic<int> plans{0};
  std::atomic<int> setups{0};
  CountingTransform* transform = nullptr;
  const std::uint64_t budget = order + 5 * (3 * 16640 + 100'000) + 1000;
  const std::source_location where = std::source_location::current();
  EXPECT_EQ(test::error_of<ConfigError>(
                [&] { counting_pipeline(budget, plans, setups, transform, false, where); }),
            fmt::format("{}:{}: pipeline.prefetch_depth, pipeline.batch_size: pool "
                        "'transform.scratch' (15 buffers of 97.7 KiB) needs 1.4 MiB of host "
                        "memory, and 793.0 KiB is available (pipeline.memory_budget.host, 303.8 "
                        "KiB of it already claimed by the pools and data sets before it; the "
                        "process would be killed for want of memory mid-run) lower "
                        "pipeline.prefetch_depth, pipeline.batch_size",
                        where.file_name(), where.line()));
  EXPECT_EQ(plans.load(), 1);
  EXPECT_EQ(setups.load(), 1);
}

}  // namespace
}  // namespace flowfeed
