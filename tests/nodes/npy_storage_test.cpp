// The npy loader reading files through the whole graph: straight into the staging node's memory
// (the staging node copies nothing), with pread and io_uring, with and without O_DIRECT, aligned
// and unaligned rows, sharded data sets, rank sharding, and corrupt or missing shards.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "tests/nodes/npy_storage_fixture.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

/// `order` is two shuffled epochs of `n` samples: each holds every sample once, in its own order.
void expect_two_shuffled_epochs(const std::vector<std::uint32_t>& order, std::size_t n) {
  ASSERT_EQ(order.size(), 2 * n);
  const auto half = order.begin() + static_cast<std::ptrdiff_t>(n);
  EXPECT_EQ(std::set<std::uint32_t>(order.begin(), half).size(), n);
  EXPECT_EQ(std::set<std::uint32_t>(half, order.end()).size(), n);
  EXPECT_NE(std::vector<std::uint32_t>(order.begin(), half),
            std::vector<std::uint32_t>(half, order.end()));
}

TEST_F(NpyStorageTest, ReadsLandInTheStagingBufferAndStagingCopiesNothing) {
  write_shards({50}, 24);
  const RunReport report = run(chain(glob_params(), "shuffle: false"));
  const std::vector<std::uint32_t> order = check_bytes();
  // Sequential: 0..49 twice, in batch order.
  ASSERT_EQ(order.size(), 100u);
  for (std::size_t i = 0; i < order.size(); ++i) EXPECT_EQ(order[i], i % 50);
  EXPECT_EQ(extra(report, "stage.copied_bytes"), 0.0);
  EXPECT_EQ(extra(report, "stage.passed_through_batches"), 14.0);
  EXPECT_EQ(report.allocations_after_build, 0u);
  // One set of batch buffers before the upload: the loader's, in the staging node's memory.
  std::vector<std::string> pools;
  for (const auto& p : report.pools) pools.push_back(p.name);
  EXPECT_EQ(pools, (std::vector<std::string>{"load.staging", "upload.device"}));
}

TEST_F(NpyStorageTest, WithoutAStagingNodeTheLoaderFillsItsOwnHostBuffers) {
  write_shards({20}, 24);
  const RunReport report = run(chain(glob_params(), "shuffle: true", ""));
  EXPECT_EQ(check_bytes().size(), 40u);
  std::vector<std::string> pools;
  for (const auto& p : report.pools) pools.push_back(p.name);
  EXPECT_EQ(pools, (std::vector<std::string>{"load.host", "upload.device"}));
}

TEST_F(NpyStorageTest, IdxLoaderFillsTheStagingBufferToo) {
  const IdxPair pair = make_idx_pair(30, 4, 5, 10);
  const auto [images, labels] = write_idx_pair(dir_, pair, "mnist", false);
  const RunReport report =
      run("pipeline: { epochs: 1, batch_size: 8, prefetch_depth: 3, device: host }\n"
          "nodes:\n" +
          idx_load_line(images, labels, ", dtype: uint8") +
          "  - { name: stage, type: host_staging }\n"
          "  - { name: upload, type: host_upload }\n"
          "  - { name: train, type: capture }\n");
  ASSERT_EQ(seen_->x.size(), 4u);
  for (std::size_t b = 0; b < seen_->x.size(); ++b) {
    for (std::size_t row = 0; row < seen_->samples[b].size(); ++row) {
      const std::uint32_t s = seen_->samples[b][row];
      EXPECT_EQ(std::memcmp(seen_->x[b].data() + row * 20, pair.images.data() + s * 20, 20), 0);
      EXPECT_EQ(seen_->y[b][row], pair.labels[s]);
    }
  }
  EXPECT_EQ(extra(report, "stage.copied_bytes"), 0.0);
  EXPECT_EQ(extra(report, "stage.passed_through_batches"), 4.0);
}

TEST_F(NpyStorageTest, ALoaderThatFillsItsOwnPoolIsStillCopied) {
  // The memory loader serves slices of its own data set: host_staging copies them as before.
  const RunReport report =
      run("pipeline: { epochs: 1, batch_size: 8, prefetch_depth: 3, device: host }\n"
          "nodes:\n"
          "  - { name: load, type: memory, params: { samples: 32, sample_shape: [4] } }\n"
          "  - { name: stage, type: host_staging }\n"
          "  - { name: upload, type: host_upload }\n"
          "  - { name: train, type: capture }\n");
  // 4 batches of x (8 × 4 float32, padded to 256 bytes) then y (8 int32).
  EXPECT_EQ(extra(report, "stage.copied_bytes"), 4.0 * (256 + 32));
  EXPECT_EQ(extra(report, "stage.passed_through_batches"), 0.0);
}

