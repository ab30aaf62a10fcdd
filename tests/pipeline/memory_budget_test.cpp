// What pools and data sets take is checked against what the machine offers before it is taken,
// with sizes computed so that they cannot wrap.
#include "flowfeed/memory_budget.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <new>
#include <string>

#include "flowfeed/batch.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/pool.hpp"
#include "flowfeed/registry.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();

/// Sets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(CheckedSizes, ProductsAndSumsThatWrapAreCaught) {
  EXPECT_EQ(checked_mul(1u << 20, 1u << 20), std::uint64_t{1} << 40);
  EXPECT_EQ(checked_mul(std::uint64_t{1} << 32, std::uint64_t{1} << 32), std::nullopt);
  EXPECT_EQ(checked_add(kMax, 1), std::nullopt);
  EXPECT_EQ(checked_add(kMax - 1, 1), kMax);
}

TEST(CheckedSizes, AShapeWhoseElementCountOverflowsHasNoSize) {
  const TensorSpec huge{"x", DType::float32, {1000000000, 1000000000, 1000000000}};
  EXPECT_EQ(huge.checked_sample_bytes(), std::nullopt);
  EXPECT_EQ(BatchLayout({huge}, 64).checked_capacity(), std::nullopt);
  // Each sample fits; a batch of them does not.
  const TensorSpec big{"x", DType::uint8, {1 << 30, 1 << 30}};
  EXPECT_EQ(big.checked_sample_bytes(), std::uint64_t{1} << 60);
  EXPECT_EQ(BatchLayout({big}, 64).checked_capacity(), std::nullopt);
  const BatchLayout mnist({{"x", DType::float32, {28, 28}}, {"y", DType::int32, {}}}, 64);
  EXPECT_EQ(mnist.checked_capacity(), mnist.capacity());
}

TEST(MemoryFigures, BytesReadAndWrittenAsAPersonWouldThem) {
  EXPECT_EQ(parse_bytes("1073741824"), std::uint64_t{1} << 30);
  EXPECT_EQ(parse_bytes("512M"), std::uint64_t{512} << 20);
  EXPECT_EQ(parse_bytes("16g"), std::uint64_t{16} << 30);
  EXPECT_EQ(parse_bytes("abc"), std::nullopt);
  EXPECT_EQ(parse_bytes("12X"), std::nullopt);
  EXPECT_EQ(parse_bytes("99999999999T"), std::nullopt);
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(1536), "1.5 KiB");
  EXPECT_EQ(format_bytes(std::uint64_t{22} << 30), "22.0 GiB");
}

TEST(MemoryFigures, TheHostFigureCanBeOverriddenAndABadOverrideIsAConfigError) {
  {
    ScopedEnv env("FLOWFEED_AVAILABLE_MEMORY", "64M");
    const MemoryAvailable a = available_memory(std::uint64_t{80} << 30);
    EXPECT_EQ(a.host, std::uint64_t{64} << 20);
    EXPECT_EQ(a.host_source, "FLOWFEED_AVAILABLE_MEMORY");
    EXPECT_EQ(a.device, std::uint64_t{80} << 30);
  }
  // Unset, the figure comes from the machine: present and non-zero on Linux.
  const MemoryAvailable machine = available_memory();
  ASSERT_TRUE(machine.host.has_value());
  EXPECT_GT(*machine.host, 0u);
  EXPECT_FALSE(machine.device.has_value());
  ScopedEnv env("FLOWFEED_AVAILABLE_MEMORY", "lots");
  try {
    available_memory();
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "FLOWFEED_AVAILABLE_MEMORY: 'lots' is not a byte count (it overrides the memory "
                 "the pipeline may use) write e.g. 1073741824, 512M or 16G, or unset it");
  }
}

TEST(MemoryBudget, AClaimBeyondWhatIsAvailableNamesKeysBytesAndTheFix) {
  MemoryAvailable available;
  available.host = std::uint64_t{1} << 30;
  available.host_source = "FLOWFEED_AVAILABLE_MEMORY";
  MemoryBudget budget(available);
  budget.claim({MemoryKind::pageable, std::uint64_t{600} << 20, "pool 'load.host'", "x.yaml:5:5",
                "pipeline.prefetch_depth, pipeline.batch_size"});
  EXPECT_EQ(budget.claimed(MemoryKind::pageable), std::uint64_t{600} << 20);
  EXPECT_EQ(test::error_of<ConfigError>([&] {
              budget.claim({MemoryKind::pinned, std::uint64_t{512} << 20, "pool 'stage.pinned'",
                            "x.yaml:7:5", "pipeline.prefetch_depth, pipeline.batch_size"});
            }),
            "x.yaml:7:5: pipeline.prefetch_depth, pipeline.batch_size: pool 'stage.pinned' "
            "needs 512.0 MiB of pinned host memory, and 1.0 GiB is available "
            "(FLOWFEED_AVAILABLE_MEMORY, 600.0 MiB of it already claimed by the pools and "
            "data sets before it; the process would be killed for want of memory mid-run) "
            "lower pipeline.prefetch_depth, pipeline.batch_size");
  // Device memory is its own budget, unchecked when not known.
  budget.claim({MemoryKind::device, kMax, "pool 'upload.device'", "x.yaml:9:5", "k"});
}

