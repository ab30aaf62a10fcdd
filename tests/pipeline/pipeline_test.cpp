#include "flowfeed/pipeline.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "flowfeed/nodes/builtin.hpp"
#include "tests/error_of.hpp"
#include "tests/pipeline/run_stopped.hpp"

namespace flowfeed {
namespace {

std::string chain(int load_conc, int stage_conc, int depth, bool ordered, const std::string& sink,
                  const std::string& extra_load = "") {
  return "pipeline: { epochs: 2, batch_size: 16, prefetch_depth: " + std::to_string(depth) +
         ", ordered: " + (ordered ? "true" : "false") +
         ", device: host, threads: 4 }\n"
         "sampler: { shuffle: true, seed: 9 }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, concurrency: " +
         std::to_string(load_conc) + ", params: { samples: 1000, sample_shape: [3, 5], seed: 3" +
         extra_load + " } }\n" +
         "  - { name: stage, type: host_staging, concurrency: " + std::to_string(stage_conc) +
         " }\n"
         "  - { name: upload, type: host_upload, concurrency: 2 }\n"
         "  - { name: train, type: " +
         sink + " }\n";
}

/// A synthetic loader (`load`: its keys after the name and type) into a sleep train node of `ms`
/// ms a batch, under `pipeline` (the section's keys).
std::string sleep_chain(const std::string& pipeline, const std::string& load, int ms) {
  return "pipeline: { " + pipeline +
         " }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, " +
         load +
         " }\n"
         "  - { name: train, type: sleep, params: { ms: " +
         std::to_string(ms) + " } }\n";
}

struct Shape {
  int load, stage, depth;
  bool ordered;
};

class ThroughTheGraph : public ::testing::TestWithParam<Shape> {};

TEST_P(ThroughTheGraph, EveryByteArrivesInOrderWithinTheBound) {
  const Shape s = GetParam();
  Registry r = builtin_registry();
  Pipeline p(load_config_string(chain(s.load, s.stage, s.depth, s.ordered, "checksum"), r), r);
  RunReport report = p.run();
  // 1000 samples / 16 = 63 batches (the last has 8 rows), two epochs.
  EXPECT_EQ(report.batches, 126u);
  EXPECT_EQ(report.samples, 2000u);
  EXPECT_EQ(report.extra.at("checksum_bytes_verified"), static_cast<double>(report.bytes_uploaded));
  EXPECT_LE(report.max_in_flight, s.depth);
  EXPECT_GE(report.max_in_flight, 1);
  EXPECT_EQ(report.allocations_after_build, 0u);
  for (const auto& n : report.nodes) EXPECT_EQ(n.items, 126u) << n.name;
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  EXPECT_EQ(p.total_buffers(), 3u * static_cast<unsigned>(s.depth));
  // A second run on the same pipeline gives the same result.
  EXPECT_EQ(p.run().batches, 126u);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ThroughTheGraph,
                         ::testing::Values(Shape{1, 1, 1, true}, Shape{4, 2, 2, true},
                                           Shape{4, 4, 8, true}, Shape{3, 2, 5, false},
                                           Shape{8, 8, 32, true}));

TEST(Pipeline, UnorderedRunsDeliverEverySampleOnce) {
  Registry r = builtin_registry();
  // checksum checks each sample arrives once per epoch; it only checks order when ordered.
  Pipeline p(load_config_string(chain(4, 4, 8, false, "checksum"), r), r);
  EXPECT_EQ(p.run().samples, 2000u);
}

TEST(Pipeline, InFlightStaysWithinDepthUnderASlowSink) {
  Registry r = builtin_registry();
  Pipeline p(
      load_config_string(sleep_chain("batch_size: 4, prefetch_depth: 3, device: host, threads: 4",
                                     "concurrency: 4, params: { batches: 30 }", 2),
                         r),
      r);
  RunReport report = p.run();
  EXPECT_EQ(report.max_in_flight, 3);  // the loaders run ahead until the limiter closes
  EXPECT_EQ(report.pools.at(0).high_water, 3u);
  EXPECT_EQ(report.batches, 30u);
}

/// Fails on one batch; the test checks the message names node, type, line and batch.
class FailAt final : public Node {
 public:
  explicit FailAt(std::int64_t at) : at_(at) {}
  void process(Batch& b) override {
    if (static_cast<std::int64_t>(b.seq) == at_) throw std::runtime_error("boom");
  }

