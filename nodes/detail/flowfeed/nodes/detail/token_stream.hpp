#pragma once
/// \file
/// Token files read as one stream of token ids: flat little-endian files (nanoGPT's train.bin) and
/// Megatron-LM indexed data sets (`.bin` + `.idx`), with their document boundaries.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/nodes/detail/io_engine.hpp"
#include "flowfeed/nodes/tokens.hpp"

namespace flowfeed {

/// What a Megatron-LM `.idx` file says about its `.bin` (MMIDIDX version 1).
struct MegatronIndex {
  DType dtype = DType::uint16;  ///< the token type (dtype code 1 uint8, 4 int32, 8 uint16)
  std::uint64_t tokens = 0;     ///< sum of the sequence lengths
  /// Token offset of each document's first token, then `tokens`: documents + 1 entries.
  std::vector<std::uint64_t> document_starts;
};

/// Reads and validates `idx_path`: the magic "MMIDIDX\x00\x00", version 1, a token dtype code,
/// the sequence and document counts against the file's size, sequence lengths, pointers that
/// follow each other from 0 (one contiguous stream), document indices that rise from 0 to the
/// sequence count, and a `.bin` of exactly `bin_bytes` holding every sequence. Throws DataError
/// naming the file, the field and its offset.
MegatronIndex read_megatron_index(const std::string& idx_path, std::uint64_t bin_bytes,
                                  const std::string& bin_path);

/// The files of a `tokens` loader's `files` param, expanded in a stable order by expand_file_set
/// (paths, globs, braces; every file checked, DataError naming the bad one). Megatron: each
/// pattern names prefixes (a trailing `.bin` or `.idx` is dropped) and is matched against the
/// `.bin` files; the prefixes are returned.
struct RemoteSource;  // file_set.hpp
/// With `remote`, files may also be URLs (raw files; Megatron prefixes, listed by their `.bin`),
/// listed only: the loader fetches them or reads them by Range requests (docs/REMOTE.md).
std::vector<std::string> expand_token_files(const std::vector<std::string>& patterns,
                                            TokenFormat format, RemoteSource* remote = nullptr);

class RemoteFiles;
/// Token files named by URL: where the cached copy of each fetched one is, and the size of each
/// read where it is, by Range requests (`access: range`) through `files`.
struct RemoteTokenFiles {
  RemoteFiles* files = nullptr;
  std::map<std::string, std::string> cached;    ///< URL → its cached copy
  std::map<std::string, std::uint64_t> ranged;  ///< URL → its size
};

/// Writes a Megatron-LM indexed data set `<prefix>.bin` + `<prefix>.idx` (one sequence per
/// document) from `documents`, each a list of token ids, stored as `dtype` (uint8, uint16 or
/// int32). For tests, benchmarks and tools. Throws DataError when a file cannot be written.
void write_megatron(const std::string& prefix, DType dtype,
                    const std::vector<std::vector<std::uint32_t>>& documents);

/// Tokens [first, first + count) of a stream, to be copied into `dst` (count × width bytes).
struct TokenRead {
  std::uint64_t first = 0;
  std::uint64_t count = 0;
  std::byte* dst = nullptr;
};

/// The token files of a `tokens` loader as one stream, opened and validated at construction. Reads
/// go through an IoEngine (pread or io_uring, optionally O_DIRECT) or copy from read-only
/// mappings; they are safe from up to `callers` threads at once; memory is O(files + documents).
class TokenStream {
 public:
  /// Opens every file (raw: the path; megatron: `<prefix>.bin` and `<prefix>.idx`), checks sizes
  /// and indexes, and lays them end to end in the order given. `dtype` nullopt: uint16 for raw
  /// files, the index's for Megatron. `mmap`: map every file read-only once and copy from the
  /// mappings. `io`, `callers` and `owner` make the engine (see IoEngine). Throws DataError
  /// naming the file.
  /// With `remote`, a file named by URL is read from its cached copy, or by Range requests
  /// through remote->files, which must outlive the stream (`remote` itself only the constructor).
  TokenStream(const std::vector<std::string>& files, TokenFormat format, std::optional<DType> dtype,
              bool mmap = false, IoOptions io = {}, int callers = 1, std::string owner = "tokens",
              const RemoteTokenFiles* remote = nullptr);
  ~TokenStream();
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  /// The token type of every file.
  DType dtype() const noexcept { return dtype_; }
  /// Bytes per token.
  std::size_t width() const noexcept { return width_; }
  /// Tokens in the whole stream.
  std::uint64_t tokens() const noexcept { return tokens_; }
  /// First token of each document, then tokens(): a raw file is one document, a Megatron index
  /// gives its own; documents never span two files.
  const std::vector<std::uint64_t>& document_starts() const noexcept { return document_starts_; }
  /// Copies each read's tokens into its `dst`: one engine request per file a range touches (the
  /// engine splits it into reads of at most `read_bytes`; with io_uring all of a call's requests
  /// are in flight together, up to queue_depth), or one memcpy from each file's mapping (mmap).
  /// Returns when every byte is in place. Throws DataError naming file and offset on a short read
  /// (the file shrank while open) or an I/O error; std::out_of_range when a range is outside the
  /// stream. Nothing is allocated.
  void read(const TokenRead* reads, std::size_t count) const;
  /// One range: read(&TokenRead{first, count, dst}, 1).
  void read(std::uint64_t first, std::uint64_t count, std::byte* dst) const;
  /// Whether a file of the stream is read by Range requests (`access: range`): there each range
  /// a call reads in a file is one request, however few tokens it holds.
  bool reads_by_range() const noexcept { return by_range_; }
  /// The engine (its figures and notes for the report).
  const IoEngine& engine() const noexcept { return *engine_; }
  /// Stream index of each file's first token, in the order given.
  std::vector<std::uint64_t> file_starts() const {
    std::vector<std::uint64_t> starts;
    for (const Piece& p : pieces_) starts.push_back(p.first);
    return starts;
  }

 private:
  struct Piece {
    IoFile file;                     ///< unless read by Range requests
    std::string url;                 ///< read by Range requests (RemoteTokenFiles::ranged)
    std::uint64_t first = 0;         ///< stream index of the file's first token
    std::uint64_t count = 0;         ///< tokens in the file
    const std::byte* map = nullptr;  ///< the whole file, read-only (mmap, count > 0)
  };
  void map_pieces();
  void unmap_pieces() noexcept;
  /// Opens `path` into `piece` (its cached copy when it is a fetched URL), or marks it read by
  /// Range requests; returns its size.
  std::uint64_t open_piece(Piece& piece, const std::string& path);
  /// The file `path` names (its cached copy when it is a fetched URL).
  std::string local(const std::string& path) const;
  void open_raw(const std::string& path);
  void open_megatron(const std::string& prefix);
  void check_dtype(const std::string& path, DType found);

  std::unique_ptr<IoEngine> engine_;
  const RemoteTokenFiles* remote_ = nullptr;  ///< while the constructor runs
  RemoteFiles* ranges_ = nullptr;             ///< reads the pieces named by URL
  bool by_range_ = false;                     ///< a piece is read by Range requests
  std::optional<DType> wanted_;
  DType dtype_ = DType::uint16;
  std::size_t width_ = 2;
  std::uint64_t tokens_ = 0;
  std::vector<Piece> pieces_;
  std::vector<std::uint64_t> document_starts_;
};

}  // namespace flowfeed