TEST(BufferPool, AFailedAllocationNamesThePoolItsKindAndSize) {
  int calls = 0;
  Allocator failing{[&](std::size_t bytes) -> void* {
                      if (++calls == 3) throw std::bad_alloc();
                      return ::operator new(bytes);
                    },
                    [](void* p) { ::operator delete(p); }};
  EXPECT_EQ(test::error_of<Error>([&] {
              BufferPool pool("stage.pinned", MemoryKind::pinned, 8, std::size_t{3} << 20, failing);
            }),
            "pool 'stage.pinned' (pinned memory): cannot allocate buffer 3 of 8 (8 buffers "
            "of 3145728 bytes = 24.0 MiB): out of memory (std::bad_alloc)");
}

/// The ConfigError building `yaml` throws (validation passes: the problem is found at build).
std::string build_error(const std::string& yaml) {
  Registry r;
  register_builtin_nodes(r);
  const PipelineConfig config = load_config_string(yaml, r, {}, "m.yaml");
  return test::error_of<ConfigError>([&] { Pipeline p(config, r); });
}

TEST(MemoryCheck, PoolsBeyondTheAvailableMemoryFailTheBuildBeforeTheyAreAllocated) {
  // 8 pools of 256 MiB would be 2 GiB per stage; the check refuses them unallocated.
  ScopedEnv env("FLOWFEED_AVAILABLE_MEMORY", "3G");
  EXPECT_EQ(build_error("pipeline: { epochs: 1, batch_size: 64, prefetch_depth: 8, device: host }\n"
                        "nodes:\n"
                        "  - { name: load, type: synthetic, params: { batches: 4, sample_shape: "
                        "[1024, 1024] } }\n"
                        "  - { name: stage, type: host_staging }\n"
                        "  - { name: upload, type: host_upload }\n"
                        "  - { name: train, type: discard }\n"),
            "m.yaml:4:5: pipeline.prefetch_depth, pipeline.batch_size: pool 'stage.staging' (8 "
            "buffers of 256.0 MiB) needs 2.0 GiB of host memory, and 3.0 GiB is available "
            "(FLOWFEED_AVAILABLE_MEMORY, 2.0 GiB of it already claimed by the pools and data sets "
            "before it; the process would be killed for want of memory mid-run) lower "
            "pipeline.prefetch_depth, pipeline.batch_size");
}

TEST(MemoryCheck, ADataSetHeldWholeIsClaimedByItsLoader) {
  ScopedEnv env("FLOWFEED_AVAILABLE_MEMORY", "1G");
  EXPECT_EQ(build_error("pipeline: { epochs: 1, batch_size: 64, device: host }\n"
                        "nodes:\n"
                        "  - { name: load, type: memory, params: { samples: 2000000, "
                        "sample_shape: [784] } }\n"
                        "  - { name: train, type: discard }\n"),
            "m.yaml:3:5: nodes[0].params.samples, nodes[0].params.sample_shape: the data set "
            "(2000000 samples) of node 'load' needs 5.8 GiB of host memory, and 1.0 GiB is "
            "available (FLOWFEED_AVAILABLE_MEMORY; the process would be killed for want of memory "
            "mid-run) lower nodes[0].params.samples, nodes[0].params.sample_shape");
}

TEST(MemoryCheck, ASampleShapeWhoseSizeOverflowsIsAConfigErrorNotASmallBuffer) {
  EXPECT_EQ(build_error("pipeline: { epochs: 1, batch_size: 64, device: host }\n"
                        "nodes:\n"
                        "  - { name: load, type: synthetic, params: { batches: 2, sample_shape: "
                        "[1000000000, 1000000000, 1000000000], dtype: int64 } }\n"
                        "  - { name: train, type: discard }\n"),
            "m.yaml:3:5: nodes[0].params: a batch of 64 samples of x [1000000000, 1000000000, "
            "1000000000] int64, y [] int32 would take more than 16 EiB (its size overflows 64 "
            "bits) use a smaller sample shape or pipeline.batch_size");
}

}  // namespace
}  // namespace flowfeed
