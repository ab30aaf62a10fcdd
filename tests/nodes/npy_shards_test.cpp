// Sharded npy data sets: shards named by a glob or a list read as one data set in a stable order,
// a last partial shard, the sampler's shuffle, drop_last and rank sharding across the whole set,
// and every shard checked at build with the bad one named.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "tests/nodes/npy_storage_fixture.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

TEST_F(NpyStorageTest, ShardsReadAsOneDataSetWithALastPartialShard) {
  // 20 + 20 + 7 rows: runs of a sequential batch cross shard ends (batch 2 holds 16..23).
  write_shards({20, 20, 7}, 40);
  for (const char* io : {"pread", "io_uring"}) {
    SCOPED_TRACE(io);
    RunReport report = run(chain(glob_params(std::string(", io: ") + io), "shuffle: false"));
    std::vector<std::uint32_t> order = check_bytes();
    ASSERT_EQ(order.size(), 94u);
    for (std::size_t i = 0; i < order.size(); ++i) ASSERT_EQ(order[i], i % 47);
    // The last batch of an epoch: samples 40..46, all from the partial shard.
    EXPECT_EQ(seen_->samples[5], (std::vector<std::uint32_t>{40, 41, 42, 43, 44, 45, 46}));
    EXPECT_EQ(report.batches, 12u);

    // Shuffled, drop_last: 5 full batches per epoch from all three shards.
    report = run(chain(glob_params(std::string(", io: ") + io), "shuffle: true, drop_last: true"));
    order = check_bytes();
    ASSERT_EQ(order.size(), 80u);
    EXPECT_EQ(report.batches, 10u);
    const std::set<std::uint32_t> epoch0(order.begin(), order.begin() + 40);
    EXPECT_EQ(epoch0.size(), 40u);
    EXPECT_GE(*epoch0.rbegin(), 40u);  // the partial shard takes part
  }
}

TEST_F(NpyStorageTest, AListKeepsItsOrder) {
  write_shards({10, 6}, 16);
  // Listed the other way round: global samples 0..5 are train-01's rows.
  const std::string params = "features: [" + dir_.file("train-01.npy") + ", " +
                             dir_.file("train-00.npy") + "], labels: [" +
                             dir_.file("train-labels-01.npy") + ", " +
                             dir_.file("train-labels-00.npy") + "]";
  run(chain(params, "shuffle: false"));
  ASSERT_EQ(seen_->samples.size(), 4u);
  // Sample 0 of this set is written as sample 10 of the fixture's numbering.
  EXPECT_EQ(static_cast<std::uint8_t>(seen_->x[0][0]), feature_byte(10, 0));
  EXPECT_EQ(seen_->y[0][0], 10 % 7);
  EXPECT_EQ(static_cast<std::uint8_t>(seen_->x[0][6 * 16]), feature_byte(0, 0));
  EXPECT_EQ(seen_->y[0][6], 0);
}

TEST_F(NpyStorageTest, RanksTakeDisjointSlicesThatCoverTheSet) {
  write_shards({20, 20, 7}, 40);
  std::multiset<std::uint32_t> all;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE(rank);
    run(chain(glob_params(", io: io_uring"),
              "shuffle: true, world: 3, rank: " + std::to_string(rank)));
    const std::vector<std::uint32_t> order = check_bytes();
    // Epoch 0 only (the order of each epoch's first half).
    all.insert(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(order.size() / 2));
  }
  // 47 samples over 3 ranks (16 + 16 + 15): every sample exactly once.
  EXPECT_EQ(all.size(), 47u);
  EXPECT_EQ(std::set<std::uint32_t>(all.begin(), all.end()).size(), 47u);
}

TEST_F(NpyStorageTest, ATruncatedShardIsNamedAtBuild) {
  write_shards({20, 20, 7}, 40);
  const std::string bad = dir_.file("train-01.npy");
  std::filesystem::resize_file(bad, 128 + 20 * 40 - 3);
  EXPECT_EQ(build_error(chain(glob_params())),
            "node 'load' (npy, <string>:4): " + bad +
                ": truncated: header promises 800 data bytes but the file holds 797");
}

TEST_F(NpyStorageTest, AShardMissingAtBuildIsNamed) {
  write_shards({20, 7}, 40);
  const std::string missing = dir_.file("train-05.npy");
  const std::string params = "features: [" + dir_.file("train-00.npy") + ", " + missing +
                             "], labels: [" + dir_.file("train-labels-00.npy") + ", " +
                             dir_.file("train-labels-01.npy") + "]";
  EXPECT_EQ(build_error(chain(params)), "node 'load' (npy, <string>:4): " + missing +
                                            ": cannot open (No such file or directory)");
  EXPECT_EQ(build_error(chain("features: " + dir_.file("valid-*.npy") +
                              ", labels: " + dir_.file("train-labels-*.npy"))),
            "node 'load' (npy, <string>:4): " + dir_.file("valid-*.npy") +
                ": matches no file (check the directory and the pattern)");
}

TEST_F(NpyStorageTest, ShardsMustAgree) {
  write_shards({20, 7}, 40);
  write_shards({5}, 32, 64, "other");
  const auto file = [&](const char* name) { return dir_.file(name); };
  const auto list = [&](const char* a, const char* b) {
    return "[" + file(a) + ", " + file(b) + "]";
  };
  const std::string glob = "'" + file("train-[0-9]*.npy") + "'";
  const std::string node = "node 'load' (npy, <string>:4): ";
  EXPECT_EQ(build_error(chain("features: " + list("train-00.npy", "other-00.npy") +
                              ", labels: " + list("train-labels-00.npy", "other-labels-00.npy"))),
            node + file("other-00.npy") + ": dtype |u1 and sample shape (32,) differ from " +
                file("train-00.npy") +
                "'s |u1 and (40,) (every shard needs the same dtype and sample shape)");
  EXPECT_EQ(build_error(chain("features: " + glob + ", labels: " + file("train-labels-00.npy"))),
            node +
                "labels: 1 files but features names 2 (each features file needs the labels "
                "file of its rows, in the same order)");
  // Shard 1's labels with shard 0's features: the row counts differ.
  EXPECT_EQ(build_error(chain("features: " + glob +
                              ", labels: " + list("train-labels-01.npy", "train-labels-00.npy"))),
            node + file("train-labels-01.npy") + ": 7 labels but " + file("train-00.npy") +
                " holds 20 samples (both files need the same first dimension)");
}

}  // namespace
}  // namespace flowfeed