 private:
  std::int64_t at_;
};

void register_fail(Registry& r, const std::string& name, Role role) {
  NodeType t;
  t.name = name;
  t.role = role;
  t.schema.add_int("at", "batch to fail on", 0);
  t.create = [](const NodeSpec& s) { return std::make_unique<FailAt>(s.params.get_int("at")); };
  r.set(std::move(t));
}

class FailureIn : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(FailureIn, AnyNodeEndsTheRunWithItsNameAndNothingLeaks) {
  const auto [position, at] = GetParam();
  Registry r = builtin_registry();
  register_fail(r, "fail_transform", Role::transform);
  register_fail(r, "fail_train", Role::train);
  std::string yaml =
      "pipeline: { batch_size: 8, prefetch_depth: 4, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 2, params: { batches: 20 } }\n";
  yaml += position == 0 ? "  - { name: bad, type: fail_transform, concurrency: 2, params: { at: " +
                              std::to_string(at) + " } }\n  - { name: train, type: discard }\n"
                        : "  - { name: stage, type: host_staging }\n  - { name: bad, type: "
                          "fail_train, params: { at: " +
                              std::to_string(at) + " } }\n";
  Pipeline p(load_config_string(yaml, r, {}, "f.yaml"), r);
  auto t0 = std::chrono::steady_clock::now();
  try {
    p.run();
    FAIL() << "the run must fail";
  } catch (const NodeError& e) {
    const std::string type = position == 0 ? "fail_transform" : "fail_train";
    EXPECT_EQ(std::string(e.what()), "node 'bad' (" + type +
                                         ", f.yaml:" + (position == 0 ? "4" : "5") + ") batch " +
                                         std::to_string(at) + " (epoch 0): boom");
    EXPECT_EQ(e.node(), "bad");
    EXPECT_EQ(e.batch(), at);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  // The same pipeline runs again (and fails again at the same batch, cleanly).
  EXPECT_THROW(p.run(), NodeError);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

INSTANTIATE_TEST_SUITE_P(FirstMiddleLast, FailureIn,
                         ::testing::Combine(::testing::Values(0, 1), ::testing::Values(0, 9, 19)));

TEST(Pipeline, RequestStopDrainsAndReportsInterrupted) {
  Registry r = builtin_registry();
  Pipeline p(load_config_string(sleep_chain("batch_size: 4, prefetch_depth: 2, device: host",
                                            "params: { batches: 1000 }", 1),
                                r),
             r);
  const RunReport report = test::run_stopped_after(p, std::chrono::milliseconds(50));
  EXPECT_TRUE(report.interrupted);
  EXPECT_LT(report.batches, 1000u);
  EXPECT_GT(report.batches, 0u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST(Pipeline, DatasetSmallerThanABatchWithDropLastIsAConfigError) {
  Registry r = builtin_registry();
  std::string yaml =
      "pipeline: { batch_size: 64 }\nsampler: { drop_last: true }\n"
      "nodes:\n  - { name: load, type: synthetic, params: { samples: 10 } }\n"
      "  - { name: train, type: discard }\n";
  EXPECT_EQ(test::error_of<ConfigError>(
                [&] { Pipeline p(load_config_string(yaml, r, {}, "d.yaml"), r); }),
            "d.yaml: pipeline.batch_size: the data set gives no batch (10 samples in this "
            "shard, batch 64, drop_last) use a smaller batch or keep the last partial batch");
}

}  // namespace
}  // namespace flowfeed
