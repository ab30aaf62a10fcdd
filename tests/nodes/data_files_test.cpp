// Data files that are not regular files: a FIFO, a device, a socket or a directory given to any
// loader (a tokens file, a Megatron .idx, a WebDataset shard, an IDX file, an npy glob's match) is
// refused when the pipeline is built, naming the file and what it is, never read (a FIFO would
// block the build for ever). And a brace pattern whose ranges multiply to billions of names is
// refused before one name is made.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <thread>

#include "flowfeed/data_file.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/nodes/detail/npy_file.hpp"
#include "flowfeed/nodes/detail/token_stream.hpp"
#include "tests/nodes/test_files.hpp"
#include "tests/temp_fifo.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

/// While it lives, opens `fifo` for writing whenever a reader waits on it and closes it at once,
/// so code that does open a FIFO reads an empty file instead of blocking the test for ever (and
/// then fails the test with its own message, not a hang).
class FifoUnblocker {
 public:
  explicit FifoUnblocker(std::string fifo)
      : fifo_(std::move(fifo)), thread_([this] {
          while (!stop_) {
            const int fd = ::open(fifo_.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
            if (fd >= 0) ::close(fd);
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          }
        }) {}
  ~FifoUnblocker() {
    stop_ = true;
    thread_.join();
  }

 private:
  std::string fifo_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

std::string fifo_message(const std::string& path) {
  return path +
         ": is a FIFO (named pipe), not a regular file (a data file must be a regular file; "
         "reading this one could wait for a writer or never end) give the path of the data file "
         "itself";
}

std::string build_error(const std::string& loader) {
  Registry r;
  register_builtin_nodes(r);
  const std::string yaml = "pipeline: { device: host, batch_size: 2 }\nnodes:\n  - " + loader +
                           "\n  - { name: train, type: discard }\n";
  return test::error_of<DataError>([&] { Pipeline p(load_config_string(yaml, r), r); });
}

TEST(DataFiles, OnlyARegularFileOpens) {
  TempDir dir;
  write_bytes(dir.file("ok.bin"), Bytes{1, 2, 3}, false);
  EXPECT_EQ(DataFile(dir.file("ok.bin")).size(), 3u);
  const test::TempFifo fifo(dir.file("pipe"));
  ASSERT_TRUE(fifo.made());
  const FifoUnblocker unblock(fifo.path());
  EXPECT_EQ(test::error_of<DataError>([&] { DataFile f(fifo.path()); }), fifo_message(fifo.path()));
  EXPECT_EQ(test::error_of<DataError>([&] { DataFile f("/dev/zero"); }),
            "/dev/zero: is a character device, not a regular file (a data file must be a regular "
            "file; reading this one could wait for a writer or never end) give the path of the "
            "data file itself");
  EXPECT_EQ(test::error_of<DataError>([&] { DataFile f(dir.file("")); }),
            dir.file("") +
                ": is a directory, not a regular file (a data file must be a regular file) give "
                "the path of the data file itself");
  const std::string socket_path = dir.file("sock");
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path.c_str());
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(test::error_of<DataError>([&] { DataFile f(socket_path); }),
            socket_path +
                ": is a socket, not a regular file (a data file must be a regular file) give the "
                "path of the data file itself");
  ::close(s);
  EXPECT_EQ(test::error_of<DataError>([&] { DataFile f(dir.file("none")); }),
            dir.file("none") + ": cannot open (No such file or directory)");
}

TEST(DataFiles, AGlobThatMatchesAFifoNamesIt) {
  TempDir dir;
  write_bytes(dir.file("a.npy"), Bytes{1}, false);
  const test::TempFifo fifo(dir.file("b.npy"));
  ASSERT_TRUE(fifo.made());
  const FifoUnblocker unblock(fifo.path());
  EXPECT_EQ(test::error_of<DataError>([&] { expand_file_set({dir.file("*.npy")}, "features"); }),
            fifo_message(fifo.path()));
}

TEST(DataFiles, EveryLoaderRefusesAFifoAtBuild) {
  TempDir dir;
  const test::TempFifo fifo(dir.file("pipe"));
  ASSERT_TRUE(fifo.made());
  const FifoUnblocker unblock(fifo.path());
  const std::string p = fifo.path();
  EXPECT_EQ(build_error("{ name: load, type: tokens, params: { files: " + p + ", context: 4 } }"),
            "node 'load' (tokens, <string>:3): " + fifo_message(p));
#if FLOWFEED_TEST_IMAGES
  EXPECT_EQ(build_error("{ name: load, type: webdataset, params: { shards: " + p + " } }"),
            "node 'load' (webdataset, <string>:3): " + fifo_message(p));
#endif
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(4, 2, 2, 2), "idx", false);
  EXPECT_EQ(build_error("{ name: load, type: idx, params: { images: " + p + ", labels: " + labels +
                        " } }"),
            "node 'load' (idx, <string>:3): " + fifo_message(p));
  // A Megatron data set whose .bin is a file and whose .idx is a FIFO.
  write_megatron(dir.file("docs"), DType::uint16, {{1, 2, 3, 4, 5, 6}});
  ::unlink(dir.file("docs.idx").c_str());
  const test::TempFifo idx(dir.file("docs.idx"));
  ASSERT_TRUE(idx.made());
  const FifoUnblocker unblock_idx(idx.path());
  EXPECT_EQ(build_error("{ name: load, type: tokens, params: { files: " + dir.file("docs") +
                        ", format: megatron, context: 2 } }"),
            "node 'load' (tokens, <string>:3): " + fifo_message(idx.path()));
  // An npy glob that matches a FIFO among real shards.
  const std::int32_t y[2] = {0, 1};
  const std::uint8_t x[2] = {1, 2};
  write_npy(dir.file("f-0.npy"), NpyDtype::uint8, {2}, x);
  write_npy(dir.file("l-0.npy"), NpyDtype::int32, {2}, y);
  const test::TempFifo npy(dir.file("f-1.npy"));
  ASSERT_TRUE(npy.made());
  const FifoUnblocker unblock_npy(npy.path());
  EXPECT_EQ(build_error("{ name: load, type: npy, params: { features: '" + dir.file("f-*.npy") +
                        "', labels: '" + dir.file("l-*.npy") + "' } }"),
            "node 'load' (npy, <string>:3): " + fifo_message(npy.path()));
}

