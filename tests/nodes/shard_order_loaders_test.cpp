// sampler.order: shards through the loaders that know their shards (npy, webdataset, tokens) and
// through whole pipelines: the order delivered, its independence of threads, and exact resume
// mid-epoch on another world size.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>

#include "flowfeed/checkpoint.hpp"
#include "flowfeed/nodes/tokens.hpp"
#include "flowfeed/sampler.hpp"
#include "tests/nodes/npy_storage_fixture.hpp"
#include "tests/nodes/token_corpus.hpp"
#if FLOWFEED_TEST_IMAGES
#include "flowfeed/nodes/detail/webdataset_loader.hpp"
#include "tests/nodes/webdataset_fixture.hpp"
#endif

namespace flowfeed {
namespace {

using namespace testing_files;

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const std::size_t at = text.find(from);
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

class ShardOrderNpy : public NpyStorageTest {
 protected:
  /// Shards of 20, 20, 7 and 13 rows of 24 bytes: 60 samples, the shards start at 0, 20, 40, 47.
  /// (Written here rather than by write_shards, whose name building GCC 12 warns about wrongly
  /// when it is inlined with these constants: -Wrestrict.)
  void write_four_shards() {
    row_bytes_ = 24;
    const char* names[][2] = {{"train-00.npy", "train-labels-00.npy"},
                              {"train-01.npy", "train-labels-01.npy"},
                              {"train-02.npy", "train-labels-02.npy"},
                              {"train-03.npy", "train-labels-03.npy"}};
    const std::size_t rows[] = {20, 20, 7, 13};
    std::size_t first = 0;
    for (std::size_t i = 0; i < 4; ++i) {
      write_feature_rows(dir_, names[i][0], names[i][1], rows[i], row_bytes_, 64, first);
      first += rows[i];
    }
    samples_ = first;
  }
  /// A run of `yaml` (resumed from `from` when given) that admits `stop_after` batches (0: all);
  /// returns each batch's samples, bytes checked, and the cursor after it.
  std::pair<std::vector<std::vector<std::uint32_t>>, Checkpoint> part(
      const std::string& yaml, std::uint64_t stop_after = 0, const Checkpoint* from = nullptr,
      const std::string& save = "") {
    seen_ = std::make_shared<Captured>();
    Registry r;
    register_builtin_nodes(r);
    register_capture(r, seen_);
    Pipeline p(load_config_string(yaml, r), r);
    if (from) p.resume(*from, {}, "mem");
    RunOptions o;
    o.stop_after = stop_after;
    p.run(o);
    if (!save.empty()) p.save_checkpoint(save);
    check_bytes();
    return {seen_->samples, p.checkpoint()};
  }
  std::string yaml(int world, int rank, int batch, const std::string& threads = "4") {
    return replace(replace(chain(glob_params(),
                                 "shuffle: true, order: shards, shuffle_window: 2, "
                                 "world: " +
                                     std::to_string(world) + ", rank: " + std::to_string(rank)),
                           "batch_size: 8", "batch_size: " + std::to_string(batch)),
                   "threads: 4", "threads: " + threads);
  }
};

TEST_F(ShardOrderNpy, TheLoaderGivesItsShardsAndTheRunDeliversTheSamplersOrder) {
  write_four_shards();
  // Epochs 0 and 1 of the order that the npy shards' starts give, in batches of 8.
  SamplerOptions o;
  o.shuffle = true;
  o.seed = 5;
  o.order = SampleOrder::shards;
  o.shuffle_window = 2;
  Sampler sampler(o, 60, 8, {0, 20, 40, 47});
  std::vector<std::uint32_t> expected = sampler.epoch_order(0);
  const std::vector<std::uint32_t> second = sampler.epoch_order(1);
  expected.insert(expected.end(), second.begin(), second.end());
  for (const std::string threads : {"1", "3"}) {
    SCOPED_TRACE("threads " + threads);
    const auto [batches, end] = part(yaml(1, 0, 8, threads));
    std::vector<std::uint32_t> delivered;
    for (const auto& b : batches) delivered.insert(delivered.end(), b.begin(), b.end());
    EXPECT_EQ(delivered, expected);
    EXPECT_EQ(end.order, SampleOrder::shards);
    EXPECT_EQ(end.data_shards, 4u);
  }
  // The first window (2 shards) fills the first positions: their samples, nothing else.
  const std::vector<std::uint32_t> shards = sampler.shard_sequence(0);
  const std::vector<std::size_t> starts = {0, 20, 40, 47, 60};
  std::set<std::uint32_t> window;
  for (std::size_t k : {shards[0], shards[1]}) {
    for (std::size_t i = starts[k]; i < starts[k + 1]; ++i)
      window.insert(static_cast<std::uint32_t>(i));
  }
  EXPECT_EQ(std::set<std::uint32_t>(expected.begin(),
                                    expected.begin() + static_cast<std::ptrdiff_t>(window.size())),
            window);
}

TEST_F(ShardOrderNpy, ResumedMidEpochFromOneRankOnTwoAndFromTwoOnOneIsTheUninterruptedRun) {
  write_four_shards();
  // The uninterrupted run: 1 rank, batch 8 (8 batches per epoch, the last of 4).
  const auto whole = part(yaml(1, 0, 8)).first;
  ASSERT_EQ(whole.size(), 16u);
  const std::filesystem::path dir = dir_.file("ckpt");

  // 1 -> 2: one rank stops after 3 batches (the checkpoint written to a directory); two ranks of
  // batch 4 resume it, and their batch k together is the uninterrupted run's batch 3 + k.
  const Checkpoint one = part(yaml(1, 0, 8), 3, nullptr, dir.string()).second;
  EXPECT_EQ(one.samples, 24u);
  std::vector<std::vector<std::vector<std::uint32_t>>> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.push_back(part(replace(yaml(2, rank, 4), "device: host",
                                 "device: host, resume_from: " + dir.string()))
                        .first);
  }
  ASSERT_EQ(ranks[0].size(), ranks[1].size());
  ASSERT_EQ(ranks[0].size(), 13u);  // 5 of epoch 0 (8 samples each), 8 of epoch 1
  for (std::size_t k = 0; k < ranks[0].size(); ++k) {
    std::multiset<std::uint32_t> together(ranks[0][k].begin(), ranks[0][k].end());
    together.insert(ranks[1][k].begin(), ranks[1][k].end());
    EXPECT_EQ(together, std::multiset<std::uint32_t>(whole[3 + k].begin(), whole[3 + k].end()))
        << "step " << k;
  }

