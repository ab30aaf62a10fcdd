#include "flowfeed/nodes/detail/token_stream.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <stdexcept>

#include "flowfeed/data_file.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"
#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed {

namespace {

constexpr char kMagic[] = "MMIDIDX\x00\x00";  // 9 bytes (the literal's own NUL is not part of it)
constexpr std::size_t kMagicBytes = 9;
constexpr std::size_t kHeaderBytes = 34;  // magic, version u64, dtype u8, sequences u64, docs u64

/// Megatron-LM's DType codes (megatron/core/datasets/indexed_dataset.py).
const char* megatron_code_name(unsigned code) {
  static const char* const names[] = {"?",     "uint8",   "int8",    "int16", "int32",
                                      "int64", "float64", "float32", "uint16"};
  return code < std::size(names) ? names[code] : "unknown";
}

std::optional<DType> megatron_token_dtype(unsigned code) {
  switch (code) {
    case 1: return DType::uint8;
    case 4: return DType::int32;
    case 8: return DType::uint16;
    default: return std::nullopt;
  }
}

unsigned megatron_code(DType dtype) {
  switch (dtype) {
    case DType::uint8: return 1;
    case DType::int32: return 4;
    case DType::uint16: return 8;
    default: throw std::invalid_argument("write_megatron: tokens must be uint8, uint16 or int32");
  }
}

/// Little-endian values read in order from one section of an open file, through a buffer of
/// fixed size: an index is never held in memory whole.
class SectionReader {
 public:
  SectionReader(const DataFile& file, std::uint64_t offset) : file_(file), offset_(offset) {}
  /// The next value; the caller checked that the section lies inside the file.
  template <typename T>
  T next() {
    if (pos_ + sizeof(T) > end_) refill();
    T v;
    std::memcpy(&v, buffer_.data() + pos_, sizeof v);  // little-endian hosts (x86-64, arm64)
    pos_ += sizeof v;
    return v;
  }

