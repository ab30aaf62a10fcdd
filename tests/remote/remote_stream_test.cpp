// npy shards by URL streamed during the run (sampler.order: shards): the same bytes and batches
// as the local run with a cache smaller than the data set (its budget never exceeded), an exact
// resume mid-epoch, a shard that fails during the run named with its URL and status, the verdict
// blaming the network behind a slow proxy, and Ctrl-C ending the run and its transfers promptly.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "flowfeed/remote/shard_stream.hpp"
#include "tests/apps/runner_process.hpp"
#include "tests/error_of.hpp"
#include "tests/nodes/npy_storage_fixture.hpp"
#include "tests/remote/servers.hpp"

namespace flowfeed {
namespace {

namespace fs = std::filesystem;
using namespace testing_files;
using remote_test::Nginx;

std::size_t count_ext(const std::string& dir, const std::string& ext) {
  std::size_t n = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) n += e.path().extension() == ext;
  return n;
}

class RemoteStreamTest : public NpyStorageTest {
 protected:
  // Six shards of 12 rows of 1000 bytes: each features file ~12 KB, the data set ~75 KB.
  void SetUp() override { write_shards({12, 12, 12, 12, 12, 12}, 1000); }
  std::string url_params(const std::string& base, const std::string& extra = "") {
    return "features: '" + base + "train-{00..05}.npy', labels: '" + base +
           "train-labels-{00..05}.npy', cache_dir: '" + cache_.file("c") + "'" + extra;
  }
  std::uint64_t data_bytes() {
    std::uint64_t total = 0;
    for (const auto& e : fs::directory_iterator(dir_.file(""))) {
      if (e.path().extension() == ".npy") total += e.file_size();
    }
    return total;
  }
  static constexpr const char* kOrder = "shuffle: true, order: shards, shuffle_window: 2";
  // Room for four shards at a time (two batches in flight, each reading a window of two):
  // less than the six of the data set.
  static constexpr const char* kSmallCache = ", cache_bytes: 52000, transfers: 2";
  /// The base URL of a fault_proxy.py with `args` in front of an nginx serving the shards (both
  /// run until the test ends).
  std::string behind_proxy(std::vector<std::string> args) {
    nginx_ = std::make_unique<Nginx>(dir_.file(""), cache_.file("nginx"));
    proxy_ = remote_test::fault_proxy(*nginx_, std::move(args));
    return remote_test::base_url(*proxy_);
  }
  TempDir cache_;
  std::unique_ptr<Nginx> nginx_;
  std::unique_ptr<remote_test::Child> proxy_;  // stops before nginx_
};

TEST_F(RemoteStreamTest, ADataSetLargerThanTheCacheMatchesTheLocalRun) {
  run(chain(glob_params(), kOrder));
  const std::vector<std::uint32_t> local = check_bytes();
  const auto local_samples = seen_->samples;
  ASSERT_EQ(local.size(), 144u);  // two epochs
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  ASSERT_GT(data_bytes(), 52000u * 4 / 3);
  const RunReport report = run(chain(url_params(nginx.url(""), kSmallCache), kOrder));
  EXPECT_EQ(check_bytes(), local);
  EXPECT_EQ(seen_->samples, local_samples);
  // The cache never held more than its budget, so shards were evicted and fetched again in the
  // second epoch: more bytes crossed the network than the data set holds.
  EXPECT_LE(report.extra.at("load.remote_peak_cache_bytes"), 52000.0);
  EXPECT_GT(report.extra.at("load.remote_peak_cache_bytes"), 0.0);
  EXPECT_GT(report.extra.at("load.remote_evicted_bytes"), 0.0);
  EXPECT_GT(report.extra.at("load.remote_bytes_fetched"), static_cast<double>(data_bytes()));
  EXPECT_EQ(count_ext(cache_.file("c"), ".part"), 0u);
  EXPECT_EQ(report.extra.at("load.remote_retries"), 0.0);
  EXPECT_EQ(report.extra.at("load.remote_retry_seconds"), 0.0);
  EXPECT_GE(report.extra.at("load.remote_wait_seconds"), 0.0);
}

// Shards of other sizes than six of 12 rows: of one size with a shorter last one (a sample's
// shard found by a division), and of sizes all different, one of a single row (found by a
// search). Each delivers the bytes, samples and order of the local run.
TEST_F(RemoteStreamTest, ShardsOfUnequalSizesMatchTheLocalRun) {
  for (const std::vector<std::size_t>& rows :
       {std::vector<std::size_t>{12, 12, 12, 12, 12, 7}, {12, 5, 20, 12, 1, 9}}) {
    write_shards(rows, 1000);
    run(chain(glob_params(), kOrder));
    const std::vector<std::uint32_t> local = check_bytes();
    const auto local_samples = seen_->samples;
    Nginx nginx(dir_.file(""), cache_.file("nginx"));
    fs::remove_all(cache_.file("c"));
    run(chain(url_params(nginx.url("")), kOrder));
    EXPECT_EQ(check_bytes(), local) << rows[5];
    EXPECT_EQ(seen_->samples, local_samples) << rows[5];
  }
}

// Stopped part way through an epoch, checkpointed and resumed by a new pipeline, a streamed run
// with a cache smaller than the data set delivers what an uninterrupted run delivers.
TEST_F(RemoteStreamTest, ResumeMidEpochEqualsTheUninterruptedRun) {
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  const std::string text = chain(url_params(nginx.url(""), kSmallCache), kOrder);
  run(text);
  const std::shared_ptr<Captured> whole = seen_;
  ASSERT_EQ(whole->samples.size(), 18u);  // 9 batches an epoch
  // Stopped mid epoch 0, in the third window of shards.
  const Resumed parts = stop_and_resume(text, 5, cache_.file("ckpt"));
  ASSERT_EQ(parts.stopped_batches, 5u);
  EXPECT_LE(parts.report.extra.at("load.remote_peak_cache_bytes"), 52000.0);
  expect_same_batches(*parts.seen, *whole);
}

// A shard that cannot be fetched during the run fails the batch that needs it with a DataError
// naming its URL and the status (on_error: fail, the default); the build fetched only the first.
TEST_F(RemoteStreamTest, AShardThatFailsDuringTheRunIsADataErrorWithItsUrl) {
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  seen_ = std::make_shared<Captured>();
  const Registry r = capture_registry(seen_);
  // A budget of three shards: the transfer cannot reach shard 4 before the run.
  Pipeline p(
      load_config_string(chain(url_params(nginx.url(""), ", transfers: 1, cache_bytes: 40000"),
                               "shuffle: false, order: shards"),
                         r),
      r);
  // Gone from the server after the build read its header.
  fs::remove(dir_.file("train-04.npy"));
  const std::string error = test::error_of<Error>([&] { p.run(); });
  // Rows 48-59 (shard 4) are in batches 6 and 7, which two bodies load at once: either may fail
  // first, with the same cause.
  const std::string cause = " (epoch 0): " + nginx.url("train-04.npy") +
                            ": HTTP 404 Not Found (no such object: check the URL (bucket, prefix "
                            "and shard names))";
  EXPECT_TRUE(error == "node 'load' (npy, <string>:4) batch 6" + cause ||
              error == "node 'load' (npy, <string>:4) batch 7" + cause)
      << error;
}

// Under pipeline.on_error: skip the batches that need the shard that fails are skipped (each
// tries it again) and the run goes on with the others.
TEST_F(RemoteStreamTest, UnderOnErrorSkipTheBatchesOfAFailedShardAreSkipped) {
  Nginx nginx(dir_.file(""), cache_.file("nginx"));
  seen_ = std::make_shared<Captured>();
  const Registry r = capture_registry(seen_);
  std::string text = chain(url_params(nginx.url(""), ", transfers: 1, cache_bytes: 40000"),
                           "shuffle: false, order: shards");
  text.replace(text.find("epochs: 2"), 9, "epochs: 1, on_error: skip, max_skipped: 5");
  Pipeline p(load_config_string(text, r), r);
  fs::remove(dir_.file("train-04.npy"));
  const RunReport report = p.run();
  // Batches 6 (samples 48-55) and 7 (56-63) read shard 4 (48-59).
  EXPECT_EQ(report.skipped_batches, 2u);
  EXPECT_EQ(report.samples, 56u);
  ASSERT_EQ(seen_->samples.size(), 7u);
  EXPECT_EQ(seen_->samples.back().front(), 64u);
  ASSERT_FALSE(report.warnings.empty());
  EXPECT_NE(report.warnings.front().find(nginx.url("train-04.npy") + ": HTTP 404 Not Found"),
            std::string::npos)
      << report.warnings.front();
}

// Faults during the run (503, a reset mid-body) are retried and resumed as at build: every
// sample is delivered once, with the bytes and order of the local run.
TEST_F(RemoteStreamTest, FaultsDuringTheRunAreRetried) {
  run(chain(glob_params(), kOrder));
  const std::vector<std::uint32_t> local = check_bytes();
  const std::string base =
      behind_proxy({"--rate", "0.3", "--faults", "503,reset", "--seed", "3", "--methods", "GET"});
  const RunReport report = run(chain(url_params(base, kSmallCache), kOrder));
  EXPECT_EQ(check_bytes(), local);
  EXPECT_GT(report.extra.at("load.remote_retries"), 0.0);
  // The proxy's first fault is a 503 (they alternate, 503 first): its lost try and the wait
  // after it are counted (25 ms at least).
  EXPECT_GE(report.extra.at("load.remote_retry_seconds"), 0.025);
  EXPECT_LE(report.extra.at("load.remote_peak_cache_bytes"), 52000.0);
}

// Behind a proxy that sends every body slowly the loader waits for shards most of its time:
// the verdict names the network; the build asked only for the first shard.
TEST_F(RemoteStreamTest, ASlowNetworkIsTheVerdict) {
  const std::string base = behind_proxy({"--bandwidth", "40000"});
  seen_ = std::make_shared<Captured>();
  const Registry r = capture_registry(seen_);
  std::string text = chain(url_params(base, ", transfers: 1"), kOrder, "");
  text.replace(text.find("epochs: 2"), 9, "epochs: 1");
  Pipeline p(load_config_string(text, r), r);
  // Built: the first shard is in the cache, most of the rest is not (yet).
  EXPECT_LT(count_ext(cache_.file("c"), ".shard"), 8u);
  const RunReport report = p.run();
  EXPECT_EQ(report.samples, 72u);
  EXPECT_EQ(report.verdict.rfind("load-bound: network (its bodies waited for shards ", 0), 0u)
      << report.verdict;
  EXPECT_GT(report.extra.at("load.remote_wait_share"), 0.5);
  EXPECT_GT(report.extra.at("load.remote_waits"), 0.0);
}

// Ctrl-C during a streamed run: the runner drains the two batches in flight, the transfers
// ahead of them stop, and it exits 130 long before the shards still to come could have arrived.
TEST_F(RemoteStreamTest, CtrlCDuringTheRunEndsTheTransfersPromptly) {
  // About 1.2 s a features file: the run needs more than seven seconds.
  const std::string base = behind_proxy({"--bandwidth", "10000"});
  const std::string config = test::write_config(
      "remote_stream_ctrl_c",
      "pipeline: { epochs: 1, batch_size: 2, prefetch_depth: 2, device: host }\n"
      "sampler: { shuffle: false, order: shards }\n"
      "nodes:\n  - name: load\n    type: npy\n    params: { " +
          url_params(base, ", transfers: 1") + " }\n  - { name: train, type: discard }\n");
  test::Runner r({config});
  // The run has begun once the first shard is complete and the next transfer under way.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while ((count_ext(cache_.file("c"), ".shard") < 2 || count_ext(cache_.file("c"), ".part") == 0) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(count_ext(cache_.file("c"), ".part"), 1u) << r.err();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto sent = std::chrono::steady_clock::now();
  r.signal(SIGINT);
  EXPECT_EQ(r.wait(20), 130) << r.err();
  // Promptly: the shards still to come need seconds more.
  EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(5));
  EXPECT_LT(count_ext(cache_.file("c"), ".shard"), 12u);
}

