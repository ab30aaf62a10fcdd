// Exact resume as a user meets it: pipeline_runner killed by SIGTERM at random (seeded) moments,
// resumed from its checkpoint, gives what one uninterrupted run gives: the same batches (the
// `record` sink's lines) and the same mlp weights, bit for bit; also across a change of world size.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
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

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("flowfeed_resume_" + std::to_string(getpid()) + "_" + name);
}

/// Writes `yaml` to temp_path(name) and returns that path.
fs::path write_temp_config(const std::string& name, const std::string& yaml) {
  const fs::path path = temp_path(name);
  std::ofstream(path) << yaml;
  return path;
}

std::string slurp(const fs::path& path) {
  return flowfeed::test::read_file(path.string());
}

/// The runner in a child process; its output goes to a log file.
class Child {
 public:
  Child(std::vector<std::string> args, const fs::path& log) {
    args.insert(args.begin(), FLOWFEED_RUNNER);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  void signal(int sig) const { kill(pid_, sig); }
  /// The exit code; -1 when it has not exited within 60 s (then it is killed).
  int wait() {
    const auto end = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 1000 + WTERMSIG(status);
      }
      if (Clock::now() > end) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

 private:
  pid_t pid_ = -1;
};

/// Batches finished so far according to the checkpoint in `dir` (-1: none yet).
long long checkpoint_steps(const fs::path& dir) {
  const std::string text = slurp(dir / "pipeline.json");
  const std::size_t at = text.find("\"steps\": ");
  return at == std::string::npos ? -1 : std::stoll(text.substr(at + 9));
}

/// Runs the runner once to its end; returns its exit code, `output` its stdout and stderr.
int run(const std::string& env, const std::vector<std::string>& args, std::string* output) {
  std::string command = env + " " + FLOWFEED_RUNNER;
  for (const auto& a : args) command += " '" + a + "'";
  return flowfeed::test::run_shell(command + " 2>&1", output);
}

/// A `record` file's lines without the seq column (it counts the batches of one run).
std::vector<std::string> record_lines(const fs::path& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::string epoch, seq, rest;
    ls >> epoch >> seq;
    std::getline(ls, rest);
    out.push_back(epoch + rest);
  }
  return out;
}

struct Scenario {
  bool shuffle;
  bool drop_last;
  bool ordered;
};

std::string record_config(const Scenario& s, const std::string& name) {
  const fs::path path = temp_path(name + ".yaml");
  std::ofstream(path) << "pipeline: { epochs: 2, batch_size: 4, prefetch_depth: 6, device: host, "
                         "ordered: "
                      << (s.ordered ? "true" : "false")
                      << " }\n"
                         "sampler: { shuffle: "
                      << (s.shuffle ? "true" : "false")
                      << ", seed: 17, drop_last: " << (s.drop_last ? "true" : "false")
                      << " }\n"
                         "nodes:\n"
                         "  - { name: load, type: synthetic, concurrency: 3, params: { samples: "
                         "403, sample_shape: [2], delay_ms: 0 } }\n"
                         "  - { name: train, type: record, params: { path: unset } }\n";
  return path.string();
}

