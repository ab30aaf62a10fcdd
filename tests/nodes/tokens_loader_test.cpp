// The tokens loader through the whole graph (tokens -> host_staging -> host_upload -> a sink that
// records x and y): windows of a real corpus, byte-level tokens of the licence texts, checked
// against a reference computed here, for raw uint16/uint32 files, several files as one stream,
// Megatron-LM indexed data sets with many documents, sequential and random positions, and ranks.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <utility>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/detail/token_stream.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/test_files.hpp"
#include "tests/nodes/token_corpus.hpp"

namespace flowfeed {
namespace {

using namespace token_corpus;
using testing_files::TempDir;

class TokensLoaderTest : public ::testing::Test {
 protected:
  std::string yaml(const std::string& params, const std::string& sampler = "shuffle: false",
                   int epochs = 2, int batch_size = 8) {
    return tokens_yaml(params, sampler, epochs, batch_size, "windows");
  }
  RunReport run(const std::string& text) {
    seen_ = std::make_shared<Seen>();
    return testing_files::run_preallocated(text,
                                           [&](Registry& r) { register_window_sink(r, seen_); });
  }
  /// The windows each epoch saw, by sample index (each exactly once).
  void expect_each_window_once_per_epoch(std::size_t windows, int epochs) {
    std::vector<std::multiset<std::uint32_t>> per_epoch(static_cast<std::size_t>(epochs));
    for (const auto& b : seen_->batches)
      per_epoch[b.epoch].insert(b.samples.begin(), b.samples.end());
    for (const auto& samples : per_epoch) {
      ASSERT_EQ(samples.size(), windows);
      EXPECT_EQ(std::set<std::uint32_t>(samples.begin(), samples.end()).size(), windows);
    }
  }

  /// Writes shard-0.bin, shard-1.bin and shard-2.bin (uint16): the corpus split at the arbitrary
  /// points a and b, which it returns.
  std::pair<std::size_t, std::size_t> write_three_shards(const Corpus& c) {
    const std::size_t a = 70001, b = 150003;
    write_raw(dir_.file("shard-0.bin"), c.tokens.data(), a, 2);
    write_raw(dir_.file("shard-1.bin"), c.tokens.data() + a, b - a, 2);
    write_raw(dir_.file("shard-2.bin"), c.tokens.data() + b, c.tokens.size() - b, 2);
    return {a, b};
  }

