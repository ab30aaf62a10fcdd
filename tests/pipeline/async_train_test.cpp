// Asynchronous train nodes that complete batches in groups (as device_checksum does with one
// kernel per group): every batch completes, in order, at the end of the data, with a slow loader,
// with skipped batches, after a failure elsewhere, and after a stop request; nothing hangs and
// every buffer comes back.
// (A batch is held while others wait to be submitted, up to a full group; a batch the loader is
// still reading does not hold back those already submitted.)
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "flowfeed/extend.hpp"
#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/testing/fault_nodes.hpp"
#include "tests/error_of.hpp"
#include "tests/pipeline/run_stopped.hpp"

namespace flowfeed {
namespace {

/// What a GroupingSink saw; shared with the test (the node lives inside the pipeline).
struct Log {
  std::mutex mutex;
  std::vector<std::uint64_t> completed;  // seqs in completion order
  std::vector<std::size_t> group_sizes;  // batches per completion group
  std::vector<std::uint32_t> epochs_ended;
  std::vector<std::uint64_t> completed_when_epoch_ended;
  std::atomic<int> flushes{0};
  std::atomic<int> max_held{0};
};

/// A train node that holds batches until `group` are waiting or the pipeline calls flush(), then
/// completes them together (outside its lock, as a real grouping node must). It fails the batch
/// `fail_at` from submit() when that is set.
class GroupingSink final : public AsynchronousNode {
 public:
  GroupingSink(std::size_t group, long long fail_at, int submit_us, Log* log)
      : group_(group), fail_at_(fail_at), submit_us_(submit_us), log_(log) {}

  void submit(Batch& batch, Completion done) override {
    // A slow submit (the cost of a launch, say) lets batches queue up behind it.
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(submit_us_);
    while (std::chrono::steady_clock::now() < until) {
    }
    if (static_cast<long long>(batch.seq) == fail_at_) {
      throw Error("grouping_sink: refused batch " + std::to_string(batch.seq));
    }
    std::vector<Completion> ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      held_.push_back(done);
      int held = static_cast<int>(held_.size());
      int m = log_->max_held.load();
      while (held > m && !log_->max_held.compare_exchange_weak(m, held)) {
      }
      if (held_.size() >= group_) ready.swap(held_);
    }
    complete(ready);
  }

  void flush() noexcept override {
    log_->flushes.fetch_add(1);
    std::vector<Completion> ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ready.swap(held_);
    }
    complete(ready);
  }

  void end_epoch(std::uint32_t epoch) override {
    std::lock_guard<std::mutex> lock(log_->mutex);
    log_->epochs_ended.push_back(epoch);
    log_->completed_when_epoch_ended.push_back(log_->completed.size());
  }

 private:
  void complete(std::vector<Completion>& ready) {
    if (ready.empty()) return;
    {
      std::lock_guard<std::mutex> lock(log_->mutex);
      for (const Completion& c : ready) log_->completed.push_back(c.batch()->seq);
      log_->group_sizes.push_back(ready.size());
    }
    for (const Completion& c : ready) c();
  }

  std::size_t group_;
  long long fail_at_;
  int submit_us_;
  Log* log_;
  std::mutex mutex_;
  std::vector<Completion> held_;
};

Log* g_log = nullptr;

Registry make_registry() {
  Registry registry;
  register_builtin_nodes(registry);
  register_fault_nodes(registry);
  Schema schema;
  schema.add_int("group", "batches per group", 4).range(1, 1000);
  schema.add_int("fail_at", "seq whose submit throws (-1: none)", -1).range(-1, 1e9);
  schema.add_int("submit_us", "busy time of each submit", 0).range(0, 1e6);
  registry.set(factory_type(
                   "grouping_sink", Role::train, std::move(schema),
                   [](const NodeSpec& spec) {
                     return std::make_unique<GroupingSink>(
                         static_cast<std::size_t>(spec.params.get_int("group")),
                         spec.params.get_int("fail_at"),
                         static_cast<int>(spec.params.get_int("submit_us")), g_log);
                   },
                   "test only: completes batches in groups")
                   .runs_on(TypeBackend::host));
  return registry;
}

const Registry& registry() {
  static const Registry r = make_registry();
  return r;
}

// 100 samples in batches of 8: 12 full batches and one of 4 per epoch.
constexpr int kPerEpoch = 13;

std::string yaml(const std::string& pipeline_extra, const std::string& load_type,
                 const std::string& load_params, const std::string& sink_params) {
  const bool epochs_set = pipeline_extra.find("epochs") != std::string::npos;
  return std::string("pipeline: { ") + (epochs_set ? "" : "epochs: 3, ") +
         "batch_size: 8, threads: 4, device: host" +
         (pipeline_extra.empty() ? "" : ", " + pipeline_extra) +
         " }\n"
         "nodes:\n"
         "  - { name: load, type: " +
         load_type + ", concurrency: 2, params: { samples: 100, sample_shape: [4], seed: 5" +
         (load_params.empty() ? "" : ", " + load_params) +
         " } }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: grouping_sink, params: { " +
         sink_params + " } }\n";
}