/// Starts the runner on `args`, waits until its first checkpoint after `after_steps` is on disk,
/// then `delay_ms` more, then sends `sig`; returns the exit code (143 for SIGTERM, 1009 for
/// SIGKILL, 0 when the run ended first).
int interrupt(const std::vector<std::string>& args, const fs::path& checkpoint,
              long long after_steps, int delay_ms, const fs::path& log, int sig = SIGTERM) {
  Child child(args, log);
  const auto end = Clock::now() + std::chrono::seconds(30);
  while (checkpoint_steps(checkpoint) <= after_steps && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  child.signal(sig);
  return child.wait();
}

class KilledAndResumed : public testing::TestWithParam<Scenario> {};

TEST_P(KilledAndResumed, TwiceGivesTheBatchesOfOneUninterruptedRun) {
  const Scenario s = GetParam();
  const std::string tag =
      std::string(s.shuffle ? "s" : "n") + (s.drop_last ? "d" : "k") + (s.ordered ? "o" : "u");
  const std::string config = record_config(s, tag);
  const fs::path full = temp_path(tag + "_full.txt");
  std::string output;
  ASSERT_EQ(run("", {config, "-q", "--set", "nodes.train.params.path=" + full.string()}, &output),
            0)
      << output;

  const fs::path ck = temp_path(tag + "_ck");
  fs::remove_all(ck);
  std::mt19937 random(static_cast<unsigned>(s.shuffle * 4 + s.drop_last * 2 + s.ordered));
  std::vector<std::string> parts;
  long long steps = -1;
  for (int kill = 0; kill < 2; ++kill) {
    const fs::path part = temp_path(tag + "_part" + std::to_string(kill) + ".txt");
    std::vector<std::string> args = {config,
                                     "-q",
                                     "--set",
                                     "nodes.train.params.path=" + part.string(),
                                     "--set",
                                     "nodes.load.params.delay_ms=6",
                                     "--checkpoint",
                                     ck.string(),
                                     "--checkpoint-every",
                                     "5"};
    if (kill > 0) args.insert(args.end(), {"--resume", ck.string()});
    const int delay = std::uniform_int_distribution<int>(0, 120)(random);
    const int code = interrupt(args, ck, steps, delay, temp_path(tag + "_log.txt"));
    EXPECT_EQ(code, 143) << slurp(temp_path(tag + "_log.txt"));
    steps = checkpoint_steps(ck);
    parts.push_back(part.string());
  }
  const fs::path last = temp_path(tag + "_last.txt");
  ASSERT_EQ(run("",
                {config, "-q", "--set", "nodes.train.params.path=" + last.string(), "--resume",
                 ck.string(), "--checkpoint", ck.string()},
                &output),
            0)
      << output;
  parts.push_back(last.string());

  std::vector<std::string> joined;
  std::vector<std::size_t> sizes;
  for (const auto& p : parts) {
    const auto lines = record_lines(p);
    sizes.push_back(lines.size());
    joined.insert(joined.end(), lines.begin(), lines.end());
  }
  EXPECT_GT(sizes[0], 0u);
  EXPECT_GT(sizes[1], 0u);
  EXPECT_GT(sizes[2], 0u);
  std::vector<std::string> expected = record_lines(full);
  ASSERT_EQ(joined.size(), expected.size()) << "batches lost or delivered twice";
  if (!s.ordered) {
    // Unordered runs finish batches in any order: the same batches, each once.
    std::sort(joined.begin(), joined.end());
    std::sort(expected.begin(), expected.end());
  }
  EXPECT_EQ(joined, expected);
  EXPECT_EQ(slurp(ck / "pipeline.json").find("\"epoch\": 2,") != std::string::npos, true);
}

INSTANTIATE_TEST_SUITE_P(Sampling, KilledAndResumed,
                         testing::Values(Scenario{true, false, true}, Scenario{false, true, false},
                                         Scenario{true, true, false}, Scenario{false, false, true}),
                         [](const testing::TestParamInfo<Scenario>& info) {
                           return std::string(info.param.shuffle ? "Shuffled" : "Sequential") +
                                  (info.param.drop_last ? "DropLast" : "KeepLast") +
                                  (info.param.ordered ? "Ordered" : "Unordered");
                         });

TEST(ResumeTraining, MlpWeightsAreBitwiseThoseOfAnUninterruptedRun) {
  // 75 batches per epoch; momentum, so that the optimizer state matters too.
  const fs::path config = write_temp_config(
      "mlp.yaml",
      "pipeline: { epochs: 3, batch_size: 8, prefetch_depth: 4, device: host }\n"
      "sampler: { shuffle: true, seed: 5 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 2, params: { samples: 600, "
      "sample_shape: [12], classes: 4, delay_ms: 0 } }\n"
      "  - { name: train, type: mlp, params: { hidden: [16], classes: 4, momentum: "
      "0.9, lr: 0.1 } }\n");
  const fs::path whole = temp_path("mlp_whole");
  const fs::path ck = temp_path("mlp_ck");
  fs::remove_all(whole);
  fs::remove_all(ck);
  std::string output;
  ASSERT_EQ(run("", {config.string(), "-q", "--checkpoint", whole.string()}, &output), 0) << output;
  // Stopped exactly at the end of epoch 0, then killed mid-epoch, then run to the end.
  ASSERT_EQ(
      run("", {config.string(), "-q", "--checkpoint", ck.string(), "--stop-after", "75"}, &output),
      0)
      << output;
  EXPECT_NE(slurp(ck / "pipeline.json").find("\"epoch\": 1,\n    \"samples\": 0,"),
            std::string::npos)
      << slurp(ck / "pipeline.json");
  const int code =
      interrupt({config.string(), "-q", "--checkpoint", ck.string(), "--resume", ck.string(),
                 "--set", "nodes.load.params.delay_ms=6", "--checkpoint-every", "3"},
                ck, 75, 40, temp_path("mlp_log.txt"));
  EXPECT_EQ(code, 143) << slurp(temp_path("mlp_log.txt"));
  const long long steps = checkpoint_steps(ck);
  EXPECT_GT(steps, 75);
  EXPECT_LT(steps, 225);
  // A crash (SIGKILL) keeps the last periodic checkpoint: the steps after it are trained again.
  const int crashed =
      interrupt({config.string(), "-q", "--checkpoint", ck.string(), "--resume", ck.string(),
                 "--set", "nodes.load.params.delay_ms=6", "--checkpoint-every", "4"},
                ck, steps, 30, temp_path("mlp_log.txt"), SIGKILL);
  EXPECT_EQ(crashed, 1000 + SIGKILL);
  EXPECT_GT(checkpoint_steps(ck), steps);
  ASSERT_EQ(run("", {config.string(), "-q", "--checkpoint", ck.string(), "--resume", ck.string()},
                &output),
            0)
      << output;
  auto weights = [](const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".bin") return slurp(e.path());
    }
    return std::string();
  };
  const std::string expected = weights(whole);
  ASSERT_GT(expected.size(), 1000u);
  EXPECT_TRUE(weights(ck) == expected) << "the resumed weights differ";
}

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

