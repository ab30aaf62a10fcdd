#include "flowfeed/batch.hpp"

#include <gtest/gtest.h>

namespace flowfeed {
namespace {

TEST(BatchLayout, PacksTensorsOnAlignedOffsetsForAnyRowCount) {
  BatchLayout layout({{"x", DType::float32, {28, 28}}, {"y", DType::int32, {}}}, 64);
  EXPECT_EQ(layout.offset(0, 64), 0u);
  EXPECT_EQ(layout.offset(1, 64), 64u * 784 * 4);  // 200704 is a multiple of 256
  EXPECT_EQ(layout.capacity(), 64u * 784 * 4 + 64 * 4);
  // A partial batch of 3 rows is packed as tightly: y starts at the next 256-byte boundary.
  EXPECT_EQ(layout.offset(1, 3), 9472u);  // 3*3136 = 9408 -> 9472
  EXPECT_EQ(layout.bytes(3), 9472u + 12);
  EXPECT_EQ(layout.find("y"), 1);
  EXPECT_EQ(layout.find("z"), -1);
}

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::float32, DType::float16, DType::uint8, DType::int32, DType::int64,
                  DType::uint16, DType::uint32}) {
    EXPECT_EQ(parse_dtype(dtype_name(d)), d);
  }
  EXPECT_FALSE(parse_dtype("float64").has_value());
  EXPECT_EQ(dtype_size(DType::float16), 2u);
  EXPECT_EQ(parse_dtype("uint16"), DType::uint16);
  EXPECT_EQ(dtype_size(DType::uint16), 2u);
  EXPECT_EQ(parse_dtype("uint32"), DType::uint32);
  EXPECT_EQ(dtype_size(DType::uint32), 4u);
}

TEST(Batch, ResetReturnsEveryLease) {
  BufferPool pool("p", MemoryKind::pageable, 3, 64);
  Batch b;
  b.host = pool.acquire();
  b.staging = pool.acquire();
  b.samples = {1, 2};
  EXPECT_EQ(pool.available(), 1u);
  EXPECT_EQ(b.newest_tier(), Tier::staging);
  b.reset();
  EXPECT_EQ(pool.available(), 3u);
  EXPECT_TRUE(b.samples.empty());
}

// The host backend's hand-off is empty: nothing to wait for, nothing to release, no stream; a
// reused batch starts empty again (no hand-off of the batch object's previous trip survives).
TEST(Batch, DeviceSyncIsEmptyOnTheHostAndAfterReset) {
  Batch b;
  EXPECT_FALSE(b.sync.ready());
  EXPECT_FALSE(b.sync.wants_release());
  EXPECT_FALSE(b.sync.takes_fence());
  EXPECT_EQ(b.sync.stream(), nullptr);
  EXPECT_EQ(b.sync.stream_index(), -1);
  b.sync.set_stream_index(3);
  EXPECT_EQ(b.sync.stream_index(), 3);
  b.reset();
  EXPECT_EQ(b.sync.stream_index(), -1);
}

}  // namespace
}  // namespace flowfeed
