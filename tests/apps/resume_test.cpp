// Exact resume as a user meets it: pipeline_runner killed by SIGTERM at random (seeded) moments,
// resumed from its checkpoint, gives what one uninterrupted run gives: the same batches (the
// `record` sink's lines) and the same mlp weights, bit for bit; a checkpoint that does not fit the
// run is refused naming the field. Across a change of world size: resume_world_test.cpp.
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
using Clock = std::chrono::steady_clock;
using flowfeed::test::LoggedRunner;

/// Batches finished so far according to the checkpoint in `dir` (-1: none yet).
long long checkpoint_steps(const fs::path& dir) {
  const std::string text = slurp(dir / "pipeline.json");
  const std::size_t at = text.find("\"steps\": ");
  return at == std::string::npos ? -1 : std::stoll(text.substr(at + 9));
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
  LoggedRunner child(args, log.string());
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
