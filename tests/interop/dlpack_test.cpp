// The DLPack export of pull-mode batches (host backend): the fields of every exported tensor, the
// bytes it points at, and the lease coming back only when the last hold on the batch is gone.
#include "flowfeed/dlpack.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

#include "flowfeed/builder.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/synthetic_formula.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

/// synthetic (x: uint8 [3, 5], y: int32) -> host_staging -> host_upload, pull mode.
Pipeline feeder(int depth, int epochs = 1, double stall_timeout_s = 0) {
  Registry registry;
  register_builtin_nodes(registry);
  PipelineBuilder b;
  b.epochs(epochs)
      .batch_size(4)
      .prefetch_depth(depth)
      .device(DeviceChoice::host)
      .mode(RunMode::pull);
  if (stall_timeout_s > 0) b.stall_timeout(stall_timeout_s);
  b.load("synthetic", {{"samples", std::int64_t{10}},
                       {"sample_shape", {3, 5}},
                       {"dtype", "uint8"},
                       {"seed", std::int64_t{9}}});
  b.stage("host_staging");
  b.upload("host_upload");
  return b.build(registry);
}

std::uint8_t expected_x(std::uint32_t sample, std::uint64_t element) {
  return static_cast<std::uint8_t>(
      formula::element_bits(formula::ElementType::uint8, formula::sample_hash(9, sample), element));
}

TEST(Dlpack, ExportedTensorsDescribeTheBatchAndPointAtItsBytes) {
  Pipeline pipeline = feeder(4);
  TensorSession session(pipeline);
  std::size_t batches = 0;
  while (BatchHandle batch = session.next()) {
    const Batch& b = batch.batch();
    DLManagedTensor* x = batch.to_dlpack("x");
    DLManagedTensor* y = batch.to_dlpack(std::size_t{1});
    const DLTensor& dx = x->dl_tensor;
    EXPECT_EQ(dx.device.device_type, kDLCPU);
    EXPECT_EQ(dx.device.device_id, 0);
    EXPECT_EQ(dx.ndim, 3);
    EXPECT_EQ(std::vector<std::int64_t>(dx.shape, dx.shape + 3),
              (std::vector<std::int64_t>{static_cast<std::int64_t>(b.rows()), 3, 5}));
    EXPECT_EQ(std::vector<std::int64_t>(dx.strides, dx.strides + 3),
              (std::vector<std::int64_t>{15, 5, 1}));
    EXPECT_EQ(dx.dtype.code, kDLUInt);
    EXPECT_EQ(dx.dtype.bits, 8);
    EXPECT_EQ(dx.dtype.lanes, 1);
    EXPECT_EQ(dx.byte_offset, 0u);
    EXPECT_EQ(dx.data, b.tensor(Tier::device, 0));
    const auto* bytes = static_cast<const std::uint8_t*>(dx.data);
    for (std::size_t r = 0; r < b.rows(); ++r) {
      for (std::uint64_t e = 0; e < 15; ++e) {
        ASSERT_EQ(bytes[r * 15 + e], expected_x(b.samples[r], e))
            << "row " << r << " element " << e;
      }
    }
    const DLTensor& dy = y->dl_tensor;
    EXPECT_EQ(dy.ndim, 1);
    EXPECT_EQ(dy.shape[0], static_cast<std::int64_t>(b.rows()));
    EXPECT_EQ(dy.dtype.code, kDLInt);
    EXPECT_EQ(dy.dtype.bits, 32);
    EXPECT_EQ(dy.data, b.tensor(Tier::device, 1));
    x->deleter(x);
    y->deleter(y);
    ++batches;
  }
  EXPECT_EQ(batches, 3u);  // 10 samples, batch 4: 4 + 4 + 2
  EXPECT_EQ(session.held(), 0u);
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Dlpack, TheLeaseComesBackWhenTheLastExportedTensorIsDeleted) {
  Pipeline pipeline = feeder(2, 2);
  TensorSession session(pipeline);
  BatchHandle first = session.next();
  ASSERT_TRUE(first);
  DLManagedTensor* x = first.to_dlpack("x");
  DLManagedTensor* y = first.to_dlpack("y");
  BatchHandle copy = first;
  first.release();
  EXPECT_FALSE(first);
  EXPECT_EQ(session.held(), 1u);  // the copy and both tensors still hold it
  copy.release();
  x->deleter(x);
  EXPECT_EQ(session.held(), 1u);  // y still holds it
  y->deleter(y);
  EXPECT_EQ(session.held(), 0u);

  // A tensor freed on another thread goes back at the owner's next call.
  BatchHandle second = session.next();
  DLManagedTensor* kept = second.to_dlpack("x");
  second.release();
  std::thread([kept] { kept->deleter(kept); }).join();
  EXPECT_EQ(session.held(), 1u);
  std::size_t rest = 0;
  while (BatchHandle b = session.next()) ++rest;
  EXPECT_EQ(rest, 4u);  // 2 epochs of 3 batches
  EXPECT_EQ(session.held(), 0u);
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
  EXPECT_EQ(session.report().batches, 6u);
}

