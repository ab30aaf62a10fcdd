// sampler.order: shards — data shards permuted by (seed, epoch), samples shuffled within windows of
// consecutive shards: every sample once, the window property, determinism, ranks, and the resume
// checks of the order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <set>
#include <stdexcept>

#include "flowfeed/checkpoint.hpp"
#include "flowfeed/sampler.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

SamplerOptions shard_options(int window, std::uint64_t seed = 7, int rank = 0, int world = 1) {
  SamplerOptions o;
  o.shuffle = true;
  o.seed = seed;
  o.rank = rank;
  o.world = world;
  o.order = SampleOrder::shards;
  o.shuffle_window = window;
  return o;
}

/// Shards of these sizes, laid end to end: their starts (an empty shard repeats a start).
std::vector<std::size_t> starts_of(const std::vector<std::size_t>& sizes) {
  std::vector<std::size_t> starts;
  std::size_t at = 0;
  for (std::size_t n : sizes) {
    starts.push_back(at);
    at += n;
  }
  return starts;
}

/// The shard that holds sample `s`.
std::size_t shard_of(const std::vector<std::size_t>& starts, std::size_t s) {
  return static_cast<std::size_t>(std::upper_bound(starts.begin(), starts.end(), s) -
                                  starts.begin()) -
         1;
}

const std::vector<std::vector<std::size_t>> kLayouts = {
    {10, 10, 10, 10, 10, 10, 10}, {1, 50, 3, 0, 17, 9, 9, 40, 2}, {100}, {5, 5, 5, 5}};

TEST(ShardOrder, EverySampleExactlyOncePerEpoch) {
  for (const auto& sizes : kLayouts) {
    const std::vector<std::size_t> starts = starts_of(sizes);
    const std::size_t n = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
    std::vector<std::uint32_t> all(n);
    std::iota(all.begin(), all.end(), 0u);
    for (int window : {0, 1, 2, 3, 100}) {
      Sampler s(shard_options(window), n, 8, starts);
      for (std::uint32_t epoch = 0; epoch < 4; ++epoch) {
        std::vector<std::uint32_t> order = s.epoch_order(epoch);
        std::sort(order.begin(), order.end());
        EXPECT_EQ(order, all) << "window " << window << " epoch " << epoch;
      }
    }
  }
}

TEST(ShardOrder, SamplesStayInsideTheWindowOfTheirShard) {
  // The property: with the epoch's shard sequence q (shard_sequence) and window W, the order is
  // window 0's samples, then window 1's, ... (window k: the shards q[kW .. kW+W)), so no sample of
  // the shard at place p + W or later comes before the last sample of the shard at place p; and
  // W = 0 reads each shard whole, front to back, in the sequence's order.
  for (const auto& sizes : kLayouts) {
    const std::vector<std::size_t> starts = starts_of(sizes);
    const std::size_t n = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0});
    for (int window : {0, 1, 2, 3}) {
      SCOPED_TRACE("window " + std::to_string(window));
      Sampler s(shard_options(window), n, 8, starts);
      for (std::uint32_t epoch = 0; epoch < 3; ++epoch) {
        const std::vector<std::uint32_t> sequence = s.shard_sequence(epoch);
        const std::vector<std::uint32_t> order = s.epoch_order(epoch);
        // The place of each non-empty shard (Sampler numbers only those) in the sequence.
        std::vector<std::size_t> nonempty;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          if (sizes[k] > 0) nonempty.push_back(k);
        }
        ASSERT_EQ(sequence.size(), nonempty.size());
        std::vector<std::size_t> place(sizes.size());
        for (std::size_t p = 0; p < sequence.size(); ++p) place[nonempty[sequence[p]]] = p;
        if (window == 0) {
          std::vector<std::uint32_t> expected;
          for (std::uint32_t shard : sequence) {
            const std::size_t k = nonempty[shard];
            for (std::size_t i = starts[k]; i < starts[k] + sizes[k]; ++i) {
              expected.push_back(static_cast<std::uint32_t>(i));
            }
          }
          EXPECT_EQ(order, expected);
          continue;
        }
        const auto w = static_cast<std::size_t>(window);
        std::size_t last_window = 0;
        for (std::uint32_t sample : order) {
          const std::size_t k = place[shard_of(starts, sample)] / w;
          ASSERT_GE(k, last_window) << "sample " << sample << " of a window already left";
          last_window = k;
        }
      }
    }
  }
}

