// Output files are written whole or not at all, and every failure says why.
#include "flowfeed/output.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "flowfeed/error.hpp"
#include "tests/error_of.hpp"
#include "tests/files.hpp"
#include "tests/temp_fifo.hpp"

namespace flowfeed {
namespace {
// Named apart from the helpers of the test files it shares a unity group with.
namespace output_test {

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "flowfeed_output_" + std::to_string(getpid()) + "_" + name;
}

/// Files in the temp dir whose name starts with `path`'s name, other than `path` itself.
int leftovers(const std::string& path) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(testing::TempDir())) {
    const std::string p = entry.path().string();
    if (p != path && p.rfind(path, 0) == 0) ++n;
  }
  return n;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(OutputFile, CommitReplacesTheFileWhole) {
  const std::string path = temp_path("whole.txt");
  std::ofstream(path) << "old contents\n";
  OutputFile out(path, "report");
  out.write("new ");
  // Until the commit, the old file is what a reader sees.
  EXPECT_EQ(test::read_file(path), "old contents\n");
  out.write(std::string(200000, 'x'));
  out.commit();
  EXPECT_EQ(test::read_file(path), "new " + std::string(200000, 'x'));
  EXPECT_EQ(leftovers(path), 0);
}

TEST(OutputFile, AFileNeverCommittedLeavesTheOldOneAndNoTemporaryFile) {
  const std::string path = temp_path("kept.txt");
  std::ofstream(path) << "old contents\n";
  {
    OutputFile out(path, "report");
    out.write(std::string(100000, 'y'));
  }
  EXPECT_EQ(test::read_file(path), "old contents\n");
  EXPECT_EQ(leftovers(path), 0);
}

TEST(OutputFile, AWriteErrorIsReportedWithItsReason) {
  EXPECT_EQ(error_of([] { write_output_file("/dev/full", "{}\n", "report"); }),
            "cannot write report /dev/full (No space left on device)");
  // Large writes fail at write(), not only at the final flush.
  EXPECT_EQ(error_of([] {
              OutputFile out("/dev/full", "trace");
              out.write(std::string(1 << 17, 'z'));
            }),
            "cannot write trace /dev/full (No space left on device)");
}

TEST(OutputFile, PathsAreCheckedWithTheirOwnReasons) {
  EXPECT_EQ(error_of([] { check_output_path("/nonexistent-dir/r.json", "report"); }),
            "cannot write report /nonexistent-dir/r.json (directory /nonexistent-dir: No such file "
            "or directory)");
  EXPECT_EQ(error_of([] { check_output_path("/", "timeline"); }),
            "cannot write timeline / (it is a directory)");
  const std::string file = temp_path("plain");
  std::ofstream(file) << "x";
  EXPECT_EQ(error_of([&] { check_output_path(file + "/r.json", "report"); }),
            "cannot write report " + file + "/r.json (" + file + " is not a directory)");
  EXPECT_EQ(error_of([] { check_output_path("", "report"); }),
            "cannot write report '' (the path is empty)");
  EXPECT_EQ(error_of([] { check_output_path("/dev/null", "report"); }), "no error");
  EXPECT_EQ(error_of([&] { check_output_path(temp_path("new.json"), "report"); }), "no error");
}

TEST(OutputFile, ALinkIsWrittenThroughEvenWhenItsTargetIsNewAndALoopIsRefused) {
  const std::string target = temp_path("link_target.json");
  const std::string link = temp_path("dangling.json");
  std::remove(target.c_str());
  std::remove(link.c_str());
  std::filesystem::create_symlink(std::filesystem::path(target).filename(), link);
  // Before, the link itself was replaced by the file (and its target never written).
  write_output_file(link, "{}\n", "report");
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(test::read_file(target), "{}\n");
  const std::string a = temp_path("loop_a"), b = temp_path("loop_b");
  std::remove(a.c_str());
  std::remove(b.c_str());
  std::filesystem::create_symlink(b, a);
  std::filesystem::create_symlink(a, b);
  EXPECT_EQ(error_of([&] { check_output_path(a, "report"); }),
            "cannot write report " + a + " (Too many levels of symbolic links)");
  EXPECT_TRUE(std::filesystem::is_symlink(a));
  for (const std::string& f : {target, link, a, b}) std::remove(f.c_str());
}

/// Sets `stop` 100 ms from now, on another thread; joined on destruction.
class StopSoon {
 public:
  explicit StopSoon(std::atomic<bool>& stop)
      : thread_([&stop] {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          stop = true;
        }) {}
  ~StopSoon() { thread_.join(); }