 private:
  void refill() {
    const std::size_t keep = end_ - pos_;
    std::memmove(buffer_.data(), buffer_.data() + pos_, keep);
    const std::uint64_t left = file_.size() > offset_ ? file_.size() - offset_ : 0;
    const auto want =
        static_cast<std::size_t>(std::min<std::uint64_t>(buffer_.size() - keep, left));
    std::size_t done = 0;
    while (done < want) {
      const ssize_t got = ::pread(file_.fd(), buffer_.data() + keep + done, want - done,
                                  static_cast<off_t>(offset_ + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        throw DataError(fmt::format("{}: read at offset {} failed ({})", file_.path(),
                                    offset_ + done,
                                    got < 0 ? std::strerror(errno) : "the file shrank"));
      }
      done += static_cast<std::size_t>(got);
    }
    offset_ += want;
    pos_ = 0;
    end_ = keep + want;
  }

  const DataFile& file_;
  std::uint64_t offset_;
  std::vector<std::byte> buffer_ = std::vector<std::byte>(std::size_t{1} << 16);  // off the stack
  std::size_t pos_ = 0;
  std::size_t end_ = 0;
};

std::string strip_megatron_extension(const std::string& path) {
  for (const char* ext : {".bin", ".idx"}) {
    if (path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0) {
      return path.substr(0, path.size() - 4);
    }
  }
  return path;
}

}  // namespace

std::vector<std::string> expand_token_files(const std::vector<std::string>& patterns,
                                            TokenFormat format, RemoteSource* remote) {
  if (format == TokenFormat::raw) return expand_file_set(patterns, "files", remote);
  // A Megatron data set is named by its prefix: match the patterns against the .bin files (an
  // s3 glob against the bucket's listing).
  std::vector<std::string> prefixes;
  for (const std::string& p : patterns) {
    const std::string bin = p.empty() ? p : strip_megatron_extension(p) + ".bin";
    if (!is_remote_url(p)) {
      for (std::string& f : expand_file_set({bin}, "files")) {
        prefixes.push_back(strip_megatron_extension(f));
      }
      continue;
    }
    if (!remote) throw DataError(p + ": files here must be local files");
    if (!remote->files) remote->files = std::make_shared<RemoteFiles>(remote->options);
    for (const std::string& expanded : expand_braces(bin)) {
      for (const std::string& url : remote->files->list(expanded)) {
        prefixes.push_back(strip_megatron_extension(url));
      }
    }
  }
  std::set<std::string> seen;
  for (const std::string& p : prefixes) {
    if (!seen.insert(p).second) {
      throw DataError(p + ": named twice in files (each file may appear once)");
    }
  }
  return prefixes;
}

MegatronIndex read_megatron_index(const std::string& idx_path, std::uint64_t bin_bytes,
                                  const std::string& bin_path) {
  const DataFile file(idx_path);  // a regular file, or DataError naming what it is
  auto fail = [&](std::uint64_t offset, const std::string& problem) {
    throw DataError(fmt::format("{}: offset {}: {}", idx_path, offset, problem));
  };
  const std::uint64_t size = file.size();
  if (size < kHeaderBytes) {
    fail(0, fmt::format("the file has {} bytes, less than the {}-byte header of a Megatron-LM "
                        "index (truncated, or not an .idx file)",
                        size, kHeaderBytes));
  }
  SectionReader header(file, 0);
  std::array<char, kMagicBytes> magic{};
  for (char& c : magic) c = header.next<char>();
  if (std::memcmp(magic.data(), kMagic, kMagicBytes) != 0) {
    fail(0, "magic is not \"MMIDIDX\\x00\\x00\" (not a Megatron-LM indexed data set index)");
  }
  const auto version = header.next<std::uint64_t>();
  if (version != 1) fail(9, fmt::format("version is {}, only version 1 is known", version));
  const auto code = static_cast<unsigned>(header.next<std::uint8_t>());
  const std::optional<DType> dtype = megatron_token_dtype(code);
  if (!dtype) {
    fail(17, fmt::format("dtype code {} ({}) is not a token type (1 uint8, 4 int32 or 8 uint16)",
                         code, megatron_code_name(code)));
  }
  const auto sequences = header.next<std::uint64_t>();
  const auto documents = header.next<std::uint64_t>();
  if (documents == 0) {
    fail(26,
         "document_count is 0 (the document indices start with 0 and end with the sequence "
         "count, so there are at least 1)");
  }
  // Lengths int32, pointers int64, document indices int64, then int8 modes when multimodal.
  const bool counts_fit = sequences < size / 12 + 1 && documents < size / 8 + 1;
  const std::uint64_t expected = kHeaderBytes + sequences * 12 + documents * 8;
  if (!counts_fit || (size != expected && size != expected + sequences)) {
    fail(18,
         fmt::format("sequence_count {} and document_count {} need {} bytes, the file has {} "
                     "(truncated, or the counts are corrupt)",
                     sequences, documents,
                     counts_fit ? std::to_string(expected) : std::string("more than that"), size));
  }
  const std::uint64_t lengths_at = kHeaderBytes;
  const std::uint64_t pointers_at = lengths_at + sequences * 4;
  const std::uint64_t documents_at = pointers_at + sequences * 8;
  const std::uint64_t width = dtype_size(*dtype);

  MegatronIndex index;
  index.dtype = *dtype;
  // One pass over the three sections side by side: the sequences are checked to follow each other
  // while the (rising) document indices pick their starts, so memory is one entry per document
  // (at most the file's size / 8), never the sequence table or the file.
  SectionReader lengths(file, lengths_at);
  SectionReader pointers(file, pointers_at);
  SectionReader document_indices(file, documents_at);
  std::uint64_t sequence = 0;  // sequences checked so far
  std::uint64_t start = 0;     // token offset of sequence `sequence`
  auto advance_to = [&](std::uint64_t target) {
    for (; sequence < target; ++sequence) {
      const std::uint64_t s = sequence;
      const auto length = lengths.next<std::int32_t>();
      if (length < 0)
        fail(lengths_at + s * 4, fmt::format("sequence_lengths[{}] is {}", s, length));
      const auto pointer = pointers.next<std::int64_t>();
      const std::uint64_t want = start * width;
      if (pointer < 0 || static_cast<std::uint64_t>(pointer) != want) {
        fail(pointers_at + s * 8,
             fmt::format("sequence_pointers[{}] is {}, expected {} (sequences must follow each "
                         "other in the .bin, as Megatron-LM writes them)",
                         s, pointer, want));
      }
      start += static_cast<std::uint64_t>(length);  // < 2^31 × 2^61 sequences: no overflow
    }
  };
  index.document_starts.reserve(documents);
  std::uint64_t previous = 0;
  for (std::uint64_t d = 0; d < documents; ++d) {
    const std::uint64_t at = documents_at + d * 8;
    const auto value = document_indices.next<std::int64_t>();
    const std::string field = fmt::format("document_indices[{}] is {}", d, value);
    if (d == 0 && value != 0) fail(at, field + ", expected 0 (the first document starts at 0)");
    if (value < 0 || static_cast<std::uint64_t>(value) > sequences) {
      fail(at, fmt::format("{}, beyond sequence_count {}", field, sequences));
    }
    if (static_cast<std::uint64_t>(value) < previous) {
      fail(at, fmt::format("{}, less than document_indices[{}] ({})", field, d - 1, previous));
    }
    if (d + 1 == documents && static_cast<std::uint64_t>(value) != sequences) {
      fail(at, fmt::format("{}, expected sequence_count {} (the last document ends at the last "
                           "sequence)",
                           field, sequences));
    }
    previous = static_cast<std::uint64_t>(value);
    advance_to(previous);
    index.document_starts.push_back(start);
  }
  advance_to(sequences);
  index.tokens = start;
  const auto bytes = checked_mul(index.tokens, width);
  if (!bytes || *bytes != bin_bytes) {
    throw DataError(
        fmt::format("{}: the file has {} bytes, but {} indexes {} tokens of {} "
                    "bytes ({} bytes) (the .bin and .idx do not belong together, or "
                    "one is truncated)",
                    bin_path, bin_bytes, idx_path, index.tokens, width,
                    bytes ? std::to_string(*bytes) : std::string("more than 2^64")));
  }
  return index;
}

void write_megatron(const std::string& prefix, DType dtype,
                    const std::vector<std::vector<std::uint32_t>>& documents) {
  const unsigned code = megatron_code(dtype);
  const std::size_t width = dtype_size(dtype);
  std::vector<std::byte> bin;
  std::vector<std::int32_t> lengths;
  std::vector<std::int64_t> pointers;
  std::vector<std::int64_t> document_indices = {0};
  for (const auto& document : documents) {
    pointers.push_back(static_cast<std::int64_t>(bin.size()));
    lengths.push_back(static_cast<std::int32_t>(document.size()));
    for (std::uint32_t token : document) {
      const std::size_t at = bin.size();
      bin.resize(at + width);
      std::memcpy(bin.data() + at, &token, width);  // the low bytes, little-endian
    }
    document_indices.push_back(static_cast<std::int64_t>(lengths.size()));
  }
  std::string idx(kMagic, kMagicBytes);
  auto put = [&idx](const auto& value) {
    idx.append(reinterpret_cast<const char*>(&value), sizeof value);
  };
  put(std::uint64_t{1});
  put(static_cast<std::uint8_t>(code));
  put(static_cast<std::uint64_t>(lengths.size()));
  put(static_cast<std::uint64_t>(document_indices.size()));
  for (auto v : lengths) put(v);
  for (auto v : pointers) put(v);
  for (auto v : document_indices) put(v);
  auto write = [](const std::string& path, const void* bytes, std::size_t size) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(bytes), static_cast<std::streamsize>(size));
    if (!out) throw DataError(fmt::format("{}: cannot write ({})", path, std::strerror(errno)));
  };
  write(prefix + ".bin", bin.data(), bin.size());
  write(prefix + ".idx", idx.data(), idx.size());
}