class AsyncTrain : public ::testing::Test {
 protected:
  void SetUp() override { g_log = &log_; }
  void TearDown() override { g_log = nullptr; }
  Pipeline build(const std::string& y) {
    return Pipeline(load_config_string(y, registry(), {}, "async.yaml"), registry());
  }
  /// Runs `p`, asking it to abort after `ms`; expects the run to end interrupted within 10 s.
  RunReport run_aborted_after(Pipeline& p, int ms) {
    std::thread aborter([&p, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      p.request_abort();
    });
    const auto t0 = std::chrono::steady_clock::now();
    const RunReport r = p.run();
    aborter.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_TRUE(r.interrupted);
    EXPECT_LT(s, 10.0) << "the abort did not end the run promptly";
    return r;
  }
  Log log_;
};

struct Shape {
  int depth;
  int group;
  bool ordered;
};

class AsyncTrainShapes : public AsyncTrain, public ::testing::WithParamInterface<Shape> {};

TEST_P(AsyncTrainShapes, EveryBatchCompletesOnceAndEpochsEndAfterTheirBatches) {
  const Shape s = GetParam();
  Pipeline p = build(yaml(
      "prefetch_depth: " + std::to_string(s.depth) + ", ordered: " + (s.ordered ? "true" : "false"),
      "synthetic", "", "group: " + std::to_string(s.group)));
  const RunReport r = p.run();
  EXPECT_EQ(r.batches, 3u * kPerEpoch);
  std::vector<std::uint64_t> seqs = log_.completed;
  ASSERT_EQ(seqs.size(), 3u * kPerEpoch);
  if (s.ordered) {
    for (std::size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i) << "completion " << i;
  }
  std::sort(seqs.begin(), seqs.end());
  for (std::size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i);
  // Never more held than can be in flight, and whole groups whenever more batches could come.
  EXPECT_LE(log_.max_held.load(), std::min(s.depth, s.group));
  ASSERT_EQ(log_.epochs_ended, (std::vector<std::uint32_t>{0, 1, 2}));
  if (s.ordered) {
    for (std::size_t e = 0; e < 3; ++e) {
      EXPECT_GE(log_.completed_when_epoch_ended[e], (e + 1) * kPerEpoch) << "epoch " << e;
    }
  }
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  // The pipeline is reusable: a second run completes everything again.
  log_.completed.clear();
  EXPECT_EQ(p.run().batches, 3u * kPerEpoch);
  EXPECT_EQ(log_.completed.size(), 3u * kPerEpoch);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AsyncTrainShapes,
                         ::testing::Values(Shape{8, 4, true}, Shape{8, 3, false},
                                           Shape{4, 100, true},  // a group never fills
                                           Shape{1, 4, true}, Shape{16, 1, true},
                                           Shape{16, 8, false}),
                         [](const auto& info) {
                           return "depth" + std::to_string(info.param.depth) + "_group" +
                                  std::to_string(info.param.group) +
                                  (info.param.ordered ? "_ordered" : "_unordered");
                         });

TEST_F(AsyncTrain, AGroupThatCannotFillIsFlushedWhenNothingIsUpstream) {
  // A group larger than prefetch_depth can never fill: only flush() moves the run on.
  Pipeline p = build(yaml("prefetch_depth: 4", "synthetic", "", "group: 50"));
  const RunReport r = p.run();
  EXPECT_EQ(r.batches, 3u * kPerEpoch);
  EXPECT_GT(log_.flushes.load(), 0);
  for (std::size_t n : log_.group_sizes) EXPECT_LE(n, 4u);
}

TEST_F(AsyncTrain, ABatchDoesNotWaitForOnesTheLoaderIsStillReading) {
  // 20 ms per batch from a serial loader: each batch is completed when it arrives (a group of
  // one), not when group - 1 more have been read.
  std::string y = yaml("prefetch_depth: 8, epochs: 1", "synthetic", "delay_ms: 20", "group: 8");
  y.replace(y.find("concurrency: 2"), 14, "concurrency: 1");
  Pipeline p = build(y);
  const RunReport r = p.run();
  EXPECT_EQ(r.batches, static_cast<std::uint64_t>(kPerEpoch));
  ASSERT_EQ(log_.completed.size(), static_cast<std::size_t>(kPerEpoch));
  EXPECT_GE(log_.group_sizes.size(), static_cast<std::size_t>(kPerEpoch) - 2);
}

