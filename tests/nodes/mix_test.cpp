// The `mix` loader: which source and sample each position is, the bytes that arrive, proportions,
// epoch ends, determinism across thread counts, exact resume (also on two ranks) and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/detail/mix_order.hpp"
#include "flowfeed/nodes/python_types.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/session.hpp"
#include "tests/error_of.hpp"

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

TEST(Mix, RealizedProportionsAreWithinABinomialBoundOfTheWeights) {
  // 2,000 positions of epoch samples: 4,000 from two sources of 500 and 100 samples (both cycle),
  // weights 0.8 / 0.2: the first 400 delivered rows hold a hypergeometric share of each, tighter
  // than a binomial one; allow 4 binomial standard deviations.
  const Identify identify(500, 100);
  const std::vector<Row> rows =
      run_all(mix_config("batch_size: 10, prefetch_depth: 4, epochs: 1", "shuffle: true, seed: 11",
                         "epoch: samples, samples: 2000", 500, 100, "4, 1"),
              identify);
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
  const Identify identify(30, 20);
  const std::vector<Row> rows =
      run_all(mix_config("batch_size: 7, prefetch_depth: 4, epochs: 2", "shuffle: true, seed: 3",
                         "epoch: samples, samples: 100", 30, 20, "1, 1"),
              identify);
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

TEST(Mix, ConfigErrorsNameTheKeyAndWhereItWasWritten) {
  const Registry r = builtin_registry();
  const auto problems = [&](const std::string& yaml) {
    return test::problems_of([&] { (void)load_config_string(yaml, r, {}, "mix.yaml"); });
  };
  EXPECT_EQ(problems(R"(pipeline: { mode: pull }
nodes:
  - name: load
    type: mix
    params: { epoch: samples }
    sources:
      - { type: npz, params: { path: a.npy } }
      - { type: synthetic, weight: 0, params: { sampels: 3 } }
      - { type: checksum }
      - { typ: synthetic }
  - { name: upload, type: host_upload }
)"),
            (std::vector<std::string>{
                "mix.yaml:8:49: nodes[0].sources[1].params.sampels: unknown key (did you mean "
                "'samples'?)",
                "mix.yaml:10:11: nodes[0].sources[3].typ: unknown key (did you mean 'type'?)",
                "mix.yaml:10:9: nodes[0].sources[3].type: missing required key (a source names "
                "its loader type)",
                "mix.yaml:7:17: nodes[0].sources[0].type: unknown node type 'npz' (did you mean "
                "'npy'? known types: checksum, cuda_upload, delay, device_checksum, "
                "device_discard, device_normalize, discard, host_staging, host_upload, idx, "
                "image_folder, memory, mix, mlp, normalize, npy, pinned_staging, random_flip, "
                "record, sleep, synthetic, tokens, webdataset)",
                "mix.yaml:9:17: nodes[0].sources[2].type: 'checksum' is a train type (a source of "
                "'mix' is a loader) pick a load type",
                "mix.yaml:5:22: nodes[0].params.epoch: samples needs the count (an epoch of how "
                "many positions?) set params.samples",
                "mix.yaml:8:36: nodes[0].sources[1].weight: 0 gives the source no share (a weight "
                "must be above 0) raise it, or remove the source"}));
  EXPECT_EQ(problems(R"(pipeline: { mode: pull }
nodes:
  - { name: load, type: mix }
  - { name: upload, type: host_upload, sources: [{ type: synthetic }] }
)"),
            (std::vector<std::string>{
                "mix.yaml:3:5: nodes[0].sources: missing required key ('mix' combines the "
                "loaders listed under sources) add sources: [{ type: ..., params: {...} }, ...]",
                "mix.yaml:4:5: nodes[1].sources: 'host_upload' takes no sources (only a type that "
                "combines loaders does, e.g. mix) remove them"}));
}

TEST(Mix, AParamThatFailedItsOwnCheckIsReportedOnceAndNotReadByTheTypesChecks) {
  // epoch fails its choices: the mix's cross-key checks (which read epoch) do not run on it.
  const Registry r = builtin_registry();
  EXPECT_EQ(test::problems_of([&] {
              (void)load_config_string(R"(pipeline: { mode: pull }
nodes:
  - name: load
    type: mix
    params: { epoch: firstexhausted }
    sources:
      - { type: synthetic, params: { samples: 3 } }
  - { name: upload, type: host_upload }
)",
                                       r, {}, "mix.yaml");
            }),
            (std::vector<std::string>{"mix.yaml:5:22: nodes[0].params.epoch: 'firstexhausted' is "
                                      "not one of first_exhausted, samples (did you mean "
                                      "'first_exhausted'?)"}));
}

TEST(Mix, APythonIterableSourceNeedsAnUnshuffledMix) {
  Registry r = builtin_registry();
  register_python_placeholders(r);
  EXPECT_EQ(test::problems_of([&] {
              (void)load_config_string(R"(pipeline: { mode: pull }
sampler: { shuffle: true }
nodes:
  - name: load
    type: mix
    sources:
      - { type: synthetic }
      - { type: python_iterable, params: { callable: "m:f", samples: 10 } }
  - { name: upload, type: host_upload }
)",
                                       r, {}, "mix.yaml");
            }),
            (std::vector<std::string>{
                "mix.yaml:2:21: sampler.shuffle: true does not fit source 1 (python_iterable) of "
                "the mix 'load' (an iterable gives its samples in its own order) set "
                "sampler.shuffle: false, or use a map-style python source"}));
}