TokenStream::TokenStream(const std::vector<std::string>& files, TokenFormat format,
                         std::optional<DType> dtype, bool mmap, IoOptions io, int callers,
                         std::string owner, const RemoteTokenFiles* remote)
    : engine_(std::make_unique<IoEngine>(io, callers, std::move(owner))),
      remote_(remote),
      ranges_(remote ? remote->files : nullptr),
      wanted_(dtype) {
  if (files.empty()) throw DataError("tokens: no token files given");
  if (format == TokenFormat::raw && !wanted_) wanted_ = DType::uint16;
  try {
    for (const std::string& file : files) {
      if (format == TokenFormat::raw) {
        open_raw(file);
      } else {
        open_megatron(strip_megatron_extension(file));
      }
    }
    if (mmap) map_pieces();
  } catch (...) {
    unmap_pieces();
    throw;
  }
  remote_ = nullptr;
  document_starts_.push_back(tokens_);
}

TokenStream::~TokenStream() {
  unmap_pieces();
}

void TokenStream::unmap_pieces() noexcept {
  for (Piece& p : pieces_) {
    if (p.map) ::munmap(const_cast<std::byte*>(p.map), p.count * width_);
    p.map = nullptr;
  }
}

void TokenStream::map_pieces() {
  for (Piece& p : pieces_) {
    if (p.count == 0 || !p.url.empty()) continue;
    void* map = ::mmap(nullptr, p.count * width_, PROT_READ, MAP_SHARED, p.file.descriptor(), 0);
    if (map == MAP_FAILED) {
      throw DataError(fmt::format("{}: cannot map the file ({}) use io: pread", p.file.path(),
                                  std::strerror(errno)));
    }
    p.map = static_cast<const std::byte*>(map);
  }
}

