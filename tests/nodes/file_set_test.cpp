// expand_file_set: lists and globs of data set files in a stable order, every file checked up
// front with the bad one named.
#include "nodes/load/file_set.hpp"

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
  EXPECT_EQ(error({dir.file("sub.npy")}), dir.file("sub.npy") + ": cannot open (Is a directory)");
  EXPECT_EQ(error({dir.file("a.npy"), dir.file("?.npy")}),
            dir.file("a.npy") + ": named twice in features (each file may appear once)");
  EXPECT_EQ(error({}), "features: names no file");
}

}  // namespace
}  // namespace flowfeed
