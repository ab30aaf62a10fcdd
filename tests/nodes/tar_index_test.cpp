// The tar shard index on hostile headers: sizes near 2^64 on directories and links, a size that
// would send the reader back to the start, base-256 sizes, sizes past the end of the file. Each is
// a DataError naming the shard and the header's offset, found in one pass (never a loop).
#include "flowfeed/nodes/detail/tar_index.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "flowfeed/error.hpp"
#include "tests/error_of.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using testing_files::TempDir;
using Block = std::vector<unsigned char>;

/// A ustar header block for `name` of `type` whose size field holds `size` (12 bytes, as given:
/// octal text or base-256), with its checksum.
Block header(const std::string& name, char type, const std::string& size) {
  Block b(512, 0);
  std::memcpy(b.data(), name.data(), name.size());
  std::memcpy(b.data() + 100, "0000644", 8);
  std::memcpy(b.data() + 108, "0000000", 8);
  std::memcpy(b.data() + 116, "0000000", 8);
  std::memcpy(b.data() + 124, size.data(), std::min<std::size_t>(size.size(), 12));
  std::memcpy(b.data() + 136, "00000000000", 12);
  b[156] = static_cast<unsigned char>(type);
  std::memcpy(b.data() + 257, "ustar", 6);
  std::memcpy(b.data() + 263, "00", 2);
  std::memset(b.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : b) sum += c;
  const std::string check = fmt::format("{:06o}", sum);
  std::memcpy(b.data() + 148, check.data(), 6);
  b[154] = 0;
  return b;
}

/// A base-256 size field: 0x80, then the value big-endian in the last 8 of its 11 bytes.
std::string base256(std::uint64_t v, unsigned char first = 0x80) {
  std::string s(12, '\0');
  s[0] = static_cast<char>(first);
  for (int i = 0; i < 8; ++i) s[11 - i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

/// A regular member `name` holding `data`, padded to whole blocks.
Block member(const std::string& name, const std::string& data) {
  Block b = header(name, '0', fmt::format("{:011o}", data.size()));
  b.insert(b.end(), data.begin(), data.end());
  b.resize((b.size() + 511) / 512 * 512, 0);
  return b;
}

class TarIndex : public ::testing::Test {
 protected:
  /// Writes the blocks in order, then two zero blocks, and returns the path.
  std::string write(const std::vector<Block>& blocks) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    for (const Block& b : blocks) out.write(reinterpret_cast<const char*>(b.data()), b.size());
    const Block end(1024, 0);
    out.write(reinterpret_cast<const char*>(end.data()), end.size());
    return path_;
  }
  std::string error(const std::vector<Block>& blocks) {
    const std::string path = write(blocks);
    return test::error_of<DataError>([&] { read_tar_listing(path); });
  }
  TempDir dir_;
  const std::string path_ = dir_.file("shard.tar");
};

TEST_F(TarIndex, ReadsRegularMembersAndSkipsDirectoriesAndLinks) {
  const std::string path = write({header("d/", '5', "00000000000"), member("d/a.jpg", "abc"),
                                  header("d/l.jpg", '2', "00000000000"), member("d/a.cls", "7")});
  const TarListing listing = read_tar_listing(path);
  ASSERT_EQ(listing.members.size(), 2u);
  EXPECT_EQ(listing.members[0].name, "d/a.jpg");
  EXPECT_EQ(listing.members[0].header, 512u);
  EXPECT_EQ(listing.members[0].size, 3u);
  EXPECT_EQ(listing.members[1].name, "d/a.cls");
  EXPECT_EQ(listing.members[1].header, 2048u);
}

TEST_F(TarIndex, ADirectoryWhoseSizeWrapsAround2To64IsABadHeader) {
  // 2^64 - 512: rounded up and added to the offset, it would wrap back to this very header.
  EXPECT_EQ(error({member("a.jpg", "x"), header("d/", '5', base256(~std::uint64_t{511}))}),
            path_ +
                ": bad tar header at offset 1024: the entry 'd/' (type '5') declares "
                "18446744073709551104 bytes, but the file ends 1024 bytes after its header (the "
                "shard is damaged or not a tar)");
}

TEST_F(TarIndex, ASymlinkWhoseSizePointsBackToTheStartIsABadHeader) {
  // Data at 1536; 2^64 - 1536 takes the next header to offset 0, the start of the file.
  EXPECT_EQ(error({member("a.jpg", "x"), header("l", '2', base256(0 - std::uint64_t{1536}))}),
            path_ +
                ": bad tar header at offset 1024: the entry 'l' (type '2') declares "
                "18446744073709550080 bytes, but the file ends 1024 bytes after its header (the "
                "shard is damaged or not a tar)");
}

TEST_F(TarIndex, AnEntrySizePastTheEndOfTheFileIsABadHeader) {
  // An octal 1 GiB on a 3 KiB file: the members after it would be lost without a word.
  EXPECT_EQ(error({header("d/", '5', "10000000000"), member("a.jpg", "x")}),
            path_ +
                ": bad tar header at offset 0: the entry 'd/' (type '5') declares 1073741824 "
                "bytes, but the file ends 2048 bytes after its header (the shard is damaged or "
                "not a tar)");
}

TEST_F(TarIndex, Base256SizesAreReadAndNegativeOnesRefused) {
  const std::string path = write({header("a.jpg", '0', base256(5)), Block(512, 'x')});
  const TarListing listing = read_tar_listing(path);
  ASSERT_EQ(listing.members.size(), 1u);
  EXPECT_EQ(listing.members[0].size, 5u);
  EXPECT_FALSE(listing.members[0].cut_short);
  EXPECT_EQ(error({header("a.jpg", '0', base256(5, 0xff))}),
            path_ + ": bad size field in the tar header at offset 0");
}

TEST_F(TarIndex, AHugeRegularMemberIsCutShortAndEndsTheListing) {
  const std::string path = write({member("a.jpg", "x"), header("b.jpg", '0', base256(~0ull))});
  const TarListing listing = read_tar_listing(path);
  ASSERT_EQ(listing.members.size(), 2u);
  EXPECT_TRUE(listing.members[1].cut_short);
  EXPECT_EQ(listing.members[1].size, ~0ull);
}

TEST_F(TarIndex, APaxSizeOnALinkIsCheckedLikeItsOwn) {
  const std::string record = "29 size=18446744073709551000\n";
  Block pax = header("pax", 'x', fmt::format("{:011o}", record.size()));
  pax.insert(pax.end(), record.begin(), record.end());
  pax.resize(1024, 0);
  EXPECT_EQ(error({pax, header("l", '2', "00000000000")}),
            path_ +
                ": bad tar header at offset 1024: the entry 'l' (type '2') declares "
                "18446744073709551000 bytes, but the file ends 1024 bytes after its header (the "
                "shard is damaged or not a tar)");
}

// The fuzzer's seeds are real tars (Python's tarfile): each lists its members.
TEST(TarIndexSeeds, EverySeedOfTheFuzzerIsAReadableTar) {
  const std::filesystem::path dir =
      std::filesystem::path(FLOWFEED_SOURCE_DIR) / "tests/fuzz/tar_corpus";
  int seeds = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    SCOPED_TRACE(entry.path().string());
    const TarListing listing = read_tar_listing(entry.path().string());
    EXPECT_GE(listing.members.size(), 1u);
    for (const TarMember& m : listing.members) EXPECT_FALSE(m.cut_short);
    ++seeds;
  }
  EXPECT_EQ(seeds, 5);
}

}  // namespace
}  // namespace flowfeed
