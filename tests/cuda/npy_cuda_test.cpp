// The npy loader on CUDA: rows read from a file straight into page-locked memory (pinned_staging
// passes them through, or cuda_upload copies from them without bounce buffers) arrive on the
// device byte-exact with their labels, with pread and io_uring, and from the page-locked mapping
// (io: mmap, pin: true); nothing is allocated after build.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/stats.hpp"
#include "gpu_test.hpp"
#include "tests/cuda/device_capture.hpp"
#include "tests/error_of.hpp"
#include "tests/nodes/npy_storage_fixture.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

constexpr std::size_t kRowBytes = 8192;
constexpr std::size_t kRows = 100;

/// Every row that reached the device holds its sample's features (`x`: the file's rows) and its
/// label, sample % 7.
void expect_rows_on_the_device(const test::DeviceCapture& seen, const std::vector<std::uint8_t>& x,
                               std::size_t row_bytes = kRowBytes) {
  ASSERT_EQ(seen.samples.size(), 14u);
  for (std::size_t b = 0; b < seen.samples.size(); ++b) {
    for (std::size_t row = 0; row < seen.samples[b].size(); ++row) {
      const std::uint32_t s = seen.samples[b][row];
      ASSERT_EQ(std::memcmp(seen.tensors[b][0].data() + row * row_bytes, x.data() + s * row_bytes,
                            row_bytes),
                0)
          << "batch " << b << " row " << row << " sample " << s;
      std::int32_t label = 0;
      std::memcpy(&label, seen.tensors[b][1].data() + row * 4, 4);
      ASSERT_EQ(label, static_cast<std::int32_t>(s % 7)) << "sample " << s;
    }
  }
}

TEST(NpyCuda, RowsReadIntoPinnedMemoryArriveOnTheDevice) {
  FLOWFEED_REQUIRE_GPU();
  TempDir dir;
  const std::vector<std::uint8_t> x =
      write_feature_rows(dir, "x.npy", "y.npy", kRows, kRowBytes, 4096);
  for (const char* io : {"pread", "io_uring"}) {
    for (const bool staging : {true, false}) {
      SCOPED_TRACE(std::string(io) + (staging ? " pinned_staging" : " no staging node"));
      const auto [report, seen] = test::run_to_device_capture(
          "  - { name: load, type: npy, concurrency: 2, params: { features: " + dir.file("x.npy") +
              ", labels: " + dir.file("y.npy") + ", io: " + io + ", direct: true } }\n",
          staging, "the npy run");
      expect_rows_on_the_device(*seen, x);
      test::expect_only_the_loaders_pinned_buffers(report, staging, 14.0);
    }
  }
}

/// pin: true: the upload copies runs of rows of 512 KiB or more (one piece each) straight from the
/// files' mapping, page-locked once while the pipeline is built; shorter runs are copied into the
/// batch's pinned buffer. Two shards of 20 and 80 rows of 80,000 bytes, in order: each batch of 16
/// is one run in place, but for batch 1 (4 rows copied at the first shard's end, 12 in place) and
/// the last (4 rows, copied). Shuffled, the single rows are copied.
TEST(NpyCuda, PinnedMappingIsCopiedToTheDeviceInPlace) {
  FLOWFEED_REQUIRE_GPU();
  constexpr std::size_t kRow = 80000;
  TempDir dir;
  std::vector<std::uint8_t> x = write_feature_rows(dir, "x-0.npy", "y-0.npy", 20, kRow, 64);
  const std::vector<std::uint8_t> rest =
      write_feature_rows(dir, "x-1.npy", "y-1.npy", 80, kRow, 64, 20);
  x.insert(x.end(), rest.begin(), rest.end());
  for (const bool shuffle : {false, true}) {
    for (const bool staging : {true, false}) {
      SCOPED_TRACE(std::string(shuffle ? "shuffled" : "in order") +
                   (staging ? ", pinned_staging" : ", no staging node"));
      const auto [report, seen] = test::run_to_device_capture(
          "  - { name: load, type: npy, concurrency: 2, params: { features: [" +
              dir.file("x-0.npy") + ", " + dir.file("x-1.npy") + "], labels: [" +
              dir.file("y-0.npy") + ", " + dir.file("y-1.npy") + "], io: mmap, pin: true } }\n",
          staging, "the pinned npy run", shuffle ? "shuffle: true, seed: 3" : "shuffle: false");
      expect_rows_on_the_device(*seen, x, kRow);
      const double in_place = report.extra.at("load.in_place_bytes");
      EXPECT_EQ(in_place, shuffle ? 0.0 : 2.0 * 92 * kRow);
      EXPECT_EQ(in_place + report.extra.at("load.io_bytes"), 200.0 * kRow);
      EXPECT_GT(report.extra.at("load.pin_seconds"), 0.0);
      test::expect_only_the_loaders_pinned_buffers(report, staging, 14.0);
    }
  }
}

/// pin: true claims the files as pinned host memory: a file that does not fit in what the
/// pipeline may use is an error at build that names the node, the bytes and the keys, before
/// anything is page-locked.
TEST(NpyCuda, APinnedFileBeyondTheMemoryBudgetIsAnErrorAtBuild) {
  FLOWFEED_REQUIRE_GPU();
  TempDir dir;
  write_feature_rows(dir, "x.npy", "y.npy", kRows, kRowBytes, 64);
  const auto file_bytes = static_cast<std::uint64_t>(std::filesystem::file_size(dir.file("x.npy")));
  Registry r = builtin_registry();
  const std::string yaml =
      "pipeline: { epochs: 1, batch_size: 16, prefetch_depth: 4, device: cuda, memory_budget: "
      "{ host: 1M } }\n"
      "nodes:\n"
      "  - { name: load, type: npy, params: { features: " +
      dir.file("x.npy") + ", labels: " + dir.file("y.npy") +
      ", io: mmap, pin: true } }\n"
      "  - { name: upload, type: cuda_upload }\n"
      "  - { name: train, type: device_discard }\n";
  // Before the files: the loader's four pinned batch buffers of 16 rows and 16 labels.
  const BatchLayout layout(
      {{"x", DType::uint8, {static_cast<std::int64_t>(kRowBytes)}}, {"y", DType::int32, {}}}, 16);
  EXPECT_EQ(test::error_of<ConfigError>([&] { Pipeline p(load_config_string(yaml, r), r); }),
            "<string>:3:5: nodes[0].params.features, nodes[0].params.pin: the page-locked "
            "features files (1 file) of node 'load' needs " +
                format_bytes(file_bytes) +
                " of pinned host memory, and 1.0 MiB is available (pipeline.memory_budget.host, " +
                format_bytes(4 * layout.capacity()) +
                " of it already claimed by the pools and data sets before it; the process would "
                "be killed for want of memory mid-run) lower nodes[0].params.features, "
                "nodes[0].params.pin");
}

}  // namespace
}  // namespace flowfeed
