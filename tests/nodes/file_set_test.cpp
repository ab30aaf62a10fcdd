// expand_file_set: lists and globs of data set files in a stable order, every file checked up
// front with the bad one named.
#include "flowfeed/nodes/detail/file_set.hpp"

#include <gtest/gtest.h>

#include "flowfeed/error.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

TEST(FileSet, GlobMatchesSortByteWiseAndListsKeepTheirOrder) {
  TempDir dir;
  for (const char* name : {"train-02.npy", "train-00.npy", "train-10.npy", "train-01.npy"}) {
    write_bytes(dir.file(name), Bytes{1, 2, 3}, false);
  }
  write_bytes(dir.file("extra.npy"), Bytes{4}, false);
  EXPECT_EQ(expand_file_set({dir.file("train-*.npy")}, "features"),
            (std::vector<std::string>{dir.file("train-00.npy"), dir.file("train-01.npy"),
                                      dir.file("train-02.npy"), dir.file("train-10.npy")}));
  // A list keeps its order; each glob in it is sorted in place.
  EXPECT_EQ(expand_file_set({dir.file("extra.npy"), dir.file("train-0[12].npy")}, "features"),
            (std::vector<std::string>{dir.file("extra.npy"), dir.file("train-01.npy"),
                                      dir.file("train-02.npy")}));
}

TEST(FileSet, BracesExpandInOrderBeforeGlobs) {
  EXPECT_EQ(expand_braces("train-{000..003}.tar"),
            (std::vector<std::string>{"train-000.tar", "train-001.tar", "train-002.tar",
                                      "train-003.tar"}));
  EXPECT_EQ(expand_braces("s{9..11}"), (std::vector<std::string>{"s9", "s10", "s11"}));
  EXPECT_EQ(expand_braces("s{3..1}"), (std::vector<std::string>{"s3", "s2", "s1"}));
  EXPECT_EQ(expand_braces("{b,a}-{1..2}"), (std::vector<std::string>{"b-1", "b-2", "a-1", "a-2"}));
  EXPECT_EQ(expand_braces("x{a,b{1..2}}"), (std::vector<std::string>{"xa", "xb1", "xb2"}));
  // Not a list or a range: kept as written, like a shell.
  EXPECT_EQ(expand_braces("{x}-{1,2}"), (std::vector<std::string>{"{x}-1", "{x}-2"}));
  EXPECT_EQ(expand_braces("open{1,2"), (std::vector<std::string>{"open{1,2"}));
  EXPECT_EQ(error_of<DataError>([] { expand_braces("s{0..99999999}"); }),
            "s{0..99999999}: the range {0..99999999} names 100000000 files, more than the 1000000 "
            "a brace may (check the bounds)");

  TempDir dir;
  for (const char* name : {"a-0.tar", "a-1.tar", "b-0.tar", "b-1.tar", "b-2.tar"}) {
    write_bytes(dir.file(name), Bytes{1}, false);
  }
  // Brace order first, then each glob's matches sorted.
  EXPECT_EQ(expand_file_set({dir.file("{b,a}-*.tar")}, "shards"),
            (std::vector<std::string>{dir.file("b-0.tar"), dir.file("b-1.tar"), dir.file("b-2.tar"),
                                      dir.file("a-0.tar"), dir.file("a-1.tar")}));
  EXPECT_EQ(error_of<DataError>([&] { expand_file_set({dir.file("a-{0..2}.tar")}, "shards"); }),
            dir.file("a-2.tar") + ": cannot open (No such file or directory)");
}

TEST(FileSet, NamesTheBadEntry) {
  TempDir dir;
  write_bytes(dir.file("a.npy"), Bytes{1}, false);
  std::filesystem::create_directory(dir.file("sub.npy"));
  auto error = [](std::vector<std::string> patterns) {
    return error_of<DataError>([&] { expand_file_set(patterns, "features"); });
  };
  EXPECT_EQ(error({dir.file("a.npy"), dir.file("b.npy")}),
            dir.file("b.npy") + ": cannot open (No such file or directory)");
  EXPECT_EQ(error({dir.file("train-*.npy")}),
            dir.file("train-*.npy") + ": matches no file (check the directory and the pattern)");
  EXPECT_EQ(error({dir.file("sub.npy")}),
            dir.file("sub.npy") +
                ": is a directory, not a regular file (a data file must be a regular file) give "
                "the path of the data file itself");
  EXPECT_EQ(error({dir.file("a.npy"), dir.file("?.npy")}),
            dir.file("a.npy") + ": named twice in features (each file may appear once)");
  EXPECT_EQ(error({}), "features: names no file");
}

}  // namespace
}  // namespace flowfeed