void TokenStream::check_dtype(const std::string& path, DType found) {
  if (pieces_.empty() && !wanted_) wanted_ = found;
  if (found != *wanted_) {
    throw DataError(fmt::format(
        "{}: tokens are {}, but {} (every file of a stream holds one token type)", path,
        dtype_name(found),
        pieces_.empty() ? fmt::format("params.dtype is {}", dtype_name(*wanted_))
                        : fmt::format("{} holds {}",
                                      pieces_.front().url.empty() ? pieces_.front().file.path()
                                                                  : pieces_.front().url,
                                      dtype_name(*wanted_))));
  }
  dtype_ = found;
  width_ = dtype_size(found);
}

std::string TokenStream::local(const std::string& path) const {
  if (!remote_) return path;
  const auto it = remote_->cached.find(path);
  return it == remote_->cached.end() ? path : it->second;
}

std::uint64_t TokenStream::open_piece(Piece& piece, const std::string& path) {
  if (remote_) {
    const auto it = remote_->ranged.find(path);
    if (it != remote_->ranged.end()) {
      piece.url = path;
      by_range_ = true;
      return it->second;
    }
  }
  piece.file = engine_->open(local(path));
  return piece.file.size();
}

void TokenStream::open_raw(const std::string& path) {
  Piece piece{{}, {}, tokens_, 0};
  const std::uint64_t bytes = open_piece(piece, path);
  dtype_ = *wanted_;
  width_ = dtype_size(dtype_);
  if (bytes % width_ != 0) {
    throw DataError(
        fmt::format("{}: the file has {} bytes, not a multiple of {} (the size of a "
                    "{} token): truncated, or set dtype to the type it holds",
                    path, bytes, width_, dtype_name(dtype_)));
  }
  piece.count = bytes / width_;
  document_starts_.push_back(tokens_);
  tokens_ += piece.count;
  pieces_.push_back(std::move(piece));
}

void TokenStream::open_megatron(const std::string& prefix) {
  const std::string bin = prefix + ".bin";
  Piece piece{{}, {}, tokens_, 0};
  const std::uint64_t bin_bytes = open_piece(piece, bin);
  MegatronIndex index = read_megatron_index(local(prefix + ".idx"), bin_bytes, bin);
  check_dtype(prefix + ".idx", index.dtype);
  // The index's last entry is the end of the file, which the next file's first start repeats.
  index.document_starts.pop_back();
  for (std::uint64_t start : index.document_starts) document_starts_.push_back(tokens_ + start);
  piece.count = index.tokens;
  tokens_ += piece.count;
  pieces_.push_back(std::move(piece));
}

void TokenStream::read(std::uint64_t first, std::uint64_t count, std::byte* dst) const {
  const TokenRead r{first, count, dst};
  read(&r, 1);
}

void TokenStream::read(const TokenRead* reads, std::size_t count) const {
  // Requests go to the engine in groups of this many (a stack array: nothing allocated per
  // call); each group's reads are in flight together.
  constexpr std::size_t kGroup = 128;
  std::array<ReadRequest, kGroup> group;
  std::size_t queued = 0;
  // Pieces read by Range requests: a group's requests run at once (RemoteFiles::read_ranges).
  std::array<RangeRead, kGroup> ranged;
  std::size_t ranged_queued = 0;
  for (std::size_t r = 0; r < count; ++r) {
    std::uint64_t first = reads[r].first;
    std::uint64_t left = reads[r].count;
    std::byte* dst = reads[r].dst;
    if (first > tokens_ || left > tokens_ - first) {
      throw std::out_of_range(fmt::format("tokens [{}, {}) are outside the stream's {} tokens",
                                          first, first + left, tokens_));
    }
    // The last piece whose first token is <= first (empty files share their start with the next).
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), first,
                               [](std::uint64_t v, const Piece& p) { return v < p.first; });
    --it;
    while (left > 0) {
      while (first >= it->first + it->count) ++it;
      const std::uint64_t n = std::min(left, it->first + it->count - first);
      const std::uint64_t offset = (first - it->first) * width_;
      const auto bytes = static_cast<std::size_t>(n * width_);
      if (it->map) {
        std::memcpy(dst, it->map + offset, bytes);
      } else if (!it->url.empty()) {
        if (ranged_queued == ranged.size()) {
          ranges_->read_ranges(ranged.data(), ranged_queued);
          ranged_queued = 0;
        }
        ranged[ranged_queued++] = RangeRead{&it->url, offset, bytes, dst};
      } else {
        if (queued == group.size()) {
          engine_->read(group.data(), queued);
          queued = 0;
        }
        group[queued++] = ReadRequest{&it->file, offset, bytes, dst};
      }
      dst += bytes;
      first += n;
      left -= n;
    }
  }
  if (queued > 0) engine_->read(group.data(), queued);
  if (ranged_queued > 0) ranges_->read_ranges(ranged.data(), ranged_queued);
}

}  // namespace flowfeed
