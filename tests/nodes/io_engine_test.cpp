// The I/O engine on its own: reads split into a buffered head, a direct middle and a buffered
// tail land byte-exact, for pread and io_uring.
#include "nodes/load/io_engine.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "flowfeed/error.hpp"
#include "flowfeed/stats.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

TEST(IoEngine, HeadMiddleAndTailOfADirectReadLandInPlace) {
  TempDir dir;
  Bytes content(64 * 1024);
  for (std::size_t i = 0; i < content.size(); ++i)
    content[i] = static_cast<std::uint8_t>(i * 7 + i / 4096);
  write_bytes(dir.file("data.bin"), content, false);
  for (const auto engine : {IoOptions::Engine::pread, IoOptions::Engine::io_uring}) {
    SCOPED_TRACE(io_engine_name(engine));
    IoOptions o;
    o.engine = engine;
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
  for (const auto engine : {IoOptions::Engine::pread, IoOptions::Engine::io_uring}) {
    SCOPED_TRACE(io_engine_name(engine));
    IoOptions o;
    o.engine = engine;
    o.read_bytes = 4096;
    IoEngine io(o, 1, "test");
    IoFile file = io.open(dir.file("short.bin"));
    std::vector<std::byte> buffer(20000);
    // Three 4 KiB reads in flight with io_uring; the one at 8192 comes back short, the one at
    // 12288 empty: the lowest failing offset is reported.
    const ReadRequest request{&file, 0, 16000, buffer.data()};
    EXPECT_EQ(error_of<DataError>([&] { io.read(&request, 1); }),
              dir.file("short.bin") +
                  ": short read at offset 10000 (end of file, 2288 more bytes wanted) the file "
                  "was truncated while open");
  }
}

}  // namespace
}  // namespace flowfeed
