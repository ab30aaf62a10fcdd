// Pull mode: Pipeline::start() and Session.
#include "flowfeed/session.hpp"

#include <gtest/gtest.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "flowfeed/builder.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

std::string at(int line) {
  return std::string(__FILE__) + ":" + std::to_string(line);
}

/// load (synthetic, 8 floats per sample) -> stage -> upload: the caller is the train step.
PipelineBuilder feeder(std::int64_t samples, std::size_t batch, int depth, int epochs = 1) {
  PipelineBuilder b;
  b.epochs(epochs).batch_size(batch).prefetch_depth(depth).device(DeviceChoice::host);
  b.load("synthetic", {{"samples", samples}, {"sample_shape", {8}}, {"seed", 5}}).concurrency(2);
  b.stage("host_staging").concurrency(2);
  b.upload("host_upload");
  return b;
}

/// Checks the bytes of a delivered batch's device tier against the synthetic formula.
void expect_synthetic_bytes(const Batch& b) {
  ASSERT_NE(b.data(Tier::device), nullptr);
  EXPECT_EQ(b.data(Tier::staging), nullptr);  // staging was returned once copied
  const auto* x = reinterpret_cast<const float*>(b.tensor(Tier::device, 0));
  const auto* y = reinterpret_cast<const std::int32_t*>(b.tensor(Tier::device, 1));
  for (std::size_t r = 0; r < b.rows(); ++r) {
    float expected[8];
    synthetic_fill(5, b.samples[r], DType::float32, 8, expected);
    ASSERT_EQ(std::memcmp(expected, x + r * 8, sizeof expected), 0) << "batch " << b.seq;
    ASSERT_EQ(y[r], synthetic_label(5, b.samples[r], 10));
  }
}

TEST(Session, DeliversEveryBatchInOrderWithItsBytes) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(1000, 64, 4, 2).build(registry);
  Session session = pipeline.start();
  std::uint64_t expected_seq = 0;
  std::size_t rows = 0;
  while (Batch* b = session.next()) {
    EXPECT_EQ(b->seq, expected_seq++);
    EXPECT_EQ(b->epoch, b->seq / 16);
    expect_synthetic_bytes(*b);
    rows += b->rows();
    session.release(b);
  }
  EXPECT_EQ(expected_seq, 32u);  // 16 batches per epoch (the last of 40 rows), 2 epochs
  EXPECT_EQ(rows, 2000u);
  EXPECT_TRUE(session.finished());
  EXPECT_EQ(session.next(), nullptr);  // and again
  RunReport report = session.report();
  EXPECT_EQ(report.batches, 32u);
  EXPECT_EQ(report.samples, 2000u);
  EXPECT_FALSE(report.interrupted);
  EXPECT_LE(report.max_in_flight, 4);
  EXPECT_GE(report.train.stall_fraction, 0.0);
  EXPECT_LE(report.train.stall_fraction, 1.0);
  ASSERT_EQ(report.nodes.size(), 3u);
  EXPECT_EQ(report.nodes[2].items, 32u);
  for (const auto& pool : report.pools) EXPECT_LE(pool.high_water, 4u) << pool.name;
  EXPECT_EQ(report.allocations_after_build, 0u);
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Session, TheCallerMayHoldBatchesUpToTheBound) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(64 * 20, 64, 3).build(registry);
  Session session = pipeline.start();
  std::vector<Batch*> held;
  for (int i = 0; i < 3; ++i) held.push_back(session.next());
  for (Batch* b : held) ASSERT_NE(b, nullptr);
  EXPECT_EQ(session.held(), 3u);
  EXPECT_EQ(test::error_of<std::logic_error>([&] { session.next(); }),
            "Session::next: the caller holds all 3 batches the pipeline may have in flight "
            "(pipeline.prefetch_depth): batch 0 (epoch 0), batch 1 (epoch 0), batch 2 (epoch "
            "0); no other batch can come, release() one first");
  // Distinct buffers: each held batch keeps its own device lease.
  std::set<std::byte*> buffers;
  for (Batch* b : held) buffers.insert(b->data(Tier::device));
  EXPECT_EQ(buffers.size(), 3u);
  session.release(held[1]);
  Batch* next = session.next();
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->seq, 3u);
  session.release(held[0]);
  session.release(held[2]);
  session.release(next);
  std::size_t n = 4;
  while (Batch* b = session.next()) {
    ++n;
    session.release(b);
  }
  EXPECT_EQ(n, 20u);
  EXPECT_LE(session.report().max_in_flight, 3);
}

