// Failure paths of a pipeline, driven by the test-only fault nodes
// (flowfeed/testing/fault_nodes.hpp): a node of each family that throws, reports a data error,
// corrupts or stalls at batch N (first, middle, last), on_error: skip, stall_timeout_s,
// stop/abort, and reruns after a failure. After every run, failed or not, every pool buffer must
// be back.
#include <gtest/gtest.h>

#include <chrono>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/testing/fault_nodes.hpp"
#include "tests/pipeline/run_stopped.hpp"

namespace flowfeed {
namespace {

constexpr const char* kFile = "reliability.yaml";
// 90 samples in batches of 16: 5 full batches and one of 10 per epoch, two epochs.
constexpr int kEpochs = 2;
constexpr int kPerEpoch = 6;
constexpr int kBatches = kEpochs * kPerEpoch;
constexpr int kSamples = 90;
constexpr int kBatchSize = 16;
constexpr int kSampleBytes = 8 * 4;  // sample_shape [8], float32

Registry make_registry() {
  Registry registry;
  register_builtin_nodes(registry);
  register_fault_nodes(registry);
  return registry;
}

const Registry& registry() {
  static const Registry r = make_registry();
  return r;
}

/// One line of the `nodes:` list.
struct NodeLine {
  std::string name;
  std::string type;
  std::string params;  // the inside of `params: { ... }`
  int concurrency = 1;
};

/// A config whose `pipeline:` options are on line 1 and whose node i is declared on line 3 + i.
std::string make_yaml(const std::string& pipeline_extra, const std::vector<NodeLine>& nodes) {
  std::string y = "pipeline: { epochs: " + std::to_string(kEpochs) +
                  ", batch_size: " + std::to_string(kBatchSize) +
                  ", prefetch_depth: 4, threads: 4, device: host" +
                  (pipeline_extra.empty() ? "" : ", " + pipeline_extra) + " }\nnodes:\n";
  for (const auto& n : nodes) {
    y += "  - { name: " + n.name + ", type: " + n.type +
         ", concurrency: " + std::to_string(n.concurrency) + ", params: { " + n.params + " } }\n";
  }
  return y;
}

const std::string kData = "samples: " + std::to_string(kSamples) + ", sample_shape: [8], seed: 3";

/// The families a fault can sit in.
enum class Family { load, transform, staging, upload, train };

const char* family_name(Family f) {
  switch (f) {
    case Family::load: return "load";
    case Family::transform: return "transform";
    case Family::staging: return "staging";
    case Family::upload: return "upload";
    case Family::train: return "train";
  }
  return "?";
}

/// The chain load → [xform] → stage → upload → train with the node of `family` replaced by its
/// fault type carrying `fault` params. A transform exists only when it is the faulty node. The
/// loader runs 2 bodies at once unless `serial_load`.
std::vector<NodeLine> chain(Family family, const std::string& fault, bool serial_load = false) {
  std::vector<NodeLine> nodes;
  const int load_conc = serial_load ? 1 : 2;
  if (family == Family::load) {
    nodes.push_back({"load", "fault_load", kData + ", " + fault, load_conc});
  } else {
    nodes.push_back({"load", "synthetic", kData, load_conc});
  }
  if (family == Family::transform) nodes.push_back({"xform", "fault_transform", fault, 2});
  nodes.push_back(family == Family::staging ? NodeLine{"stage", "fault_staging", fault, 1}
                                            : NodeLine{"stage", "host_staging", "", 1});
  nodes.push_back(family == Family::upload ? NodeLine{"upload", "fault_upload", fault, 1}
                                           : NodeLine{"upload", "host_upload", "", 1});
  nodes.push_back(family == Family::train ? NodeLine{"train", "fault_train", fault, 1}
                                          : NodeLine{"train", "checksum", "", 1});
  return nodes;
}

/// Name, type and declaring line of the faulty node in chain(family).
struct Faulty {
  std::string name, type;
  int line;
};
Faulty faulty(Family family) {
  switch (family) {
    case Family::load: return {"load", "fault_load", 3};
    case Family::transform: return {"xform", "fault_transform", 4};
    case Family::staging: return {"stage", "fault_staging", 4};
    case Family::upload: return {"upload", "fault_upload", 5};
    case Family::train: return {"train", "fault_train", 6};
  }
  return {};
}

std::string label(const Faulty& f) {
  return "node '" + f.name + "' (" + f.type + ", " + kFile + ":" + std::to_string(f.line) + ")";
}
std::string at(int batch) {
  return " batch " + std::to_string(batch) + " (epoch " + std::to_string(batch / kPerEpoch) + ")";
}
/// The offset a data error names: the file position of the batch's first sample (no shuffle).
std::string data_error_text(const std::string& type, int batch) {
  const int offset = (batch % kPerEpoch) * kBatchSize * kSampleBytes;
  return "fault.bin: short read at offset " + std::to_string(offset) + " (injected by " + type +
         " at batch " + std::to_string(batch) + ")";
}
int rows_of(int batch) {
  return batch % kPerEpoch == kPerEpoch - 1 ? kSamples % kBatchSize : kBatchSize;
}

Pipeline build(const std::string& yaml) {
  return Pipeline(load_config_string(yaml, registry(), {}, kFile), registry());
}

/// Runs `p` expecting a NodeError; returns it (and checks that every buffer came back).
NodeError run_expecting_node_error(Pipeline& p) {
  try {
    p.run();
  } catch (const NodeError& e) {
    EXPECT_EQ(p.free_buffers(), p.total_buffers()) << "a buffer leaked after: " << e.what();
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a NodeError, got: " << e.what();
    return NodeError("", "", "", -2);
  }
  ADD_FAILURE() << "the run succeeded, expected it to fail";
  return NodeError("", "", "", -2);
}

std::string run_expecting_error(Pipeline& p) {
  try {
    p.run();
  } catch (const NodeError& e) {
    ADD_FAILURE() << "expected a plain Error, got NodeError: " << e.what();
    return e.what();
  } catch (const Error& e) {
    EXPECT_EQ(p.free_buffers(), p.total_buffers()) << "a buffer leaked after: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the run succeeded, expected it to fail";
  return "";
}

const std::vector<Family> kFamilies = {Family::load, Family::transform, Family::staging,
                                       Family::upload, Family::train};
/// First batch, a middle one (in the second epoch), the last one.
const std::vector<int> kPositions = {0, 7, kBatches - 1};

struct Case {
  Family family;
  int batch;
  bool ordered;
};
void PrintTo(Family f, std::ostream* os) {
  *os << family_name(f);
}
void PrintTo(const Case& c, std::ostream* os) {
  *os << family_name(c.family) << " node, batch " << c.batch << (c.ordered ? ", ordered" : "");
}
std::string case_name(const testing::TestParamInfo<Case>& info) {
  return std::string(family_name(info.param.family)) + "_batch" + std::to_string(info.param.batch) +
         (info.param.ordered ? "_ordered" : "_unordered");
}
std::vector<Case> cases(std::vector<bool> orders) {
  std::vector<Case> out;
  for (Family f : kFamilies) {
    for (int b : kPositions) {
      for (bool o : orders) out.push_back({f, b, o});
    }
  }
  return out;
}

class NodeThrows : public testing::TestWithParam<Case> {};

TEST_P(NodeThrows, RunFailsNamingNodeLineBatchAndEpochAndReturnsEveryBuffer) {
  const Case c = GetParam();
  const std::string ordered = c.ordered ? "ordered: true" : "ordered: false";
  Pipeline p = build(
      make_yaml(ordered, chain(c.family, "mode: throw, at_batch: " + std::to_string(c.batch))));
  const Faulty f = faulty(c.family);
  NodeError e = run_expecting_node_error(p);
  EXPECT_EQ(std::string(e.what()), label(f) + at(c.batch) + ": " + f.type +
                                       ": injected failure at batch " + std::to_string(c.batch));
  EXPECT_EQ(e.node(), f.name);
  EXPECT_EQ(e.type(), f.type);
  EXPECT_EQ(e.batch(), c.batch);
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, NodeThrows, testing::ValuesIn(cases({true, false})),
                         case_name);

TEST(NodeThrows, UploadThatThrowsFromSubmitFailsTheSameWay) {
  Pipeline p =
      build(make_yaml("", chain(Family::upload, "mode: throw, at_batch: 4, in_submit: true")));
  NodeError e = run_expecting_node_error(p);
  EXPECT_EQ(std::string(e.what()),
            label(faulty(Family::upload)) + at(4) + ": fault_upload: injected failure at batch 4");
}

class DataErrorFails : public testing::TestWithParam<Case> {};

TEST_P(DataErrorFails, MessageNamesTheFileAndOffset) {
  const Case c = GetParam();
  Pipeline p = build(
      make_yaml("", chain(c.family, "mode: data_error, at_batch: " + std::to_string(c.batch))));
  const Faulty f = faulty(c.family);
  NodeError e = run_expecting_node_error(p);
  EXPECT_EQ(std::string(e.what()),
            label(f) + at(c.batch) + ": " + data_error_text(f.type, c.batch));
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, DataErrorFails, testing::ValuesIn(cases({true})), case_name);

class CorruptData : public testing::TestWithParam<Case> {};

TEST_P(CorruptData, ChecksumSinkCatchesTheDamagedByte) {
  const Case c = GetParam();
  Pipeline p =
      build(make_yaml("", chain(c.family, "mode: corrupt, at_batch: " + std::to_string(c.batch))));
  NodeError e = run_expecting_node_error(p);
  const int first_sample = (c.batch % kPerEpoch) * kBatchSize;
  EXPECT_EQ(std::string(e.what()),
            label({"train", "checksum", c.family == Family::transform ? 7 : 6}) + at(c.batch) +
                ": checksum: batch " + std::to_string(c.batch) + " row 0 (sample " +
                std::to_string(first_sample) + "): x differs at byte 0 of " +
                std::to_string(kSampleBytes));
}

std::vector<Case> corrupt_cases() {
  std::vector<Case> out;
  for (const Case& c : cases({true})) {
    if (c.family != Family::train) out.push_back(c);
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(EveryFamily, CorruptData, testing::ValuesIn(corrupt_cases()), case_name);

TEST(CorruptData, FaultTrainHasNoCorruptMode) {
  try {
    (void)load_config_string(make_yaml("", chain(Family::train, "mode: corrupt")), registry(), {},
                             kFile);
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    ASSERT_EQ(e.problems().size(), 1u) << e.what();
    EXPECT_NE(e.problems()[0].find("reliability.yaml:6:"), std::string::npos) << e.what();
    EXPECT_NE(e.problems()[0].find("nodes[3].params.mode"), std::string::npos) << e.what();
    EXPECT_NE(e.problems()[0].find("corrupt"), std::string::npos) << e.what();
  }
}

class SkipDataError : public testing::TestWithParam<Case> {};

TEST_P(SkipDataError, SkippedBatchIsCountedReportedAndTheRestArrives) {
  const Case c = GetParam();
  const std::string opts =
      std::string("on_error: skip, max_skipped: 1, ordered: ") + (c.ordered ? "true" : "false");
  Pipeline p = build(
      make_yaml(opts, chain(c.family, "mode: data_error, at_batch: " + std::to_string(c.batch))));
  const Faulty f = faulty(c.family);
  RunReport r = p.run();
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  EXPECT_FALSE(r.interrupted);
  EXPECT_EQ(r.skipped_batches, 1u);
  EXPECT_EQ(r.skipped_samples, static_cast<std::uint64_t>(rows_of(c.batch)));
  EXPECT_EQ(r.batches, static_cast<std::uint64_t>(kBatches - 1));
  EXPECT_EQ(r.samples, static_cast<std::uint64_t>(kEpochs * kSamples - rows_of(c.batch)));
  EXPECT_LE(r.max_in_flight, 4);
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_EQ(r.warnings[0],
            "skipped: " + label(f) + at(c.batch) + ": " + data_error_text(f.type, c.batch));
  const NodeReport& node = r.nodes[static_cast<std::size_t>(f.line - 3)];
  EXPECT_EQ(node.name, f.name);
  EXPECT_EQ(node.failures, 1u);
  if (c.family != Family::train) {
    // The checksum sink saw every other batch, byte for byte, in order when ordered.
    // A batch's bytes: x (rows x 32) padded to 256, then y (rows x 4).
    double expected = 0;
    for (int b = 0; b < kBatches; ++b) {
      if (b == c.batch) continue;
      const int rows = rows_of(b);
      const int x = rows * kSampleBytes;
      expected += ((x + 255) / 256) * 256 + rows * 4;
    }
    EXPECT_EQ(r.extra.at("checksum_bytes_verified"), expected);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, SkipDataError, testing::ValuesIn(cases({true, false})),
                         case_name);

TEST(SkipDataError, MoreThanMaxSkippedFailsWithTheCount) {
  // A serial loader so that the third skipped batch is batch 8.
  Pipeline p = build(make_yaml("on_error: skip, max_skipped: 2",
                               chain(Family::load, "mode: data_error, at_batch: 6, count: 3",
                                     /*serial_load=*/true)));
  NodeError e = run_expecting_node_error(p);
  EXPECT_EQ(std::string(e.what()), label(faulty(Family::load)) + at(8) + ": " +
                                       data_error_text("fault_load", 8) +
                                       " (3 batches skipped, more than pipeline.max_skipped = 2)");
  EXPECT_EQ(e.batch(), 8);
}

TEST(SkipDataError, MaxSkippedZeroFailsOnTheFirst) {
  Pipeline p =
      build(make_yaml("on_error: skip", chain(Family::upload, "mode: data_error, at_batch: 2")));
  NodeError e = run_expecting_node_error(p);
  EXPECT_EQ(std::string(e.what()), label(faulty(Family::upload)) + at(2) + ": " +
                                       data_error_text("fault_upload", 2) +
                                       " (1 batch skipped, more than pipeline.max_skipped = 0)");
}

TEST(SkipDataError, EveryBatchOfAnEpochMaySkipWhenAllowed) {
  Pipeline p = build(make_yaml("on_error: skip, max_skipped: 6",
                               chain(Family::staging, "mode: data_error, at_batch: 0, count: 6")));
  RunReport r = p.run();
  EXPECT_EQ(r.skipped_batches, 6u);
  EXPECT_EQ(r.skipped_samples, static_cast<std::uint64_t>(kSamples));
  EXPECT_EQ(r.batches, static_cast<std::uint64_t>(kPerEpoch));
  EXPECT_EQ(r.warnings.size(), 6u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST(SkipDataError, OtherFailuresStillEndTheRun) {
  Pipeline p = build(make_yaml("on_error: skip, max_skipped: 100",
                               chain(Family::transform, "mode: throw, at_batch: 5")));
  NodeError e = run_expecting_node_error(p);
  EXPECT_EQ(std::string(e.what()), label(faulty(Family::transform)) + at(5) +
                                       ": fault_transform: injected failure at batch 5");
}

class Stall : public testing::TestWithParam<Family> {};

// stall_s is far beyond ctest's timeout: the run ends only if the stall notices the cancellation.
TEST_P(Stall, StallTimeoutEndsTheRunNamingTheStuckNodeAndBatch) {
  const Family family = GetParam();
  Pipeline p = build(make_yaml("stall_timeout_s: 0.3",
                               chain(family, "mode: stall, at_batch: 3, stall_s: 100000")));
  const std::string message = run_expecting_error(p);
  EXPECT_EQ(message, "run stalled: no progress for 0.3 s (pipeline.stall_timeout_s): " +
                         label(faulty(family)) + " is still processing" + at(3));
}

INSTANTIATE_TEST_SUITE_P(EveryFamily, Stall, testing::ValuesIn(kFamilies),
                         [](const testing::TestParamInfo<Family>& info) {
                           return std::string(family_name(info.param));
                         });

TEST(Stall, ShortStallWithinTheTimeoutIsNotAFailure) {
  Pipeline p = build(make_yaml("stall_timeout_s: 30",
                               chain(Family::train, "mode: stall, at_batch: 3, stall_s: 0.05")));
  RunReport r = p.run();
  EXPECT_EQ(r.batches, static_cast<std::uint64_t>(kBatches));
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST(Stall, FailureElsewhereCancelsAStalledNode) {
  // The upload's completion is late (stall) at batch 1 while the loader fails at batch 2: the run
  // ends with the loader's error instead of waiting for the stall.
  auto nodes = chain(Family::upload, "mode: stall, at_batch: 1, stall_s: 100000");
  nodes[0] = {"load", "fault_load", kData + ", mode: throw, at_batch: 2", 1};
  Pipeline p = build(make_yaml("", nodes));
  NodeError e = run_expecting_node_error(p);
  EXPECT_EQ(std::string(e.what()),
            label(faulty(Family::load)) + at(2) + ": fault_load: injected failure at batch 2");
}

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