  // 2 -> 1: both ranks stop after 5 batches (the same cursor); one rank of batch 8 resumes from
  // either and runs exactly the uninterrupted run's batches 5, 6, ...
  const Checkpoint two0 = part(yaml(2, 0, 4), 5).second;
  const Checkpoint two1 = part(yaml(2, 1, 4), 5).second;
  EXPECT_EQ(two0.samples, two1.samples);
  EXPECT_EQ(two0.samples, 40u);
  const auto rest = part(yaml(1, 0, 8), 0, &two1).first;
  EXPECT_EQ(rest, std::vector<std::vector<std::uint32_t>>(whole.begin() + 5, whole.end()));
}

TEST_F(ShardOrderNpy, ConfigErrorsNameTheKeyAndTheAllowedValues) {
  write_four_shards();
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, seen_);
  auto error = [&](const std::string& sampler) {
    return test::error_of<ConfigError>(
        [&] { load_config_string(chain(glob_params(), sampler), r); });
  };
  EXPECT_EQ(error("shuffle: true, order: files"),
            "<string>:2:43: sampler.order: 'files' is not one of samples, shards");
  EXPECT_EQ(error("shuffle: true, order: shards, shuffle_window: -1"),
            "<string>:2:67: sampler.shuffle_window: -1 is out of range (must be between 0 and "
            "1000000)");
}

