// pipeline_runner with shards by URL: Ctrl-C while the shards are fetched (the pipeline is being
// built) ends the process at once, with the partial transfer left for the next run, which
// resumes it and runs to the end.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <thread>

#include "flowfeed/nodes/detail/npy_file.hpp"
#include "tests/apps/runner_process.hpp"
#include "tests/nodes/test_files.hpp"
#include "tests/remote/servers.hpp"

namespace flowfeed {
namespace {

namespace fs = std::filesystem;

bool has_part(const std::string& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() == ".part") return true;
  }
  return false;
}

TEST(RemoteRunner, CtrlCDuringTheFetchEndsAtOnceAndTheNextRunResumes) {
  testing_files::TempDir dir_;
  const std::vector<std::uint8_t> x(40 * 16384, 7);
  const std::vector<std::int32_t> y(40, 1);
  for (const char* n : {"00", "01"}) {
    write_npy(dir_.file(std::string("train-") + n + ".npy"), NpyDtype::uint8, {40, 16384},
              x.data());
    write_npy(dir_.file(std::string("train-labels-") + n + ".npy"), NpyDtype::int32, {40},
              y.data());
  }
  testing_files::TempDir work;
  remote_test::Nginx nginx(dir_.file(""), work.file("nginx"));
  // Every body arrives in four pieces 0.4 s apart: a shard takes 1.6 s.
  auto proxy = remote_test::python_server(
      "fault_proxy.py", {"--upstream", std::to_string(nginx.port()), "--rate", "1", "--faults",
                         "slow", "--slow-s", "0.4", "--methods", "GET"});
  std::ostringstream base;
  base << "http://127.0.0.1:" << proxy->port() << "/";
  const std::string cache = work.file("cache");
  std::ostringstream yaml;
  yaml << "pipeline: { epochs: 1, batch_size: 8, device: host }\n"
       << "nodes:\n  - name: load\n    type: npy\n    params: { features: '" << base.str()
       << "train-{00..01}.npy', labels: '" << base.str()
       << "train-labels-{00..01}.npy', transfers: 1, cache_dir: '" << cache << "' }\n"
       << "  - { name: train, type: discard }\n";
  const std::string config = test::write_config("remote_ctrl_c", yaml.str());
  {
    test::Runner r({config});
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!has_part(cache) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(has_part(cache)) << r.err();
    const auto sent = std::chrono::steady_clock::now();
    r.signal(SIGINT);
    EXPECT_EQ(r.wait(10), 130) << r.err();
    // Promptly: well before the transfer in progress could have ended.
    EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(5));
  }
  EXPECT_TRUE(has_part(cache));  // the partial shard, resumed below
  test::Runner again({config});
  EXPECT_EQ(again.wait(60), 0) << again.err();
  EXPECT_FALSE(has_part(cache));
  std::size_t shards = 0;
  for (const auto& e : fs::directory_iterator(cache)) shards += e.path().extension() == ".shard";
  EXPECT_EQ(shards, 4u);
}

}  // namespace
}  // namespace flowfeed
