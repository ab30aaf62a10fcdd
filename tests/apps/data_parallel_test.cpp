// Several real processes: launched by Open MPI's mpirun (or given RANK/WORLD_SIZE), they read
// disjoint shards that cover each epoch, and the mlp node's MPI all-reduce makes N ranks train
// the model that one process trains with N times the batch.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "tests/apps/process_util.hpp"

namespace {

namespace fs = std::filesystem;

fs::path temp_file(const std::string& name) {
  return fs::temp_directory_path() / ("flowfeed_dp_" + std::to_string(getpid()) + "_" + name);
}

using flowfeed::test::have_mpirun;
using flowfeed::test::kMpirun;
using flowfeed::test::relative_difference;
using flowfeed::test::run_shell_bounded;

// ---- sharding ------------------------------------------------------------------------------

std::string record_config(bool drop_last) {
  auto path = temp_file(std::string("record") + (drop_last ? "_drop" : "") + ".yaml");
  std::ofstream(path) << "pipeline: { epochs: 2, batch_size: 7, prefetch_depth: 4, device: host }\n"
                         "sampler: { shuffle: true, seed: 11, drop_last: "
                      << (drop_last ? "true" : "false")
                      << " }\n"
                         "nodes:\n"
                         "  - { name: load, type: synthetic, concurrency: 2, params: { samples: "
                         "1001, sample_shape: [2] } }\n"
                         "  - { name: train, type: record, params: { path: unset } }\n";
  return path.string();
}

using flowfeed::test::read_record;
using flowfeed::test::Record;

/// Two ranks by mpirun (MPMD: one record file per rank).
std::vector<Record> mpirun_shards(const std::string& config, const std::string& tag) {
  std::vector<std::string> files = {temp_file(tag + "_0.txt"), temp_file(tag + "_1.txt")};
  std::string output;
  const std::string cmd = kMpirun + " -np 1 " + FLOWFEED_RUNNER + " " + config + " -q --set " +
                          "nodes.train.params.path=" + files[0] + " : -np 1 " + FLOWFEED_RUNNER +
                          " " + config + " -q --set nodes.train.params.path=" + files[1];
  EXPECT_EQ(run_shell_bounded(cmd, &output), 0) << output;
  return {read_record(files[0]), read_record(files[1])};
}

TEST(DataParallel, MpirunRanksReadDisjointShardsThatCoverEachEpoch) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed (Debian: openmpi-bin)";
  const std::string config = record_config(false);
  const std::vector<Record> shards = mpirun_shards(config, "full");
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::multiset<unsigned> all;
    for (const Record& shard : shards) {
      for (const auto& batch : shard.at(epoch)) all.insert(batch.begin(), batch.end());
    }
    EXPECT_EQ(all.size(), 1001u) << "epoch " << epoch;
    EXPECT_EQ(std::set<unsigned>(all.begin(), all.end()).size(), 1001u)
        << "shards overlap in epoch " << epoch;
  }
  // 1001 samples over 2 ranks: 501 and 500, in batches of 7 (the last ones partial).
  EXPECT_EQ(shards[0].at(0).size(), 72u);
  EXPECT_EQ(shards[0].at(0).back().size(), 4u);
  EXPECT_EQ(shards[1].at(0).back().size(), 3u);
  // Deterministic per (seed, epoch): the same again, and the same as plain processes given
  // RANK/WORLD_SIZE; the epochs differ.
  EXPECT_EQ(mpirun_shards(config, "again"), shards);
  for (int r = 0; r < 2; ++r) {
    const std::string file = temp_file("torch" + std::to_string(r) + ".txt");
    std::string output;
    EXPECT_EQ(run_shell_bounded("RANK=" + std::to_string(r) + " WORLD_SIZE=2 " + FLOWFEED_RUNNER +
                                    " " + config + " -q --set nodes.train.params.path=" + file,
                                &output),
              0)
        << output;
    EXPECT_EQ(read_record(file), shards[static_cast<std::size_t>(r)]) << "rank " << r;
  }
  EXPECT_NE(shards[0].at(0), shards[0].at(1));
}

TEST(DataParallel, MpirunShardsWithDropLastLoseOnlyThePartialBatches) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed (Debian: openmpi-bin)";
  const std::vector<Record> shards = mpirun_shards(record_config(true), "drop");
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<unsigned> all;
    std::size_t total = 0;
    for (const Record& shard : shards) {
      EXPECT_EQ(shard.at(epoch).size(), 71u);  // 501 / 7 and 500 / 7 full batches
      for (const auto& batch : shard.at(epoch)) {
        EXPECT_EQ(batch.size(), 7u);
        total += batch.size();
        all.insert(batch.begin(), batch.end());
      }
    }
    EXPECT_EQ(total, 2u * 71u * 7u);
    EXPECT_EQ(all.size(), total) << "shards overlap in epoch " << epoch;
  }
}

// ---- training ------------------------------------------------------------------------------

std::string train_config() {
  auto path = temp_file("train.yaml");
  std::ofstream(path)
      << "pipeline: { epochs: 2, batch_size: 64, prefetch_depth: 4, device: host }\n"
         "sampler: { shuffle: true, seed: 3 }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, concurrency: 2,\n"
         "      params: { samples: 448, sample_shape: [24], classes: 5, seed: 9 } }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: mlp, params: { hidden: [16], classes: 5, lr: 0.2, momentum: "
         "0.9 } }\n";
  return path.string();
}

std::vector<float> read_params(const std::string& path) {
  std::vector<float> out;
  std::ifstream in(path);
  for (float v; in >> v;) out.push_back(v);
  return out;
}