TEST_F(ShardOrderNpy, TheOrderAndItsShardsAreClaimedFromTheMemoryBudget) {
  // The order (60 samples x 4 bytes, twice) and 4 shards x 12 bytes: 528 bytes, after the
  // loader's pool, against 1000 bytes available.
  write_four_shards();
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, seen_);
  const PipelineConfig config = load_config_string(yaml(1, 0, 8), r);
  EXPECT_EQ(testing_files::build_error_with_memory(config, r, "1000"),
            "<string>:4:5: nodes.load.params (the data set's size): the sampling order of node "
            "'load' (npy: 60 samples x 4 bytes, twice while an epoch's order replaces the last, "
            "and 4 shards x 12 bytes) needs 528 B of host memory, and 1000 B is available "
            "(FLOWFEED_AVAILABLE_MEMORY, 864 B of it already claimed by the pools and data sets "
            "before it; the process would be killed for want of memory mid-run) lower "
            "nodes.load.params (the data set's size)");
}

TEST_F(ShardOrderNpy, ALoaderWithoutShardsIsOneShard) {
  // synthetic names no shards: order: shards is then one window holding every sample.
  const std::string yaml =
      "pipeline: { epochs: 1, batch_size: 10, device: host }\n"
      "sampler: { shuffle: true, seed: 3, order: shards, shuffle_window: 1 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { samples: 50, sample_shape: [2] } }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: capture }\n";
  seen_ = std::make_shared<Captured>();
  run_with(yaml, [&](Registry& r) { register_capture(r, seen_); });
  std::vector<std::uint32_t> delivered;
  for (const auto& b : seen_->samples) delivered.insert(delivered.end(), b.begin(), b.end());
  SamplerOptions o;
  o.shuffle = true;
  o.seed = 3;
  o.order = SampleOrder::shards;
  o.shuffle_window = 1;
  EXPECT_EQ(delivered, Sampler(o, 50, 10).epoch_order(0));
  EXPECT_EQ(std::set<std::uint32_t>(delivered.begin(), delivered.end()).size(), 50u);
  EXPECT_FALSE(std::is_sorted(delivered.begin(), delivered.end()));
}

#if FLOWFEED_TEST_IMAGES  // the image family is built
TEST(ShardOrderLoaders, WebDatasetShardsStartWhereTheirTarsDo) {
  const webdataset_testing::Shards& s = webdataset_testing::photos();  // 40 samples: 14, 14, 12
  WebDatasetOptions o;
  o.shards = {s.file("photos-{000..002}.tar")};
  EXPECT_EQ(WebDatasetLoader(o).shard_starts(), (std::vector<std::size_t>{0, 14, 28}));
  o.shards = {s.file("photos-{002..000}.tar")};
  EXPECT_EQ(WebDatasetLoader(o).shard_starts(), (std::vector<std::size_t>{0, 12, 26}));
}
#endif

TEST(ShardOrderLoaders, TokenFilesStartAtTheirFirstSequentialWindow) {
  TempDir dir;
  // Files of 100, 50 and 130 tokens; windows of 10 (+1 for y).
  std::uint32_t next = 0;
  for (const auto& [name, count] : {std::pair{"t-0.bin", 100}, {"t-1.bin", 50}, {"t-2.bin", 130}}) {
    std::vector<std::uint32_t> tokens(static_cast<std::size_t>(count));
    for (auto& t : tokens) t = next++ % 60000;
    token_corpus::write_raw(dir.file(name), tokens, 2);
  }
  TokensOptions o;
  o.files = {dir.file("t-{0..2}.bin")};
  o.context = 10;
  // Across files: window i at token 10 i; files start at tokens 100 and 150.
  EXPECT_EQ(TokensLoader(o).shard_starts(), (std::vector<std::size_t>{0, 10, 15}));
  // Inside files: 9 windows in the first (the last token of 100 has no y), 4, then 12.
  o.cross_documents = false;
  TokensLoader inside(o);
  EXPECT_EQ(inside.shard_starts(), (std::vector<std::size_t>{0, 9, 13}));
  EXPECT_EQ(inside.size(), 25u);
  // Random positions draw from the whole stream every epoch: one shard.
  o.positions = WindowPositions::random;
  EXPECT_TRUE(TokensLoader(o).shard_starts().empty());
}

}  // namespace
}  // namespace flowfeed
