// Several runner processes, each told its rank by a launcher's environment variables, read
// disjoint shards that together cover the data set, in an order fixed by (seed, epoch).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "tests/apps/process_util.hpp"

namespace {
// Named apart from the helpers of the test files it shares a unity group with.
namespace sharding_test {

namespace fs = std::filesystem;

/// Files of this test process (ctest runs tests in parallel processes).
fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("flowfeed_sharding_" + std::to_string(getpid()) + "_" + name);
}

std::string config_path() {
  auto path = temp_file("config.yaml");
  std::ofstream(path) << "pipeline: { epochs: 2, batch_size: 7, prefetch_depth: 4, device: host }\n"
                         "sampler: { shuffle: true, seed: 11 }\n"
                         "nodes:\n"
                         "  - { name: load, type: synthetic, concurrency: 3, params: { samples: "
                         "1001, sample_shape: [2] } }\n"
                         "  - { name: train, type: record, params: { path: unset } }\n";
  return path.string();
}

int run(const std::string& env, const std::string& args, std::string* output = nullptr) {
  return flowfeed::test::run_shell(env + " " + FLOWFEED_RUNNER + " " + args + " -q 2>&1", output);
}

/// epoch -> samples in visiting order, from a record file.
std::map<int, std::vector<unsigned>> read_record(const std::string& path) {
  std::map<int, std::vector<unsigned>> out;
  for (const auto& [epoch, batches] : flowfeed::test::read_record(path)) {
    for (const auto& batch : batches)
      out[epoch].insert(out[epoch].end(), batch.begin(), batch.end());
  }
  return out;
}

std::map<int, std::vector<unsigned>> run_rank(const std::string& env, const std::string& tag) {
  auto record = temp_file("shard_" + tag + ".txt").string();
  std::string output;
  EXPECT_EQ(run(env, config_path() + " --set nodes.train.params.path=" + record, &output), 0)
      << output;
  return read_record(record);
}

void expect_partition(const std::vector<std::map<int, std::vector<unsigned>>>& shards) {
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<unsigned> all;
    std::size_t total = 0;
    for (const auto& shard : shards) {
      total += shard.at(epoch).size();
      all.insert(shard.at(epoch).begin(), shard.at(epoch).end());
    }
    EXPECT_EQ(total, 1001u) << "epoch " << epoch;
    EXPECT_EQ(all.size(), 1001u) << "shards overlap in epoch " << epoch;
    EXPECT_EQ(*all.rbegin(), 1000u);
  }
}

TEST(Sharding, TorchrunVariablesGiveDisjointCoveringShards) {
  std::vector<std::map<int, std::vector<unsigned>>> shards;
  for (int r = 0; r < 3; ++r) {
    shards.push_back(run_rank("RANK=" + std::to_string(r) + " WORLD_SIZE=3 LOCAL_RANK=0",
                              "torch" + std::to_string(r)));
  }
  expect_partition(shards);
  // Deterministic: the same rank sees the same order again, and epochs differ.
  EXPECT_EQ(run_rank("RANK=1 WORLD_SIZE=3", "torch1b"), shards[1]);
  EXPECT_NE(shards[0].at(0), shards[0].at(1));
}

TEST(Sharding, OpenMpiAndSlurmVariablesToo) {
  expect_partition({run_rank("OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2", "ompi0"),
                    run_rank("OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2", "ompi1")});
  expect_partition({run_rank("SLURM_PROCID=0 SLURM_NTASKS=2", "slurm0"),
                    run_rank("SLURM_PROCID=1 SLURM_NTASKS=2", "slurm1")});
  // The same shards whichever launcher named them.
  EXPECT_EQ(run_rank("SLURM_PROCID=1 SLURM_NTASKS=2", "slurm1b"),
            run_rank("RANK=1 WORLD_SIZE=2", "torch1of2"));
}

TEST(Sharding, BadLauncherVariablesAreConfigErrors) {
  std::string output;
  EXPECT_EQ(run("RANK=2 WORLD_SIZE=2", config_path(), &output), 2);
  EXPECT_EQ(output, "environment: RANK=2 is out of range (WORLD_SIZE=2)\n");
  EXPECT_EQ(run("RANK=x WORLD_SIZE=2", config_path(), &output), 2);
  EXPECT_EQ(output,
            "environment: RANK='x' is not a non-negative integer (set by the launcher) fix or "
            "unset it\n");
  EXPECT_EQ(run("RANK=0", config_path(), &output), 2);
  EXPECT_EQ(output,
            "environment: RANK is set but WORLD_SIZE is not (a launcher sets both) set both or "
            "neither\n");
}

TEST(Sharding, ExplicitRankInTheFileWins) {
  auto record = temp_file("shard_explicit.txt").string();
  std::string output;
  EXPECT_EQ(run("RANK=1 WORLD_SIZE=3",
                config_path() +
                    " --set sampler.rank=0 --set sampler.world=1 --set "
                    "nodes.train.params.path=" +
                    record,
                &output),
            0)
      << output;
  EXPECT_EQ(read_record(record).at(0).size(), 1001u);
}

}  // namespace sharding_test
}  // namespace
