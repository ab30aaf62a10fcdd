// The I/O engine on its own: reads split into a buffered head, a direct middle and a buffered
// tail land byte-exact, for pread and io_uring.
#include "flowfeed/nodes/detail/io_engine.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "flowfeed/error.hpp"
#include "flowfeed/stats.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

/// Each engine, and each with `async` (pread and mmap: pieces read as parallel tasks).
struct EngineCase {
  IoOptions::Engine engine;
  bool async;
};
constexpr EngineCase kEngines[] = {{IoOptions::Engine::pread, false},
                                   {IoOptions::Engine::pread, true},
                                   {IoOptions::Engine::io_uring, false},
                                   {IoOptions::Engine::io_uring, true}};
constexpr EngineCase kBufferedEngines[] = {
    {IoOptions::Engine::pread, false},    {IoOptions::Engine::pread, true},
    {IoOptions::Engine::io_uring, false}, {IoOptions::Engine::io_uring, true},
    {IoOptions::Engine::mmap, false},     {IoOptions::Engine::mmap, true}};

TEST(IoEngine, HeadMiddleAndTailOfADirectReadLandInPlace) {
  TempDir dir;
  Bytes content(64 * 1024);
  for (std::size_t i = 0; i < content.size(); ++i)
    content[i] = static_cast<std::uint8_t>(i * 7 + i / 4096);
  write_bytes(dir.file("data.bin"), content, false);
  for (const EngineCase c : kEngines) {
    SCOPED_TRACE(std::string(io_engine_name(c.engine)) + (c.async ? " async" : ""));
    IoOptions o;
    o.engine = c.engine;
    o.async = c.async;
    o.direct = true;
    o.read_bytes = 8192;
    o.queue_depth = 3;
    IoEngine io(o, 1, "test");
    IoFile file = io.open(dir.file("data.bin"));
    ASSERT_TRUE(file.direct());
    auto* buffer = static_cast<std::byte*>(::operator new (content.size(), std::align_val_t{4096}));
    // Offset 100 into a buffer at 100: a 3996-byte head, aligned middle reads, a 1000-byte tail.
    // And a second request whose destination does not share the file offset's alignment.
    const ReadRequest requests[] = {{&file, 100, 40000 - 100 + 1000, buffer + 100},
                                    {&file, 50000, 3000, buffer + 45000}};
    io.read(requests, 2);
    EXPECT_EQ(std::memcmp(buffer + 100, content.data() + 100, 40900), 0);
    EXPECT_EQ(std::memcmp(buffer + 45000, content.data() + 50000, 3000), 0);
    RunReport report;
    io.report(report, "x");
    EXPECT_EQ(report.extra["x.io_bytes"], 40900.0 + 3000.0);
    // [4096, 40960): 36864 bytes direct.
    EXPECT_EQ(report.extra["x.io_direct_bytes"], 36864.0);
    EXPECT_EQ(report.extra["x.io_uring"], io.engine() == IoOptions::Engine::io_uring ? 1.0 : 0.0);
    ::operator delete (buffer, std::align_val_t{4096});
  }
}

TEST(IoEngine, ReadingPastTheEndNamesFileAndOffset) {
  TempDir dir;
  write_bytes(dir.file("short.bin"), Bytes(10000, 1), false);
  for (const EngineCase c : kBufferedEngines) {
    SCOPED_TRACE(std::string(io_engine_name(c.engine)) + (c.async ? " async" : ""));
    IoOptions o;
    o.engine = c.engine;
    o.async = c.async;
    o.read_bytes = 4096;
    IoEngine io(o, 1, "test");
    IoFile file = io.open(dir.file("short.bin"));
    std::vector<std::byte> buffer(20000);
    // Three 4 KiB reads in flight with io_uring (or as parallel tasks with async pread and mmap);
    // the one at 8192 comes back short, the one at 12288 empty: the lowest failing offset is
    // reported.
    const ReadRequest request{&file, 0, 16000, buffer.data()};
    EXPECT_EQ(error_of<DataError>([&] { io.read(&request, 1); }),
              dir.file("short.bin") +
                  ": short read at offset 10000 (end of file, 2288 more bytes wanted) the file "
                  "was truncated while open");
  }
}

