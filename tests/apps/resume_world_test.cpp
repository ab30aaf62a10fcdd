// Resume across a change of world size: a run on two ranks resumed on one (and one on two)
// continues the global order of batches, and data-parallel mlp training (mpirun) resumed on another
// world size trains the uninterrupted model.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/apps/process_util.hpp"
#include "tests/apps/resume_util.hpp"
#include "tests/apps/runner_process.hpp"

namespace {

namespace fs = std::filesystem;
using namespace flowfeed::test::resume;

/// global step -> the samples of every rank's batch of that step, per epoch.
using Steps = std::map<int, std::vector<std::multiset<unsigned>>>;

void add_steps(Steps& steps, const fs::path& record, std::size_t first_step) {
  std::map<int, std::size_t> next;
  for (const auto& [epoch, batches] : flowfeed::test::read_record(record.string())) {
    std::size_t step = epoch == 0 ? first_step : 0;
    for (const auto& batch : batches) {
      auto& list = steps[epoch];
      if (list.size() <= step) list.resize(step + 1);
      list[step].insert(batch.begin(), batch.end());
      ++step;
    }
  }
}

/// A world size change between a run and its resume: the config, and the order of one
/// uninterrupted rank with the global batch (14) that the runs of another world size must add up
/// to.
class ResumeWorldSize : public ::testing::Test {
 protected:
  /// Records the uninterrupted run in temp_path(`record`) and adds its steps to expected_.
  void record_global_order(const std::string& record) {
    std::string output;
    const fs::path full = temp_path(record);
    ASSERT_EQ(run("",
                  {config_, "-q", "--set", "pipeline.batch_size=14", "--set",
                   "nodes.train.params.path=" + full.string()},
                  &output),
              0)
        << output;
    add_steps(expected_, full, 0);
  }

  const std::string config_ = world_config().string();
  Steps expected_;
};

TEST_F(ResumeWorldSize, TwoRanksToOneContinueTheGlobalOrder) {
  ASSERT_NO_FATAL_FAILURE(record_global_order("w21_full.txt"));
  std::string output;
  Steps got;
  for (int rank = 0; rank < 2; ++rank) {
    const fs::path part = temp_path("w21_rank" + std::to_string(rank) + ".txt");
    ASSERT_EQ(run("RANK=" + std::to_string(rank) + " WORLD_SIZE=2",
                  {config_, "-q", "--set", "nodes.train.params.path=" + part.string(),
                   "--stop-after", "30", "--checkpoint", temp_path("w21_ck{rank}").string()},
                  &output),
              0)
        << output;
    add_steps(got, part, 0);
  }
  // One rank goes on with the global batch: batch 14 = 2 x 7.
  const fs::path rest = temp_path("w21_rest.txt");
  ASSERT_EQ(run("",
                {config_, "-q", "--set", "nodes.train.params.path=" + rest.string(), "--resume",
                 temp_path("w21_ck0").string()},
                &output),
            2);
  EXPECT_NE(output.find("cursor.global_batch: the checkpoint was written by world 2 x batch_size "
                        "7 = global batch 14, this run is world 1 x batch_size 7 = 7"),
            std::string::npos)
      << output;
  ASSERT_EQ(
      run("",
          {config_, "-q", "--set", "pipeline.batch_size=14", "--set",
           "nodes.train.params.path=" + rest.string(), "--resume", temp_path("w21_ck0").string()},
          &output),
      0)
      << output;
  add_steps(got, rest, 30);
  EXPECT_EQ(got, expected_);
}

TEST_F(ResumeWorldSize, OneRankToTwoSplitTheRestOfTheGlobalOrder) {
  ASSERT_NO_FATAL_FAILURE(record_global_order("w12_full.txt"));
  std::string output;
  Steps got;
  const fs::path first = temp_path("w12_first.txt");
  const fs::path ck = temp_path("w12_ck");
  ASSERT_EQ(run("",
                {config_, "-q", "--set", "pipeline.batch_size=14", "--set",
                 "nodes.train.params.path=" + first.string(), "--stop-after", "41", "--checkpoint",
                 ck.string()},
                &output),
            0)
      << output;
  add_steps(got, first, 0);
  for (int rank = 0; rank < 2; ++rank) {
    const fs::path part = temp_path("w12_rank" + std::to_string(rank) + ".txt");
    ASSERT_EQ(run("RANK=" + std::to_string(rank) + " WORLD_SIZE=2",
                  {config_, "-q", "--set", "nodes.train.params.path=" + part.string(), "--resume",
                   ck.string()},
                  &output),
              0)
        << output;
    add_steps(got, part, 41);
  }
  EXPECT_EQ(got, expected_);
}

using flowfeed::test::kMpirun;
using flowfeed::test::relative_difference;

/// The floats of an mlp state file (after its header and layer shapes).
std::vector<float> mlp_state(const fs::path& dir) {
  std::string bytes;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".bin") bytes = slurp(e.path());
  }
  const std::size_t header = std::string("flowfeed mlp state 1\n").size();
  if (bytes.size() < header + 4) return {};
  std::uint32_t layers = 0;
  std::memcpy(&layers, bytes.data() + header, 4);
  const std::size_t first = header + 4 + 8 * layers;
  std::vector<float> out((bytes.size() - first) / 4);
  std::memcpy(out.data(), bytes.data() + first, out.size() * 4);
  return out;
}

