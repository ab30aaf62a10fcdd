// The webdataset and tokens loaders read shards named by URL (nginx on 127.0.0.1) exactly as the
// same shards on disk: every sample's bytes, label and window, and the order; token files also
// by Range requests (access: range), Megatron data sets too.
#include <gtest/gtest.h>

#include <filesystem>

#include "flowfeed/nodes/detail/token_stream.hpp"
#include "tests/nodes/token_corpus.hpp"
#include "tests/nodes/webdataset_fixture.hpp"
#include "tests/remote/servers.hpp"

namespace flowfeed {
namespace {

using namespace webdataset_testing;
using remote_test::Nginx;
using testing_files::TempDir;

#if FLOWFEED_TEST_IMAGES  // the image family is built
TEST(RemoteWebDataset, SamplesMatchTheLocalShards) {
  const Shards& s = photos();
  TempDir work;
  Nginx nginx(s.file(""), work.file("nginx"));
  const std::string params = ", height: 16, width: 16, seed: 3";
  const Outcome local = run(
      chain(s.file("photos-{000..002}.tar"), params, ", batch_size: 7", "shuffle: true, seed: 9"));
  ASSERT_EQ(local.x.size(), 40u);
  for (int warm = 0; warm < 2; ++warm) {
    const Outcome remote = run(chain(nginx.url("photos-{000..002}.tar"),
                                     params + ", cache_dir: '" + work.file("cache") + "'",
                                     ", batch_size: 7", "shuffle: true, seed: 9"));
    EXPECT_EQ(remote.x, local.x);
    EXPECT_EQ(remote.y, local.y);
    EXPECT_EQ(remote.seen->samples, local.seen->samples);  // batch by batch, in order
    EXPECT_EQ(remote.report.extra.at("load.remote_cache_hits"), warm ? 3.0 : 0.0);
  }
}

/// `text` with every `from` replaced by `to`.
std::string replaced(std::string text, const std::string& from, const std::string& to) {
  for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at)) {
    text.replace(at, from.size(), to);
    at += to.size();
  }
  return text;
}

// An error about a fetched shard names its URL, not the cached copy: at build (a damaged tar)
// and in a batch (an image that does not decode).
TEST(RemoteWebDataset, ErrorsNameTheUrl) {
  TempDir work;
  Nginx nginx(corrupt().file(""), work.file("nginx"));
  const std::string cache = ", cache_dir: '" + work.file("cache") + "'";
  for (const char* name : {"truncated.tar", "not_image.tar"}) {
    SCOPED_TRACE(name);
    const std::string local = corrupt().file(name);
    const std::string url = nginx.url(name);
    const bool at_build = std::string(name) == "truncated.tar";
    const std::string want = at_build ? build_error(chain(local, "")) : run_error(chain(local, ""));
    ASSERT_NE(want.find(local), std::string::npos) << want;
    EXPECT_EQ(at_build ? build_error(chain(url, cache)) : run_error(chain(url, cache)),
              replaced(want, local, url));
  }
}
#endif

// Raw token files by URL, fetched whole or read a window a Range request, are one stream in the
// order given, as the same files on disk.
TEST(RemoteTokens, RawFilesByUrlAreOneStreamInOrder) {
  const token_corpus::Corpus& c = token_corpus::licenses();
  TempDir dir;
  const std::size_t a = 70001, b = 150003;
  token_corpus::write_raw(dir.file("shard-0.bin"), c.tokens.data(), a, 2);
  token_corpus::write_raw(dir.file("shard-1.bin"), c.tokens.data() + a, b - a, 2);
  token_corpus::write_raw(dir.file("shard-2.bin"), c.tokens.data() + b, c.tokens.size() - b, 2);
  TempDir work;
  Nginx nginx(dir.file(""), work.file("nginx"));
  for (const std::string access : {"fetch", "range"}) {
    SCOPED_TRACE(access);
    const std::string cache = work.file("cache-" + access);
    const std::string yaml =
        "pipeline: { epochs: 2, batch_size: 8, prefetch_depth: 4, device: host, threads: 4 }\n"
        "sampler: { shuffle: true, seed: 4 }\n"
        "nodes:\n"
        "  - name: load\n"
        "    type: tokens\n"
        "    params: { files: '" +
        nginx.url("shard-{0..2}.bin") + "', context: 1000, access: " + access + ", cache_dir: '" +
        cache +
        "' }\n"
        "  - { name: upload, type: host_upload }\n"
        "  - { name: train, type: windows }\n";
    auto seen = std::make_shared<token_corpus::Seen>();
    const RunReport report = testing_files::run_with(
        yaml, [&](Registry& r) { token_corpus::register_window_sink(r, seen); });
    // Window s of every epoch starts at token s * 1000 of the concatenation, across the files.
    token_corpus::expect_windows(*seen, c.tokens, 1000, 2, [](std::uint32_t, std::uint32_t s) {
      return std::uint64_t{s} * 1000;
    });
    if (access == "range") {
      // Nothing of the tokens in the cache: each run of adjacent windows of a batch (1,000
      // uint16 tokens each) came by one Range request (two where it spans two files) of its x
      // and y together, 1,000 tokens a window and one more, and a byte a file at build.
      std::size_t windows = 0, runs = 0;
      for (const auto& batch : seen->batches) {
        windows += batch.samples.size();
        for (std::size_t i = 0; i < batch.samples.size(); ++i) {
          runs += i == 0 || batch.samples[i] != batch.samples[i - 1] + 1 ? 1 : 0;
        }
      }
      EXPECT_EQ(report.extra.at("load.remote_shards"), 0.0);
      EXPECT_EQ(static_cast<std::uint64_t>(report.extra.at("load.remote_bytes_fetched")),
                windows * 2000 + runs * 2 + 3);
      EXPECT_GE(report.extra.at("load.remote_range_reads"), static_cast<double>(runs + 3));
      EXPECT_LE(report.extra.at("load.remote_range_reads"), static_cast<double>(2 * runs + 3));
      for (const auto& e : std::filesystem::directory_iterator(cache)) {
        EXPECT_NE(e.path().extension(), ".shard") << e.path();
      }
    }
  }
}