 private:
  std::thread thread_;
};

TEST(OutputFile, AFifoNobodyOpensIsGivenUpWhenAskedToStop) {
  const test::TempFifo fifo(temp_path("unread.fifo"));
  ASSERT_TRUE(fifo.made());
  std::atomic<bool> stop{false};
  const StopSoon soon(stop);
  // Before, open() waited for a reader forever, whatever the flag said.
  EXPECT_EQ(error_of([&] { write_output_file(fifo.path(), "{}\n", "report", &stop); }),
            "cannot write report " + fifo.path() + " (interrupted)");
}

TEST(OutputFile, AFifoWhoseReaderDoesNotReadIsGivenUpWhenAskedToStop) {
  const test::TempFifo fifo(temp_path("stuck.fifo"));
  ASSERT_TRUE(fifo.made());
  // A reader that never reads: the pipe fills after 64 KiB.
  const int reader = ::open(fifo.path().c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  std::atomic<bool> stop{false};
  const StopSoon soon(stop);
  EXPECT_EQ(error_of([&] {
              OutputFile out(fifo.path(), "trace", &stop);
              out.write(std::string(1 << 20, 't'));
              out.commit();
            }),
            "cannot write trace " + fifo.path() + " (interrupted)");
  ::close(reader);
}

TEST(OutputFile, AStoppedWriteToARegularFileLeavesTheOldFileAndNoTemporaryFile) {
  const std::string path = temp_path("stopped.json");
  std::ofstream(path) << "old contents\n";
  std::atomic<bool> stop{true};
  EXPECT_EQ(error_of([&] { write_output_file(path, std::string(100000, 'r'), "report", &stop); }),
            "cannot write report " + path + " (interrupted)");
  EXPECT_EQ(test::read_file(path), "old contents\n");
  EXPECT_EQ(leftovers(path), 0);
}

std::string paths_error(const std::vector<NamedPath>& paths) {
  return test::error_of<ConfigError>([&] { check_paths_apart(paths); });
}

/// paths_error with each `dir` in the message written as "D".
std::string paths_error_in(const std::string& dir, const std::vector<NamedPath>& paths) {
  std::string message = paths_error(paths);
  for (std::size_t at = 0; (at = message.find(dir, at)) != std::string::npos;) {
    message.replace(at, dir.size(), "D");
  }
  return message;
}

TEST(OutputPaths, AnOutputInsideTheCheckpointDirectoryIsRefusedThroughDotDotAndLinks) {
  using Use = NamedPath::Use;
  const std::string dir = temp_path("apart");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/ck");
  std::filesystem::create_directory_symlink(dir + "/ck", dir + "/link");
  const std::string theirs = " (the files there are the checkpoint's) choose another path";
  EXPECT_EQ(paths_error_in(dir, {{"--checkpoint", dir + "/ck", Use::directory},
                                 {"--report", dir + "/ck/pipeline.json", Use::output}}),
            "--report D/ck/pipeline.json: inside the --checkpoint directory D/ck" + theirs);
  EXPECT_EQ(paths_error_in(dir, {{"--checkpoint", dir + "/ck/", Use::directory},
                                 {"--trace", dir + "/link/../ck/./t.json", Use::output},
                                 {"--timeline", dir + "/link/t.svg", Use::output}}),
            "--trace D/link/../ck/./t.json: inside the --checkpoint directory D/ck/" + theirs +
                "\n--timeline D/link/t.svg: inside the --checkpoint directory D/ck/" + theirs);
  EXPECT_EQ(
      paths_error_in(dir, {{"--checkpoint", dir + "/ck", Use::directory},
                           {"--report", dir + "/link", Use::output}}),
      "--report D/link: the same path as the --checkpoint directory D/ck choose another path");
  // A directory beside it whose name starts the same is not inside it.
  EXPECT_EQ(paths_error({{"--checkpoint", dir + "/ck", Use::directory},
                         {"--report", dir + "/ck2/r.json", Use::output}}),
            "<no exception>");
  std::filesystem::remove_all(dir);
}

TEST(OutputPaths, TwoOutputsOrAnOutputAndAnInputNamingOneFileAreRefused) {
  using Use = NamedPath::Use;
  const std::string dir = temp_path("same");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/x.yaml") << "{}\n";
  std::filesystem::create_symlink(dir + "/x.yaml", dir + "/alias.json");
  EXPECT_EQ(paths_error_in(dir, {{"config", dir + "/x.yaml", Use::input},
                                 {"--report", dir + "/out.json", Use::output},
                                 {"--trace", dir + "/sub/../out.json", Use::output},
                                 {"--timeline", dir + "/alias.json", Use::output}}),
            "--trace D/sub/../out.json: the same file as --report D/out.json (one would replace "
            "the other) choose another path\n--timeline D/alias.json: the same file as config "
            "D/x.yaml (writing it would replace what was read) choose another path");
  // Special files replace nothing: two outputs may share /dev/null.
  EXPECT_EQ(
      paths_error({{"--report", "/dev/null", Use::output}, {"--trace", "/dev/null", Use::output}}),
      "<no exception>");
  std::filesystem::remove_all(dir);
}

}  // namespace output_test
}  // namespace
}  // namespace flowfeed
