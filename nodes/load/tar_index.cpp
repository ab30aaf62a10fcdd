#include "flowfeed/nodes/detail/tar_index.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <string_view>

#include "flowfeed/data_file.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/memory_budget.hpp"

namespace flowfeed {

namespace {

constexpr std::uint64_t kBlock = 512;
using Block = std::array<unsigned char, kBlock>;

class File {
 public:
  explicit File(const std::string& path) : file_(path) {}

  std::uint64_t size() const { return file_.size(); }
  /// Reads exactly `n` bytes at `offset` (the caller checked they are inside the file).
  void read(std::uint64_t offset, void* dst, std::size_t n) const {
    auto* p = static_cast<char*>(dst);
    std::size_t done = 0;
    while (done < n) {
      const ssize_t got =
          ::pread(file_.fd(), p + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        throw DataError(fmt::format("{}: read of {} bytes at offset {} failed ({})", file_.path(),
                                    n, offset + done,
                                    got < 0 ? std::strerror(errno) : "end of file"));
      }
      done += static_cast<std::size_t>(got);
    }
  }

 private:
  DataFile file_;
};

/// A NUL- (or space-) terminated header field.
std::string_view field(const Block& b, std::size_t offset, std::size_t len) {
  const char* p = reinterpret_cast<const char*>(b.data()) + offset;
  std::size_t n = 0;
  while (n < len && p[n] != '\0') ++n;
  return {p, n};
}

/// An octal number field (leading spaces, trailing NUL/space), or GNU base-256 when the high bit
/// of the first byte is set.
std::optional<std::uint64_t> number(const Block& b, std::size_t offset, std::size_t len) {
  if (b[offset] & 0x80) {
    // GNU base-256: 0x80 then a big-endian number; 0xff starts a negative one, never a size.
    if (b[offset] != 0x80) return std::nullopt;
    std::uint64_t v = 0;
    for (std::size_t i = 1; i < len; ++i) {
      if (v >> 56) return std::nullopt;
      v = (v << 8) | b[offset + i];
    }
    return v;
  }
  std::string_view s = field(b, offset, len);
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  if (s.empty()) return 0;
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 8);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

bool all_zero(const Block& b) {
  for (unsigned char c : b) {
    if (c != 0) return false;
  }
  return true;
}

/// The header checksum: the sum of its bytes with the checksum field read as spaces (unsigned,
/// as POSIX says; some old writers summed signed chars, accepted too).
bool checksum_ok(const Block& b) {
  const std::optional<std::uint64_t> stored = number(b, 148, 8);
  if (!stored) return false;
  std::uint64_t sum = 0;
  std::int64_t signed_sum = 0;
  for (std::size_t i = 0; i < kBlock; ++i) {
    const unsigned char c = (i >= 148 && i < 156) ? ' ' : b[i];
    sum += c;
    signed_sum += static_cast<signed char>(c);
  }
  return *stored == sum || static_cast<std::int64_t>(*stored) == signed_sum;
}

/// Applies the `path` and `size` records of a pax extended header.
void apply_pax(std::string_view records, std::optional<std::string>& path, bool& has_size,
               std::uint64_t& size) {
  while (!records.empty()) {
    const std::size_t space = records.find(' ');
    if (space == std::string_view::npos) return;
    std::size_t len = 0;
    auto [end, ec] = std::from_chars(records.data(), records.data() + space, len);
    if (ec != std::errc() || len <= space || len > records.size()) return;
    std::string_view record = records.substr(space + 1, len - space - 1);
    if (!record.empty() && record.back() == '\n') record.remove_suffix(1);
    const std::size_t eq = record.find('=');
    if (eq != std::string_view::npos) {
      const std::string_view key = record.substr(0, eq);
      const std::string_view value = record.substr(eq + 1);
      if (key == "path") path = std::string(value);
      if (key == "size") {
        std::uint64_t v = 0;
        auto [e2, ec2] = std::from_chars(value.data(), value.data() + value.size(), v);
        if (ec2 == std::errc() && e2 == value.data() + value.size()) {
          has_size = true;
          size = v;
        }
      }
    }
    records.remove_prefix(len);
  }
}

/// A type byte as a message shows it.
std::string printable(char type) {
  const auto c = static_cast<unsigned char>(type);
  return c >= 0x20 && c < 0x7f ? std::string(1, type) : fmt::format("\\x{:02x}", c);
}

/// The offset of the header after an entry at `pos` whose `size` data bytes start at `data`,
/// rounded up to whole blocks: overflow-checked, and strictly after `pos`, so that no header can
/// send the reader back or leave it in place.
std::uint64_t next_header(const std::string& path, std::uint64_t pos, std::uint64_t data,
                          std::uint64_t size) {
  const std::optional<std::uint64_t> end = checked_add(data, size);
  const std::optional<std::uint64_t> next =
      end ? checked_add(*end, (kBlock - *end % kBlock) % kBlock) : std::nullopt;
  if (!next || *next <= pos) {
    throw DataError(fmt::format(
        "{}: bad tar header at offset {}: its size {} takes the next header past 2^64 bytes (the "
        "shard is damaged or not a tar)",
        path, pos, size));
  }
  return *next;
}

}  // namespace

TarListing read_tar_listing(const std::string& path) {
  File file(path);
  TarListing listing;
  listing.file_size = file.size();
  std::optional<std::string> long_name;  // from a GNU 'L' entry or a pax 'x' header
  bool has_pax_size = false;  // a pax 'size' record overrides the next header's size field
  std::uint64_t pax_size = 0;
  std::uint64_t pos = 0;
  Block b{};
  while (pos < file.size()) {
    if (file.size() - pos < kBlock) {
      throw DataError(fmt::format(
          "{}: truncated tar: the file ends {} bytes into the header block at offset {} (a "
          "header is 512 bytes; was the shard cut short while it was written or copied?)",
          path, file.size() - pos, pos));
    }
    file.read(pos, b.data(), kBlock);
    if (all_zero(b)) break;  // end-of-archive
    if (!checksum_ok(b)) {
      throw DataError(
          fmt::format("{}: not a tar header at offset {} (its checksum does not match; the file is "
                      "damaged or not a tar)",
                      path, pos));
    }
    const std::optional<std::uint64_t> size = number(b, 124, 12);
    if (!size) {
      throw DataError(fmt::format("{}: bad size field in the tar header at offset {}", path, pos));
    }
    const char type = static_cast<char>(b[156]);
    const std::uint64_t data = pos + kBlock;
    std::uint64_t data_size = *size;
    if (type == 'L' || type == 'x') {
      // The data of these entries describes the next member; it must be in the file.
      if (data_size > file.size() - data || data_size > (1u << 20)) {
        throw DataError(fmt::format(
            "{}: truncated tar: the {} record at offset {} declares {} bytes but the file ends "
            "{} bytes after its header",
            path, type == 'L' ? "GNU long name" : "pax", pos, data_size, file.size() - data));
      }
      std::string text(data_size, '\0');
      file.read(data, text.data(), text.size());
      if (type == 'L') {
        text.resize(std::strlen(text.c_str()));
        long_name = std::move(text);
      } else {
        apply_pax(text, long_name, has_pax_size, pax_size);
      }
      pos = next_header(path, pos, data, data_size);
      continue;
    }
    if (has_pax_size) data_size = pax_size;
    const bool regular = type == '0' || type == '\0' || type == '7';
    if (!regular && data_size > file.size() - data) {
      // Only a regular member may be cut short (the last one, kept for the caller to judge): any
      // other entry's size must lie inside the file, or the next header would be read from a
      // wrapped-around or far-off offset.
      throw DataError(fmt::format(
          "{}: bad tar header at offset {}: the entry '{}' (type '{}') declares {} bytes, but the "
          "file ends {} bytes after its header (the shard is damaged or not a tar)",
          path, pos, field(b, 0, 100), printable(type), data_size, file.size() - data));
    }
    if (regular) {
      TarMember m;
      if (long_name) {
        m.name = std::move(*long_name);
      } else {
        const std::string_view prefix = field(b, 345, 155);
        const std::string_view magic = field(b, 257, 6);
        m.name = (magic == "ustar" && !prefix.empty())
                     ? fmt::format("{}/{}", prefix, field(b, 0, 100))
                     : std::string(field(b, 0, 100));
      }
      m.header = pos;
      m.offset = data;
      m.size = data_size;
      m.cut_short = data_size > file.size() - data;
      listing.members.push_back(std::move(m));
      if (listing.members.back().cut_short) break;
    }
    long_name.reset();
    has_pax_size = false;
    pos = next_header(path, pos, data, data_size);
  }
  return listing;
}

}  // namespace flowfeed
