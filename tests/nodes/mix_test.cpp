// The `mix` loader: which source and sample each position is, the bytes that arrive, proportions,
// epoch ends, determinism across thread counts and exact resume (also on two ranks). Its config
// and build errors: mix_config_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/detail/mix_order.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/session.hpp"

namespace flowfeed {
namespace {

constexpr std::size_t kShape = 16;  // int32 x of 4 elements: a sample's identity (32 bits of hash)

/// A mix of a `memory` source (seed 1, written by fill_rows) and a `synthetic` one (seed 2, through
/// its own batch), in pull mode.
std::string mix_config(const std::string& pipeline, const std::string& sampler,
                       const std::string& params, std::uint64_t first = 300,
                       std::uint64_t second = 200, const std::string& weights = "0.7, 0.3",
                       int concurrency = 2) {
  const std::size_t comma = weights.find(',');
  return "pipeline: { mode: pull, device: host, " + pipeline + " }\nsampler: { " + sampler +
         " }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: mix\n"
         "    concurrency: " +
         std::to_string(concurrency) + "\n    params: { " + params +
         " }\n"
         "    sources:\n"
         "      - { type: memory, weight: " +
         weights.substr(0, comma) + ", params: { samples: " + std::to_string(first) +
         ", sample_shape: [4], dtype: int32, seed: 1 } }\n"
         "      - { type: synthetic, weight: " +
         weights.substr(comma + 1) + ", params: { samples: " + std::to_string(second) +
         ", sample_shape: [4], dtype: int32, seed: 2 } }\n"
         "  - { name: upload, type: host_upload }\n";
}

struct Row {
  int source = -1;           // which source the bytes are from (-1: neither)
  std::uint32_t sample = 0;  // which of its samples
  std::uint32_t position = 0;
  std::uint32_t epoch = 0;
  std::string bytes;  // x and y
};

/// Identifies rows by their bytes: x and y of every sample of both sources.
class Identify {
 public:
  Identify(std::uint32_t first, std::uint32_t second) {
    for (int source = 0; source < 2; ++source) {
      for (std::uint32_t s = 0; s < (source ? second : first); ++s) {
        seen_[row_bytes(source + 1, s)] = {source, s};
      }
    }
  }
  static std::string row_bytes(std::uint64_t seed, std::uint32_t sample) {
    std::string x(kShape, '\0');
    synthetic_fill(seed, sample, DType::int32, kShape / 4, x.data());
    const std::int32_t y = synthetic_label(seed, sample, 10);
    return x + std::string(reinterpret_cast<const char*>(&y), 4);
  }
  std::pair<int, std::uint32_t> operator()(const std::string& bytes) const {
    auto it = seen_.find(bytes);
    return it == seen_.end() ? std::pair<int, std::uint32_t>{-1, 0} : it->second;
  }

