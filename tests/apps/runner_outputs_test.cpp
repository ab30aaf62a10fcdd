// pipeline_runner's outputs and arguments under failure: write errors with their reason, paths
// checked before the run, range errors on the command line, a skipped-batches line that --quiet
// does not hide, and a signal while the config is still being read.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "tests/apps/runner_process.hpp"
#include "tests/temp_fifo.hpp"

namespace flowfeed::test {
namespace {

std::string temp_path(const std::string& name) {
  return runner_temp_path(name);
}

const std::string kSmallRun =
    "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
    "nodes:\n"
    "  - { name: load, type: synthetic, params: { batches: 3, sample_shape: [2] } }\n"
    "  - { name: train, type: checksum }\n";

TEST(RunnerOutputs, AReportThatCannotBeWrittenExits1WithTheReason) {
  Runner r({write_config("full", kSmallRun), "--quiet", "--report", "/dev/full"});
  EXPECT_EQ(r.wait(kExitBound), 1);
  EXPECT_EQ(r.err(), "error: cannot write report /dev/full (No space left on device)\n");
}

TEST(RunnerOutputs, AnOutputPathIsCheckedBeforeTheRun) {
  // The run would print its table; it never starts.
  Runner r({write_config("nodir", kSmallRun), "--report", "/nonexistent-dir/r.json"});
  EXPECT_EQ(r.wait(kExitBound), 1);
  EXPECT_EQ(r.out(), "");
  EXPECT_EQ(r.err(),
            "pipeline_runner: cannot write report /nonexistent-dir/r.json (directory "
            "/nonexistent-dir: No such file or directory)\n");
  Runner dir({write_config("dir", kSmallRun), "--trace", testing::TempDir()});
  EXPECT_EQ(dir.wait(kExitBound), 1);
  EXPECT_EQ(dir.err(),
            "pipeline_runner: cannot write trace " + testing::TempDir() + " (it is a directory)\n");
}

TEST(RunnerOutputs, ARecordFileOnAFullDiskFailsTheRunAndLeavesNoPartialFile) {
  Runner full({write_config("record_full",
                            "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
                            "nodes:\n"
                            "  - { name: load, type: synthetic, params: { batches: 3, "
                            "sample_shape: [2] } }\n"
                            "  - { name: train, type: record, params: { path: /dev/full } }\n"),
               "--quiet"});
  EXPECT_EQ(full.wait(kExitBound), 1);
  EXPECT_EQ(full.err(), "error: cannot write record file /dev/full (No space left on device)\n");

  // A run that fails midway leaves the previous file as it was, and no temporary file beside it.
  const std::string record = temp_path("record.txt");
  std::ofstream(record) << "previous\n";
  Runner failed({write_config("record_fail",
                              "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
                              "nodes:\n"
                              "  - { name: load, type: fault_load, params: { batches: 8, "
                              "sample_shape: [2], mode: throw, at_batch: 5 } }\n"
                              "  - { name: train, type: record, params: { path: " +
                                  record + " } }\n"),
                 "--quiet", "--enable-fault-nodes"});
  EXPECT_EQ(failed.wait(kExitBound), 1);
  EXPECT_EQ(read_file(record), "previous\n");
  for (const auto& entry : std::filesystem::directory_iterator(testing::TempDir())) {
    EXPECT_EQ(entry.path().string().rfind(record + ".tmp", 0), std::string::npos) << entry.path();
  }
}

TEST(RunnerOutputs, ARecordFileNeverReplacesTheConfigOrADataFile) {
  // 4,000 uint16 tokens, the data a tokens loader reads.
  const std::string data = temp_path("tokens.bin");
  {
    std::ofstream out(data, std::ios::binary);
    for (std::uint16_t t = 0; t < 4000; ++t) out.write(reinterpret_cast<const char*>(&t), 2);
  }
  const std::string bytes = read_file(data);
  const std::string config =
      write_config("record_data",
                   "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
                   "nodes:\n"
                   "  - { name: load, type: tokens, params: { files: " +
                       data +
                       ", context: 16 } }\n"
                       "  - { name: train, type: record, params: { path: out.txt } }\n");
  const std::string yaml = read_file(config);
  // Before, both were replaced by the record's lines, exit 0.
  Runner over_data({config, "--quiet", "--set", "nodes.train.params.path=" + data});
  EXPECT_EQ(over_data.wait(kExitBound), 1);
  EXPECT_EQ(over_data.err(), "error: node 'train' (record, " + config +
                                 ":4): cannot write record file " + data +
                                 " (a file this pipeline reads; writing it would replace the "
                                 "data) choose another path\n");
  EXPECT_EQ(read_file(data), bytes);
  Runner over_config({config, "--quiet", "--set", "nodes.train.params.path=" + config});
  EXPECT_EQ(over_config.wait(kExitBound), 2);
  EXPECT_EQ(over_config.err(), "nodes.train.params.path " + config + ": the same file as config " +
                                   config +
                                   " (writing it would replace what was read) choose another "
                                   "path\n");
  EXPECT_EQ(read_file(config), yaml);
}

TEST(RunnerOutputs, SkippedBatchesAreReportedOnStderrEvenWhenQuiet) {
  const std::string path = write_config(
      "skip",
      "pipeline: { epochs: 1, batch_size: 4, device: host, on_error: skip, max_skipped: 100 }\n"
      "nodes:\n"
      "  - { name: load, type: fault_load, params: { batches: 50, sample_shape: [2], mode: "
      "data_error, at_batch: 1, count: 47 } }\n"
      "  - { name: train, type: discard }\n");
  Runner r({path, "--quiet", "--enable-fault-nodes"});
  EXPECT_EQ(r.wait(kExitBound), 0);
  EXPECT_EQ(r.out(), "");
  EXPECT_EQ(r.err(),
            "pipeline_runner: 47 of 50 batches skipped (pipeline.on_error: skip); run with "
            "--report FILE.json to list the first 20 errors\n");
  const std::string report = temp_path("skip.json");
  Runner with_report({path, "--quiet", "--enable-fault-nodes", "--report", report});
  EXPECT_EQ(with_report.wait(kExitBound), 0);
  EXPECT_EQ(with_report.err(),
            "pipeline_runner: 47 of 50 batches skipped (pipeline.on_error: skip); the first 20 "
            "errors are under \"warnings\" in " +
                report + "\n");
}

TEST(RunnerArguments, RangeErrorsShowTheBoundsAndTellANonNumberApart) {
  const std::string path = write_config("args", kSmallRun);
  Runner word({path, "--epochs", "abc"});
  EXPECT_EQ(word.wait(kExitBound), 2);
  EXPECT_EQ(word.err(),
            "--epochs: 'abc' is not a whole number\nRun with --help for more information.\n");
  Runner huge({path, "--epochs", "99999999999999999999"});
  EXPECT_EQ(huge.wait(kExitBound), 2);
  EXPECT_EQ(huge.err(),
            "--epochs: '99999999999999999999' is out of range (must be between 1 and 1000000)\n"
            "Run with --help for more information.\n");
  Runner zero({path, "--trace-limit", "0"});
  EXPECT_EQ(zero.wait(kExitBound), 2);
  EXPECT_EQ(zero.err(),
            "--trace-limit: '0' is out of range (must be between 1 and 1000000000)\n"
            "Run with --help for more information.\n");
}

TEST(RunnerMemory, APipelineThatDoesNotFitFailsAtBuildWithExit2) {
  // The figure the build reads, lowered for the child (inherited through the environment).
  setenv("FLOWFEED_AVAILABLE_MEMORY", "1G", 1);
  Runner r({write_config("memory",
                         "pipeline: { epochs: 1, batch_size: 64, prefetch_depth: 8, device: host "
                         "}\n"
                         "nodes:\n"
                         "  - { name: load, type: synthetic, params: { batches: 4, sample_shape: "
                         "[1024, 1024] } }\n"
                         "  - { name: train, type: discard }\n"),
            "--quiet"});
  unsetenv("FLOWFEED_AVAILABLE_MEMORY");
  EXPECT_EQ(r.wait(kExitBound), 2);
  EXPECT_EQ(r.err(), temp_path("memory.yaml") +
                         ":3:5: pipeline.prefetch_depth, pipeline.batch_size: pool 'load.host' (8 "
                         "buffers of 256.0 MiB) needs 2.0 GiB of host memory, and 1.0 GiB is "
                         "available (FLOWFEED_AVAILABLE_MEMORY; the process would be killed for "
                         "want of memory mid-run) lower pipeline.prefetch_depth, "
                         "pipeline.batch_size\n");
}

TEST(RunnerMemory, ATraceLimitThatDoesNotFitFailsBeforeTheRunNamingTheOption) {
  const std::string trace = temp_path("huge_trace.json");
  setenv("FLOWFEED_AVAILABLE_MEMORY", "1G", 1);
  // Before: "error: std::bad_alloc" (the storage for a billion batches taken at the start).
  Runner r({write_config("huge_trace", kSmallRun), "--quiet", "--trace-limit", "1000000000",
            "--trace", trace});
  unsetenv("FLOWFEED_AVAILABLE_MEMORY");
  EXPECT_EQ(r.wait(kExitBound), 1);
  EXPECT_EQ(r.err(),
            "error: the trace keeps up to 1000000000 batches of 2 nodes (74.5 GiB), more than "
            "half of the 1.0 GiB of host memory available (FLOWFEED_AVAILABLE_MEMORY) lower "
            "--trace-limit (Trace's max_batches)\n");
  std::remove(trace.c_str());
}

/// True once `pid` is blocked opening a FIFO that has no writer (its wait channel in /proc).
bool waits_for_a_writer(pid_t pid) {
  std::ifstream wchan("/proc/" + std::to_string(pid) + "/wchan");
  std::string where;
  std::getline(wchan, where);
  return where == "wait_for_partner";
}

/// Waits (up to 30 s) until the runner blocks on a FIFO, then sends SIGTERM; returns its exit code
/// and checks that it ended promptly.
int terminate_while_blocked(Runner& r) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!waits_for_a_writer(r.pid()) && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(waits_for_a_writer(r.pid()));
  const auto sent = std::chrono::steady_clock::now();
  r.signal(SIGTERM);
  const int code = r.wait(kExitBound);
  EXPECT_LT(std::chrono::steady_clock::now() - sent, std::chrono::seconds(10));
  return code;
}

TEST(RunnerSignal, SigtermWhileTheConfigIsReadExits143SayingWhatWasInterrupted) {
  // A FIFO nobody writes to: open() blocks until the signal comes. It is not reported as an
  // interrupted system call.
  const TempFifo pipe(temp_path("config.fifo"));
  ASSERT_TRUE(pipe.made());
  const std::string& fifo = pipe.path();
  Runner r({fifo, "--quiet"});
  EXPECT_EQ(terminate_while_blocked(r), 143);
  EXPECT_EQ(r.err(),
            "pipeline_runner: SIGTERM while reading the config: stopped before the pipeline was "
            "built\n");
}

TEST(RunnerSignal, SigtermWhileThePipelineIsBuiltExits143SayingWhatWasInterrupted) {
  // The config is valid; building it blocks in the loader's setup, which opens a FIFO nobody
  // writes to (data files that are FIFOs are refused: a test-only loader stands in for a hung
  // network mount).
  const TempFifo pipe(temp_path("setup.fifo"));
  ASSERT_TRUE(pipe.made());
  const std::string& fifo = pipe.path();
  Runner r({write_config("slow_build",
                         "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
                         "nodes:\n"
                         "  - { name: load, type: fault_load, params: { mode: stall, at_batch: "
                         "1000000, open_in_setup: " +
                             fifo +
                             " } }\n"
                             "  - { name: train, type: discard }\n"),
            "--quiet", "--enable-fault-nodes"});
  EXPECT_EQ(terminate_while_blocked(r), 143);
  EXPECT_EQ(r.err(),
            "pipeline_runner: SIGTERM while building the pipeline: stopped before the run "
            "started\n");
}

}  // namespace
}  // namespace flowfeed::test