fs::path world_config() {
  return write_temp_config(
      "world.yaml",
      "pipeline: { epochs: 2, batch_size: 7, prefetch_depth: 4, device: host }\n"
      "sampler: { shuffle: true, seed: 11 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 2, params: { samples: "
      "1001, sample_shape: [2] } }\n"
      "  - { name: train, type: record, params: { path: unset } }\n");
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

TEST(ResumeErrors, BadCheckpointsExit2NamingTheField) {
  const std::string config = world_config().string();
  const fs::path ck = temp_path("bad_ck");
  fs::remove_all(ck);
  std::string output;
  ASSERT_EQ(run("",
                {config, "-q", "--set", "nodes.train.params.path=/dev/null", "--stop-after", "3",
                 "--checkpoint", ck.string()},
                &output),
            0)
      << output;
  const std::string manifest = (ck / "pipeline.json").string();
  EXPECT_EQ(run("",
                {config, "-q", "--set", "nodes.train.params.path=/dev/null", "--set",
                 "nodes.load.params.samples=1000", "--resume", ck.string()},
                &output),
            2);
  EXPECT_EQ(output, manifest +
                        ": sampler.dataset_size: the checkpoint was written for 1001 samples, this "
                        "run's data set has 1000 (a resume continues the same sample order) resume "
                        "with the same data set\n");
  EXPECT_EQ(run("",
                {config, "-q", "--set", "nodes.train.params.path=/dev/null", "--set",
                 "sampler.seed=12", "--resume", ck.string()},
                &output),
            2);
  EXPECT_EQ(output,
            manifest +
                ": sampler.seed: the checkpoint was written with seed 11, this run has seed "
                "12 (every epoch's order comes from the seed) set sampler.seed: 11\n");
  const std::string text = slurp(manifest);
  std::ofstream(manifest, std::ios::trunc) << text.substr(0, text.size() / 2);
  EXPECT_EQ(
      run("", {config, "-q", "--set", "nodes.train.params.path=/dev/null", "--resume", ck.string()},
          &output),
      2);
  EXPECT_EQ(output.rfind(manifest + ":", 0), 0u) << output;
  EXPECT_NE(output.find(": not a checkpoint: syntax error while parsing"), std::string::npos)
      << output;
}

}  // namespace