TEST(ShardOrder, AWindowsSamplesAreShuffledNotReadShardByShard) {
  Sampler s(shard_options(2), 70, 8, starts_of({10, 10, 10, 10, 10, 10, 10}));
  const std::vector<std::uint32_t> order = s.epoch_order(0);
  // The first window: shards q0 and q1 mixed; sorted it is two runs of 10.
  const std::vector<std::uint32_t> window(order.begin(), order.begin() + 20);
  EXPECT_FALSE(std::is_sorted(window.begin(), window.end()));
  std::set<std::size_t> shards;
  for (std::uint32_t sample : window) shards.insert(sample / 10);
  EXPECT_EQ(shards.size(), 2u);
  // Both shards' samples interleave: the window is not one shard's samples followed by the other's.
  std::size_t switches = 0;
  for (std::size_t i = 1; i < window.size(); ++i) switches += window[i] / 10 != window[i - 1] / 10;
  EXPECT_GT(switches, 1u);
}

TEST(ShardOrder, EpochsAndSeedsPermuteTheShardsDifferentlyAndAFixedSeedGivesAFixedOrder) {
  const std::vector<std::size_t> starts = starts_of(std::vector<std::size_t>(20, 5));
  Sampler a(shard_options(3), 100, 8, starts);
  Sampler b(shard_options(3), 100, 8, starts);
  EXPECT_EQ(a.shard_sequence(2), b.shard_sequence(2));
  EXPECT_EQ(a.epoch_order(2), b.epoch_order(2));
  EXPECT_NE(a.shard_sequence(0), a.shard_sequence(1));
  EXPECT_NE(a.shard_sequence(1), a.shard_sequence(2));
  EXPECT_NE(Sampler(shard_options(3, 8), 100, 8, starts).shard_sequence(0), a.shard_sequence(0));
  // A change here silently changes every run that uses the order.
  Sampler small(shard_options(2, 42), 10, 4, {0, 3, 5, 9});
  EXPECT_EQ(small.shard_sequence(0), (std::vector<std::uint32_t>{1, 3, 2, 0}));
  // Shards 1 and 3 (samples 3, 4 and 9), then shards 2 and 0 (5..8 and 0..2), each mixed.
  EXPECT_EQ(small.epoch_order(0), (std::vector<std::uint32_t>{3, 9, 4, 2, 1, 7, 5, 8, 0, 6}));
}

TEST(ShardOrder, WithoutShuffleBothOrdersAreSequential) {
  SamplerOptions o = shard_options(2);
  o.shuffle = false;
  Sampler s(o, 10, 4, {0, 3, 5});
  std::vector<std::uint32_t> all(10);
  std::iota(all.begin(), all.end(), 0u);
  EXPECT_EQ(s.epoch_order(3), all);
  EXPECT_EQ(s.shard_sequence(3), (std::vector<std::uint32_t>{0, 1, 2}));
}

TEST(ShardOrder, RanksAreDisjointCoverTheSetAndStepKIsTheSameForAnyWorld) {
  const std::vector<std::size_t> starts = starts_of({30, 7, 30, 1, 30, 2, 19});
  const std::size_t n = 119;
  const std::vector<std::uint32_t> global = Sampler(shard_options(2), n, 12, starts).epoch_order(1);
  for (int world : {2, 3, 4}) {
    const std::size_t batch = 12 / static_cast<std::size_t>(world);
    std::vector<std::vector<std::uint32_t>> orders;
    std::multiset<std::uint32_t> all;
    for (int rank = 0; rank < world; ++rank) {
      orders.push_back(Sampler(shard_options(2, 7, rank, world), n, batch, starts).epoch_order(1));
      all.insert(orders.back().begin(), orders.back().end());
    }
    EXPECT_EQ(all.size(), n);
    EXPECT_EQ(std::set<std::uint32_t>(all.begin(), all.end()).size(), n);
    // Global step k: every rank's batch k together is positions [12k, 12k + 12) of the order.
    for (std::size_t step = 0; step * 12 < n; ++step) {
      std::multiset<std::uint32_t> together;
      for (const auto& order : orders) {
        for (std::size_t i = step * batch; i < std::min(order.size(), (step + 1) * batch); ++i) {
          together.insert(order[i]);
        }
      }
      const auto first = global.begin() + static_cast<std::ptrdiff_t>(step * 12);
      EXPECT_EQ(together, std::multiset<std::uint32_t>(
                              first, global.begin() +
                                         static_cast<std::ptrdiff_t>(std::min(n, step * 12 + 12))))
          << "world " << world << " step " << step;
    }
  }
}