 private:
  std::map<std::string, std::pair<int, std::uint32_t>> seen_;
};

/// Up to `batches` batches of a session (all: -1), row by row, each identified.
std::vector<std::vector<Row>> take(Session& session, const Identify& identify, long batches = -1) {
  std::vector<std::vector<Row>> out;
  while (batches < 0 || static_cast<long>(out.size()) < batches) {
    Batch* b = session.next();
    if (!b) break;
    const Tier tier = b->newest_tier();
    std::vector<Row> rows;
    for (std::size_t r = 0; r < b->rows(); ++r) {
      Row row;
      row.bytes.assign(reinterpret_cast<const char*>(b->tensor(tier, 0)) + r * kShape, kShape);
      row.bytes.append(reinterpret_cast<const char*>(b->tensor(tier, 1)) + r * 4, 4);
      std::tie(row.source, row.sample) = identify(row.bytes);
      row.position = b->samples[r];
      row.epoch = b->epoch;
      rows.push_back(std::move(row));
    }
    out.push_back(std::move(rows));
    session.release(b);
  }
  return out;
}

std::vector<Row> flat(const std::vector<std::vector<Row>>& batches) {
  std::vector<Row> out;
  for (const auto& b : batches) out.insert(out.end(), b.begin(), b.end());
  return out;
}

std::vector<std::string> bytes_of(const std::vector<Row>& rows) {
  std::vector<std::string> out;
  for (const Row& r : rows) out.push_back(r.bytes);
  return out;
}

std::vector<Row> run_all(const std::string& yaml, const Identify& identify,
                         RunReport* report = nullptr) {
  const Registry r = builtin_registry();
  Pipeline p(load_config_string(yaml, r), r);
  Session s = p.start();
  std::vector<Row> rows = flat(take(s, identify));
  if (report) *report = s.report();
  return rows;
}

/// Every row of a shuffled mix (sampler seed `seed`) of `first` and `second` samples by `weights`,
/// whose epoch is `samples` positions, identified.
std::vector<Row> shuffled_rows(std::uint32_t first, std::uint32_t second,
                               const std::string& pipeline, int seed, int samples,
                               const std::string& weights) {
  return run_all(
      mix_config(pipeline, "shuffle: true, seed: " + std::to_string(seed),
                 "epoch: samples, samples: " + std::to_string(samples), first, second, weights),
      Identify(first, second));
}

TEST(Mix, EveryRowIsTheSampleTheEpochTableNamesForItsPosition) {
  const Identify identify(300, 200);
  for (const bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle);
    RunReport report;
    const std::vector<Row> rows =
        run_all(mix_config("batch_size: 8, prefetch_depth: 4, epochs: 2",
                           std::string("shuffle: ") + (shuffle ? "true" : "false") + ", seed: 5",
                           "epoch: first_exhausted"),
                identify, &report);
    // first_exhausted: source 0 (300 samples, weight 0.7) runs out first: 428 positions
    // (300 / 0.7 rounded down), 300 + 128 of them.
    ASSERT_EQ(rows.size(), 2u * 428);
    const MixPlan plan = plan_mix({300, 200}, {0.7, 0.3}, 0);
    EXPECT_EQ(plan.epoch_size, 428u);
    EXPECT_EQ(plan.counts, (std::vector<std::uint64_t>{300, 128}));
    const MixOrder order(plan, {300, 200}, shuffle, 5);
    MixTable table;
    std::map<std::pair<std::uint32_t, int>, std::vector<int>> seen;  // (epoch, source) -> counts
    for (const Row& row : rows) {
      order.build(row.epoch, table);
      ASSERT_EQ(row.source, table.source[row.position]) << row.position;
      ASSERT_EQ(row.sample, table.sample[row.position]) << row.position;
      auto& counts = seen[{row.epoch, row.source}];
      counts.resize(row.source ? 200 : 300);
      ++counts[row.sample];
    }
    // Every sample of the exhausted source once per epoch, of the other at most once.
    for (std::uint32_t e = 0; e < 2; ++e) {
      for (int c : seen[{e, 0}]) EXPECT_EQ(c, 1);
      for (int c : seen[{e, 1}]) EXPECT_LE(c, 1);
    }
    EXPECT_EQ(report.extra.at("load.epoch_samples"), 428);
    EXPECT_EQ(report.extra.at("load.source0.samples"), 2 * 300);
    EXPECT_EQ(report.extra.at("load.source1.samples"), 2 * 128);
    EXPECT_DOUBLE_EQ(report.extra.at("load.source0.weight"), 0.7);
    EXPECT_EQ(report.extra.at("load.source1.epoch_samples"), 128);
  }
}

// The rows a source fills in place are written run by run (consecutive rows of one source), and
// the memory source copies consecutive samples of one of its slices as one block: runs that cross
// its slices' ends (batches of 8, a last slice of 6), its cycles' wrap (30 samples, 90 positions)
// and the mix's batches must each still give every row its own sample.
TEST(Mix, LongRunsOfOneSourceCrossingItsSlicesAndCyclesGiveEachRowItsSample) {
  const Identify identify(30, 20);
  for (const bool shuffle : {false, true}) {
    SCOPED_TRACE(shuffle);
    const std::vector<Row> rows =
        run_all(mix_config("batch_size: 8, prefetch_depth: 4, epochs: 2",
                           std::string("shuffle: ") + (shuffle ? "true" : "false") + ", seed: 7",
                           "epoch: samples, samples: 100", 30, 20, "9, 1"),
                identify);
    ASSERT_EQ(rows.size(), 200u);
    const MixOrder order(plan_mix({30, 20}, {9, 1}, 100), {30, 20}, shuffle, 7);
    MixTable table;
    std::size_t longest = 0, run = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& row = rows[i];
      order.build(row.epoch, table);
      ASSERT_EQ(row.source, table.source[row.position]) << i;
      ASSERT_EQ(row.sample, table.sample[row.position]) << i;
      run = row.source == 0 && i > 0 && rows[i - 1].source == 0 ? run + 1 : 1;
      longest = std::max(longest, run);
    }
    // Unshuffled, source 0 takes 9 positions of 10: runs of 9 rows, past the batches of 8.
    if (!shuffle) {
      EXPECT_GE(longest, 9u);
    }
  }
}

