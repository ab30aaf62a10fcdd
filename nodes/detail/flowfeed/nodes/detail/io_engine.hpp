#pragma once
/// \file
/// The I/O engine a file loader reads with: `pread`, or `io_uring` with many reads in flight per
/// batch; optional O_DIRECT. A loader-side helper, not a node: the loader's process() calls
/// IoEngine::read() and returns when the batch's bytes are in its buffer.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/nodes/io.hpp"

namespace flowfeed {

class Params;
class Schema;
struct RunReport;

/// Declares the I/O params above in a loader's schema.
void add_io_params(Schema& schema);
/// IoOptions from validated params (declared by add_io_params).
IoOptions io_options_from(const Params& params);
/// "pread", "io_uring" or "mmap".
const char* io_engine_name(IoOptions::Engine engine) noexcept;

/// An open file: a buffered descriptor, an O_DIRECT one when the engine reads direct and the file
/// system allows it, and its read-only mapping when the engine copies from mappings. Move-only;
/// closes and unmaps.
class IoFile {
 public:
  IoFile() = default;
  IoFile(IoFile&& other) noexcept;
  IoFile& operator=(IoFile&& other) noexcept;
  IoFile(const IoFile&) = delete;
  IoFile& operator=(const IoFile&) = delete;
  ~IoFile();
  /// The path as given.
  const std::string& path() const noexcept { return path_; }
  /// Size in bytes when opened.
  std::uint64_t size() const noexcept { return size_; }
  /// True when aligned reads of this file go direct (O_DIRECT was asked for and opened).
  bool direct() const noexcept { return direct_fd_ >= 0; }
  /// The buffered descriptor (e.g. to map the file read-only); owned by this IoFile, -1 when
  /// not open.
  int descriptor() const noexcept { return fd_; }
  /// True when reads copy from the file's mapping.
  bool mapped() const noexcept { return map_ != nullptr; }
  /// The file's read-only mapping, size() bytes from its first; null when not mapped.
  const std::byte* mapping() const noexcept { return map_; }

 private:
  friend class IoEngine;
  std::string path_;
  int fd_ = -1;
  int direct_fd_ = -1;  // -1: every read is buffered
  std::uint64_t size_ = 0;
  const std::byte* map_ = nullptr;  // size_ bytes, PROT_READ; null: not mapped
};

/// One read: `bytes` bytes of `file` from `offset` into `dst`.
struct ReadRequest {
  const IoFile* file = nullptr;
  std::uint64_t offset = 0;
  std::size_t bytes = 0;
  std::byte* dst = nullptr;
};

/// Reads batches of requests. With io_uring, each concurrent read() call takes one of `callers`
/// rings made at construction and keeps up to queue_depth reads in flight on it; the calling
/// thread (a TBB worker running the loader's body) waits for its own completions, so a loader
/// occupies at most its `concurrency` workers, each for one batch's reads. With pread and
/// `async`, a call splits its requests into pieces of read_bytes and reads them as TBB tasks
/// (tbb::parallel_for, isolated), so idle workers copy one batch out of the page cache together.
/// With O_DIRECT, the part of a read whose file offset and destination are both 4 KiB-aligned
/// goes direct; its unaligned head and tail (and reads whose offset and destination are not
/// aligned alike) go through the page cache. With mmap, each file is mapped read-only at open()
/// and a read is a copy from the mapping (in pieces as parallel tasks with `async`, as pread);
/// a file that cannot be mapped is read with pread (logged). Nothing of the engine's is allocated
/// per read() call (the parallel pread's tasks are TBB's).
class IoEngine {
 public:
  /// Makes the engine for `callers` concurrent read() calls; `owner` (e.g. "node 'load'") starts
  /// log lines. mmap with `direct` throws DataError (a mapping reads through the page cache). When
  /// io_uring cannot start (io_uring_queue_init fails: old kernel, seccomp, a build without
  /// liburing) it logs and reads with pread, or throws DataError when options.fallback is false.
  IoEngine(IoOptions options, int callers, std::string owner);
  ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  /// Opens `path` for reading (and with O_DIRECT when the engine reads direct; a file system that
  /// refuses O_DIRECT is logged and the file read buffered, or DataError without fallback); with
  /// mmap, maps it (a file that cannot be mapped is logged and read with pread, or DataError
  /// without fallback).
  /// Throws DataError naming the file.
  IoFile open(const std::string& path);
  /// Reads every request in full; returns once all are done. Thread-safe up to `callers` calls at
  /// once. A failed read (an errno such as EIO, or the end of the file: a file that shrank while
  /// open) throws DataError `path: short read at offset N (why)` after every read in flight has
  /// completed, so no read lands in the buffer after the call returned. From a mapping, a read
  /// past the size the file had at open() throws the same error; a file truncated while mapped
  /// raises SIGBUS instead (the process ends).
  void read(const ReadRequest* requests, std::size_t count);

  /// The engine that actually reads (pread after a fallback).
  IoOptions::Engine engine() const noexcept { return engine_; }
  /// The options as given.
  const IoOptions& options() const noexcept { return options_; }
  /// What fell back and why (one line each), for the run report's warnings.
  std::vector<std::string> notes() const;
  /// Adds `<prefix>.io_*` figures (reads, bytes, direct bytes, most reads in flight, whether
  /// io_uring runs) and the notes to a report.
  void report(RunReport& report, const std::string& prefix) const;

 private:
  struct Ring;
  void note(const std::string& line);
  void read_pread(const ReadRequest* requests, std::size_t count);
  void read_pread_parallel(const ReadRequest* requests, std::size_t count);
  void read_uring(Ring& ring, const ReadRequest* requests, std::size_t count);
  Ring* take_ring();
  void give_ring(Ring* ring) noexcept;

  IoOptions options_;
  std::string owner_;
  IoOptions::Engine engine_ = IoOptions::Engine::pread;
  std::vector<std::unique_ptr<Ring>> rings_;
  std::vector<Ring*> free_rings_;
  mutable std::mutex mutex_;  // free_rings_, notes_
  std::vector<std::string> notes_;
  std::atomic<std::uint64_t> reads_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> direct_bytes_{0};
  std::atomic<int> max_in_flight_{0};
  std::atomic<int> pread_in_flight_{0};  // pread with async: chunks being read now
};

}  // namespace flowfeed