/// io × direct × row size: every byte through the graph, shuffled, two epochs.
struct EngineCase {
  const char* io;
  bool direct;
  std::size_t row_bytes;
  std::size_t align;   // where the payload starts in the file
  bool async = false;  // io_async
};

class NpyEngineTest : public NpyStorageTest, public ::testing::WithParamInterface<EngineCase> {};

TEST_P(NpyEngineTest, EveryByteArrivesInOrder) {
  const EngineCase c = GetParam();
  // 45 samples: the last batch of each epoch has 5 rows.
  write_shards({45}, c.row_bytes, c.align);
  const std::string io =
      std::string(", io: ") + c.io + ", direct: " + (c.direct ? "true" : "false") +
      ", io_async: " + (c.async ? "true" : "false") + ", read_bytes: 8192, queue_depth: 4";
  // Sequential: runs of 8 rows become one request each, split into 8 KiB reads.
  RunReport report = run(chain(glob_params(io), "shuffle: false"));
  std::vector<std::uint32_t> order = check_bytes();
  ASSERT_EQ(order.size(), 90u);
  for (std::size_t i = 0; i < order.size(); ++i) ASSERT_EQ(order[i], i % 45);
  EXPECT_EQ(extra(report, "load.io_bytes"), 90.0 * static_cast<double>(c.row_bytes));
  const bool uring = std::string(c.io) == "io_uring" && io_uring_works();
  EXPECT_EQ(extra(report, "load.io_uring"), uring ? 1.0 : 0.0);
  if (uring || std::string(c.io) != "io_uring") {
    EXPECT_TRUE(report.warnings.empty()) << report.warnings.front();
  }
  if (uring) {
    // Several reads of one batch were in flight together.
    EXPECT_GE(extra(report, "load.io_max_in_flight"), 2.0);
  }
  // Aligned rows from an aligned payload go direct whole; 5000-byte rows in part (batch 0 starts
  // aligned: its aligned middle goes direct, its tail through the cache; batch 1 starts at an
  // offset its buffer does not share, so all of it goes through the cache); none without
  // O_DIRECT.
  const double direct = extra(report, "load.io_direct_bytes");
  if (!c.direct) {
    EXPECT_EQ(direct, 0.0);
  } else if (c.align == 4096 && c.row_bytes % 4096 == 0) {
    EXPECT_EQ(direct, 90.0 * static_cast<double>(c.row_bytes));
  } else {
    EXPECT_GT(direct, 0.0);
  }
  EXPECT_EQ(extra(report, "stage.copied_bytes"), 0.0);
  EXPECT_EQ(report.allocations_after_build, 0u);

  // Shuffled: one request per row (runs are rare), many in flight.
  report = run(chain(glob_params(io), "shuffle: true"));
  expect_two_shuffled_epochs(check_bytes(), 45);
}

INSTANTIATE_TEST_SUITE_P(
    Engines, NpyEngineTest,
    ::testing::Values(
        EngineCase{"pread", false, 4096, 4096}, EngineCase{"pread", false, 5000, 64},
        EngineCase{"pread", true, 4096, 4096}, EngineCase{"pread", true, 5000, 4096},
        EngineCase{"io_uring", false, 4096, 4096}, EngineCase{"io_uring", false, 5000, 64},
        EngineCase{"io_uring", true, 4096, 4096}, EngineCase{"io_uring", true, 5000, 4096},
        EngineCase{"io_uring", false, 5000, 64, true}, EngineCase{"pread", false, 5000, 64, true},
        EngineCase{"pread", true, 4096, 4096, true}, EngineCase{"mmap", false, 5000, 64},
        EngineCase{"mmap", false, 4096, 4096, true}),
    [](const ::testing::TestParamInfo<EngineCase>& info) {
      return std::string(info.param.io) + (info.param.direct ? "_direct_" : "_cached_") +
             (info.param.async ? "async_" : "") + std::to_string(info.param.row_bytes);
    });

