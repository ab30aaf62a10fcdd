// The file loaders read shards named by URL exactly as the same shards named by path: every
// sample's bytes and the order of every batch, from nginx on 127.0.0.1, cold and warm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>

#include "tests/error_of.hpp"
#include "tests/nodes/npy_storage_fixture.hpp"
#include "tests/remote/servers.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;
using remote_test::Nginx;

class RemoteNpyTest : public NpyStorageTest {
 protected:
  std::string url_params(const Nginx& nginx, const std::string& extra = "") {
    return "features: '" + nginx.url("train-{00..02}.npy") + "', labels: '" +
           nginx.url("train-labels-{00..02}.npy") + "', cache_dir: '" + cache_.file("c") + "'" +
           extra;
  }
  /// The bytes of the six files served (each smaller than the KiB a header read asks for).
  std::uint64_t served_bytes() const {
    std::uint64_t total = 0;
    for (const char* n : {"00", "01", "02"}) {
      for (const std::string f : {"train-", "train-labels-"}) {
        total += std::filesystem::file_size(dir_.file(f + n + ".npy"));
      }
    }
    EXPECT_LT(std::filesystem::file_size(dir_.file("train-00.npy")), 1024u);
    return total;
  }
  TempDir cache_;
};

TEST_F(RemoteNpyTest, SamplesAndOrderMatchTheLocalRunColdAndWarm) {
  write_shards({20, 20, 7}, 40);
  run(chain(glob_params(), "shuffle: true"));
  const std::vector<std::uint32_t> local = check_bytes();
  const auto local_samples = seen_->samples;
  ASSERT_EQ(local.size(), 94u);
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  for (const char* transfers : {"1", "auto"}) {
    SCOPED_TRACE(transfers);
    std::filesystem::remove_all(cache_.file("c"));
    for (int warm = 0; warm < 2; ++warm) {
      const RunReport report =
          run(chain(url_params(nginx, std::string(", transfers: ") + transfers), "shuffle: true"));
      EXPECT_EQ(check_bytes(), local);
      EXPECT_EQ(seen_->samples, local_samples);  // the same batches, in the same order
      // Six files (features and labels of three shards): fetched cold, found warm.
      EXPECT_EQ(report.extra.at("load.remote_shards"), 6.0);
      EXPECT_EQ(report.extra.at("load.remote_cache_hits"), warm ? 6.0 : 0.0);
      // Cold: every file, and before that each file's header (its first KiB: the whole of these
      // small files) read at build. Warm: only the first file's header, from the server.
      const double files = static_cast<double>(served_bytes());
      const double first =
          static_cast<double>(std::filesystem::file_size(dir_.file("train-00.npy")));
      EXPECT_EQ(report.extra.at("load.remote_bytes_fetched"), warm ? first : 2 * files);
      EXPECT_EQ(report.extra.at("load.remote_retries"), 0.0);
    }
  }
}

// A streamed loader's build asks for each file's size and header with one Range request (its
// Content-Range gives the size): no HEAD request besides.
TEST_F(RemoteNpyTest, AStreamedBuildAsksEachFileOnceForItsSizeAndHeader) {
  write_shards({20, 20, 7}, 40);
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  const Registry r = capture_registry(seen_);
  Pipeline p(load_config_string(chain(url_params(nginx), "shuffle: true, order: shards"), r), r);
  const std::vector<std::string> requests = nginx.requests();
  EXPECT_EQ(std::count(requests.begin(), requests.end(), "GET bytes=0-1023"), 6);
  EXPECT_EQ(std::count_if(requests.begin(), requests.end(),
                          [](const std::string& q) { return q.rfind("HEAD ", 0) == 0; }),
            0);
}

// Stopped part way through an epoch, checkpointed and resumed by a new pipeline (which finds the
// shards in the cache), a run by URL delivers what an uninterrupted run delivers, batch by batch.
TEST_F(RemoteNpyTest, ResumeMidEpochEqualsTheUninterruptedRun) {
  write_shards({20, 20, 7}, 40);
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  const std::string text = chain(url_params(nginx), "shuffle: true");
  run(text);
  const std::shared_ptr<Captured> whole = seen_;
  ASSERT_EQ(whole->samples.size(), 12u);                                // 6 batches an epoch
  const Resumed parts = stop_and_resume(text, 4, cache_.file("ckpt"));  // stopped mid epoch 0
  ASSERT_EQ(parts.stopped_batches, 4u);
  EXPECT_EQ(parts.report.extra.at("load.remote_cache_hits"), 6.0);
  expect_same_batches(*parts.seen, *whole);
}