TEST(Mix, RealizedProportionsAreWithinABinomialBoundOfTheWeights) {
  // 2,000 positions of epoch samples: 4,000 from two sources of 500 and 100 samples (both cycle),
  // weights 0.8 / 0.2: the first 400 delivered rows hold a hypergeometric share of each, tighter
  // than a binomial one; allow 4 binomial standard deviations.
  const std::vector<Row> rows =
      shuffled_rows(500, 100, "batch_size: 10, prefetch_depth: 4, epochs: 1", 11, 2000, "4, 1");
  ASSERT_EQ(rows.size(), 2000u);
  for (const std::size_t n : {std::size_t{400}, std::size_t{2000}}) {
    std::size_t first = 0;
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_NE(rows[i].source, -1);
      first += rows[i].source == 0;
    }
    const double sd = std::sqrt(n * 0.8 * 0.2);
    EXPECT_LE(std::abs(static_cast<double>(first) - 0.8 * n), 4 * sd) << n << ": " << first;
  }
  // The whole epoch is the weights apportioned exactly: 1,600 and 400; each cycle of a source
  // gives every sample once (the second source's 400 draws are 4 cycles).
  std::vector<int> second(100);
  std::size_t first = 0;
  for (const Row& r : rows) {
    if (r.source == 1) ++second[r.sample];
    first += r.source == 0;
  }
  EXPECT_EQ(first, 1600u);
  for (int c : second) EXPECT_EQ(c, 4);
}

TEST(Mix, AFixedEpochCyclesTheSourcesReshufflingEachCycle) {
  const std::vector<Row> rows =
      shuffled_rows(30, 20, "batch_size: 7, prefetch_depth: 4, epochs: 2", 3, 100, "1, 1");
  ASSERT_EQ(rows.size(), 200u);
  for (std::uint32_t e = 0; e < 2; ++e) {
    // The source's samples in the order of its positions (the sampler visits them shuffled).
    std::map<std::uint32_t, std::uint32_t> by_position;
    for (const Row& r : rows) {
      if (r.epoch == e && r.source == 1) by_position[r.position] = r.sample;
    }
    std::vector<std::uint32_t> second;
    for (const auto& [position, sample] : by_position) second.push_back(sample);
    // 50 draws of 20 samples: cycles of 20, 20 and 10; each cycle without repeats, and the
    // first two in different orders.
    ASSERT_EQ(second.size(), 50u);
    for (std::size_t c = 0; c < 3; ++c) {
      std::vector<int> count(20);
      for (std::size_t i = c * 20; i < std::min<std::size_t>(50, (c + 1) * 20); ++i) {
        EXPECT_EQ(++count[second[i]], 1) << "epoch " << e << " cycle " << c;
      }
    }
    EXPECT_NE(std::vector<std::uint32_t>(second.begin(), second.begin() + 20),
              std::vector<std::uint32_t>(second.begin() + 20, second.begin() + 40));
  }
}

