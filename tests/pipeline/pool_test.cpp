#include "flowfeed/pool.hpp"

#include <gtest/gtest.h>

#include <set>
#include <thread>
#include <vector>

#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

TEST(BufferPool, AllocatesOnceAndCountsLeases) {
  const auto before = allocation_count();
  BufferPool pool("stage.staging", MemoryKind::pinned, 4, 1000);
  EXPECT_EQ(allocation_count() - before, 4u);
  std::set<std::byte*> seen;
  {
    Lease a = pool.acquire();
    Lease b = pool.acquire();
    seen.insert(a.data());
    seen.insert(b.data());
    EXPECT_EQ(pool.available(), 2u);
    Lease moved = std::move(a);
    EXPECT_FALSE(a);
    EXPECT_TRUE(moved);
  }
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(pool.available(), 4u);
  EXPECT_EQ(pool.high_water(), 2u);
  EXPECT_EQ(pool.acquisitions(), 2u);
  EXPECT_EQ(allocation_count() - before, 4u);  // leases never allocate
}

TEST(BufferPool, EmptyPoolIsABugWithAClearMessage) {
  BufferPool pool("load.host", MemoryKind::pageable, 1, 8);
  Lease a = pool.acquire();
  EXPECT_EQ(test::error_of<std::logic_error>([&] { (void)pool.acquire(); }),
            "buffer pool 'load.host' is empty (1 buffers, all in use): the in-flight bound "
            "was broken");
}

TEST(BufferPool, ConcurrentAcquireReleaseKeepsEveryBuffer) {
  BufferPool pool("p", MemoryKind::pageable, 8, 16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        Lease a = pool.acquire();
        Lease b = pool.acquire();
        a.data()[0] = std::byte{1};
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(pool.available(), 8u);
  EXPECT_LE(pool.high_water(), 8u);
  EXPECT_EQ(pool.acquisitions(), 16000u);
}

}  // namespace
}  // namespace flowfeed
