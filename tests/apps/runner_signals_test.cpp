// pipeline_runner as a user meets it: run in a child process, its exit code, what it prints, and
// what SIGINT / SIGTERM do to a run in progress.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/apps/runner_process.hpp"
#include "tests/temp_fifo.hpp"

namespace flowfeed::test {
namespace {

/// A run of 1000 batches with a train step of 2 ms: long enough to be interrupted.
std::string long_run(const std::string& train) {
  return "pipeline: { epochs: 1, batch_size: 16, prefetch_depth: 4, device: host }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, concurrency: 2, params: { batches: 1000, "
         "sample_shape: [8] } }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - " +
         train + "\n";
}

// The progress line the runner prints (to stderr, every 500 ms) once the run is under way.
constexpr const char* kProgress = "flowfeed: ";

// What the runner prints on stdout when a signal stopped the run.
constexpr const char* kInterrupted = "interrupted: the run was stopped before its end\n";

/// What a finished run printed.
struct Printed {
  std::string out, err;
};

/// Runs the runner with `args` to its end and expects exit code `code`.
Printed finished(const std::vector<std::string>& args, int code) {
  Runner r(args);
  EXPECT_EQ(r.wait(kExitBound), code);
  return {r.out(), r.err()};
}

/// Runs `path` with the fault nodes and --quiet, and expects exit code 1.
Printed fault_run(const std::string& path) {
  return finished({path, "--enable-fault-nodes", "--quiet"}, 1);
}

/// Once the run is under way (its progress line is out), sends SIGINT twice, 200 ms apart.
void interrupt_twice(Runner& r) {
  ASSERT_TRUE(r.wait_for_stderr(kProgress, kExitBound)) << r.err();
  r.signal(SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  r.signal(SIGINT);
}

/// Paths for a run's --report (`name`.json) and --checkpoint (`name`_ck), neither there yet.
std::pair<std::string, std::string> fresh_report_and_checkpoint(const std::string& name) {
  std::pair<std::string, std::string> paths{runner_temp_path(name + ".json"),
                                            runner_temp_path(name + "_ck")};
  std::remove(paths.first.c_str());
  std::filesystem::remove_all(paths.second);
  return paths;
}

TEST(RunnerExit, NodeFailureExits1WithOneMessageNamingNodeLineAndBatch) {
  const std::string path = write_config("fail",
                                        "pipeline: { epochs: 2, batch_size: 16, device: host }\n"
                                        "nodes:\n"
                                        "  - { name: load, type: fault_load, params: { batches: 5, "
                                        "sample_shape: [8], mode: throw, at_batch: 7 } }\n"
                                        "  - { name: train, type: checksum }\n");
  const Printed printed = fault_run(path);
  EXPECT_EQ(printed.err, "error: node 'load' (fault_load, " + path +
                             ":3) batch 7 (epoch 1): fault_load: injected failure at batch 7\n");
  EXPECT_EQ(printed.out, "");
}

TEST(RunnerExit, DataErrorNamesFileAndOffset) {
  const std::string path = write_config(
      "data",
      "pipeline: { epochs: 1, batch_size: 16, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 5, sample_shape: [8] } }\n"
      "  - { name: stage, type: fault_staging, params: { mode: data_error, at_batch: 2, file: "
      "shard-3.bin } }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: checksum }\n");
  EXPECT_EQ(fault_run(path).err, "error: node 'stage' (fault_staging, " + path +
                                     ":4) batch 2 (epoch 0): shard-3.bin: short read at offset "
                                     "1024 (injected by fault_staging at batch 2)\n");
}

TEST(RunnerExit, StalledSinkExits1NamingTheStuckNode) {
  const std::string path = write_config(
      "stall",
      "pipeline: { epochs: 1, batch_size: 16, device: host, stall_timeout_s: 0.5 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 50, sample_shape: [8] } }\n"
      "  - { name: train, type: fault_train, params: { mode: stall, at_batch: 3, stall_s: 100000 } "
      "}\n");
  EXPECT_EQ(fault_run(path).err,
            "error: run stalled: no progress for 0.5 s (pipeline.stall_timeout_s): node "
            "'train' (fault_train, " +
                path + ":4) is still processing batch 3 (epoch 0)\n");
}

TEST(RunnerExit, ConfigErrorExits2) {
  const std::string path = write_config("config",
                                        "pipeline: { epochs: 1, prefetch_dept: 4 }\n"
                                        "nodes:\n"
                                        "  - { name: load, type: synthetic }\n"
                                        "  - { name: train, type: checksum }\n");
  EXPECT_EQ(finished({path, "--quiet"}, 2).err,
            path + ":1:24: pipeline.prefetch_dept: unknown key (did you mean 'prefetch_depth'?)\n");
}

TEST(RunnerExit, FaultNodesExistOnlyWhenAskedFor) {
  const std::string path =
      write_config("nofault",
                   "pipeline: { epochs: 1 }\n"
                   "nodes:\n"
                   "  - { name: load, type: fault_load, params: { mode: throw } }\n"
                   "  - { name: train, type: checksum }\n");
  const std::string err = finished({path, "--quiet"}, 2).err;
  EXPECT_EQ(err.rfind(path + ":3:25: nodes[0].type: unknown node type 'fault_load' (", 0), 0u)
      << err;
}

TEST(RunnerSignal, SigintStopsDrainsPrintsTheSummaryAndExits130) {
  const std::string path =
      write_config("sigint", long_run("{ name: train, type: sleep, params: { ms: 2 } }"));
  const std::string report =
      testing::TempDir() + "flowfeed_runner_" + std::to_string(getpid()) + "_sigint.json";
  std::remove(report.c_str());
  Runner r({path, "--report", report});
  ASSERT_TRUE(r.wait_for_stderr(kProgress, kExitBound)) << r.err();
  r.signal(SIGINT);
  EXPECT_EQ(r.wait(kExitBound), 130) << r.err();
  EXPECT_NE(r.out().find(kInterrupted), std::string::npos) << r.out();
  EXPECT_EQ(r.err().find("error"), std::string::npos) << r.err();
  const std::string json = read_file(report);
  EXPECT_NE(json.find("\"interrupted\": true"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"batches\": 1000,"), std::string::npos) << json;
}

TEST(RunnerSignal, SigtermExits143) {
  const std::string path =
      write_config("sigterm", long_run("{ name: train, type: sleep, params: { ms: 2 } }"));
  Runner r({path});
  ASSERT_TRUE(r.wait_for_stderr(kProgress, kExitBound)) << r.err();
  r.signal(SIGTERM);
  EXPECT_EQ(r.wait(kExitBound), 143) << r.err();
  EXPECT_NE(r.out().find(kInterrupted), std::string::npos) << r.out();
}

TEST(RunnerSignal, SecondSigintAbortsADrainThatWaitsForAStalledNode) {
  // The first SIGINT drains, which waits for the stalled sink; the second cancels the graph.
  const std::string path = write_config(
      "abort", long_run("{ name: train, type: fault_train, params: { mode: stall, at_batch: 2, "
                        "stall_s: 100000 } }"));
  Runner r({path, "--enable-fault-nodes"});
  ASSERT_NO_FATAL_FAILURE(interrupt_twice(r));
  EXPECT_EQ(r.wait(kExitBound), 130) << r.err();
  EXPECT_NE(r.out().find(kInterrupted), std::string::npos) << r.out();
  EXPECT_EQ(r.err().find("did not end"), std::string::npos) << r.err();
}

TEST(RunnerSignal, SecondSigintExitsEvenWhenANodeNeverReturns) {
  // `sleep` with ms: 1e7 blocks in one call that no cancellation reaches: the runner gives up on
  // it 2 s after the abort and exits anyway.
  const std::string path =
      write_config("stuck", long_run("{ name: train, type: sleep, params: { ms: 10000000 } }"));
  Runner r({path});
  ASSERT_NO_FATAL_FAILURE(interrupt_twice(r));
  EXPECT_EQ(r.wait(kExitBound), 130) << r.err();
  EXPECT_NE(r.err().find("pipeline_runner: the run did not end within 2 s of the abort (a node is "
                         "stuck in a call that does not return); exiting\n"),
            std::string::npos)
      << r.err();
}

TEST(RunnerSignal, SighupDrainsCheckpointsReportsAndExits129LikeSigterm) {
  const std::string path =
      write_config("sighup", long_run("{ name: train, type: sleep, params: { ms: 2 } }"));
  const auto [report, checkpoint] = fresh_report_and_checkpoint("sighup");
  Runner r({path, "--report", report, "--checkpoint", checkpoint});
  ASSERT_TRUE(r.wait_for_stderr(kProgress, kExitBound)) << r.err();
  // Before, SIGHUP's default action killed the process: no drain, checkpoint or report.
  r.signal(SIGHUP);
  EXPECT_EQ(r.wait(kExitBound), 129) << r.err();
  EXPECT_NE(r.out().find(kInterrupted), std::string::npos) << r.out();
  EXPECT_NE(r.err().find("pipeline_runner: checkpoint " + checkpoint + ": epoch 0, "),
            std::string::npos)
      << r.err();
  EXPECT_NE(read_file(checkpoint + "/pipeline.json").find("\"format\": \"flowfeed checkpoint\""),
            std::string::npos);
  EXPECT_NE(read_file(report).find("\"interrupted\": true"), std::string::npos);
  std::filesystem::remove_all(checkpoint);
}

TEST(RunnerSignal, ASignalWhileTheReportWaitsForAFifoNobodyReadsEndsTheRunPromptly) {
  const test::TempFifo fifo(runner_temp_path("report.fifo"));
  ASSERT_TRUE(fifo.made());
  const std::string trace = runner_temp_path("fifo_trace.json");
  const std::string path = write_config(
      "report_fifo",
      "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 3, sample_shape: [2] } }\n"
      "  - { name: train, type: checksum }\n");
  for (const auto& [sig, name] :
       {std::pair{SIGTERM, "SIGTERM"}, std::pair{SIGINT, "SIGINT"}, std::pair{SIGHUP, "SIGHUP"}}) {
    std::remove(trace.c_str());
    Runner r({path, "--report", fifo.path(), "--trace", trace});
    // The summary is printed before the report is written: from then on the runner waits for a
    // reader of the FIFO that never comes.
    const auto end = Clock::now() + std::chrono::duration<double>(kExitBound);
    while (r.out().find("verdict") == std::string::npos && Clock::now() < end) {
      r.wait_for_stderr("<never printed>", 0.05);
    }
    ASSERT_NE(r.out().find("verdict"), std::string::npos) << r.out();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    r.signal(sig);
    // Before, the first signal did nothing: the runner waited on the FIFO for ever.
    EXPECT_EQ(r.wait(10), 128 + sig) << name << ": " << r.err();
    EXPECT_EQ(r.err(), std::string("pipeline_runner: ") + name + ": cannot write report " +
                           fifo.path() + " (interrupted)\n");
    // The trace, written before, is whole.
    EXPECT_NE(read_file(trace).find("traceEvents"), std::string::npos);
  }
}

TEST(RunnerSignal, ARecordFileWaitingForAFifoReaderEndsWithTheAbort) {
  const test::TempFifo fifo(runner_temp_path("record.fifo"));
  ASSERT_TRUE(fifo.made());
  const std::string path =
      write_config("record_fifo",
                   "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
                   "nodes:\n"
                   "  - { name: load, type: synthetic, params: { batches: 1000, sample_shape: "
                   "[2] } }\n"
                   "  - { name: train, type: record, params: { path: " +
                       fifo.path() + " } }\n");
  Runner r({path});
  ASSERT_NO_FATAL_FAILURE(interrupt_twice(r));
  // Before, the open() of the FIFO could not be cancelled: the runner gave up on it 2 s later.
  EXPECT_EQ(r.wait(kExitBound), 130) << r.err();
  EXPECT_EQ(r.err().find("did not end"), std::string::npos) << r.err();
  EXPECT_EQ(r.err().find("error"), std::string::npos) << r.err();
}

TEST(RunnerSignal, AClosedStdoutDoesNotKillTheRunBeforeItsReportAndCheckpoint) {
  const std::string path =
      write_config("closed_stdout", long_run("{ name: train, type: checksum }"));
  const auto [report, checkpoint] = fresh_report_and_checkpoint("closed_stdout");
  // `true` has exited before the summary is printed: writing it meets a pipe with no reader.
  // Before, SIGPIPE killed the runner there (exit 141 through pipefail) and no report was
  // written.
  const int code =
      run_shell("bash -c 'set -o pipefail; " + std::string(FLOWFEED_RUNNER) + " " + path +
                " --report " + report + " --checkpoint " + checkpoint + " 2>/dev/null | true'");
  EXPECT_EQ(code, 0);
  EXPECT_NE(read_file(report).find("\"batches\": 1000,"), std::string::npos);
  EXPECT_NE(read_file(checkpoint + "/pipeline.json").find("\"format\": \"flowfeed checkpoint\""),
            std::string::npos);
  std::filesystem::remove_all(checkpoint);
}

const std::string kSmallRunForClosedFds =
    "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
    "nodes:\n"
    "  - { name: load, type: synthetic, params: { batches: 3, sample_shape: [2] } }\n"
    "  - { name: train, type: checksum }\n";

TEST(RunnerSignal, AClosedStdoutAndStderrDoNotPrintIntoTheFilesTheRunOpens) {
  const std::string path = write_config("closed_fds", kSmallRunForClosedFds);
  const auto [report, checkpoint] = fresh_report_and_checkpoint("closed_fds");
  // `>&- 2>&-`: descriptors 1 and 2 are free. Before, the checkpoint's lock file, opened first,
  // became descriptor 1, and the summary table and the checkpoint line were written into it.
  const int code = run_shell("sh -c 'exec " + std::string(FLOWFEED_RUNNER) + " " + path +
                             " --report " + report + " --checkpoint " + checkpoint + " >&- 2>&-'");
  EXPECT_EQ(code, 0);
  const std::string lock = read_file(checkpoint + "/flowfeed.lock");
  EXPECT_EQ(lock.rfind("flowfeed checkpoint lock\npid ", 0), 0u) << lock;
  EXPECT_EQ(lock.find("batches"), std::string::npos) << lock;
  EXPECT_EQ(lock.find("pipeline_runner"), std::string::npos) << lock;
  EXPECT_EQ(read_file(report).rfind("{", 0), 0u);
  EXPECT_EQ(read_file(checkpoint + "/pipeline.json").rfind("{", 0), 0u);
  std::filesystem::remove_all(checkpoint);
  std::remove(report.c_str());
}

}  // namespace
}  // namespace flowfeed::test