TEST(Dlpack, HoldingEveryBatchStallsNamingThem) {
  // 0.5 s: long enough for the loader's first batches on a loaded machine (the pipeline's own
  // stall check, "node 'load' is not producing batches", uses the same timeout).
  Pipeline pipeline = feeder(2, 1, 0.5);
  TensorSession session(pipeline);
  BatchHandle a = session.next();
  DLManagedTensor* x = a.to_dlpack("x");
  a.release();
  BatchHandle b = session.next();
  EXPECT_EQ(test::error_of<Error>([&] { session.next(); }),
            "run stalled: the caller holds all 2 batches the pipeline may have in flight "
            "(pipeline.prefetch_depth) and none came back for 0.5 s: batch 0 (epoch 0: "
            "released, 1 exported tensor alive); batch 1 (epoch 0: not released, 0 exported "
            "tensors alive); a batch goes back once it was released and every tensor taken "
            "from it was freed (release batches and drop tensors kept across steps, or raise "
            "pipeline.prefetch_depth)");
  x->deleter(x);
  b.release();
  BatchHandle c = session.next();
  ASSERT_TRUE(c);
  EXPECT_EQ(c.batch().seq, 2u);
}

TEST(Dlpack, BadNamesAndStreamsAreRefused) {
  Pipeline pipeline = feeder(2);
  TensorSession session(pipeline);
  BatchHandle a = session.next();
  EXPECT_THROW(
      {
        try {
          a.to_dlpack("z");
        } catch (const std::invalid_argument& e) {
          EXPECT_STREQ(e.what(), "the batch has no tensor 'z' (it has 'x', 'y')");
          throw;
        }
      },
      std::invalid_argument);
  EXPECT_THROW(a.to_dlpack("x", 7), std::invalid_argument);
  DLManagedTensor* unsynchronized = a.to_dlpack("x", -1);
  unsynchronized->deleter(unsynchronized);
}

TEST(Dlpack, AViewPointsAtTheBufferWithoutHoldingTheBatch) {
  Pipeline pipeline = feeder(2);
  TensorSession session(pipeline);
  BatchHandle a = session.next();
  DLManagedTensor* exported = a.to_dlpack("x");
  DLManagedTensor* view = a.to_dlpack_view(0);
  const DLTensor& e = exported->dl_tensor;
  const DLTensor& v = view->dl_tensor;
  EXPECT_EQ(v.data, e.data);
  EXPECT_EQ(v.ndim, e.ndim);
  EXPECT_EQ(std::vector<std::int64_t>(v.shape, v.shape + v.ndim),
            std::vector<std::int64_t>(e.shape, e.shape + e.ndim));
  EXPECT_EQ(std::vector<std::int64_t>(v.strides, v.strides + v.ndim),
            std::vector<std::int64_t>(e.strides, e.strides + e.ndim));
  EXPECT_EQ(v.dtype.code, e.dtype.code);
  EXPECT_EQ(v.device.device_type, kDLCPU);
  exported->deleter(exported);
  a.synchronize();
  EXPECT_THROW(a.synchronize(7), std::invalid_argument);  // a CUDA stream on the host backend
  a.release();
  EXPECT_EQ(session.held(), 0u);                        // the view holds no batch
  EXPECT_THROW(a.to_dlpack_view(5), std::logic_error);  // an empty handle
  BatchHandle b = session.next();
  EXPECT_THROW(b.to_dlpack_view(2), std::invalid_argument);
  view->deleter(view);
  b.release();
  std::size_t rest = 0;
  while (BatchHandle c = session.next()) ++rest;
  EXPECT_EQ(rest, 1u);  // 3 batches of 10 samples
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Dlpack, ReleasingTogetherGivesEveryHeldBatchBackAndKeepsThoseTensorsHold) {
  Pipeline pipeline = feeder(4, 2);
  TensorSession session(pipeline);
  std::vector<BatchHandle> group;
  for (int i = 0; i < 3; ++i) group.push_back(session.next());
  DLManagedTensor* kept = group[1].to_dlpack("x");  // a tensor still alive after the release
  const std::uint32_t first = group[1].batch().samples.front();
  EXPECT_EQ(session.held(), 3u);
  release_together(group.data(), group.size(), -1);
  for (const BatchHandle& h : group) EXPECT_FALSE(h);
  EXPECT_EQ(session.held(), 1u);  // the batch whose tensor is alive
  EXPECT_EQ(static_cast<const std::uint8_t*>(kept->dl_tensor.data)[0], expected_x(first, 0));
  kept->deleter(kept);
  EXPECT_EQ(session.held(), 0u);
  release_together(group.data(), group.size(), 1);  // empty handles: nothing to do
  std::size_t rest = 0;
  while (BatchHandle h = session.next()) ++rest;
  EXPECT_EQ(rest, 3u);  // 6 batches of 10 samples over 2 epochs
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(Dlpack, ClosingTheSessionReturnsHeldBatches) {
  Pipeline pipeline = feeder(2, 3);
  DLManagedTensor* survivor = nullptr;
  {
    TensorSession session(pipeline);
    BatchHandle a = session.next();
    survivor = a.to_dlpack("x");
    session.close();
    EXPECT_TRUE(session.finished());
    EXPECT_TRUE(session.report().interrupted);
  }
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
  survivor->deleter(survivor);  // after the session: frees the tensor, returns nothing twice
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

}  // namespace
}  // namespace flowfeed
