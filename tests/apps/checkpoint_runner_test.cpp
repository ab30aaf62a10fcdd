// pipeline_runner's --checkpoint and --resume against a hostile user: a directory of data given as
// the checkpoint directory, two runs with one directory, a path that cannot be written, a device or
// FIFO given to --resume, and a finished run resumed. Each is refused before any work, with a
// message naming the path, and nothing of the user's is removed.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/apps/process_util.hpp"
#include "tests/apps/runner_process.hpp"
#include "tests/temp_fifo.hpp"

namespace {

namespace fs = std::filesystem;
using flowfeed::test::read_file;
using flowfeed::test::run_shell_bounded;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("flowfeed_ckrun_" + std::to_string(getpid()) + "_" + name);
}

/// A config of `samples` samples, 2 epochs, batches of 5, each loaded after `delay_ms`, recorded.
std::string config(const std::string& name, int samples, int delay_ms) {
  const fs::path path = temp_path(name + ".yaml");
  std::ofstream(path) << "pipeline: { epochs: 2, batch_size: 5, prefetch_depth: 2, device: host }\n"
                         "nodes:\n"
                         "  - { name: load, type: synthetic, params: { samples: "
                      << samples << ", sample_shape: [2], delay_ms: " << delay_ms
                      << " } }\n"
                         "  - { name: train, type: record, params: { path: unset } }\n";
  return path.string();
}

/// Runs the runner (under a time limit); returns its exit code, `output` its stdout and stderr.
int run(const std::vector<std::string>& args, std::string* output) {
  std::string command = FLOWFEED_RUNNER;
  for (const auto& a : args) command += " '" + a + "'";
  return run_shell_bounded(command, output);
}

/// How a refused --resume path's message ends.
const std::string kResumeHint =
    " point pipeline.resume_from (--resume) at a directory --checkpoint wrote\n";

/// run() of `config` quietly, its record sink writing to /dev/null, with `args` after.
int run_unrecorded(const std::string& config, std::vector<std::string> args, std::string* output) {
  args.insert(args.begin(), {config, "-q", "--set", "nodes.train.params.path=/dev/null"});
  return run(args, output);
}

/// What run_unrecorded prints when it refuses `args`, with a failure unless it exits 2.
std::string refused(const std::string& config, std::vector<std::string> args) {
  std::string output;
  EXPECT_EQ(run_unrecorded(config, std::move(args), &output), 2) << output;
  return output;
}

TEST(RunnerCheckpoint, ADirectoryOfDataIsRefusedAndKept) {
  // The user's data directory given as --checkpoint: it used to lose train.bin and val.bin.
  const fs::path data = flowfeed::test::fresh_path("ckrun", "owt");
  fs::create_directories(data);
  std::ofstream(data / "train.bin") << "train tokens";
  std::ofstream(data / "val.bin") << "val tokens";
  const fs::path record = temp_path("owt_record.txt");
  fs::remove(record);
  std::string output;
  EXPECT_EQ(run({config("owt", 40, 0), "-q", "--set", "nodes.train.params.path=" + record.string(),
                 "--checkpoint", data.string()},
                &output),
            2);
  EXPECT_EQ(output, data.string() +
                        ": holds train.bin, which this checkpoint did not write (--checkpoint "
                        "removes the files of its older checkpoints, so it takes only a directory "
                        "of its own) give --checkpoint an empty or new directory\n");
  EXPECT_EQ(read_file((data / "train.bin").string()), "train tokens");
  EXPECT_EQ(read_file((data / "val.bin").string()), "val tokens");
  EXPECT_EQ(std::distance(fs::directory_iterator(data), fs::directory_iterator()), 2);
  EXPECT_FALSE(fs::exists(record)) << "the run trained before the refusal";
}

TEST(RunnerCheckpoint, AnUnwritablePathIsFoundBeforeTraining) {
  const fs::path file = temp_path("plain_file");
  std::ofstream(file) << "x";
  const std::string below = (file / "ck").string();
  const fs::path record = temp_path("unwritable_record.txt");
  fs::remove(record);
  std::string output;
  EXPECT_EQ(run({config("unwritable", 400, 0), "-q", "--set",
                 "nodes.train.params.path=" + record.string(), "--checkpoint", below},
                &output),
            2);
  EXPECT_EQ(output, below +
                        ": cannot create the checkpoint directory (Not a directory) give "
                        "--checkpoint a directory that can be written\n");
  EXPECT_FALSE(fs::exists(record)) << "the run trained before the refusal";
}

