#pragma once
/// \file
/// What the I/O engine's read paths share (private to io_engine.cpp and io_pread.cpp): the O_DIRECT
/// alignment, the short-read error, and the cursor that cuts requests into pieces.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/io_engine.hpp"

namespace flowfeed::io_detail {

// O_DIRECT alignment of offsets, lengths and buffers: 4 KiB covers every common block size.
constexpr std::uint64_t kDirectAlign = 4096;

[[noreturn]] inline void short_read(const std::string& path, std::uint64_t offset, int error,
                                    std::size_t missing) {
  if (error != 0) {
    throw DataError(path + ": short read at offset " + std::to_string(offset) + " (" +
                    std::strerror(error) + ")");
  }
  throw DataError(path + ": short read at offset " + std::to_string(offset) + " (end of file, " +
                  std::to_string(missing) +
                  " more bytes wanted) the file was truncated while open");
}

/// A part of a request that one read asks for.
struct Piece {
  const IoFile* file = nullptr;
  bool direct = false;
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
  std::byte* dst = nullptr;
};

/// Splits requests into pieces of at most `read_bytes`; with O_DIRECT, into a buffered head up
/// to the next aligned offset, an aligned direct middle and a buffered tail.
class PieceCursor {
 public:
  PieceCursor(const ReadRequest* requests, std::size_t count, std::size_t read_bytes)
      : requests_(requests), count_(count), read_bytes_(read_bytes) {}

  /// The next piece; false when every request is covered.
  bool next(Piece& piece) {
    while (r_ < count_ && pos_ >= requests_[r_].bytes) {
      ++r_;
      pos_ = 0;
    }
    if (r_ == count_) return false;
    const ReadRequest& q = requests_[r_];
    std::size_t len = std::min(read_bytes_, q.bytes - pos_);
    const std::uint64_t offset = q.offset + pos_;
    std::byte* dst = q.dst + pos_;
    bool direct = false;
    const auto address = reinterpret_cast<std::uintptr_t>(dst);
    if (q.file->direct() && (address - offset) % kDirectAlign == 0) {
      const std::uint64_t misalign = offset % kDirectAlign;
      if (misalign != 0) {
        len = std::min<std::size_t>(len, kDirectAlign - misalign);
      } else if (len >= kDirectAlign) {
        len -= len % kDirectAlign;
        direct = true;
      }
    }
    piece = Piece{q.file, direct, offset, len, dst};
    pos_ += len;
    return true;
  }

 private:
  const ReadRequest* requests_;
  std::size_t count_;
  std::size_t read_bytes_;
  std::size_t r_ = 0;
  std::size_t pos_ = 0;
};

}  // namespace flowfeed::io_detail
