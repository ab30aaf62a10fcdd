// The webdataset loader with index files (DALI's wds2idx format, written by
// scripts/wds_index.py): the same samples as from the tars' headers; shards named by URL
// streamed during the run, a data set larger than the cache included; a shard that does not
// match its index, and a damaged index, named with the file (and line).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/nodes/webdataset_fixture.hpp"
#include "tests/remote/servers.hpp"

namespace flowfeed {
namespace {

#if FLOWFEED_TEST_IMAGES  // the image family is built
using namespace webdataset_testing;
using remote_test::Nginx;
using testing_files::TempDir;
namespace fs = std::filesystem;

/// Runs scripts/wds_index.py with `args`; its exit status and what it printed.
std::pair<int, std::string> wds_index(const std::string& args) {
  const std::string cmd =
      fmt::format("{} {}/scripts/wds_index.py {} 2>&1", FLOWFEED_PYTHON, FLOWFEED_SOURCE_DIR, args);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string out;
  char buf[512];
  while (pipe && std::fgets(buf, sizeof buf, pipe)) out += buf;
  const int status = pipe ? ::pclose(pipe) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

/// `dir` holding copies of the photos shards and their index files.
void shards_with_index(const TempDir& dir) {
  for (int i = 0; i < 3; ++i) {
    const std::string name = fmt::format("photos-{:03}.tar", i);
    fs::copy_file(photos().file(name), dir.file(name));
    ASSERT_EQ(wds_index(dir.file(name)).first, 0);
  }
}

std::string text_of(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string streamed(const std::string& shards, const std::string& params, int epochs = 2) {
  return fmt::format(
      "pipeline: {{ device: host, epochs: {}, batch_size: 5, prefetch_depth: 4 }}\n"
      "sampler: {{ shuffle: true, seed: 5, order: shards, shuffle_window: 1 }}\n"
      "nodes:\n"
      "  - name: load\n"
      "    type: webdataset\n"
      "    params: {{ shards: '{}', height: 16, width: 16, seed: 3{} }}\n"
      "  - {{ name: train, type: capture }}\n",
      epochs, shards, params);
}

TEST(WebDatasetIndexFiles, GiveTheSameSamplesAsTheTarsHeaders) {
  TempDir dir;
  shards_with_index(dir);
  for (const char* name : {"gnu.tar", "formats.tar"}) {  // long names, pax headers, odd members
    fs::copy_file(formats().file(name), dir.file(name));
    ASSERT_EQ(wds_index(dir.file(name)).first, 0);
  }
  // The script does not replace an index file unless told to.
  EXPECT_EQ(wds_index(dir.file("gnu.tar")),
            std::make_pair(1, "wds_index: " + dir.file("gnu.tar") + ": " + dir.file("gnu.idx") +
                                  " exists (--force replaces it)\n"));
  const std::string pipeline = ", batch_size: 4, on_error: skip";
  for (const std::string& set :
       {std::string("photos-{000..002}"), std::string("gnu"), std::string("formats")}) {
    SCOPED_TRACE(set);
    const std::string params = ", height: 16, width: 16, seed: 3";
    const Outcome headers =
        run(chain(dir.file(set + ".tar"), params, pipeline, "shuffle: true, seed: 9"));
    const Outcome indexed =
        run(chain(dir.file(set + ".tar"), params + ", index: '" + dir.file(set + ".idx") + "'",
                  pipeline, "shuffle: true, seed: 9"));
    ASSERT_FALSE(headers.x.empty());
    EXPECT_EQ(indexed.x, headers.x);
    EXPECT_EQ(indexed.y, headers.y);
    EXPECT_EQ(indexed.seen->samples, headers.seen->samples);
  }
}

TEST(WebDatasetIndexFiles, ShardsByUrlLargerThanTheCacheStreamDuringTheRun) {
  TempDir dir;
  shards_with_index(dir);
  TempDir work;
  Nginx nginx(dir.file(""), work.file("nginx"));
  std::uint64_t largest = 0, all = 0, indexes = 0;
  for (int i = 0; i < 3; ++i) {
    const std::uint64_t bytes = fs::file_size(dir.file(fmt::format("photos-{:03}.tar", i)));
    largest = std::max(largest, bytes);
    all += bytes;
    indexes += fs::file_size(dir.file(fmt::format("photos-{:03}.idx", i)));
  }
  // Room for the index files and two tars (the one read and the next), not for all three.
  const std::uint64_t budget = indexes + 2 * largest;
  ASSERT_LT(budget, indexes + all);
  const Outcome local = run(streamed(dir.file("photos-{000..002}.tar"), ""), 2);
  ASSERT_EQ(local.x.size(), 80u);  // 40 samples, 2 epochs
  const Outcome remote =
      run(streamed(nginx.url("photos-{000..002}.tar"),
                   fmt::format(", index: '{}', cache_dir: '{}', cache_bytes: {}, transfers: 2",
                               nginx.url("photos-{000..002}.idx"), work.file("cache"), budget)),
          2);
  EXPECT_EQ(remote.x, local.x);
  EXPECT_EQ(remote.y, local.y);
  EXPECT_EQ(remote.seen->samples, local.seen->samples);  // batch by batch, in order
  const auto& extra = remote.report.extra;
  EXPECT_LE(extra.at("load.remote_peak_cache_bytes"), static_cast<double>(budget));
  // A tar let go in epoch 0 was evicted for the next and fetched again in epoch 1.
  EXPECT_GT(extra.at("load.remote_evicted_bytes"), 0.0);
  EXPECT_GT(extra.at("load.remote_bytes_fetched"), static_cast<double>(indexes + all));
  EXPECT_LE(extra.at("load.remote_bytes_fetched"), static_cast<double>(indexes + 2 * all));
}

// Stopped part way through epoch 0, checkpointed and resumed by a new pipeline, a streamed run
// whose tars do not all fit the cache delivers the uninterrupted run's batches.
TEST(WebDatasetIndexFiles, AStreamedRunResumedMidEpochEqualsTheUninterruptedRun) {
  TempDir dir;
  shards_with_index(dir);
  TempDir work;
  Nginx nginx(dir.file(""), work.file("nginx"));
  const std::uint64_t budget = 3000 + 2 * fs::file_size(dir.file("photos-000.tar"));
  const std::string yaml =
      streamed(nginx.url("photos-{000..002}.tar"),
               fmt::format(", index: '{}', cache_dir: '{}', cache_bytes: {}",
                           nginx.url("photos-{000..002}.idx"), work.file("cache"), budget));
  const Outcome whole = run(yaml, 2);
  ASSERT_EQ(whole.seen->samples.size(), 16u);  // 8 batches of 5 an epoch
  auto seen = std::make_shared<Captured>();
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, seen);
  {
    Pipeline p(load_config_string(yaml, r), r);
    RunOptions options;
    options.stop_after = 3;
    p.run(options);
    p.save_checkpoint(work.file("ckpt"));
  }
  ASSERT_EQ(seen->samples.size(), 3u);
  PipelineConfig config = load_config_string(yaml, r);
  config.pipeline.resume_from = work.file("ckpt");
  Pipeline(config, r).run();
  EXPECT_EQ(seen->samples, whole.seen->samples);
  EXPECT_EQ(seen->x, whole.seen->x);
  EXPECT_EQ(seen->y, whole.seen->y);
}

TEST(WebDatasetIndexFiles, AShardThatDoesNotMatchItsIndexFailsItsBatchNamingBoth) {
  TempDir dir;
  shards_with_index(dir);
  // photos-001.idx loses its last sample (and says so in its header).
  std::string idx = text_of(dir.file("photos-001.idx"));
  idx.erase(idx.rfind('\n', idx.size() - 2) + 1);
  idx.replace(0, idx.find('\n'), "v1.2 13");
  std::ofstream(dir.file("photos-001.idx")) << idx;
  TempDir work;
  Nginx nginx(dir.file(""), work.file("nginx"));
  const std::string message =
      run_error(streamed(nginx.url("photos-{000..002}.tar"),
                         fmt::format(", index: '{}', cache_dir: '{}'",
                                     nginx.url("photos-{000..002}.idx"), work.file("cache")),
                         1));
  const std::string tail = ": " + nginx.url("photos-001.tar") + ": does not match its index " +
                           nginx.url("photos-001.idx") +
                           ": the index lists 13 samples, the shard holds 14 (write the index "
                           "again from the shard)";
  EXPECT_EQ(message.rfind(kLoad + " batch ", 0), 0u) << message;
  ASSERT_GE(message.size(), tail.size()) << message;
  EXPECT_EQ(message.substr(message.size() - tail.size()), tail) << message;
}

TEST(WebDatasetIndexFiles, ADamagedIndexIsRefusedAtBuildWithItsFileAndLine) {
  TempDir dir;
  shards_with_index(dir);
  const std::string shards = dir.file("photos-{000..002}.tar");
  const std::string first = dir.file("photos-000.idx");
  const std::string good = text_of(first);
  auto with_first = [&](const std::string& text) {
    std::ofstream(first) << text;
    return build_error(chain(shards, ", index: '" + dir.file("photos-{000..002}.idx") + "'", "",
                             "shuffle: false"));
  };
  EXPECT_EQ(with_first("v1.1 14\n" + good.substr(good.find('\n') + 1)),
            kLoad + ": " + first +
                ":1: 'v1.1 14' is not the header 'v1.2 <samples>' of a WebDataset index (the "
                "format of DALI's wds2idx)");
  EXPECT_EQ(
      with_first("v1.2 1\ncls 512 2\n"),
      kLoad + ": " + first + ":2: 3 fields; a sample is groups of 'extension offset size name'");
  const std::uint64_t size = fs::file_size(dir.file("photos-000.tar"));
  EXPECT_EQ(with_first(fmt::format("v1.2 1\ncls {} 2 a.cls\n", size)),
            kLoad + ": " + first +
                fmt::format(":2: member 'a.cls' at offset {} of 2 bytes runs "
                            "past the shard's {} bytes",
                            size, size));
  EXPECT_EQ(with_first("v1.2 2\ncls 512 2 a.cls jpg 1536 20 a.jpg\n"),
            kLoad + ": " + first + ": says 2 samples and lists 1");
  // A line longer than any sample's (64 KiB) is refused when it passes the bound, however long
  // it runs: 64 MiB with no newline is not read into memory whole.
  EXPECT_EQ(with_first("v1.2 1\n" + std::string(std::size_t{64} << 20, '7')),
            kLoad + ": " + first +
                ":2: a line longer than 65536 bytes (a sample's line lists its members' "
                "extensions, offsets, sizes and names)");
  std::ofstream(first) << good;
  EXPECT_EQ(build_error(chain(shards, ", index: '" + first + "'", "", "shuffle: false")),
            kLoad +
                ": index: names 1 file for 3 shards (one index file per shard, in the shards' "
                "order)");
}
#endif

}  // namespace
}  // namespace flowfeed
