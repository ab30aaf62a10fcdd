// Output files are written whole or not at all, and every failure says why.
#include "flowfeed/output.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "flowfeed/error.hpp"

namespace flowfeed {
namespace {

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "flowfeed_output_" + std::to_string(getpid()) + "_" + name;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
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
  EXPECT_EQ(read_file(path), "old contents\n");
  out.write(std::string(200000, 'x'));
  out.commit();
  EXPECT_EQ(read_file(path), "new " + std::string(200000, 'x'));
  EXPECT_EQ(leftovers(path), 0);
}

TEST(OutputFile, AFileNeverCommittedLeavesTheOldOneAndNoTemporaryFile) {
  const std::string path = temp_path("kept.txt");
  std::ofstream(path) << "old contents\n";
  {
    OutputFile out(path, "report");
    out.write(std::string(100000, 'y'));
  }
  EXPECT_EQ(read_file(path), "old contents\n");
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

}  // namespace
}  // namespace flowfeed