TEST(RunnerCheckpoint, ASecondRunWithTheSameDirectoryIsRefusedWhileTheFirstWrites) {
  const fs::path ck = flowfeed::test::fresh_path("ckrun", "shared_ck");
  const std::string slow = config("slow", 100000, 20);
  const fs::path log = temp_path("first.log");
  flowfeed::test::LoggedRunner first({slow, "-q", "--set", "nodes.train.params.path=/dev/null",
                                      "--checkpoint", ck.string(), "--checkpoint-every", "2"},
                                     log.string());
  // Until the first run has written a checkpoint (it holds the lock from before its build).
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(ck / "pipeline.json") && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(fs::exists(ck / "pipeline.json")) << read_file(log.string());
  std::string output;
  EXPECT_EQ(refused(slow, {"--checkpoint", ck.string()}),
            ck.string() + ": another run (pid " + std::to_string(first.pid()) +
                ") holds this checkpoint directory (its lock flowfeed.lock; two writers "
                "would remove each other's files) give this run its own --checkpoint "
                "directory, or wait until that run ends\n");
  first.signal(SIGTERM);
  EXPECT_EQ(first.wait(), 143) << read_file(log.string());
  // The first run's checkpoint is whole, and the directory is free again.
  EXPECT_EQ(run_unrecorded(
                slow, {"--stop-after", "1", "--resume", ck.string(), "--checkpoint", ck.string()},
                &output),
            0)
      << output;
}

TEST(RunnerCheckpoint, ResumeFromADeviceOrAFifoIsRefusedUnread) {
  const std::string c = config("device", 40, 0);
  EXPECT_EQ(refused(c, {"--resume", "/dev/zero"}),
            "/dev/zero: is a character device, not a checkpoint manifest file (a device such as "
            "/dev/zero gives bytes without end)" +
                kResumeHint);
  const flowfeed::test::TempFifo fifo(temp_path("resume.fifo").string());
  ASSERT_TRUE(fifo.made());
  // No writer: an open would wait for one for ever.
  EXPECT_EQ(refused(c, {"--resume", fifo.path()}),
            fifo.path() +
                ": is a FIFO, not a checkpoint manifest file (a pipe waits for a writer "
                "and may give bytes without end)" +
                kResumeHint);
}

TEST(RunnerCheckpoint, ResumingAFinishedRunIsAnErrorNotAnEmptyRun) {
  const std::string c = config("finished", 40, 0);
  const fs::path ck = flowfeed::test::fresh_path("ckrun", "finished_ck");
  std::string output;
  ASSERT_EQ(run_unrecorded(c, {"--checkpoint", ck.string()}, &output), 0) << output;
  EXPECT_EQ(refused(c, {"--resume", ck.string()}),
            (ck / "pipeline.json").string() +
                ": cursor.epoch: the checkpoint is at epoch 2, sample 0 of its order: "
                "nothing of this run's 2 epochs is left after it (allowed: an epoch below "
                "pipeline.epochs with a batch of this rank left in it) raise "
                "pipeline.epochs to train further, or start without "
                "pipeline.resume_from\n");
  // With more epochs it continues.
  EXPECT_EQ(run_unrecorded(c, {"--epochs", "3", "--resume", ck.string()}, &output), 0) << output;
}

TEST(RunnerCheckpoint, AnEmptyResumeFromIsAnErrorNotAFreshRun) {
  const std::string c = config("empty_resume", 40, 0);
  // Before, '' read as "no checkpoint": the run started over, exit 0.
  EXPECT_EQ(refused(c, {"--set", "pipeline.resume_from=\"\""}),
            "--set pipeline.resume_from=\"\": pipeline.resume_from: the path is empty "
            "give the checkpoint directory, or leave resume_from out\n");
}

TEST(RunnerCheckpoint, ARecordFileInsideTheCheckpointDirectoryIsRefusedAtBuild) {
  const std::string c = config("record_in_ck", 40, 0);
  const fs::path ck = flowfeed::test::fresh_path("ckrun", "record_in_ck");
  std::string output;
  // Before, the record file was written, then replaced by the manifest (exit 0), or (another
  // name) left in the directory, which the next --checkpoint refused as foreign.
  for (const std::string name : {"pipeline.json", "rows.txt"}) {
    EXPECT_EQ(run({c, "-q", "--set", "nodes.train.params.path=" + (ck / name).string(),
                   "--checkpoint", ck.string()},
                  &output),
              2);
    EXPECT_EQ(output, "nodes.train.params.path " + (ck / name).string() +
                          ": inside the --checkpoint directory " + ck.string() +
                          " (the files there are the checkpoint's) choose another path\n");
    EXPECT_FALSE(fs::exists(ck / name));
  }
  // The directory a resume reads is the checkpoint's too, given by --set as by --resume.
  ASSERT_EQ(run_unrecorded(c, {"--stop-after", "2", "--checkpoint", ck.string()}, &output), 0)
      << output;
  const std::string manifest = read_file((ck / "pipeline.json").string());
  EXPECT_EQ(run({c, "-q", "--set", "nodes.train.params.path=" + (ck / "pipeline.json").string(),
                 "--set", "pipeline.resume_from=" + ck.string()},
                &output),
            2);
  EXPECT_EQ(output, "nodes.train.params.path " + (ck / "pipeline.json").string() +
                        ": inside the --resume directory " + ck.string() +
                        " (the files there are the checkpoint's) choose another path\n");
  EXPECT_EQ(read_file((ck / "pipeline.json").string()), manifest);
  fs::remove_all(ck);
}

}  // namespace
