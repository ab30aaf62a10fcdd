// `concurrency: auto` and `prefetch_depth: auto` in pull mode: the caller's loop is the train step
// the tuner serves, and a caller that holds every batch in flight raises the depth, not a stall.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/registry.hpp"
#include "tests/pipeline/autotune_chain.hpp"

namespace flowfeed {
namespace {

using namespace test::autotune;

/// The chain without its train node, in pull mode: the caller's loop is the train step.
std::string pull_chain(int batches, double load_ms) {
  return fmt::format(
      "pipeline: {{ mode: pull, epochs: 1, batch_size: 64, prefetch_depth: auto, threads: 8, "
      "device: host }}\n"
      "nodes:\n"
      "  - {{ name: load, type: synthetic, concurrency: auto, params: {{ batches: {}, "
      "sample_shape: [64], delay_ms: {:g} }} }}\n"
      "  - {{ name: stage, type: host_staging, concurrency: 2 }}\n"
      "  - {{ name: upload, type: host_upload }}\n",
      batches, load_ms);
}

TEST(Autotune, InPullModeTheCallersLoopIsTheTrainStepTheTunerServes) {
  Registry registry = builtin_registry();
  Pipeline pipeline(load_config_string(pull_chain(240, 4), registry, {}, "pull.yaml"), registry);
  Session session = pipeline.start();
  std::uint64_t taken = 0;
  while (Batch* b = session.next()) {
    ++taken;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the caller's step
    session.release(b);
  }
  EXPECT_EQ(taken, 240u);
  const RunReport r = session.report();
  // 8 threads for the loader; staging 2, upload 1 and the caller's loop 1 on top.
  const TuningDecision first = first_load_raise(r, 12);
  EXPECT_EQ(first.why.rfind("the caller's loop waits ", 0), 0u) << first.why;
  EXPECT_NE(first.why.find("and the caller's loop takes "), std::string::npos) << first.why;
  // 4 ms a batch against a step of 1 ms and more: at least 3 bodies.
  EXPECT_GE(settled(r, "nodes.load.concurrency"), 3) << r.to_table();
  EXPECT_EQ(r.nodes[0].concurrency, settled(r, "nodes.load.concurrency"));
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Autotune, APullCallerHoldingEveryBatchInFlightRaisesTheDepthInsteadOfStalling) {
  Registry registry = builtin_registry();
  Pipeline pipeline(
      load_config_string(pull_chain(40, 0), registry, {"pipeline.stall_timeout_s=5"}, "pull.yaml"),
      registry);
  Session session = pipeline.start();
  // The tuner starts at one batch per body and one more (load 1, staging 2, upload 1: 5); the
  // caller keeps 12 before it gives any back.
  std::vector<Batch*> held;
  for (int i = 0; i < 12; ++i) {
    Batch* b = session.next();
    ASSERT_NE(b, nullptr) << i;
    EXPECT_EQ(b->seq, static_cast<std::uint64_t>(i));
    held.push_back(b);
  }
  for (Batch* b : held) session.release(b);
  std::uint64_t rest = 0;
  while (Batch* b = session.next()) {
    ++rest;
    session.release(b);
  }
  EXPECT_EQ(rest, 28u);
  const RunReport r = session.report();
  expect_within_budget(r);
  EXPECT_GE(r.max_in_flight, 12);
  bool said = false;
  for (const TuningDecision& d : r.tuning.decisions) {
    if (d.why == "the caller holds 5 batches and asks for another: 6 may be in flight") {
      said = d.knob == "pipeline.prefetch_depth" && d.from == 5 && d.to == 6;
    }
  }
  EXPECT_TRUE(said) << r.to_table();
}

}  // namespace
}  // namespace flowfeed
