// `concurrency: auto` and `prefetch_depth: auto` on real push-mode graphs whose stages cost what
// their delay params say: the tuner gives the slow stage the bodies it needs and leaves the rest,
// follows a cost that changes mid-run, serves an asynchronous train node and several devices'
// branches, stops growing a node whose bodies share one resource, and memory never grows past the
// pools sized at build, which fit pipeline.memory_budget. Pull mode: autotune_pull_test.cpp; the
// keys: autotune_config_test.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>

#include "flowfeed/config.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/registry.hpp"
#include "tests/pipeline/autotune_chain.hpp"

namespace flowfeed {
namespace {

using namespace test::autotune;

TEST(Autotune, ASlowLoaderGetsTheBodiesItNeeds) {
  // 4 ms a batch against a 1 ms train step: 4 bodies keep up, 5 with the tuner's headroom. A
  // budget of 8 bodies over every synchronous node leaves the loader 4 of them, so that a window
  // measured on a busy machine (a slower loader) cannot take it far past what the run needed.
  const RunReport r = run_yaml(chain(240, 4, "", 1, ", thread_budget: 8"));
  EXPECT_EQ(r.batches, 240u);
  expect_within_budget(r);
  ASSERT_FALSE(r.tuning.decisions.empty());
  const TuningDecision& first = r.tuning.decisions.front();
  EXPECT_EQ(first.knob, "nodes.load.concurrency");
  EXPECT_EQ(first.from, 1);
  // About 4 (4 ms against 1 ms), 5 with the tuner's headroom.
  const double need = needed(r, 0);
  EXPECT_GE(settled(r, "nodes.load.concurrency"), static_cast<int>(need)) << need;
  EXPECT_LE(settled(r, "nodes.load.concurrency"), static_cast<int>(need * 1.25) + 2) << need;
  EXPECT_EQ(r.nodes[0].concurrency, settled(r, "nodes.load.concurrency"));
  // The values to pin them, as YAML a user pastes.
  EXPECT_NE(r.tuning.yaml.find(fmt::format("pipeline:\n  prefetch_depth: {}\n",
                                           settled(r, "pipeline.prefetch_depth"))),
            std::string::npos)
      << r.tuning.yaml;
  EXPECT_NE(r.tuning.yaml.find(fmt::format("  - {{ name: load, concurrency: {} }}\n",
                                           settled(r, "nodes.load.concurrency"))),
            std::string::npos)
      << r.tuning.yaml;
  const std::string json = r.to_json();
  EXPECT_NE(json.find("\"knob\": \"nodes.load.concurrency\""), std::string::npos);
}

TEST(Autotune, ByDefaultTheFixedNodesBodiesComeOnTopOfTheThreadsSoALoaderMayTakeEveryThread) {
  // 16 ms a batch against a 1 ms train step: 16 bodies needed, 20 with headroom (over 8 even
  // when a busy machine makes the train step take twice as long). The threads (8)
  // are the auto loader's; staging (2 bodies), upload (1) and the train step (1) are on top: a
  // budget of 12.
  const RunReport r = run_yaml(chain(160, 16, "", 1));
  EXPECT_EQ(r.batches, 160u);
  const TuningDecision first = first_load_raise(r, 12);
  EXPECT_EQ(settled(r, "nodes.load.concurrency"), 8);
  EXPECT_EQ(first.to, 8);
  EXPECT_NE(first.why.find("(the thread budget of 12 allows 8)"), std::string::npos) << first.why;
  // Pools for 2 × (12 bodies + 4 nodes) batches.
  EXPECT_EQ(r.tuning.max_prefetch_depth, 32);
}

TEST(Autotune, ByDefaultEveryFurtherAutoNodesOneBodyComesOnTopSoALoaderMayStillTakeEveryThread) {
  // The same 16 ms loader, and a transform of no cost that is auto too: its one body comes on top
  // of the 8 threads with the fixed nodes' 4, a budget of 13, and the loader still gets all 8.
  const RunReport r = run_yaml(chain(
      160, 16, "  - { name: augment, type: delay, concurrency: auto, params: { ms: 0 } }\n", 1));
  EXPECT_EQ(r.batches, 160u);
  const TuningDecision first = first_load_raise(r, 13);
  EXPECT_EQ(first.to, 8);
  EXPECT_NE(first.why.find("(the thread budget of 13 allows 8)"), std::string::npos) << first.why;
  EXPECT_EQ(settled(r, "nodes.load.concurrency"), 8);
  EXPECT_EQ(settled(r, "nodes.augment.concurrency"), 1);
}

TEST(Autotune, ASlowTransformGrowsAndTheFastLoaderStaysSmall) {
  const RunReport r = run_yaml(chain(
      240, 0, "  - { name: augment, type: delay, concurrency: auto, params: { ms: 3 } }\n", 1));
  EXPECT_EQ(r.batches, 240u);
  expect_within_budget(r);
  const double need = needed(r, 1);
  EXPECT_GE(settled(r, "nodes.augment.concurrency"), static_cast<int>(need)) << need;
  EXPECT_GE(settled(r, "nodes.augment.concurrency"), 2);
  EXPECT_LE(settled(r, "nodes.load.concurrency"), 2);
}

TEST(Autotune, ASlowTrainNodeLeavesTheLoaderAloneAndTheDepthGateHoldsBelowThePools) {
  const RunReport r = run_yaml(chain(100, 0.5, "", 4));
  EXPECT_EQ(r.batches, 100u);
  expect_within_budget(r);
  // A loader 8 times faster than the train step never needs a second body.
  for (const TuningDecision& d : r.tuning.decisions) {
    EXPECT_NE(d.knob, "nodes.load.concurrency") << d.why;
  }
  EXPECT_EQ(settled(r, "nodes.load.concurrency"), 1);
  // Pools for 2 × (12 bodies + 4 nodes) batches (8 threads for the loader, 4 bodies of fixed
  // nodes); the run starts with one in flight per body
  // (load, staging 2, upload, train) and one more admitted. On a quiet machine the train node is
  // fed at once; a busy one may make it wait and the depth grow. Either way no more batches were
  // in flight than the gate let through, far below the pools.
  EXPECT_EQ(r.tuning.max_prefetch_depth, 32);
  int largest = 6;
  for (const TuningDecision& d : r.tuning.decisions) {
    if (d.knob == "pipeline.prefetch_depth") largest = std::max(largest, d.to);
  }
  EXPECT_EQ(settled(r, "pipeline.prefetch_depth"), largest);
  EXPECT_LE(r.max_in_flight, largest);
}

TEST(Autotune, AMemoryBudgetTooSmallForTheWantedDepthSizesThePoolsForTheMostItAllows) {
  // Three pools of 16640-byte buffers: 49920 bytes per batch in flight. The sampling order takes
  // 60 KiB (7680 samples x 4 bytes, twice), so the 240 KiB left of 300 KiB hold 4.
  const RunReport r = run_yaml(chain(120, 4, "", 1, ", memory_budget: { host: 300K, device: 1G }"));
  EXPECT_EQ(r.batches, 120u);
  expect_within_budget(r);
  EXPECT_EQ(r.tuning.max_prefetch_depth, 4);
  EXPECT_TRUE(r.tuning.depth_capped_by_memory);
  EXPECT_EQ(r.tuning.host_budget_bytes, 300u * 1024);
  EXPECT_EQ(r.tuning.host_pool_bytes, 4u * 3 * 16640 + 7680 * 4 * 2);
  EXPECT_LE(settled(r, "pipeline.prefetch_depth"), 4);
  ASSERT_FALSE(r.tuning.decisions.empty());
  EXPECT_EQ(r.tuning.decisions.front().why,
            "limit: pools sized for prefetch_depth 4, the most pipeline.memory_budget allows (32 "
            "wanted; host budget 300.0 KiB, device budget 1.0 GiB)");
}

TEST(Autotune, ACostThatRisesMidRunIsFollowed) {
  // The transform costs 0.3 ms for 100 batches, then 4 ms (the data set's cold part).
  const RunReport r = run_yaml(
      chain(300, 0,
            "  - { name: augment, type: delay, concurrency: auto, params: { ms: 0.3, change_after: "
            "100, ms_after: 4 } }\n",
            1));
  EXPECT_EQ(r.batches, 300u);
  expect_within_budget(r);
  // A raise made from a window that saw the new cost (the transform's 100th batch comes before
  // the train node's 100th: batches in flight between them).
  bool followed = false;
  const std::regex took("augment takes ([0-9.]+) ms a batch");
  for (const TuningDecision& d : r.tuning.decisions) {
    std::smatch m;
    if (d.knob == "nodes.augment.concurrency" && d.to > d.from &&
        std::regex_search(d.why, m, took) && std::stod(m[1].str()) >= 2.0) {
      followed = true;
    }
  }
  EXPECT_TRUE(followed) << r.to_table();
  EXPECT_GE(settled(r, "nodes.augment.concurrency"), 2) << r.to_table();
}

TEST(Autotune, WithSeveralDevicesTheBranchesTrainNodesTogetherSetTheRateAndCopiesShareAKnob) {
  // Two branches of a 2 ms train step take 1000 batches/s, where one alone takes at most 500; a
  // 4 ms loader needs 4 bodies for them (one branch: 2). The upload node is auto in both
  // branches: one knob.
  const RunReport r = run_yaml(
      "pipeline: { epochs: 1, batch_size: 64, prefetch_depth: auto, threads: 8, device: host, "
      "devices: [0, 1] }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: auto, params: { batches: 400, "
      "sample_shape: [64], delay_ms: 4 } }\n"
      "  - { name: stage, type: host_staging, concurrency: 2 }\n"
      "  - { name: upload, type: host_upload, concurrency: auto }\n"
      "  - { name: train, type: sleep, params: { ms: 2 } }\n");
  EXPECT_EQ(r.batches, 400u);
  // 8 threads for the auto nodes; staging 2, a train step per branch and the upload copies' one
  // body each (the loader's first is within the 8) on top.
  const TuningDecision first = first_load_raise(r, 14);
  // The rate to reach is the branches' together: above the 500 batches/s one branch's 2 ms step
  // could take at best (a loaded machine's sleeps run long, so the two give less than 1000).
  std::smatch rate;
  ASSERT_TRUE(
      std::regex_search(first.why, rate, std::regex("the train node takes ([0-9]+) batches/s")))
      << first.why;
  EXPECT_GT(std::stoi(rate[1].str()), 500) << first.why;
  EXPECT_GE(settled(r, "nodes.load.concurrency"), 3) << r.to_table();
  for (const TuningDecision& d : r.tuning.decisions) {
    EXPECT_EQ(d.knob.find('@'), std::string::npos) << d.knob;
  }
  ASSERT_EQ(r.tuning.settled.count("nodes.upload.concurrency"), 1u);
  const int upload = settled(r, "nodes.upload.concurrency");
  EXPECT_NE(r.tuning.yaml.find(fmt::format("  - {{ name: upload, concurrency: {} }}\n", upload)),
            std::string::npos)
      << r.tuning.yaml;
  EXPECT_EQ(r.tuning.yaml.find("upload@"), std::string::npos) << r.tuning.yaml;
  for (const NodeReport& n : r.nodes) {
    if (n.name.rfind("upload@", 0) == 0) {
      EXPECT_EQ(n.concurrency, upload) << n.name;
    }
  }
}

/// An asynchronous train node whose work takes `ms` per batch, one batch after another, on a
/// thread of its own (a device's stream).
class TimedSink final : public AsynchronousNode {
 public:
  explicit TimedSink(double ms) : ms_(ms), worker_([this] { work(); }) {}
  ~TimedSink() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }
  void submit(Batch&, Completion done) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(done);
    }
    wake_.notify_all();
  }

 private:
  void work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      const Completion done = queue_.front();
      queue_.pop_front();
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms_));
      done();
      lock.lock();
    }
  }
  double ms_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Completion> queue_;
  bool stop_ = false;
  std::thread worker_;
};

