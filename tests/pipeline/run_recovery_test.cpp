// What follows a failure and what ends a run early, on the fault chain (fault_chain.hpp): the same
// pipeline (and a new one) runs again after a failure or a stall, a run that lost a batch fails,
// and request_stop drains while request_abort ends a run stuck in a stall; every pool buffer is
// back after each.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "flowfeed/flowfeed.hpp"
#include "tests/pipeline/fault_chain.hpp"
#include "tests/pipeline/run_stopped.hpp"

namespace flowfeed {
namespace {

using namespace test::fault_chain;

TEST(Rerun, SamePipelineRunsAgainAfterAFailure) {
  // fires: 1 -- the fault fires once, in the first run.
  Pipeline p = build(make_yaml("", chain(Family::staging, "mode: throw, at_batch: 7, fires: 1")));
  NodeError e = run_expecting_node_error(p);
  EXPECT_EQ(e.batch(), 7);
  RunReport r = p.run();
  EXPECT_EQ(r.batches, static_cast<std::uint64_t>(kBatches));
  EXPECT_EQ(r.samples, static_cast<std::uint64_t>(kEpochs * kSamples));
  EXPECT_GT(r.extra.at("checksum_bytes_verified"), 0);
  EXPECT_EQ(r.allocations_after_build, 0u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  // And a third time, with the same report.
  RunReport again = p.run();
  EXPECT_EQ(again.batches, r.batches);
  EXPECT_EQ(again.extra.at("checksum_bytes_verified"), r.extra.at("checksum_bytes_verified"));
}

TEST(Rerun, SamePipelineRunsAgainAfterAStall) {
  Pipeline p =
      build(make_yaml("stall_timeout_s: 0.3",
                      chain(Family::train, "mode: stall, at_batch: 2, stall_s: 100000, fires: 1")));
  (void)run_expecting_error(p);
  RunReport r = p.run();
  EXPECT_EQ(r.batches, static_cast<std::uint64_t>(kBatches));
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

/// A transform that gives batch 3 another sequence number: the sequencer then holds it (and every
/// later batch) forever, as a node that lost or kept a batch would.
class Renumber final : public Node {
 public:
  void process(Batch& batch) override {
    if (batch.seq == 3) batch.seq += 1000;
  }
};

TEST(LostBatch, ARunThatLostABatchIsAFailure) {
  Registry r = make_registry();
  NodeType t;
  t.name = "renumber";
  t.role = Role::transform;
  t.create = [](const NodeSpec&) { return std::make_unique<Renumber>(); };
  r.set(std::move(t));
  auto nodes = chain(Family::train, "mode: throw, at_batch: 1000");
  nodes.insert(nodes.begin() + 1, NodeLine{"renumber", "renumber", "", 1});
  Pipeline p(load_config_string(make_yaml("ordered: true", nodes), r, {}, kFile), r);
  // Batches 0-2 arrive; 3 is held and 4-6 wait behind it until the limiter (depth 4) is shut. The
  // source may have made batch 7 too (the limiter refused it), depending on timing.
  const std::string message = run_expecting_error(p);
  auto text = [](int left) {
    return "run lost batches: 3 of 12 reached the train node (" + std::to_string(left) +
           " left the source) — a node dropped or held a batch";
  };
  EXPECT_TRUE(message == text(7) || message == text(8)) << message;
}

TEST(Rerun, NewPipelineRunsAfterAFailedOne) {
  {
    Pipeline failing = build(make_yaml("", chain(Family::upload, "mode: throw, at_batch: 3")));
    (void)run_expecting_node_error(failing);
  }
  Pipeline p = build(make_yaml("", chain(Family::upload, "mode: throw, at_batch: 1000")));
  RunReport r = p.run();
  EXPECT_EQ(r.batches, static_cast<std::uint64_t>(kBatches));
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

/// A config that runs long enough to be interrupted: 2000 batches of 1 ms each at the sink.
std::string long_yaml(const std::string& train_type, const std::string& train_params) {
  return make_yaml("", {{"load", "synthetic", "batches: 1000, sample_shape: [8]", 2},
                        {"stage", "host_staging", "", 1},
                        {"upload", "fault_upload", "mode: throw, at_batch: 100000000", 1},
                        {"train", train_type, train_params, 1}});
}

TEST(Interrupt, RequestStopDrainsAndReportsAnInterruptedRun) {
  Pipeline p = build(long_yaml("sleep", "ms: 1"));
  const RunReport r = test::run_stopped_after(p, std::chrono::milliseconds(100));
  EXPECT_TRUE(r.interrupted);
  EXPECT_LT(r.batches, 2000u);
  // Drained: every batch that left the source reached the sink.
  EXPECT_EQ(r.nodes.front().items, r.batches);
  EXPECT_EQ(r.nodes.back().items, r.batches);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  // The request applied to that run only.
  Pipeline q = build(make_yaml("", chain(Family::train, "mode: throw, at_batch: 1000")));
  RunReport full = q.run();
  EXPECT_FALSE(full.interrupted);
  EXPECT_EQ(full.batches, static_cast<std::uint64_t>(kBatches));
}

TEST(Interrupt, StopRequestedBeforeRunStopsThatRunAtOnce) {
  Pipeline p = build(make_yaml("", chain(Family::train, "mode: throw, at_batch: 1000")));
  p.request_stop();
  RunReport r = p.run();
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.batches, 0u);
  RunReport again = p.run();
  EXPECT_FALSE(again.interrupted);
  EXPECT_EQ(again.batches, static_cast<std::uint64_t>(kBatches));
}

TEST(Interrupt, RequestAbortEndsARunStuckInAStall) {
  Pipeline p =
      build(long_yaml("fault_train", "mode: stall, at_batch: 5, stall_s: 100000, fires: 1"));
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    p.request_stop();  // drains: waits for the stall...
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    p.request_abort();  // ...until the abort cancels it
  });
  RunReport r = p.run();
  aborter.join();
  EXPECT_TRUE(r.interrupted);
  EXPECT_LE(r.batches, 6u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  // Aborting cancelled the graph; the pipeline still runs again, to the end (fires: 1).
  RunReport again = p.run();
  EXPECT_FALSE(again.interrupted);
  EXPECT_EQ(again.batches, 2000u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

}  // namespace
}  // namespace flowfeed