/// io: mmap with pin: true: runs of rows of 512 KiB or more stay in the files' mapping and the
/// upload copies them from there; shorter runs and the labels are copied into the batch's buffer.
/// Two shards, sequential and shuffled, with and without a staging node, across ranks.
TEST_F(NpyStorageTest, PinnedRowsStayInTheMappingAndTheUploadCopiesThemFromThere) {
  constexpr double kRow = 80000;  // runs of 7 rows or more reach 512 KiB
  write_shards({23, 25}, 80000);
  for (const char* stages : {"host_staging", ""}) {
    SCOPED_TRACE(std::string("stages: ") + stages);
    RunReport report = run(chain(glob_params(", io: mmap, pin: true"), "shuffle: false", stages));
    std::vector<std::uint32_t> order = check_bytes();
    ASSERT_EQ(order.size(), 96u);
    for (std::size_t i = 0; i < order.size(); ++i) ASSERT_EQ(order[i], i % 48);
    // Each epoch's batches are runs of 8 rows, but for batch 2: 7 rows at the first shard's end,
    // left in place, and the second shard's first row, copied into the buffer between them and
    // the labels.
    EXPECT_EQ(extra(report, "load.in_place_bytes"), 2 * 47 * kRow);
    EXPECT_EQ(extra(report, "load.io_bytes"), 2 * 1 * kRow);
    EXPECT_EQ(extra(report, "load.pin_seconds"), 0.0);  // the host backend page-locks nothing
    EXPECT_EQ(report.allocations_after_build, 0u);

    // Shuffled: single rows, copied; a run of seven or more would stay in place.
    report = run(chain(glob_params(", io: mmap, pin: true"), "shuffle: true", stages));
    expect_two_shuffled_epochs(check_bytes(), 48);
    EXPECT_EQ(extra(report, "load.in_place_bytes") + extra(report, "load.io_bytes"), 96 * kRow);
  }
  // Two ranks: each epoch's samples of the two are disjoint and cover the set.
  std::vector<std::uint32_t> epoch0;
  for (int rank = 0; rank < 2; ++rank) {
    run(chain(glob_params(", io: mmap, pin: true"),
              "shuffle: true, world: 2, rank: " + std::to_string(rank)));
    const std::vector<std::uint32_t> order = check_bytes();
    ASSERT_EQ(order.size(), 48u);
    epoch0.insert(epoch0.end(), order.begin(), order.begin() + 24);
  }
  std::sort(epoch0.begin(), epoch0.end());
  for (std::size_t i = 0; i < epoch0.size(); ++i) ASSERT_EQ(epoch0[i], i);
}

TEST_F(NpyStorageTest, PinWithoutAMappingIsAConfigError) {
  write_shards({20}, 64);
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, seen_);
  const std::string yaml = chain(glob_params(", io: pread, pin: true"), "shuffle: false");
  // Line 7 holds the params; the column is where `true` stands after `pin: `.
  const std::size_t line7 = [&] {
    std::size_t at = 0;
    for (int i = 0; i < 6; ++i) at = yaml.find('\n', at) + 1;
    return at;
  }();
  const std::size_t column = yaml.find("pin: true", line7) + 5 - line7 + 1;
  EXPECT_EQ(error_of<ConfigError>([&] { load_config_string(yaml, r); }),
            "<string>:7:" + std::to_string(column) +
                ": nodes[0].params.pin: true leaves the feature rows in the files' mapping, which "
                "io: pread does not make set io: mmap, or pin: false");
}

TEST_F(NpyStorageTest, PinWithATransformBeforeTheUploadIsAConfigError) {
  write_shards({20}, 64);
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, seen_);
  const std::string yaml =
      chain(glob_params(", io: mmap, pin: true"), "shuffle: false", "delay, params: { ms: 0 }");
  EXPECT_EQ(error_of<ConfigError>([&] { Pipeline p(load_config_string(yaml, r), r); }),
            "<string>:4:5: node 'load': pin: true leaves the feature rows in the files' mapping "
            "for the upload node to copy from there, but a transform, or no upload node, comes "
            "after the loader (only staging nodes may stand between it and the upload) set pin: "
            "false, or move the transform after the upload");
}

/// A file cut after the build fails the batch that reads past its end, naming file and offset,
/// for every engine.
TEST_F(NpyStorageTest, AFileThatShrinksWhileOpenFailsItsBatch) {
  for (const char* io : {"pread", "io_uring"}) {
    for (const bool direct : {false, true}) {
      SCOPED_TRACE(std::string(io) + (direct ? " direct" : ""));
      write_shards({40}, 4096, 4096);
      const std::string file = dir_.file("train-00.npy");
      Registry r;
      register_builtin_nodes(r);
      register_capture(r, seen_);
      Pipeline p(load_config_string(chain(glob_params(std::string(", io: ") + io +
                                                      ", direct: " + (direct ? "true" : "false")),
                                          "shuffle: false"),
                                    r),
                 r);
      // The last batch, 4, holds samples 32..39: the file now ends 100 bytes into sample 34.
      std::filesystem::resize_file(file, 4096 + 34 * 4096 + 100);
      EXPECT_EQ(error_of<NodeError>([&] { p.run(); }),
                "node 'load' (npy, <string>:4) batch 4 (epoch 0): " + file +
                    ": short read at offset " + std::to_string(4096 + 34 * 4096 + 100) +
                    " (end of file, " + std::to_string(6 * 4096 - 100) +
                    " more bytes wanted) the file was truncated while open");
      EXPECT_EQ(p.free_buffers(), p.total_buffers());
    }
  }
}

}  // namespace
}  // namespace flowfeed