TEST(ShardOrder, ShardStartsAreTakenAsTheLoaderGivesThemAndCheckedAsAContract) {
  EXPECT_EQ(Sampler(shard_options(2), 10, 4).data_shards(), 1u);
  // A missing first 0, empty shards (a repeated start, a start at the end) are fine.
  EXPECT_EQ(Sampler(shard_options(2), 10, 4, {3, 3, 6, 10}).data_shards(), 3u);
  EXPECT_EQ(Sampler(shard_options(2), 10, 4, {0, 0, 5, 5, 10}).data_shards(), 2u);
  // order: samples does not read them.
  SamplerOptions samples = shard_options(2);
  samples.order = SampleOrder::samples;
  EXPECT_EQ(Sampler(samples, 10, 4, {0, 5}).data_shards(), 1u);
  EXPECT_THROW(Sampler(shard_options(2), 10, 4, {0, 6, 5}), std::invalid_argument);
  EXPECT_THROW(Sampler(shard_options(2), 10, 4, {0, 11}), std::invalid_argument);
  EXPECT_THROW(Sampler(shard_options(-1), 10, 4, {0, 5}), std::invalid_argument);
}

TEST(ShardOrderCheckpoint, RecordsTheOrderAndRejectsAnotherNamingTheField) {
  const std::vector<std::size_t> starts = {0, 25, 50, 75};
  Sampler s(shard_options(2), 100, 10, starts);
  const Checkpoint c = make_checkpoint(s, 3, {}, 3);
  EXPECT_EQ(c.order, SampleOrder::shards);
  EXPECT_EQ(c.shuffle_window, 2u);
  EXPECT_EQ(c.data_shards, 4u);
  const std::string json = checkpoint_json(c);
  EXPECT_NE(json.find("\"version\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"order\": \"shards\",\n    \"shuffle_window\": 2,\n    \"data_shards\": 4"),
            std::string::npos)
      << json;
  EXPECT_EQ(resume_point(c, s, 2, "ck").first, 3u);
  {  // The file round trip keeps the fields.
    const std::string file = ::testing::TempDir() + "shard_order_pipeline.json";
    std::ofstream(file) << json;
    const Checkpoint back = read_checkpoint(file);
    EXPECT_EQ(back.version, 2);
    EXPECT_EQ(back.order, SampleOrder::shards);
    EXPECT_EQ(back.shuffle_window, 2u);
    EXPECT_EQ(back.data_shards, 4u);
    // A damaged field is named.
    auto damaged = [&](const std::string& from, const std::string& to) {
      std::string text = json;
      text.replace(text.find(from), from.size(), to);
      std::ofstream(file, std::ios::trunc) << text;
      return test::error_of<ConfigError>([&] { read_checkpoint(file); });
    };
    EXPECT_EQ(damaged("\"order\": \"shards\"", "\"order\": \"rows\""),
              file +
                  ": sampler.order: expected \"samples\" or \"shards\", found \"rows\" (the "
                  "checkpoint is corrupt) resume from a complete one");
    EXPECT_EQ(damaged("\"shuffle_window\": 2", "\"shuffle_window\": -2"),
              file +
                  ": sampler.shuffle_window: expected a non-negative integer, found -2 (the "
                  "checkpoint is corrupt) resume from a complete one");
    EXPECT_EQ(damaged(",\n    \"data_shards\": 4", ""),
              file +
                  ": sampler.data_shards: missing (the checkpoint is incomplete or corrupt) resume "
                  "from a complete one");
    std::remove(file.c_str());
  }
  auto message = [&](const SamplerOptions& o, const std::vector<std::size_t>& st) {
    return test::error_of<ConfigError>([&] { resume_point(c, Sampler(o, 100, 10, st), 2, "ck"); });
  };
  SamplerOptions samples = shard_options(2);
  samples.order = SampleOrder::samples;
  EXPECT_EQ(message(samples, starts),
            "ck: sampler.order: the checkpoint was written with order: shards, this run has "
            "order: samples (a resume continues the same sample order) set sampler.order: shards");
  EXPECT_EQ(message(shard_options(3), starts),
            "ck: sampler.shuffle_window: the checkpoint was written with shuffle_window: 2, this "
            "run has shuffle_window: 3 (it decides which samples are shuffled together) set "
            "sampler.shuffle_window: 2");
  EXPECT_EQ(message(shard_options(2), {0, 50}),
            "ck: sampler.data_shards: the checkpoint was written for 4 data shards, this run's "
            "loader has 2 (every epoch's order permutes the shards) resume with the same shards");
  // A checkpoint of order: samples is written as before (version 1, no order): older builds read
  // it; resuming it under order: shards is refused.
  const Checkpoint old = make_checkpoint(Sampler(samples, 100, 10), 3, {}, 3);
  EXPECT_NE(checkpoint_json(old).find("\"version\": 1"), std::string::npos);
  EXPECT_EQ(checkpoint_json(old).find("order"), std::string::npos);
  EXPECT_EQ(test::error_of<ConfigError>([&] { resume_point(old, s, 2, "ck"); }),
            "ck: sampler.order: the checkpoint was written with order: samples, this run has "
            "order: shards (a resume continues the same sample order) set sampler.order: samples");
}

}  // namespace
}  // namespace flowfeed