TEST(Mix, TheSameBytesInTheSameOrderOnOneThreadAndOnFour) {
  const Identify identify(300, 200);
  const auto on = [&](int threads, int concurrency) {
    return bytes_of(run_all(
        mix_config(
            "batch_size: 8, prefetch_depth: 6, epochs: 3, threads: " + std::to_string(threads),
            "shuffle: true, seed: 21", "epoch: first_exhausted", 300, 200, "0.7, 0.3", concurrency),
        identify));
  };
  const std::vector<std::string> one = on(1, 1);
  ASSERT_EQ(one.size(), 3u * 428);
  EXPECT_EQ(on(4, 4), one);
}

TEST(Mix, PrefetchDepthAutoSolvesTheSourcesPoolsAndDeliversTheSameRows) {
  // The sources' per-batch pools are the mix's: with prefetch_depth: auto they are sized after
  // the mix's setup, at the solved depth, as a plain loader's are.
  const Identify identify(300, 200);
  const auto on = [&](const std::string& depth) {
    return bytes_of(run_all(mix_config("batch_size: 8, epochs: 2, prefetch_depth: " + depth,
                                       "shuffle: true, seed: 21", "epoch: first_exhausted"),
                            identify));
  };
  const std::vector<std::string> fixed = on("6");
  ASSERT_EQ(fixed.size(), 2u * 428);
  EXPECT_EQ(on("auto"), fixed);
}

/// Rows of a run stopped after `stop` batches, then of runs resumed from its cursor on `world`
/// ranks (batch_size each 8 / world), merged back into the global order step by step.
std::vector<std::string> stopped_and_resumed(long stop, int world, const Identify& identify) {
  const Registry r = builtin_registry();
  const std::string sampler = "shuffle: true, seed: 7";
  Pipeline first(load_config_string(mix_config("batch_size: 8, prefetch_depth: 4, epochs: 2",
                                               sampler, "epoch: samples, samples: 300"),
                                    r),
                 r);
  std::vector<std::string> out;
  Checkpoint cursor;
  {
    Session s = first.start();
    out = bytes_of(flat(take(s, identify, stop)));
    cursor = s.checkpoint();
  }
  std::vector<std::vector<std::vector<Row>>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    Pipeline resumed(load_config_string(mix_config("batch_size: " + std::to_string(8 / world) +
                                                       ", prefetch_depth: 4, epochs: 2",
                                                   sampler + ", world: " + std::to_string(world) +
                                                       ", rank: " + std::to_string(rank),
                                                   "epoch: samples, samples: 300"),
                                        r),
                     r);
    resumed.resume(cursor, {}, "mem");
    Session s = resumed.start();
    ranks.push_back(take(s, identify));
  }
  // Step k of every rank: rank q's row j is global position k x 8 + j x world + q.
  for (std::size_t k = 0; k < ranks[0].size(); ++k) {
    for (std::size_t j = 0; j < ranks[0][k].size(); ++j) {
      for (int q = 0; q < world; ++q) {
        if (k < ranks[q].size() && j < ranks[q][k].size()) out.push_back(ranks[q][k][j].bytes);
      }
    }
  }
  return out;
}

TEST(Mix, AResumeMidEpochContinuesTheUninterruptedRunOnOneRankAndOnTwo) {
  const Identify identify(300, 200);
  const std::vector<std::string> whole =
      bytes_of(run_all(mix_config("batch_size: 8, prefetch_depth: 4, epochs: 2",
                                  "shuffle: true, seed: 7", "epoch: samples, samples: 300"),
                       identify));
  ASSERT_EQ(whole.size(), 600u);
  EXPECT_EQ(stopped_and_resumed(13, 1, identify), whole);  // mid epoch 0
  EXPECT_EQ(stopped_and_resumed(13, 2, identify), whole);
  EXPECT_EQ(stopped_and_resumed(45, 2, identify), whole);  // mid epoch 1
}

}  // namespace
}  // namespace flowfeed