TEST(Session, ReleaseRejectsForeignAndRepeatedBatches) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(64 * 4, 64, 2).build(registry);
  Session session = pipeline.start();
  Batch* b = session.next();
  ASSERT_NE(b, nullptr);
  Batch stranger;
  EXPECT_THROW(session.release(&stranger), std::logic_error);
  session.release(b);
  EXPECT_EQ(test::error_of<std::logic_error>([&] { session.release(b); }),
            "Session::release: this batch was not handed out by this session's next(), or "
            "was released already");
}

TEST(Session, TheReportSaysHowManyWorkerThreadsRan) {
  Registry registry = builtin_registry();
  const int cores = tbb::info::default_concurrency();
  {
    Pipeline pipeline = feeder(100, 10, 4).build(registry);
    Session session = pipeline.start();
    while (Batch* b = session.next()) session.release(b);
    EXPECT_EQ(session.report().threads, cores);  // threads: 0 is one per core
  }
  {
    // An explicit count is taken as it is.
    Pipeline pipeline = feeder(100, 10, 4).threads(3).build(registry);
    Session session = pipeline.start();
    while (Batch* b = session.next()) session.release(b);
    EXPECT_EQ(session.report().threads, 3);
  }
}

TEST(Session, TheCallersThreadRunsNoNode) {
  Registry registry = builtin_registry();
  std::mutex mutex;
  std::set<std::thread::id> node_threads;
  auto record = [&](Batch&) {
    std::lock_guard<std::mutex> lock(mutex);
    node_threads.insert(std::this_thread::get_id());
  };
  PipelineBuilder b;
  b.prefetch_depth(4).threads(2);
  b.load("synthetic", {{"batches", 40}, {"sample_shape", {4}}});
  b.transform(make_node(record)).concurrency(2);
  b.stage("host_staging");
  b.transform(make_node(record));
  Pipeline pipeline = b.build(registry);
  Session session = pipeline.start();
  int n = 0;
  while (Batch* batch = session.next()) {
    // Give the graph a moment to run ahead while this thread holds the batch.
    if (n++ % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    session.release(batch);
  }
  EXPECT_EQ(n, 40);
  EXPECT_FALSE(node_threads.empty());
  EXPECT_EQ(node_threads.count(std::this_thread::get_id()), 0u);
}

TEST(Session, DestroyingItEarlyStopsAndDrains) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(64 * 200, 64, 6).build(registry);
  {
    Session session = pipeline.start();
    for (int i = 0; i < 3; ++i) session.release(session.next());
    Batch* kept = session.next();
    ASSERT_NE(kept, nullptr);
    EXPECT_EQ(kept->seq, 3u);
    // Let the graph fill every slot so there is work in flight to drain.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
  // The pipeline is free again and a new session starts from batch 0.
  Session again = pipeline.start();
  std::uint64_t n = 0;
  while (Batch* b = again.next()) {
    EXPECT_EQ(b->seq, n++);
    again.release(b);
  }
  EXPECT_EQ(n, 200u);
}

TEST(Session, RethrowsANodeFailureFromNext) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  b.prefetch_depth(4);
  b.load("synthetic", {{"batches", 50}, {"sample_shape", {4}}});
  const int l_boom = __LINE__ + 1;
  b.transform(make_node([](Batch& batch) {
    if (batch.seq == 5) throw DataError("sample.bin: truncated record");
  }));
  b.named("decode").concurrency(2);
  b.stage("host_staging");
  Pipeline pipeline = b.build(registry);
  const std::string message = "node 'decode' (flowfeed::CallableNode, " + at(l_boom) +
                              ") batch 5 (epoch 0): sample.bin: truncated record";
  {
    Session session = pipeline.start();
    std::uint64_t got = 0;
    try {
      while (Batch* batch = session.next()) {
        ++got;
        session.release(batch);
      }
      FAIL() << "next() did not throw";
    } catch (const NodeError& e) {
      EXPECT_EQ(std::string(e.what()), message);
      EXPECT_EQ(e.node(), "decode");
      EXPECT_EQ(e.batch(), 5);
    }
    EXPECT_LE(got, 5u);  // ordered: nothing after the failed batch is handed out
    // Every later call throws the same error.
    EXPECT_EQ(test::error_of<NodeError>([&] { session.next(); }), message);
  }
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Session, AFailureWakesACallerThatHoldsBatches) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  b.prefetch_depth(4).ordered(false);
  b.load("synthetic", {{"batches", 50}, {"sample_shape", {4}}});
  std::atomic<int> taken{0};
  b.transform(make_node([&taken](Batch& batch) {
    if (batch.seq >= 3) {
      // Fail only once the caller holds its three (bounded, so a bug cannot hang).
      for (int i = 0; i < 2000 && taken.load() < 3; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      throw Error("out of range");
    }
  }));
  b.named("check");
  Pipeline pipeline = b.build(registry);
  Session session = pipeline.start();
  Batch* first = session.next();
  Batch* second = session.next();
  Batch* third = session.next();
  taken = 3;
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  ASSERT_NE(third, nullptr);
  // The graph cannot finish while these three are held, yet next() must not wait for that.
  EXPECT_THROW(session.next(), NodeError);
  session.release(second);
  // Leave the other two held: the destructor gives them back.
}