TEST(DataParallel, TwoMpiRanksTrainTheModelOfOneProcessWithTwiceTheBatch) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed (Debian: openmpi-bin)";
  const std::string config = train_config();
  const std::string single = temp_file("single").string();
  const std::string pair = temp_file("pair").string();
  const std::string alone = temp_file("alone").string();
  std::string output;
  ASSERT_EQ(
      run_shell_bounded(std::string(FLOWFEED_DP_PROBE) + " " + config + " " + single, &output), 0)
      << output;
  EXPECT_EQ(output, "batches 14 samples 896\n");
  ASSERT_EQ(run_shell_bounded(kMpirun + " -np 2 " + FLOWFEED_DP_PROBE + " " + config + " " + pair +
                                  " pipeline.batch_size=32",
                              &output),
            0)
      << output;
  EXPECT_EQ(output, "batches 14 samples 448\nbatches 14 samples 448\n");
  const std::vector<float> one = read_params(single + ".0");
  const std::vector<float> rank0 = read_params(pair + ".0");
  const std::vector<float> rank1 = read_params(pair + ".1");
  ASSERT_EQ(one.size(), 24u * 16 + 16 * 5 + 16 + 5);
  EXPECT_EQ(rank0, rank1) << "the ranks' weights differ";
  EXPECT_LT(relative_difference(rank0, one), 1e-5);
  // Without the all-reduce each rank trains its own model on its half: far from the one above.
  ASSERT_EQ(run_shell_bounded(kMpirun + " -np 2 " + FLOWFEED_DP_PROBE + " " + config + " " + alone +
                                  " pipeline.batch_size=32 nodes.train.params.all_reduce=none",
                              &output),
            0)
      << output;
  EXPECT_GT(relative_difference(read_params(alone + ".0"), one), 1e-2);
  EXPECT_NE(read_params(alone + ".0"), read_params(alone + ".1"));
}

TEST(DataParallel, MpiTransportNeedsMpirunAndEqualStepCounts) {
  const std::string config = train_config();
  std::string output;
  EXPECT_EQ(
      run_shell_bounded(
          "RANK=1 WORLD_SIZE=2 " + std::string(FLOWFEED_RUNNER) + " " + config + " -q", &output),
      2);
  EXPECT_EQ(output, config +
                        ":8:5: nodes.train.params.all_reduce: mpi needs a job launched by Open "
                        "MPI's mpirun (2 ranks, but OMPI_COMM_WORLD_SIZE is not set) launch with "
                        "mpirun, or set all_reduce: none to train one model per rank\n");
  // 448 samples over 3 ranks in batches of 32: 150 samples (5 batches) for rank 0, 149 (5) for
  // the others; in batches of 30: 5 and 5; in batches of 50: 3 and 3; in batches of 149: 2 and 1.
  EXPECT_EQ(run_shell_bounded(
                "RANK=0 WORLD_SIZE=3 " + std::string(FLOWFEED_RUNNER) + " " + config +
                    " -q --set pipeline.batch_size=149 --set nodes.train.params.all_reduce=none",
                &output),
            0)
      << output;
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed (Debian: openmpi-bin)";
  EXPECT_NE(run_shell_bounded(kMpirun + " -np 3 " + FLOWFEED_RUNNER + " " + config +
                                  " -q --set pipeline.batch_size=149",
                              &output),
            0);
  // Whichever rank checks first reports it; each names a rank with another step count.
  EXPECT_NE(output.find(config +
                        ":8:5: nodes.train.type: data-parallel training needs the same number of "
                        "steps on every rank, but rank "),
            std::string::npos)
      << output;
  EXPECT_NE(output.find(" batches per epoch and rank "), std::string::npos) << output;
  EXPECT_NE(output.find(" (448 samples over 3 ranks in batches of 149) set sampler.drop_last: "
                        "true, or a batch size that divides the shards\n"),
            std::string::npos)
      << output;
}

TEST(DataParallel, ARankThatFailsEndsTheWholeJob) {
  if (!have_mpirun()) GTEST_SKIP() << "mpirun not installed (Debian: openmpi-bin)";
  const std::string config = train_config();
  std::string output;
  // Rank 1 cannot read its evaluation files and ends before it joins; rank 0 waits for it. mpirun
  // must end rank 0 (within the 120 s limit of run_shell_bounded()), and rank 1 says why.
  const std::string missing = temp_file("missing.idx").string();
  int status = run_shell_bounded(kMpirun + " -np 1 " + FLOWFEED_RUNNER + " " + config +
                                     " -q : -np 1 " + FLOWFEED_RUNNER + " " + config +
                                     " -q --set nodes.train.params.eval_images=" + missing +
                                     " --set nodes.train.params.eval_labels=" + missing,
                                 &output);
  EXPECT_NE(status, 0);
  EXPECT_NE(status, 124) << "the job hung: " << output;
  EXPECT_NE(output.find(missing), std::string::npos) << output;
  EXPECT_NE(output.find("the job has been aborted"), std::string::npos) << output;
  // Rank 1 fails at batch 3, after both have trained together: rank 0 is inside an all-reduce.
  status =
      run_shell_bounded(kMpirun + " -np 1 " + FLOWFEED_RUNNER + " " + config + " -q : -np 1 " +
                            FLOWFEED_RUNNER + " " + config +
                            " -q --enable-fault-nodes --set nodes.upload.type=fault_upload --set "
                            "nodes.upload.params.mode=throw --set nodes.upload.params.at_batch=3",
                        &output);
  EXPECT_NE(status, 0);
  EXPECT_NE(status, 124) << "the job hung: " << output;
  EXPECT_NE(output.find("error: node 'upload' (fault_upload, " + config + ":7) batch 3"),
            std::string::npos)
      << output;
}

}  // namespace