TEST(Autotune, AnAsynchronousTrainNodeIsFedByWhatItsWorkInFlightShows) {
  Registry registry = builtin_registry();
  Schema schema;
  schema.add_number("ms", "work per batch", 1.0).range(0, 1000);
  registry.set(factory_type(
                   "timed_sink", Role::train, std::move(schema),
                   [](const NodeSpec& spec) {
                     return std::make_unique<TimedSink>(spec.params.get_number("ms"));
                   },
                   "test only: asynchronous work of ms per batch")
                   .runs_on(TypeBackend::host));
  std::string yaml = chain(300, 4, "", 1);
  yaml.replace(yaml.find("type: sleep"), 11, "type: timed_sink");
  Pipeline pipeline(load_config_string(yaml, registry, {}, "auto.yaml"), registry);
  const RunReport r = pipeline.run();
  EXPECT_EQ(r.batches, 300u);
  expect_within_budget(r);
  // 4 ms loads against 1 ms of device work: about 4 bodies.
  EXPECT_GE(settled(r, "nodes.load.concurrency"), 3) << r.to_table();
}

TEST(Autotune, ATransformWhoseBodiesShareOneResourceStopsGrowingWhenMoreBodiesGainNothing) {
  // Each batch takes 3 ms for every body of the node running at the time: like a decoder that
  // spreads each batch over the cores, more bodies do not add capacity.
  Registry registry = builtin_registry();
  auto active = std::make_shared<std::atomic<int>>(0);
  registry.set(callable_type("shared_work", Role::transform, [active](Batch&) {
    const int running = ++*active;
    std::this_thread::sleep_for(std::chrono::microseconds(3000 * running));
    --*active;
  }));
  const std::string yaml =
      chain(300, 0, "  - { name: augment, type: shared_work, concurrency: auto }\n", 1);
  Pipeline pipeline(load_config_string(yaml, registry, {}, "auto.yaml"), registry);
  const RunReport r = pipeline.run();
  EXPECT_EQ(r.batches, 300u);
  expect_within_budget(r);
  std::size_t saturated = r.tuning.decisions.size();
  for (std::size_t i = 0; i < r.tuning.decisions.size() && saturated == r.tuning.decisions.size();
       ++i) {
    if (r.tuning.decisions[i].why.find("more bodies did not raise augment's rate") !=
        std::string::npos) {
      saturated = i;
    }
  }
  ASSERT_LT(saturated, r.tuning.decisions.size()) << r.to_table();
  // Found once, after the raise it judged (a depth change may come between them, while the raise's
  // bodies wait for batches); augment never grows past that raise again.
  std::size_t raised = saturated;
  while (raised > 0 && r.tuning.decisions[raised - 1].knob != "nodes.augment.concurrency") {
    --raised;
  }
  ASSERT_GE(raised, 1u) << r.to_table();
  const TuningDecision& raise = r.tuning.decisions[raised - 1];
  EXPECT_GT(raise.to, raise.from) << r.to_table();
  for (std::size_t i = saturated; i < r.tuning.decisions.size(); ++i) {
    const TuningDecision& d = r.tuning.decisions[i];
    if (d.knob == "nodes.augment.concurrency") {
      EXPECT_LE(d.to, raise.to) << r.to_table();
    }
  }
  EXPECT_LE(settled(r, "nodes.augment.concurrency"), raise.to);
}

}  // namespace
}  // namespace flowfeed