TEST_F(AsyncTrain, GroupsFormWhileBatchesQueueForASlowTrainNode) {
  // 2 ms per submit against a loader with no delay: batches wait for the train node, and it
  // takes them in groups (at most `group`).
  Pipeline p =
      build(yaml("prefetch_depth: 16, epochs: 1", "synthetic", "", "group: 4, submit_us: 2000"));
  const RunReport r = p.run();
  EXPECT_EQ(r.batches, static_cast<std::uint64_t>(kPerEpoch));
  ASSERT_EQ(log_.completed.size(), static_cast<std::size_t>(kPerEpoch));
  const std::size_t largest = *std::max_element(log_.group_sizes.begin(), log_.group_sizes.end());
  EXPECT_EQ(largest, 4u);
  EXPECT_LT(log_.group_sizes.size(), static_cast<std::size_t>(kPerEpoch));
}

TEST_F(AsyncTrain, AnAbortWhileBatchesAreHeldEndsTheRunAndTheNextRunCompletes) {
  // A loader that stalls (fires once) while the train node holds batches it can never group: the
  // abort cancels the graph, and the held batches must be let go or the run would never end.
  Pipeline p = build(yaml("prefetch_depth: 8", "fault_load",
                          "mode: stall, at_batch: 5, fires: 1, stall_s: 30", "group: 100"));
  run_aborted_after(p, 100);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  log_.completed.clear();
  const RunReport again = p.run();
  EXPECT_FALSE(again.interrupted);
  EXPECT_EQ(again.batches, 3u * kPerEpoch);
  EXPECT_EQ(log_.completed.size(), 3u * kPerEpoch);
}

TEST_F(AsyncTrain, AnAbortLetsGoOfBatchesHeldBehindASequencerGap) {
  // The upload of batch 5 stalls (a late completion); 6, 7, ... wait in the sequencer for it, so
  // the train node keeps holding 0-4 (more batches are queued for it). Only the flush the
  // pipeline sends while cancelling lets them go: without it the run would never end.
  // A slow submit (20 ms) lets 6 and 7 pass the upload while 0-4 are being submitted.
  std::string y =
      yaml("prefetch_depth: 8, ordered: true", "synthetic", "", "group: 100, submit_us: 20000");
  const std::string plain = "type: host_upload }";
  y.replace(y.find(plain), plain.size(),
            "type: fault_upload, params: { mode: stall, at_batch: 5, fires: 1, stall_s: 30 } }");
  Pipeline p = build(y);
  run_aborted_after(p, 500);
  EXPECT_GE(log_.max_held.load(), 5) << "the train node never held the batches before the gap";
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST_F(AsyncTrain, EachDeviceBranchFlushesItsOwnTrainNode) {
  // pipeline.devices: [0, 1]: two grouping train nodes, each fed every other batch; a group of
  // 50 never fills, so each branch's node must be flushed when its own queue is empty.
  Pipeline p = build(yaml("prefetch_depth: 8, devices: [0, 1]", "synthetic", "", "group: 50"));
  const RunReport r = p.run();
  EXPECT_EQ(r.batches, 3u * kPerEpoch);
  std::vector<std::uint64_t> seqs = log_.completed;
  ASSERT_EQ(seqs.size(), 3u * kPerEpoch);
  std::sort(seqs.begin(), seqs.end());
  for (std::size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], i);
  // Both branches end every epoch.
  EXPECT_EQ(log_.epochs_ended.size(), 6u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST_F(AsyncTrain, SkippedBatchesDoNotLeaveAGroupWaiting) {
  // The last three batches of the run are skipped data errors: they never reach submit(), and
  // the batches held before them must still complete.
  Pipeline p = build(yaml("prefetch_depth: 8, on_error: skip, max_skipped: 10", "fault_load",
                          "mode: data_error, at_batch: 36, count: 3", "group: 6"));
  const RunReport r = p.run();
  EXPECT_EQ(r.skipped_batches, 3u);
  EXPECT_EQ(log_.completed.size(), 3u * kPerEpoch - 3);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST_F(AsyncTrain, ALoaderFailureWhileBatchesAreHeldEndsTheRunWithTheLoadersError) {
  Pipeline p =
      build(yaml("prefetch_depth: 8", "fault_load", "mode: throw, at_batch: 20", "group: 100"));
  try {
    p.run();
    FAIL() << "the run did not fail";
  } catch (const NodeError& e) {
    EXPECT_EQ(e.node(), "load");
    EXPECT_NE(std::string(e.what()).find("batch 20 (epoch 1)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST_F(AsyncTrain, ASubmitThatThrowsFailsThatBatchAndNamesTheTrainNode) {
  Pipeline p = build(yaml("prefetch_depth: 8", "synthetic", "", "group: 4, fail_at: 17"));
  EXPECT_EQ(test::error_of<NodeError>([&] { p.run(); }),
            "node 'train' (grouping_sink, async.yaml:6) batch 17 (epoch 1): grouping_sink: "
            "refused batch 17");
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST_F(AsyncTrain, AStopRequestDrainsHeldBatches) {
  Pipeline p = build(yaml("prefetch_depth: 8", "synthetic", "delay_ms: 2", "group: 6"));
  const RunReport r = test::run_stopped_after(p, std::chrono::milliseconds(30));
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(log_.completed.size(), r.batches);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

}  // namespace
}  // namespace flowfeed
