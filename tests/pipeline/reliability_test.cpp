// Failure paths of a pipeline, driven by the test-only fault nodes
// (flowfeed/testing/fault_nodes.hpp; the chain: fault_chain.hpp): a node of each family that
// throws, reports a data error, corrupts or stalls at batch N (first, middle, last), on_error:
// skip and stall_timeout_s. After every run, failed or not, every pool buffer must be back. Runs
// after a failure, a lost batch and stop/abort: run_recovery_test.cpp.
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "flowfeed/flowfeed.hpp"
#include "tests/pipeline/fault_chain.hpp"

namespace flowfeed {
namespace {

using namespace test::fault_chain;

struct Case {
  Family family;
  int batch;
  bool ordered;
};

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

}  // namespace
}  // namespace flowfeed