TEST(Session, RequestStopEndsAfterTheBatchesInFlight) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(64 * 1000, 64, 4).build(registry);
  Session session = pipeline.start();
  std::uint64_t n = 0;
  while (Batch* b = session.next()) {
    EXPECT_EQ(b->seq, n++);
    if (n == 5) pipeline.request_stop();
    session.release(b);
  }
  EXPECT_GE(n, 5u);
  EXPECT_LE(n, 5u + 5u);  // the ones admitted before the stop: at most prefetch_depth + 1
  RunReport report = session.report();
  EXPECT_TRUE(report.interrupted);
  EXPECT_EQ(report.batches, n);
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Session, RequestAbortEndsAtOnce) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(64 * 100000, 64, 8).build(registry);
  std::uint64_t n = 0;
  Session session = pipeline.start();
  while (Batch* b = session.next()) {
    if (++n == 3) pipeline.request_abort();
    session.release(b);
  }
  // Not even the batches already delivered come out: the graph is cancelled at once.
  EXPECT_EQ(n, 3u);
  EXPECT_TRUE(session.finished());
  EXPECT_TRUE(session.report().interrupted);
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Session, SkippedBatchesNeverReachTheCaller) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  b.prefetch_depth(4).on_error(OnError::skip, 2);
  b.load("synthetic", {{"batches", 12}, {"sample_shape", {4}}});
  b.transform(make_node([](Batch& batch) {
    if (batch.seq == 4 || batch.seq == 9) throw DataError("bad record");
  }));
  b.named("decode");
  Pipeline pipeline = b.build(registry);
  Session session = pipeline.start();
  std::vector<std::uint64_t> seqs;
  while (Batch* batch = session.next()) {
    seqs.push_back(batch->seq);
    session.release(batch);
  }
  EXPECT_EQ(seqs, (std::vector<std::uint64_t>{0, 1, 2, 3, 5, 6, 7, 8, 10, 11}));
  RunReport report = session.report();
  EXPECT_EQ(report.skipped_batches, 2u);
  ASSERT_EQ(report.warnings.size(), 2u);
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Session, AStalledGraphFailsNextAfterTheTimeout) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  b.prefetch_depth(2).stall_timeout(0.2);
  b.load("synthetic", {{"batches", 10}, {"sample_shape", {4}}});
  const int l_slow = __LINE__ + 1;
  b.transform(make_node([](Batch& batch) {
    if (batch.seq == 2) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  }));
  b.named("slow");
  Pipeline pipeline = b.build(registry);
  Session session = pipeline.start();
  session.release(session.next());
  session.release(session.next());
  EXPECT_EQ(test::error_of<Error>([&] { session.next(); }),
            "run stalled: no batch for 0.2 s (pipeline.stall_timeout_s): node 'slow' "
            "(flowfeed::CallableNode, " +
                at(l_slow) + ") is still processing batch 2 (epoch 0)");
}

/// A pipeline of the built-in types from `yaml`, read as the file `file`.
Pipeline built_in(const Registry& registry, const std::string& yaml, const std::string& file) {
  return Pipeline(load_config_string(yaml, registry, {}, file), registry);
}

TEST(Session, StartNeedsModePull) {
  const Registry registry = builtin_registry();
  Pipeline pipeline = built_in(registry, R"(
pipeline: { epochs: 1 }
nodes:
  - { name: load, type: synthetic, params: { batches: 3 } }
  - { name: train, type: sleep }
)",
                               "run.yaml");
  EXPECT_EQ(test::error_of<ConfigError>([&] { pipeline.start(); }),
            "run.yaml:2:11: pipeline.mode: Pipeline::start() hands batches to the caller's "
            "loop, and this pipeline has mode: run (its train node 'train' takes them) set "
            "pipeline.mode: pull and remove the train node, or call Pipeline::run()");
  EXPECT_EQ(pipeline.run().batches, 3u);  // the pipeline itself is fine
}

