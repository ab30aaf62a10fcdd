// The memory loader on the host backend (its pinned, zero-copy path is tested in tests/cuda).
#include "flowfeed/nodes/memory.hpp"

#include <gtest/gtest.h>

#include <string>

#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/pool.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

std::string memory_config(const std::string& sampler, const std::string& params) {
  return "pipeline: { batch_size: 16, prefetch_depth: 4, epochs: 2, device: host }\n" + sampler +
         "nodes:\n"
         "  - { name: load, type: memory, concurrency: 2, params: { " +
         params +
         " } }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: checksum }\n";
}

TEST(MemoryLoader, ServesEveryBatchAsASliceThatTheChecksumAccepts) {
  const Registry r = builtin_registry();
  // 100 samples of 13 bytes: six full batches and a last one of 4.
  Pipeline p(load_config_string(
                 memory_config("", "samples: 100, sample_shape: [13], dtype: uint8, seed: 3"), r),
             r);
  for (int run = 0; run < 2; ++run) {
    RunReport report = p.run();
    EXPECT_EQ(report.batches, 14u);
    EXPECT_EQ(report.samples, 200u);
    EXPECT_EQ(report.allocations_after_build, 0u);
    EXPECT_EQ(p.free_buffers(), p.total_buffers());
    ASSERT_FALSE(report.pools.empty());
    EXPECT_EQ(report.pools[0].name, "load.data");
    EXPECT_EQ(report.pools[0].kind, "pageable");
    EXPECT_EQ(report.pools[0].buffers, 7u);
    // A batch of 16 rows: 208 bytes of x, y at the next 256-byte boundary: 320 bytes; the last
    // batch of 4 rows: 52 bytes of x, y at 256: 272 bytes.
    EXPECT_EQ(report.extra.at("checksum_bytes_verified"), 2.0 * (6 * 320 + 272));
  }
}

TEST(MemoryLoader, PinIsIgnoredOnTheHostBackend) {
  const Registry r = builtin_registry();
  Pipeline p(load_config_string(memory_config("", "batches: 3, sample_shape: [4], pin: true"), r),
             r);
  RunReport report = p.run();
  EXPECT_EQ(report.pools[0].kind, "pageable");
  EXPECT_EQ(report.batches, 6u);
}

TEST(MemoryLoader, AShuffledSamplerIsAConfigErrorThatSaysWhatToDo) {
  const Registry r = builtin_registry();
  EXPECT_EQ(test::error_of<ConfigError>([&] {
              (void)load_config_string(memory_config("sampler: { shuffle: true, seed: 1 }\n",
                                                     "batches: 4, sample_shape: [4]"),
                                       r, {}, "m.yaml");
            }),
            "m.yaml:2:21: sampler.shuffle: true does not fit (the memory loader 'load' serves "
            "batch k as the pre-batched slice of samples [k*batch_size, (k+1)*batch_size)) "
            "set sampler.shuffle: false, or use the synthetic loader");
}

TEST(BufferPool, AcquireAtSharesABufferOnLoanAndAcquireNeverTakesItUntilItsLastLeaseEnds) {
  BufferPool pool("slices", MemoryKind::pageable, 3, 64);
  Lease b = pool.acquire_at(1);
  EXPECT_EQ(b.index(), 1u);
  EXPECT_EQ(b.data(), pool.buffer(1));
  EXPECT_EQ(pool.available(), 2u);
  Lease shared = pool.acquire_at(1);
  EXPECT_EQ(shared.data(), pool.buffer(1));
  EXPECT_EQ(pool.available(), 2u);
  EXPECT_THROW(pool.acquire_at(3), std::logic_error);
  Lease a = pool.acquire();
  Lease c = pool.acquire();
  EXPECT_NE(a.index(), 1u);
  EXPECT_NE(c.index(), 1u);
  EXPECT_NE(a.index(), c.index());
  EXPECT_THROW(pool.acquire(), std::logic_error);
  b.reset();
  EXPECT_EQ(pool.available(), 0u);  // still lent once
  shared.reset();
  EXPECT_EQ(pool.available(), 1u);
  EXPECT_EQ(pool.acquire().index(), 1u);
  EXPECT_EQ(pool.high_water(), 3u);  // buffers, not leases
  EXPECT_EQ(pool.acquisitions(), 5u);
}

TEST(MemoryLoader, ADataSetOfFewerSlicesThanThePrefetchDepthServesASliceStillInFlight) {
  const Registry r = builtin_registry();
  // Two slices, four batches in flight, no staging copy (the train step holds the slice itself)
  // and a train step slow enough that batch 0 (slice 0) is still in it when batch 2 (slice 0
  // again) loads.
  Pipeline p(load_config_string(
                 "pipeline: { batch_size: 8, prefetch_depth: 4, epochs: 3, device: host }\n"
                 "nodes:\n"
                 "  - { name: load, type: memory, params: { batches: 2, sample_shape: [4] } }\n"
                 "  - { name: train, type: sleep, params: { ms: 20 } }\n",
                 r),
             r);
  RunReport report = p.run();
  EXPECT_EQ(report.batches, 6u);
  EXPECT_EQ(report.pools[0].buffers, 2u);
  EXPECT_EQ(report.pools[0].acquisitions, 6u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

}  // namespace
}  // namespace flowfeed