TEST(DataParallel, MpiRanksResumedOnOneAndOneResumedOnTwoTrainTheUninterruptedModel) {
  if (!flowfeed::test::have_mpirun()) GTEST_SKIP() << "mpirun not installed (Debian: openmpi-bin)";
  // 7 steps of global batch 64 per epoch; all_reduce: auto is mpi under mpirun.
  const fs::path config = write_temp_config(
      "dp.yaml",
      "pipeline: { epochs: 2, batch_size: 64, prefetch_depth: 4, device: host }\n"
      "sampler: { shuffle: true, seed: 3 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 2,\n"
      "      params: { samples: 448, sample_shape: [24], classes: 5, seed: 9 } }\n"
      "  - { name: train, type: mlp, params: { hidden: [16], classes: 5, lr: 0.2, "
      "momentum: 0.9 } }\n");
  const auto shell = flowfeed::test::run_shell_bounded;
  const std::string runner = std::string(FLOWFEED_RUNNER) + " " + config.string() + " -q ";
  std::string output;
  const fs::path whole = temp_path("dp_whole");
  fs::remove_all(whole);
  ASSERT_EQ(shell(runner + "--checkpoint " + whole.string(), &output), 0) << output;

  // 2 ranks x 32 for 5 steps, then 1 rank x 64.
  const std::string two = temp_path("dp_two").string();
  ASSERT_EQ(shell(kMpirun + " -np 2 " + runner +
                      "--set pipeline.batch_size=32 --stop-after 5 --checkpoint " + two + "{rank}",
                  &output),
            0)
      << output;
  EXPECT_EQ(mlp_state(two + "0"), mlp_state(two + "1")) << "the ranks' weights differ";
  ASSERT_EQ(shell(runner + "--resume " + two + "0 --checkpoint " + two + "0", &output), 0)
      << output;
  EXPECT_LT(relative_difference(mlp_state(two + "0"), mlp_state(whole)), 1e-5);

  // 1 rank x 64 for 9 steps (into epoch 1), then 2 ranks x 32 from its checkpoint.
  const fs::path one = temp_path("dp_one");
  fs::remove_all(one);
  ASSERT_EQ(shell(runner + "--stop-after 9 --checkpoint " + one.string(), &output), 0) << output;
  const std::string after = temp_path("dp_after").string();
  ASSERT_EQ(shell(kMpirun + " -np 2 " + runner + "--set pipeline.batch_size=32 --resume " +
                      one.string() + " --checkpoint " + after + "{rank}",
                  &output),
            0)
      << output;
  EXPECT_EQ(mlp_state(after + "0"), mlp_state(after + "1")) << "the ranks' weights differ";
  EXPECT_LT(relative_difference(mlp_state(after + "1"), mlp_state(whole)), 1e-5);
  EXPECT_NE(slurp(fs::path(after + "1") / "pipeline.json").find("\"epoch\": 2,"),
            std::string::npos);
}

}  // namespace