TEST(DataFiles, ADeviceOrADirectoryIsNoTokenFile) {
  TempDir dir;
  EXPECT_EQ(build_error("{ name: load, type: tokens, params: { files: /dev/zero, context: 4 } }"),
            "node 'load' (tokens, <string>:3): /dev/zero: is a character device, not a regular "
            "file (a data file must be a regular file; reading this one could wait for a writer "
            "or never end) give the path of the data file itself");
  const std::string d = dir.file("");
  EXPECT_EQ(build_error("{ name: load, type: tokens, params: { files: '" + d + "', context: 4 } }"),
            "node 'load' (tokens, <string>:3): " + d +
                ": is a directory, not a regular file (a data file must be a regular file) give "
                "the path of the data file itself");
}

TEST(DataFiles, BracesThatMultiplyToBillionsAreRefusedBeforeExpansion) {
  EXPECT_EQ(test::error_of<DataError>(
                [] { expand_braces("s-{000000..999999}-{000000..999999}-{0..9}.tar"); }),
            "s-{000000..999999}-{000000..999999}-{0..9}.tar: its braces name 10000000000000 files "
            "together, more than the 1000000 a pattern may (each list or range multiplies the "
            "names of the others) check the bounds, or list fewer shards");
  EXPECT_EQ(test::error_of<DataError>(
                [] { expand_braces("{0..999999}{0..999999}{0..999999}{0..999999}"); }),
            "{0..999999}{0..999999}{0..999999}{0..999999}: its braces name more than 2^64 files "
            "together, more than the 1000000 a pattern may (each list or range multiplies the "
            "names of the others) check the bounds, or list fewer shards");
  // Lists count too, nested ones by their own expansions.
  EXPECT_EQ(test::error_of<DataError>([] { expand_braces("{a,b{1..999999}}{0..9}"); }),
            "{a,b{1..999999}}{0..9}: its braces name 10000000 files together, more than the "
            "1000000 a pattern may (each list or range multiplies the names of the others) check "
            "the bounds, or list fewer shards");
  EXPECT_EQ(expand_braces("{a,b}{0..499999}").size(), 1000000u);
  // The widest range of all: its count does not wrap to 0.
  EXPECT_EQ(test::error_of<DataError>(
                [] { expand_braces("s{-9223372036854775808..9223372036854775807}"); }),
            "s{-9223372036854775808..9223372036854775807}: the range "
            "{-9223372036854775808..9223372036854775807} names 18446744073709551615 files, more "
            "than the 1000000 a brace may (check the bounds)");
}

}  // namespace
}  // namespace flowfeed