// interrupt_builds() (what an embedding program's SIGINT handler calls) ends a build that waits for
// the network within about a second, whether it fetches every shard or the first one streamed,
// with the run's cancellation (RunCancelled) naming the URL; after resume_builds() the same
// config builds again.
TEST_F(RemoteStreamTest, InterruptBuildsEndsABuildWaitingForTheNetwork) {
  // Each answer comes 20 s late.
  const std::string base = behind_proxy({"--delay", "20"});
  for (const char* order : {"samples", "shards"}) {
    SCOPED_TRACE(order);
    const std::string yaml = chain(url_params(base, ", transfers: 1, timeout_s: 60"),
                                   std::string("shuffle: false, order: ") + order);
    std::string error;
    bool cancelled = false;
    std::thread build([&] {
      try {
        const Registry r = capture_registry(seen_);
        Pipeline p(load_config_string(yaml, r), r);
      } catch (const RunCancelled& e) {
        cancelled = true;
        error = e.what();
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const auto sent = std::chrono::steady_clock::now();
    interrupt_builds();
    build.join();
    resume_builds();
    EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::milliseconds(1500));
    EXPECT_TRUE(cancelled) << error;
    EXPECT_NE(error.find(base + "train-00.npy: the "), std::string::npos) << error;
    EXPECT_NE(error.find(" was cancelled (the "), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace flowfeed