TEST_F(RemoteNpyTest, AMissingShardFailsTheBuildNamingItsUrl) {
  write_shards({5, 5}, 8);
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  EXPECT_EQ(build_error(chain(url_params(nginx))),
            "node 'load' (npy, <string>:4): " + nginx.url("train-02.npy") +
                ": HTTP 404 Not Found (no such object: check the URL (bucket, prefix and shard "
                "names))");
}

// access: range reads the features by Range requests and fetches only the labels: the bytes and
// batches of the local run, nothing of the features in the cache.
TEST_F(RemoteNpyTest, RangeAccessDeliversTheLocalRunAndFetchesOnlyTheLabels) {
  write_shards({20, 20, 7}, 40);
  run(chain(glob_params(), "shuffle: true"));
  const std::vector<std::uint32_t> local = check_bytes();
  const auto local_samples = seen_->samples;
  ASSERT_EQ(local.size(), 94u);  // two epochs of 47
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  const RunReport report = run(chain(url_params(nginx, ", access: range"), "shuffle: true"));
  EXPECT_EQ(check_bytes(), local);
  EXPECT_EQ(seen_->samples, local_samples);
  std::uint64_t labels = 0;
  for (const char* n : {"00", "01", "02"}) {
    labels += std::filesystem::file_size(dir_.file(std::string("train-labels-") + n + ".npy"));
  }
  // Every sample's 40 bytes twice, the byte asked for at build, and each file's header (its
  // first KiB: the whole of these small files).
  EXPECT_EQ(report.extra.at("load.remote_bytes_fetched"),
            static_cast<double>(labels + 94 * 40 + 1 + served_bytes()));
  EXPECT_EQ(report.extra.at("load.remote_shards"), 3.0);        // the labels
  EXPECT_GE(report.extra.at("load.remote_range_reads"), 13.0);  // a run of rows a request at least
  std::uint64_t cached = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(cache_.file("c"))) {
    if (e.is_regular_file()) cached += e.file_size();
  }
  EXPECT_LE(cached, labels + 4096);  // the labels, and the cache's own small files
  const Registry registry = capture_registry(seen_);
  const std::string pinned = chain(url_params(nginx, ", access: range, io: mmap, pin: true"));
  const std::string message =
      test::error_of<ConfigError>([&] { load_config_string(pinned, registry); });
  EXPECT_NE(message.find("nodes[0].params.pin: true leaves the feature rows in the files' "
                         "mapping, and access: range maps no file set access: fetch, or pin: "
                         "false"),
            std::string::npos)
      << message;
}

// 30% of the requests fail (503 or a connection reset mid-body): each Range request is tried
// again, and every sample arrives once with the bytes of the local run.
TEST_F(RemoteNpyTest, RangeAccessRetriesFaults) {
  write_shards({20, 20, 7}, 40);
  run(chain(glob_params(), "shuffle: true"));
  const std::vector<std::uint32_t> local = check_bytes();
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  const auto proxy = remote_test::fault_proxy(
      nginx, {"--rate", "0.3", "--faults", "503,reset", "--seed", "3", "--methods", "GET"});
  const std::string base = remote_test::base_url(*proxy);
  const RunReport report = run(chain("features: '" + base + "train-{00..02}.npy', labels: '" +
                                         base + "train-labels-{00..02}.npy', cache_dir: '" +
                                         cache_.file("c") + "', access: range",
                                     "shuffle: true"));
  EXPECT_EQ(check_bytes(), local);
  EXPECT_GT(report.extra.at("load.remote_retries"), 0.0);
}

// A header length past NpyFile's limit is refused from the preamble read at build: the server
// sends the first kilobyte, not the megabytes the length field asks for.
TEST_F(RemoteNpyTest, AHeaderLongerThanTheLimitIsRefusedWithoutFetchingIt) {
  const std::size_t header_len = 2 * NpyFile::kMaxHeaderBytes;
  std::string bytes("\x93NUMPY\x02\x00", 8);
  for (int i = 0; i < 4; ++i) bytes += static_cast<char>((header_len >> (8 * i)) & 0xFF);
  bytes.resize(12 + header_len + 64, ' ');
  std::ofstream(dir_.file("big.npy"), std::ios::binary) << bytes;
  const std::int32_t labels[2] = {0, 1};
  write_npy(dir_.file("big-labels.npy"), NpyDtype::int32, {2}, labels);
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  EXPECT_EQ(
      build_error(chain("features: '" + nginx.url("big.npy") + "', labels: '" +
                        nginx.url("big-labels.npy") + "', cache_dir: '" + cache_.file("c") + "'")),
      "node 'load' (npy, <string>:4): " + nginx.url("big.npy") +
          ": bad header (header length 2097152 exceeds the limit of 1048576 bytes) "
          "re-save the array with numpy.save");
  EXPECT_LT(nginx.body_bytes_sent(), 4096u);
}

}  // namespace
}  // namespace flowfeed