// pread with async: a batch of requests, each split into pieces of read_bytes read as parallel
// tasks, lands byte-exact with the same figures as the serial engine; a failing piece fails the
// call after every other piece finished, and the engine stays usable.
TEST(IoEngine, ParallelPreadPiecesLandInPlace) {
  TempDir dir;
  Bytes content(1 << 20);
  for (std::size_t i = 0; i < content.size(); ++i)
    content[i] = static_cast<std::uint8_t>(i * 13 + i / 977);
  write_bytes(dir.file("data.bin"), content, false);
  IoOptions o;
  o.async = true;
  o.read_bytes = 4096;
  IoEngine io(o, 2, "test");
  IoFile file = io.open(dir.file("data.bin"));
  std::vector<std::byte> buffer(content.size());
  // A large request, a small one, and an empty one, out of file order. Pieces end at multiples
  // of read_bytes in the file: [300000, 709000) is 101 pieces, [7, 5007) two.
  const ReadRequest requests[] = {{&file, 300000, 409000, buffer.data()},
                                  {&file, 7, 5000, buffer.data() + 409000},
                                  {&file, 0, 0, buffer.data() + 414000}};
  io.read(requests, 3);
  EXPECT_EQ(std::memcmp(buffer.data(), content.data() + 300000, 409000), 0);
  EXPECT_EQ(std::memcmp(buffer.data() + 409000, content.data() + 7, 5000), 0);
  RunReport report;
  io.report(report, "x");
  EXPECT_EQ(report.extra["x.io_bytes"], 414000.0);
  EXPECT_EQ(report.extra["x.io_reads"], 101.0 + 2.0);
  EXPECT_GE(report.extra["x.io_max_in_flight"], 1.0);
  // The second request runs past the end: its first failing piece (the one that starts at the
  // end, [1048576, 1052672)) is named, after the first request's pieces all landed.
  std::vector<std::byte> again(content.size());
  const ReadRequest past[] = {{&file, 0, 200000, again.data()},
                              {&file, content.size() - 5000, 20000, again.data() + 200000}};
  EXPECT_EQ(error_of<DataError>([&] { io.read(past, 2); }),
            dir.file("data.bin") + ": short read at offset " + std::to_string(content.size()) +
                " (end of file, 4096 more bytes wanted) the file was truncated while open");
  EXPECT_EQ(std::memcmp(again.data(), content.data(), 200000), 0);
  io.read(requests, 1);
  EXPECT_EQ(std::memcmp(buffer.data(), content.data() + 300000, 409000), 0);
}

// mmap: the file is mapped at open() and reads copy from the mapping, byte-exact, in pieces of
// read_bytes (parallel with async); no system call per read; direct reads cannot apply.
TEST(IoEngine, MappedReadsCopyFromTheMapping) {
  TempDir dir;
  Bytes content(300000);
  for (std::size_t i = 0; i < content.size(); ++i)
    content[i] = static_cast<std::uint8_t>(i * 11 + i / 613);
  write_bytes(dir.file("data.bin"), content, false);
  write_bytes(dir.file("empty.bin"), Bytes{}, false);
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "serial");
    IoOptions o;
    o.engine = IoOptions::Engine::mmap;
    o.async = async;
    o.read_bytes = 4096;
    IoEngine io(o, 2, "test");
    EXPECT_EQ(io.engine(), IoOptions::Engine::mmap);
    IoFile file = io.open(dir.file("data.bin"));
    EXPECT_TRUE(file.mapped());
    EXPECT_FALSE(io.open(dir.file("empty.bin")).mapped());  // nothing to map
    std::vector<std::byte> buffer(content.size());
    const ReadRequest requests[] = {{&file, 123, 200000, buffer.data()},
                                    {&file, 0, 7, buffer.data() + 200000}};
    io.read(requests, 2);
    EXPECT_EQ(std::memcmp(buffer.data(), content.data() + 123, 200000), 0);
    EXPECT_EQ(std::memcmp(buffer.data() + 200000, content.data(), 7), 0);
    RunReport report;
    io.report(report, "x");
    EXPECT_EQ(report.extra["x.io_bytes"], 200007.0);
    EXPECT_EQ(report.extra["x.io_uring"], 0.0);
    EXPECT_TRUE(report.warnings.empty());
  }
  IoOptions direct;
  direct.engine = IoOptions::Engine::mmap;
  direct.direct = true;
  EXPECT_EQ(error_of<DataError>([&] { IoEngine io(direct, 1, "test"); }),
            "io: mmap copies from the page cache, so direct: true cannot apply (set io: pread or "
            "io_uring for O_DIRECT reads, or direct: false)");
}

}  // namespace
}  // namespace flowfeed
