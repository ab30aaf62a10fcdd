// Several branches and NCCL on one GPU: `pipeline.devices: [0, 0]` runs two upload → train branches
// on device 0, each with its own cuda_upload streams and pool; the mlp node's NCCL all-reduce at
// world size 1 trains exactly as without one; two processes sharing one GPU fail clearly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "flowfeed/mlp/mlp_node.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/nccl.hpp"
#include "flowfeed/pipeline.hpp"
#include "gpu_test.hpp"
#include "tests/apps/process_util.hpp"

namespace flowfeed {
namespace {

namespace fs = std::filesystem;

std::string two_branches(int streams, bool ordered) {
  return "pipeline: { epochs: 2, batch_size: 64, prefetch_depth: 6, device: cuda, devices: [0, "
         "0], ordered: " +
         std::string(ordered ? "true" : "false") +
         ", stall_timeout_s: 30 }\n"
         "sampler: { shuffle: true, seed: 4 }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, concurrency: 2, params: { samples: 2000, "
         "sample_shape: [784], seed: 7 } }\n"
         "  - { name: stage, type: pinned_staging }\n"
         "  - { name: upload, type: cuda_upload, streams: " +
         std::to_string(streams) +
         " }\n"
         "  - { name: train, type: device_checksum }\n";
}

class TwoBranchesOnOneGpu : public ::testing::TestWithParam<bool> {};

TEST_P(TwoBranchesOnOneGpu, EachBranchVerifiesItsBytesOnItsOwnStreams) {
  FLOWFEED_REQUIRE_GPU();
  Registry r = builtin_registry();
  Pipeline p(load_config_string(two_branches(2, GetParam()), r, {}, "x.yaml"), r);
  for (int run = 0; run < 2; ++run) {
    const RunReport report = test::within(120, "two-branch run", [&] { return p.run(); });
    // 2000 samples in batches of 64: 32 batches per epoch (the last has 16 rows), two epochs.
    EXPECT_EQ(report.batches, 64u);
    EXPECT_EQ(report.samples, 4000u);
    EXPECT_EQ(report.allocations_after_build, 0u);
    EXPECT_EQ(report.device.rfind("cuda:0,0", 0), 0u) << report.device;
    // Each branch's device_checksum verified its own half on the device.
    const double first = report.extra.at("train@0.bytes_verified");
    const double second = report.extra.at("train@0.1.bytes_verified");
    EXPECT_GT(first, 0);
    EXPECT_GT(second, 0);
    EXPECT_EQ(first + second, static_cast<double>(report.bytes_uploaded));
    ASSERT_EQ(report.branches.size(), 2u);
    EXPECT_EQ(report.branches[0].batches, 32u);
    EXPECT_EQ(report.branches[1].batches, 32u);
    EXPECT_EQ(static_cast<double>(report.branches[0].bytes_uploaded), first);
    EXPECT_EQ(static_cast<double>(report.branches[1].bytes_uploaded), second);
    // Two cuda_upload nodes with two streams each: branch 0's streams first, each branch spread
    // evenly over its own streams.
    ASSERT_EQ(report.stream_copies.size(), 4u);
    EXPECT_EQ(report.stream_copies[0] + report.stream_copies[1], 32u);
    EXPECT_EQ(report.stream_copies[2] + report.stream_copies[3], 32u);
    for (std::uint64_t copies : report.stream_copies) EXPECT_EQ(copies, 16u);
    // Each upload owns its device pool.
    int device_pools = 0;
    for (const auto& pool : report.pools) {
      if (pool.kind != "device") continue;
      ++device_pools;
      EXPECT_TRUE(pool.name == "upload@0.device" || pool.name == "upload@0.1.device") << pool.name;
      EXPECT_EQ(pool.buffers, 6u);
    }
    EXPECT_EQ(device_pools, 2);
    EXPECT_EQ(p.free_buffers(), p.total_buffers());
  }
}

INSTANTIATE_TEST_SUITE_P(Ordered, TwoBranchesOnOneGpu, ::testing::Values(true, false));

// ---- NCCL on one GPU -----------------------------------------------------------------------

/// Skips the test, with the reason, when libnccl.so.2 cannot be loaded.
#define FLOWFEED_REQUIRE_NCCL()                                                         \
  std::string nccl_version;                                                             \
  try {                                                                                 \
    nccl_version = nccl::version();                                                     \
  } catch (const std::exception& e) {                                                   \
    GTEST_SKIP() << "NCCL cannot be loaded (" << e.what() << "): this test needs NCCL"; \
  }

fs::path temp_dir(const std::string& tag) {
  fs::path dir =
      fs::temp_directory_path() / ("flowfeed_nccl_" + std::to_string(getpid()) + "_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string mlp_config(const std::string& all_reduce, const std::string& id_file) {
  return "pipeline: { epochs: 2, batch_size: 32, prefetch_depth: 4, device: cuda }\n"
         "sampler: { shuffle: true, seed: 3, rank: 0, world: 1 }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, concurrency: 2, params: { samples: 640, "
         "sample_shape: [20], seed: 5, classes: 4 } }\n"
         "  - { name: stage, type: pinned_staging }\n"
         "  - { name: upload, type: cuda_upload }\n"
         "  - name: train\n"
         "    type: mlp\n"
         "    params: { hidden: [16], classes: 4, lr: 0.05, momentum: 0.9, seed: 2, all_reduce: " +
         all_reduce + (id_file.empty() ? "" : ", nccl_id_file: " + id_file) + " }\n";
}

/// Runs the config; returns the mlp node's final parameters, flattened, and the report.
std::vector<float> train(const std::string& yaml, RunReport* report) {
  Registry r = builtin_registry();
  MlpNode* mlp = nullptr;
  NodeType type = *r.find("mlp");
  auto create = type.create;
  type.create = [create, &mlp](const NodeSpec& spec) {
    std::unique_ptr<Node> node = create(spec);
    mlp = dynamic_cast<MlpNode*>(node.get());
    return node;
  };
  r.set(std::move(type));
  Pipeline p(load_config_string(yaml, r, {}, "x.yaml"), r);
  *report = test::within(120, "mlp run", [&] { return p.run(); });
  std::vector<float> out;
  const MlpParams params = mlp->params();
  for (const auto* part : {&params.weights, &params.biases}) {
    for (const auto& layer : *part) out.insert(out.end(), layer.begin(), layer.end());
  }
  return out;
}

TEST(NcclOneGpu, WorldSizeOneTrainsExactlyAsWithoutAllReduce) {
  FLOWFEED_REQUIRE_GPU();
  FLOWFEED_REQUIRE_NCCL();
  std::printf("NCCL %s\n", nccl_version.c_str());
  const fs::path dir = temp_dir("world1");
  RunReport plain_report, nccl_report;
  const std::vector<float> plain = train(mlp_config("none", ""), &plain_report);
  const std::vector<float> reduced =
      train(mlp_config("nccl", (dir / "nccl.id").string()), &nccl_report);
  // The NCCL run really had a communicator (of one rank).
  EXPECT_EQ(nccl_report.extra.at("train_world"), 1.0);
  EXPECT_EQ(plain_report.extra.count("train_world"), 0u);
  EXPECT_EQ(nccl_report.batches, 40u);
  ASSERT_EQ(plain.size(), reduced.size());
  ASSERT_GT(plain.size(), 0u);
  double worst = 0;
  std::size_t differ = 0;
  for (std::size_t i = 0; i < plain.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(plain[i]) - reduced[i]));
    if (plain[i] != reduced[i]) ++differ;
  }
  EXPECT_LE(worst, 1e-6) << differ << " of " << plain.size() << " parameters differ";
  std::printf("%zu of %zu parameters differ bitwise (largest difference %g)\n", differ,
              plain.size(), worst);
  fs::remove_all(dir);
}

TEST(NcclOneGpu, TwoProcessesOnOneGpuFailClearlyInsteadOfHanging) {
  FLOWFEED_REQUIRE_GPU();
  FLOWFEED_REQUIRE_NCCL();
  const fs::path dir = temp_dir("two");
  const fs::path config = dir / "dp.yaml";
  {
    std::string yaml = mlp_config("nccl", (dir / "nccl.id").string());
    // The ranks come from RANK/WORLD_SIZE: drop the sampler's explicit rank and world.
    const std::string fixed = ", rank: 0, world: 1";
    yaml.erase(yaml.find(fixed), fixed.size());
    std::ofstream(config) << yaml;
  }
  // Both ranks on GPU 0, each with a 20 s collective timeout; the shell's limit catches a hang.
  auto rank = [&](int r) {
    return "RANK=" + std::to_string(r) + " WORLD_SIZE=2 timeout -k 5 90 " + FLOWFEED_DP_PROBE +
           " " + config.string() + " " + (dir / "params").string() +
           " nodes.train.params.collective_timeout_s=20 > " +
           (dir / ("out" + std::to_string(r))).string() + " 2>&1; echo $? > " +
           (dir / ("rc" + std::to_string(r))).string();
  };
  const int status = test::run_shell("(" + rank(0) + ") & (" + rank(1) + ") & wait");
  ASSERT_EQ(status, 0);
  auto read = [](const fs::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  for (int r = 0; r < 2; ++r) {
    const std::string rc = read(dir / ("rc" + std::to_string(r)));
    const std::string out = read(dir / ("out" + std::to_string(r)));
    SCOPED_TRACE("rank " + std::to_string(r) + " exit " + rc + " output:\n" + out);
    // Not killed by the shell's limit: it ended by itself.
    EXPECT_NE(std::atoi(rc.c_str()), 124);
    if (std::atoi(rc.c_str()) != 0) {
      // NCCL refused the shared GPU (or a rank gave up waiting): the message says where.
      EXPECT_NE(out.find("error: "), std::string::npos);
      EXPECT_TRUE(out.find("NCCL") != std::string::npos || out.find("nccl") != std::string::npos);
    }
    std::printf("rank %d exit %s%s", r, rc.c_str(), out.c_str());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace flowfeed