TEST(Session, RunRefusesModePull) {
  const Registry registry = builtin_registry();
  Pipeline pipeline = built_in(registry,
                               "\npipeline: { mode: pull }\nnodes:\n"
                               "  - { name: load, type: synthetic, params: { batches: 3 } }\n"
                               "  - { name: stage, type: host_staging }\n",
                               "feed.yaml");
  EXPECT_EQ(test::error_of<ConfigError>([&] { pipeline.run(); }),
            "feed.yaml:2:11: pipeline.mode: this pipeline has mode: pull (no train node; a "
            "C++ loop takes its batches) step it with Pipeline::start(), or set "
            "pipeline.mode: run and add a train node");
  Session session = pipeline.start();
  int n = 0;
  while (Batch* b = session.next()) {
    ++n;
    EXPECT_NE(b->data(Tier::staging), nullptr);  // the newest tier is what the chain reached
    session.release(b);
  }
  EXPECT_EQ(n, 3);
}

TEST(Session, ModePullMeansNoTrainNode) {
  Registry registry = builtin_registry();
  EXPECT_EQ(test::error_of<ConfigError>([&] {
              load_config_string(R"(
pipeline: { mode: pull }
nodes:
  - { name: load, type: synthetic }
  - { name: train, type: sleep }
)",
                                 registry, {}, "pull.yaml");
            }),
            "pull.yaml:5:26: nodes[1].type: 'train' is a train node, and a pipeline with "
            "mode: pull has none (the caller's loop is the train step) remove it, or set "
            "pipeline.mode: run");
}

TEST(Session, TheBuilderPicksModePullWithoutATrainNode) {
  Registry registry = builtin_registry();
  PipelineConfig pull = feeder(64, 64, 2).config(registry);
  EXPECT_EQ(pull.pipeline.mode, RunMode::pull);
  PipelineBuilder b = feeder(64, 64, 2);
  b.train("discard");
  EXPECT_EQ(b.config(registry).pipeline.mode, RunMode::run);
  PipelineBuilder forced = feeder(64, 64, 2);
  forced.mode(RunMode::run);
  const std::vector<std::string> problems = test::problems_of([&] { forced.config(registry); });
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("nodes[2].type: the last node must be a train node"),
            std::string::npos)
      << problems[0];
}

TEST(Session, OneRunOrSessionAtATime) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(64 * 10, 64, 2).build(registry);
  Session session = pipeline.start();
  EXPECT_EQ(test::error_of<std::logic_error>([&] { pipeline.start(); }),
            "Pipeline::start: the pipeline is already running (one run or session at a "
            "time)");
}

TEST(Session, APipelineDestroyedFirstEndsItsSession) {
  Registry registry = builtin_registry();
  auto pipeline = std::make_unique<Pipeline>(feeder(64 * 100, 64, 4).build(registry));
  Session session = pipeline->start();
  Batch* b = session.next();
  ASSERT_NE(b, nullptr);
  pipeline.reset();
  EXPECT_TRUE(session.finished());
  EXPECT_EQ(session.next(), nullptr);
  EXPECT_THROW(session.release(b), std::logic_error);
  EXPECT_TRUE(session.report().interrupted);
}

TEST(Session, UnorderedDeliveryGivesEachBatchOnce) {
  Registry registry = builtin_registry();
  PipelineBuilder b = feeder(64 * 300, 64, 8);
  b.ordered(false);
  Pipeline pipeline = b.build(registry);
  Session session = pipeline.start();
  std::set<std::uint64_t> seen;
  while (Batch* batch = session.next()) {
    EXPECT_TRUE(seen.insert(batch->seq).second) << batch->seq;
    session.release(batch);
  }
  EXPECT_EQ(seen.size(), 300u);
  EXPECT_EQ(*seen.rbegin(), 299u);
}

TEST(Session, RefusesToStartWithoutAWorkerThread) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(64 * 4, 64, 2).build(registry);
  {
    // An application that holds TBB to one thread: the caller's thread runs no node in pull
    // mode, so nothing would run. start() says so instead of hanging in next().
    tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    EXPECT_EQ(test::error_of<Error>([&] { pipeline.start(); }),
              "Pipeline::start: pull mode needs at least one TBB worker thread, and a "
              "tbb::global_control limits parallelism to 1 (the caller's thread does not run "
              "nodes in pull mode) raise the limit, or use Pipeline::run()");
  }
  Session session = pipeline.start();  // and nothing was left half-started
  int n = 0;
  while (Batch* b = session.next()) {
    ++n;
    session.release(b);
  }
  EXPECT_EQ(n, 4);
}

TEST(Session, AMovedSessionKeepsRunning) {
  Registry registry = builtin_registry();
  Pipeline pipeline = feeder(64 * 6, 64, 2).build(registry);
  Session first = pipeline.start();
  first.release(first.next());
  Session second = std::move(first);
  int n = 1;
  while (Batch* b = second.next()) {
    ++n;
    second.release(b);
  }
  EXPECT_EQ(n, 6);
  EXPECT_THROW(first.next(), std::logic_error);  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace flowfeed