TEST(Mix, SourcesOfDifferentSamplesAreAConfigErrorNamingBothAndTheTensor) {
  const Registry r = builtin_registry();
  const std::string yaml = R"(pipeline: { mode: pull, device: host }
nodes:
  - name: load
    type: mix
    sources:
      - { type: synthetic, params: { sample_shape: [4], dtype: uint8 } }
      - { type: synthetic, params: { sample_shape: [4], dtype: float32 } }
  - { name: upload, type: host_upload }
)";
  EXPECT_EQ(
      test::error_of<ConfigError>([&] { Pipeline(load_config_string(yaml, r, {}, "m.yaml"), r); }),
      "m.yaml:3:5: node 'load': sources 0 (synthetic) and 1 (synthetic) give different "
      "samples: tensor 'x' is uint8 [4] in source 0 and float32 [4] in source 1 (a mix's "
      "batches have one layout) make every source give the same tensors");
}

TEST(Mix, ASourcesOwnBuildErrorNamesTheSource) {
  const Registry r = builtin_registry();
  const std::string yaml = R"(pipeline: { mode: pull, device: host, batch_size: 4 }
nodes:
  - name: load
    type: mix
    sources:
      - { type: synthetic, params: { samples: 8, sample_shape: [4] } }
      - { type: npy, params: { features: /nonexistent/x.npy, labels: /nonexistent/y.npy } }
  - { name: upload, type: host_upload }
)";
  EXPECT_EQ(test::error_of<Error>([&] { Pipeline(load_config_string(yaml, r, {}, "m.yaml"), r); }),
            "node 'load' (mix, m.yaml:3): source 1 (npy): /nonexistent/x.npy: cannot open (No "
            "such file or directory)");
  // A config error a source finds while it is built: at the source's place in the config.
  const std::string budget =
      R"(pipeline: { mode: pull, device: host, batch_size: 4, memory_budget: { host: 1000000 } }
nodes:
  - name: load
    type: mix
    sources:
      - { type: synthetic, params: { samples: 8, sample_shape: [1000] } }
      - { type: memory, params: { samples: 1000, sample_shape: [1000] } }
  - { name: upload, type: host_upload }
)";
  EXPECT_EQ(
      test::error_of<ConfigError>(
          [&] { Pipeline(load_config_string(budget, r, {}, "m.yaml"), r); }),
      "m.yaml:7:17: node 'load' source 1 (memory): nodes[0].params.samples, "
      "nodes[0].params.sample_shape: the data set (1000 samples) of source 1 (memory) of node "
      "'load' needs 3.9 MiB of host memory, and 976.6 KiB is available "
      "(pipeline.memory_budget.host, 126.1 KiB of it already claimed by the pools and data sets "
      "before it; the process would be killed for want of memory mid-run) lower "
      "nodes[0].params.samples, nodes[0].params.sample_shape");
}

TEST(Mix, TheEpochTablesAreClaimedFromTheMemoryBudget) {
  const Registry r = builtin_registry();
  // 100,000,000 positions: two tables of 500 MB, against a budget of 100 MB.
  const std::string yaml =
      R"(pipeline: { mode: pull, device: host, batch_size: 4, memory_budget: { host: 100000000 } }
nodes:
  - name: load
    type: mix
    params: { epoch: samples, samples: 100000000 }
    sources:
      - { type: synthetic, params: { samples: 8, sample_shape: [4] } }
      - { type: synthetic, params: { samples: 8, sample_shape: [4] } }
  - { name: upload, type: host_upload }
)";
  EXPECT_EQ(
      test::error_of<ConfigError>([&] { Pipeline(load_config_string(yaml, r, {}, "m.yaml"), r); }),
      "m.yaml:3:5: nodes.load.params.samples: the epoch tables (2 epochs of 100000000 positions, "
      "5 bytes each) of node 'load' needs 953.7 MiB of host memory, and 95.4 MiB is available "
      "(pipeline.memory_budget.host, 4.2 KiB of it already claimed by the pools and data sets "
      "before it; the process would be killed for want of memory mid-run) lower "
      "nodes.load.params.samples");
}

TEST(Mix, AConfigBuiltInCppHasItsSourcesCheckedAndDefaulted) {
  const Registry r = builtin_registry();
  PipelineConfig config;
  config.pipeline.mode = RunMode::pull;
  config.pipeline.device = DeviceChoice::host;
  config.pipeline.batch_size = 5;
  NodeSpec load;
  load.name = "load";
  load.type = "mix";
  for (const std::int64_t samples : {10, 30}) {
    SourceSpec source;
    source.type = "synthetic";
    source.params.set("samples", samples);
    load.sources.push_back(std::move(source));
  }
  NodeSpec upload;
  upload.name = "upload";
  upload.type = "host_upload";
  config.nodes = {load, upload};
  PipelineConfig bad = config;
  bad.nodes[0].sources[1].params.set("sampels", std::int64_t{3});
  bad.nodes[0].sources[0].keys.set("weight", 0.0);
  EXPECT_EQ(test::problems_of([&] { validate_config(bad, r); }),
            (std::vector<std::string>{
                "<c++>: nodes[0].sources[1].params.sampels: unknown key (did you mean "
                "'samples'?)",
                "<c++>: nodes[0].sources[0].weight: 0 gives the source no share (a weight must be "
                "above 0) raise it, or remove the source"}));
  validate_config(config, r);
  // Weights default to 1: the 10-sample source runs out after 20 positions.
  Pipeline p(config, r);
  Session s = p.start();
  std::size_t rows = 0;
  while (Batch* b = s.next()) {
    rows += b->rows();
    s.release(b);
  }
  EXPECT_EQ(rows, 20u);
  EXPECT_EQ(s.report().extra.at("load.source1.samples"), 10);
}

}  // namespace
}  // namespace flowfeed