// A Megatron-LM data set by URL (its prefixes; the .idx fetched, the .bin fetched or read a
// window a Range request) gives the local data set's windows, documents kept apart.
TEST(RemoteTokens, AMegatronDataSetByUrlGivesTheLocalWindows) {
  const token_corpus::Corpus& c = token_corpus::licenses();
  TempDir dir;
  std::vector<std::vector<std::uint32_t>> documents[2];
  std::size_t at = 0;
  for (std::size_t d = 0; at < c.tokens.size(); ++d) {
    const std::size_t n = std::min<std::size_t>(100 + (d * 37) % 400, c.tokens.size() - at);
    documents[d % 2].emplace_back(c.tokens.begin() + static_cast<std::ptrdiff_t>(at),
                                  c.tokens.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  write_megatron(dir.file("corpus-0"), DType::uint16, documents[0]);
  write_megatron(dir.file("corpus-1"), DType::uint16, documents[1]);
  TempDir work;
  Nginx nginx(dir.file(""), work.file("nginx"));
  auto run = [&](const std::string& files, const std::string& extra) {
    const std::string yaml =
        "pipeline: { epochs: 2, batch_size: 8, prefetch_depth: 4, device: host }\n"
        "sampler: { shuffle: true, seed: 4 }\n"
        "nodes:\n"
        "  - name: load\n"
        "    type: tokens\n"
        "    params: { files: '" +
        files +
        "', format: megatron, context: 64, cross_documents: false, positions: random, seed: 3, "
        "windows: 300" +
        extra +
        " }\n"
        "  - { name: train, type: windows }\n";
    auto seen = std::make_shared<token_corpus::Seen>();
    testing_files::run_with(yaml,
                            [&](Registry& r) { token_corpus::register_window_sink(r, seen); });
    return seen;
  };
  const auto local = run(dir.file("corpus-{0..1}"), "");
  ASSERT_EQ(local->batches.size(), 76u);  // 300 windows in batches of 8, two epochs
  for (const std::string access : {"fetch", "range"}) {
    SCOPED_TRACE(access);
    const auto remote = run(nginx.url("corpus-{0..1}"),
                            ", access: " + access + ", cache_dir: '" + work.file(access) + "'");
    ASSERT_EQ(remote->batches.size(), local->batches.size());
    for (std::size_t i = 0; i < local->batches.size(); ++i) {
      EXPECT_EQ(remote->batches[i].samples, local->batches[i].samples) << "batch " << i;
      EXPECT_EQ(remote->batches[i].x, local->batches[i].x) << "batch " << i;
      EXPECT_EQ(remote->batches[i].y, local->batches[i].y) << "batch " << i;
    }
  }
}

TEST(RemoteTokens, RangeAccessWithEosOrMmapIsAConfigErrorWithTheReason) {
  Registry r;
  register_builtin_nodes(r);
  auto problem = [&](const std::string& extra) {
    const std::string yaml =
        "pipeline: { device: host }\n"
        "nodes:\n"
        "  - name: load\n"
        "    type: tokens\n"
        "    params: { files: 'https://127.0.0.1:9/t.bin', context: 8, access: range" +
        extra +
        " }\n"
        "  - { name: train, type: discard }\n";
    return testing_files::error_of<ConfigError>([&] { load_config_string(yaml, r); });
  };
  EXPECT_NE(problem(", eos: 0, packing: best_fit")
                .find("nodes[0].params.access: range reads only the windows, and eos needs every "
                      "token read at build to find the documents: use a Megatron data set (its "
                      "index gives them), or access: fetch"),
            std::string::npos);
  EXPECT_NE(problem(", io: mmap")
                .find("nodes[0].params.access: range reads each window by an HTTP Range request "
                      "and maps no file: set io: pread, or access: fetch"),
            std::string::npos);
}

}  // namespace
}  // namespace flowfeed
