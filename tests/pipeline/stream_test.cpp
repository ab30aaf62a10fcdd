// A loader of unknown length (size() kUnknownSize): the sampler's stream positions, epochs that
// end where the loader's data does, the train node's epoch ends, and the cursor after it.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "flowfeed/builder.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {
namespace {
// Named apart from the helpers of the test files it shares a unity group with.
namespace stream_test {

TEST(StreamSampler, PositionsInOrderWithoutAnOrder) {
  Sampler s(SamplerOptions{}, kUnknownSize, 16);
  EXPECT_TRUE(s.stream());
  EXPECT_EQ(s.dataset_size(), 0u);
  EXPECT_EQ(s.batches_per_epoch(), (std::size_t{1} << 32) / 16);
  EXPECT_TRUE(s.epoch_order(3).empty());
  std::vector<std::uint32_t> batch;
  s.batch_samples({}, 2, batch);
  EXPECT_EQ(batch, (std::vector<std::uint32_t>{32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
                                               45, 46, 47}));
  SamplerOptions shuffled;
  shuffled.shuffle = true;
  EXPECT_THROW(Sampler(shuffled, kUnknownSize, 16), std::invalid_argument);
}

/// `length` samples a pass, y = the position, read in order; marks the end as a stream does.
class CountingStream final : public LoaderNode {
 public:
  explicit CountingStream(std::uint32_t length) : length_(length) {}
  void setup(BuildContext& context) override {
    pool_ = &context.make_batch_pool("host", MemoryKind::pageable, context.layout().capacity(),
                                     Allocator::host());
  }
  void process(Batch& batch) override {
    batch.host = pool_->acquire();
    std::size_t rows = 0;
    while (rows < batch.rows() && batch.samples[rows] < length_) ++rows;
    if (rows < batch.rows()) {
      batch.samples.resize(rows);  // the rows are written below, packed for `rows`
      batch.end_of_data = true;
    }
    auto* y = reinterpret_cast<std::int32_t*>(batch.tensor(Tier::host, 0));
    for (std::size_t r = 0; r < rows; ++r) y[r] = static_cast<std::int32_t>(batch.samples[r]);
  }
  std::size_t size() const override { return kUnknownSize; }
  std::vector<TensorSpec> sample_tensors() const override { return {{"y", DType::int32, {}}}; }

 private:
  std::uint32_t length_;
  BufferPool* pool_ = nullptr;
};

/// Records each batch (epoch, first y, rows) and each end of epoch, in order.
class Recorder final : public Node {
 public:
  explicit Recorder(std::vector<std::vector<std::int64_t>>& log) : log_(log) {}
  void process(Batch& batch) override {
    const auto* y = reinterpret_cast<const std::int32_t*>(batch.tensor(Tier::host, 0));
    log_.push_back({batch.epoch, batch.rows() ? y[0] : -1, static_cast<std::int64_t>(batch.rows()),
                    batch.rows() ? y[batch.rows() - 1] : -1});
  }
  void end_epoch(std::uint32_t epoch) override { log_.push_back({-1, epoch}); }

 private:
  std::vector<std::vector<std::int64_t>>& log_;
};

std::vector<std::vector<std::int64_t>> expected_log(std::int64_t length, std::int64_t batch,
                                                    bool drop_last, int epochs) {
  std::vector<std::vector<std::int64_t>> log;
  for (std::int64_t e = 0; e < epochs; ++e) {
    for (std::int64_t first = 0; first < length; first += batch) {
      const std::int64_t rows = std::min(batch, length - first);
      if (rows < batch && drop_last) continue;
      log.push_back({e, first, rows, first + rows - 1});
    }
    log.push_back({-1, e});
  }
  return log;
}

struct Case {
  std::uint32_t length;
  bool drop_last;
};

class StreamRun : public ::testing::TestWithParam<Case> {};

TEST_P(StreamRun, EachEpochEndsWhereTheDataDoes) {
  const Case c = GetParam();
  Registry registry = builtin_registry();
  std::vector<std::vector<std::int64_t>> log;
  PipelineBuilder b;
  b.epochs(3).batch_size(16).prefetch_depth(4).drop_last(c.drop_last);
  Pipeline pipeline = b.load(std::make_unique<CountingStream>(c.length))
                          .train(std::make_unique<Recorder>(log))
                          .build(registry);
  const RunReport report = pipeline.run();
  const auto want = expected_log(c.length, 16, c.drop_last, 3);
  EXPECT_EQ(log, want);
  EXPECT_EQ(report.batches, want.size() - 3);
  EXPECT_EQ(report.skipped_batches, 0u);
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
  // Past the last epoch's end: the cursor is at the run's end.
  const Checkpoint done = pipeline.checkpoint();
  EXPECT_EQ(done.dataset_size, 0u);
  EXPECT_EQ(done.epoch, 3u);
  EXPECT_EQ(done.samples, 0u);
}

TEST(StreamRun, StopAfterCountsTheBatchesBeforeTheEnd) {
  // Batches let in past epoch 0's end are dropped, not counted: 10 of epoch 0, 2 of epoch 1.
  Registry registry = builtin_registry();
  std::vector<std::vector<std::int64_t>> log;
  PipelineBuilder b;
  b.epochs(3).batch_size(16).prefetch_depth(4);
  Pipeline pipeline = b.load(std::make_unique<CountingStream>(150))
                          .train(std::make_unique<Recorder>(log))
                          .build(registry);
  RunOptions options;
  options.stop_after = 12;
  const RunReport report = pipeline.run(options);
  auto want = expected_log(150, 16, false, 1);
  want.push_back({1, 0, 16, 15});
  want.push_back({1, 16, 16, 31});
  want.push_back({-1, 1});  // as a run of known size, a stopped epoch ends with its last batch
  EXPECT_EQ(log, want);
  EXPECT_EQ(report.batches, 12u);
  const Checkpoint c = pipeline.checkpoint();
  EXPECT_EQ(c.epoch, 1u);
  EXPECT_EQ(c.samples, 32u);
}

INSTANTIATE_TEST_SUITE_P(Lengths, StreamRun,
                         ::testing::Values(Case{150, false}, Case{150, true}, Case{160, false},
                                           Case{5, false}, Case{1000, false}));

}  // namespace stream_test
}  // namespace
}  // namespace flowfeed