  TempDir dir_;
  std::shared_ptr<Seen> seen_;
};

TEST_F(TokensLoaderTest, SequentialWindowsOfUint16AndUint32Files) {
  const Corpus& c = licenses();
  constexpr std::size_t kContext = 256;
  for (std::size_t width : {2u, 4u}) {
    SCOPED_TRACE(width);
    const std::string path = dir_.file("train" + std::to_string(width) + ".bin");
    write_raw(path, c.tokens, width);
    const std::string dtype = width == 2 ? "uint16" : "uint32";
    const RunReport report = run(yaml("files: " + path + ", dtype: " + dtype + ", context: 256"));
    const std::size_t windows = (c.tokens.size() - 1) / kContext;
    EXPECT_EQ(report.batches, 2 * ((windows + 7) / 8));
    ASSERT_EQ(seen_->tensors.size(), 2u);
    for (const TensorSpec& t : seen_->tensors) {
      EXPECT_EQ(t.dtype, width == 2 ? DType::uint16 : DType::uint32);
      EXPECT_EQ(t.shape, (std::vector<std::int64_t>{256}));
    }
    // Unshuffled: batch k of each epoch holds windows 8k.., starting at token 256 * window.
    for (const SeenBatch& b : seen_->batches) {
      for (std::size_t row = 0; row < b.samples.size(); ++row) {
        ASSERT_EQ(b.samples[row], b.seq % ((windows + 7) / 8) * 8 + row);
      }
    }
    expect_windows(*seen_, c.tokens, kContext, width,
                   [](std::uint32_t, std::uint32_t s) { return std::uint64_t{s} * kContext; });
    expect_each_window_once_per_epoch(windows, 2);
  }
}

TEST_F(TokensLoaderTest, ShuffledSequentialWindowsKeepTheirTokens) {
  const Corpus& c = licenses();
  const std::string path = dir_.file("train.bin");
  write_raw(path, c.tokens, 2);
  run(yaml("files: " + path + ", context: 100", "shuffle: true, seed: 5"));
  expect_windows(*seen_, c.tokens, 100, 2,
                 [](std::uint32_t, std::uint32_t s) { return std::uint64_t{s} * 100; });
  expect_each_window_once_per_epoch((c.tokens.size() - 1) / 100, 2);
}

TEST_F(TokensLoaderTest, RandomPositionsDependOnlyOnSeedEpochAndIndex) {
  const Corpus& c = licenses();
  const std::vector<std::uint64_t> whole = {0, c.tokens.size()};
  const std::vector<std::uint64_t> starts = all_starts(whole, 128, true);
  for (std::size_t width : {2u, 4u}) {
    SCOPED_TRACE(width);
    const std::string path = dir_.file("r" + std::to_string(width) + ".bin");
    write_raw(path, c.tokens, width);
    const std::string params = "files: " + path + ", dtype: " + (width == 2 ? "uint16" : "uint32") +
                               ", context: 128, positions: random, seed: 9, windows: 300";
    run(yaml(params, "shuffle: true, seed: 3", 3, 16));
    expect_windows(*seen_, c.tokens, 128, width,
                   [&](std::uint32_t e, std::uint32_t s) { return random_start(starts, 9, e, s); });
    expect_each_window_once_per_epoch(300, 3);
    // The same windows whatever the batch size, concurrency or sampler order.
    const std::vector<SeenBatch> first = seen_->batches;
    run(yaml(params, "shuffle: false", 3, 7));
    std::map<std::pair<std::uint32_t, std::uint32_t>, std::vector<std::byte>> by_window;
    const std::size_t row_bytes = 128 * width;
    for (const std::vector<SeenBatch>* batches : {&first, &std::as_const(seen_->batches)}) {
      for (const SeenBatch& b : *batches) {
        for (std::size_t row = 0; row < b.samples.size(); ++row) {
          const std::vector<std::byte> x(b.x.begin() + static_cast<long>(row * row_bytes),
                                         b.x.begin() + static_cast<long>((row + 1) * row_bytes));
          auto [it, added] = by_window.emplace(std::make_pair(b.epoch, b.samples[row]), x);
          if (!added) {
            ASSERT_EQ(it->second, x) << "epoch " << b.epoch << " window " << b.samples[row];
          }
        }
      }
    }
    EXPECT_EQ(by_window.size(), 900u);
  }
  // Epochs draw different positions.
  EXPECT_NE(random_start(starts, 9, 0, 0), random_start(starts, 9, 1, 0));
}

TEST_F(TokensLoaderTest, SeveralFilesAreOneStream) {
  const Corpus& c = licenses();
  // Three shards that split the corpus at arbitrary points, listed and globbed.
  const auto [a, b] = write_three_shards(c);
  const std::string list = "[" + dir_.file("shard-0.bin") + ", " + dir_.file("shard-1.bin") + ", " +
                           dir_.file("shard-2.bin") + "]";
  for (const std::string& files :
       {list, dir_.file("shard-*.bin"), "'" + dir_.file("shard-{0..2}.bin") + "'"}) {
    for (const char* io : {"pread", "io_uring", "mmap"}) {
      SCOPED_TRACE(files + " " + io);
      // Across files: the concatenation, windows spanning the shard boundaries included.
      run(yaml("files: " + files + ", context: 1000, io: " + io));
      expect_windows(*seen_, c.tokens, 1000, 2,
                     [](std::uint32_t, std::uint32_t s) { return std::uint64_t{s} * 1000; });
      expect_each_window_once_per_epoch((c.tokens.size() - 1) / 1000, 2);
    }
  }
  // Random positions across the files, read from their mappings.
  {
    const std::vector<std::uint64_t> starts = all_starts({0, c.tokens.size()}, 1000, true);
    run(yaml("files: " + list + ", context: 1000, io: mmap, positions: random, seed: 2",
             "shuffle: true"));
    expect_windows(*seen_, c.tokens, 1000, 2,
                   [&](std::uint32_t e, std::uint32_t s) { return random_start(starts, 2, e, s); });
  }
  // cross_documents: false: each file is a document, no window spans two.
  const std::vector<std::uint64_t> bounds = {0, a, b, c.tokens.size()};
  const std::vector<std::uint64_t> starts = all_starts(bounds, 1000, false);
  run(yaml("files: " + list + ", context: 1000, cross_documents: false"));
  expect_windows(*seen_, c.tokens, 1000, 2,
                 [&](std::uint32_t, std::uint32_t s) { return starts[s]; });
  expect_each_window_once_per_epoch(starts.size(), 2);
}

// The stream follows the list's order, then brace order, then each glob's sorted matches: three
// shards listed as 2, 0, 1 are read in that order.
TEST_F(TokensLoaderTest, ListsBracesAndGlobsGiveTheStreamItsOrder) {
  const Corpus& c = licenses();
  const std::size_t b = write_three_shards(c).second;
  std::vector<std::uint32_t> reordered(c.tokens.begin() + static_cast<long>(b), c.tokens.end());
  reordered.insert(reordered.end(), c.tokens.begin(), c.tokens.begin() + static_cast<long>(b));
  TokensOptions o;
  o.files = {dir_.file("shard-{2,0}.bin"), dir_.file("shard-[1].bin")};
  o.context = 1000;
  EXPECT_EQ(TokensLoader(o).files(),
            (std::vector<std::string>{dir_.file("shard-2.bin"), dir_.file("shard-0.bin"),
                                      dir_.file("shard-1.bin")}));
  run(yaml("files: ['" + o.files[0] + "', '" + o.files[1] + "'], context: 1000"));
  expect_windows(*seen_, reordered, 1000, 2,
                 [](std::uint32_t, std::uint32_t s) { return std::uint64_t{s} * 1000; });
  expect_each_window_once_per_epoch((c.tokens.size() - 1) / 1000, 2);
}

TEST_F(TokensLoaderTest, MegatronDocumentsBoundWindowsUnlessCrossed) {
  const Corpus& c = licenses();
  // BSD (1,499 tokens) is shorter than a window of 1500 + 1: it gives none inside documents.
  constexpr std::uint64_t kContext = 1500;
  for (DType dtype : {DType::uint16, DType::int32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const std::string prefix = dir_.file(std::string("licenses_") + dtype_name(dtype));
    write_megatron(prefix, dtype, c.documents);
    const std::size_t width = dtype_size(dtype);
    const std::string files = "files: " + prefix + ", format: megatron, context: 1500";
    for (bool random : {false, true}) {
      SCOPED_TRACE(random);
      const std::string positions = random ? ", positions: random, seed: 4" : "";
      const std::vector<std::uint64_t> inside = all_starts(c.document_starts, kContext, random);
      run(yaml(files + positions + ", cross_documents: false", "shuffle: true, seed: 1"));
      EXPECT_EQ(seen_->tensors[0].dtype, dtype);
      expect_windows(*seen_, c.tokens, kContext, width, [&](std::uint32_t e, std::uint32_t s) {
        return random ? random_start(inside, 4, e, s) : inside[s];
      });
      const std::size_t sequential = all_starts(c.document_starts, kContext, false).size();
      expect_each_window_once_per_epoch(sequential, 2);
      // No window starts in BSD or overlaps a document's end.
      for (const SeenBatch& b : seen_->batches) {
        for (std::uint32_t s : b.samples) {
          const std::uint64_t start = random ? random_start(inside, 4, b.epoch, s) : inside[s];
          const auto doc =
              std::upper_bound(c.document_starts.begin(), c.document_starts.end(), start) - 1;
          ASSERT_LE(start + kContext + 1, *(doc + 1));
          ASSERT_NE(c.names[static_cast<std::size_t>(doc - c.document_starts.begin())], "BSD");
        }
      }
      // Across documents: the .bin is one stream (read here from its mapping).
      const std::vector<std::uint64_t> whole = {0, c.tokens.size()};
      const std::vector<std::uint64_t> crossing = all_starts(whole, kContext, random);
      run(yaml(files + positions + ", io: mmap", "shuffle: true, seed: 1"));
      expect_windows(*seen_, c.tokens, kContext, width, [&](std::uint32_t e, std::uint32_t s) {
        return random ? random_start(crossing, 4, e, s) : crossing[s];
      });
    }
  }
}

TEST_F(TokensLoaderTest, RanksGetDisjointWindowsThatCoverTheEpoch) {
  const Corpus& c = licenses();
  const std::string path = dir_.file("train.bin");
  write_raw(path, c.tokens, 2);
  for (const std::string positions : {"sequential", "random"}) {
    SCOPED_TRACE(positions);
    const std::string params = "files: " + path + ", context: 512, positions: " + positions;
    const std::vector<std::uint64_t> starts =
        all_starts({0, c.tokens.size()}, 512, positions == std::string("random"));
    const std::size_t windows = (c.tokens.size() - 1) / 512;
    std::vector<std::set<std::uint32_t>> epoch0(3);
    for (int rank = 0; rank < 3; ++rank) {
      run(yaml(params, "shuffle: true, seed: 8, world: 3, rank: " + std::to_string(rank)));
      expect_windows(*seen_, c.tokens, 512, 2, [&](std::uint32_t e, std::uint32_t s) {
        return positions == std::string("random") ? random_start(starts, 0, e, s)
                                                  : std::uint64_t{s} * 512;
      });
      for (const SeenBatch& b : seen_->batches) {
        if (b.epoch == 0)
          epoch0[static_cast<std::size_t>(rank)].insert(b.samples.begin(), b.samples.end());
      }
    }
    std::set<std::uint32_t> all;
    std::size_t total = 0;
    for (const auto& shard : epoch0) {
      all.insert(shard.begin(), shard.end());
      total += shard.size();
    }
    EXPECT_EQ(total, windows);       // disjoint
    EXPECT_EQ(all.size(), windows);  // and covering
    EXPECT_EQ(*all.rbegin(), windows - 1);
  }
}

double extra(const RunReport& report, const std::string& key) {
  const auto it = report.extra.find(key);
  return it == report.extra.end() ? -1.0 : it->second;
}

std::vector<std::string> pool_names(const RunReport& report) {
  std::vector<std::string> names;
  for (const auto& p : report.pools) names.push_back(p.name);
  return names;
}

// The loader reads x and y straight into the staging node's buffer: the staging node copies
// nothing and the only batch buffers before the upload are the loader's. Each byte of x and y is
// read once, by one of two requests per run of adjacent windows.
TEST_F(TokensLoaderTest, WindowsAreReadStraightIntoTheStagingBuffer) {
  const Corpus& c = licenses();
  const std::string path = dir_.file("train.bin");
  write_raw(path, c.tokens, 2);
  const std::size_t windows = (c.tokens.size() - 1) / 256;
  const double window_bytes = 2.0 * 256 * 2;  // x and y, uint16
  for (const char* io : {"pread", "io_uring"}) {
    SCOPED_TRACE(io);
    const std::string params = std::string("files: ") + path + ", context: 256, io: " + io;
    RunReport report = run(yaml(params));
    expect_windows(*seen_, c.tokens, 256, 2,
                   [](std::uint32_t, std::uint32_t s) { return std::uint64_t{s} * 256; });
    expect_each_window_once_per_epoch(windows, 2);
    EXPECT_EQ(extra(report, "stage.copied_bytes"), 0.0);
    EXPECT_EQ(extra(report, "stage.passed_through_batches"), static_cast<double>(report.batches));
    EXPECT_EQ(pool_names(report), (std::vector<std::string>{"load.staging", "upload.device"}));
    EXPECT_EQ(extra(report, "load.io_bytes"), 2.0 * static_cast<double>(windows) * window_bytes);
    // Unshuffled, a batch's windows are one run: one read for x and one for y.
    EXPECT_EQ(extra(report, "load.io_reads"), 2.0 * static_cast<double>(report.batches));
    // Shuffled: a run a window, the same bytes.
    report = run(yaml(params, "shuffle: true, seed: 3"));
    expect_windows(*seen_, c.tokens, 256, 2,
                   [](std::uint32_t, std::uint32_t s) { return std::uint64_t{s} * 256; });
    EXPECT_EQ(extra(report, "load.io_bytes"), 2.0 * static_cast<double>(windows) * window_bytes);
    EXPECT_EQ(extra(report, "stage.copied_bytes"), 0.0);
  }
  // Without a staging node the loader fills host buffers of its own.
  seen_ = std::make_shared<Seen>();
  Registry r;
  register_builtin_nodes(r);
  register_window_sink(r, seen_);
  std::string text = yaml("files: " + path + ", context: 256");
  text.erase(text.find("  - { name: stage"),
             text.find("  - { name: upload") - text.find("  - { name: stage"));
  Pipeline p(load_config_string(text, r), r);
  const RunReport report = p.run();
  EXPECT_EQ(pool_names(report), (std::vector<std::string>{"load.host", "upload.device"}));
  expect_windows(*seen_, c.tokens, 256, 2,
                 [](std::uint32_t, std::uint32_t s) { return std::uint64_t{s} * 256; });
}

// direct: true: x of windows whose rows are whole 4 KiB pages (2,048 uint16 tokens) at page
// offsets goes around the page cache; y, one token later, is not aligned like its buffer and goes
// through the cache. The bytes are the same.
TEST_F(TokensLoaderTest, DirectReadsTakeTheAlignedXRows) {
  const Corpus& c = licenses();
  const std::string path = dir_.file("train.bin");
  write_raw(path, c.tokens, 2);
  const std::size_t windows = (c.tokens.size() - 1) / 2048;
  for (const char* io : {"pread", "io_uring"}) {
    SCOPED_TRACE(io);
    const RunReport report =
        run(yaml(std::string("files: ") + path + ", context: 2048, direct: true, io: " + io));
    expect_windows(*seen_, c.tokens, 2048, 2,
                   [](std::uint32_t, std::uint32_t s) { return std::uint64_t{s} * 2048; });
    EXPECT_EQ(extra(report, "load.io_bytes"), 2.0 * static_cast<double>(windows) * 2 * 4096);
    EXPECT_EQ(extra(report, "load.io_direct_bytes"), 2.0 * static_cast<double>(windows) * 4096);
  }
}

// 2^32 - 1 random windows need a sampling order of 32 GiB: the build checks it against the memory
// the pipeline may use (here 1 GiB) before any of it is taken, even for a run of five batches.
TEST_F(TokensLoaderTest, TheSamplingOrderOfAllWindowsIsCheckedAgainstTheBudget) {
  const std::string path = dir_.file("train.bin");
  write_raw(path, licenses().tokens, 2);
  Registry r;
  register_builtin_nodes(r);
  register_window_sink(r, std::make_shared<Seen>());
  const PipelineConfig config = load_config_string(
      yaml("files: " + path + ", context: 8, positions: random, windows: 4294967295"), r);
  EXPECT_EQ(testing_files::build_error_with_memory(config, r, "1G"),
            "<string>:4:5: nodes.load.params (the data set's size): the sampling order of node "
            "'load' (tokens: 4294967295 samples x 4 bytes, twice while an epoch's order replaces "
            "the last) needs 32.0 GiB of host memory, and 1.0 GiB is available "
            "(FLOWFEED_AVAILABLE_MEMORY, 1.5 KiB of it already claimed by the pools and data sets "
            "before it; the process would be killed for want of memory mid-run) lower "
            "nodes.load.params (the data set's size)");
}

// configs/tokens.yaml runs over the licence corpus written as nanoGPT's train.bin.
TEST_F(TokensLoaderTest, ShippedConfigRuns) {
  const std::string path = dir_.file("train.bin");
  write_raw(path, licenses().tokens, 2);
  Registry r;
  register_builtin_nodes(r);
  Pipeline p(
      load_config_file(std::string(FLOWFEED_SOURCE_DIR) + "/configs/tokens.yaml", r,
                       {"nodes.load.params.files=" + path, "nodes.load.params.windows=1000"}),
      r);
  const RunReport report = p.run();
  EXPECT_EQ(report.samples, 1000u);
  EXPECT_EQ(report.batches, 16u);  // 15 of 64 windows and one of 40
  EXPECT_EQ(report.allocations_after_build, 0u);
}

}  // namespace
}  // namespace flowfeed
