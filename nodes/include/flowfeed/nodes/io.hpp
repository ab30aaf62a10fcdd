#pragma once
/// \file
/// How a file loader reads (the `io`, `read_bytes`, `queue_depth`, `direct` and `io_fallback`
/// params of the `npy` loader and of users' loaders built on the same engine).

#include <cstddef>

namespace flowfeed {

/// The I/O settings of a file loader.
struct IoOptions {
  /// pread: one read at a time per loader call; io_uring: queue_depth reads in flight per batch;
  /// mmap: copies from the files mapped read-only once (no system call per read; from a warm
  /// page cache, the copy of an array already in memory).
  enum class Engine { pread, io_uring, mmap };
  Engine engine = Engine::pread;
  std::size_t read_bytes = std::size_t{1} << 20;  ///< one read asks for at most this many bytes
  int queue_depth = 32;  ///< io_uring: reads in flight per batch (per concurrent caller)
  bool direct = false;   ///< open with O_DIRECT (aligned reads bypass the page cache)
  /// When io_uring or O_DIRECT is unavailable (kernel, seccomp, file system): true logs it and
  /// reads with pread / through the page cache; false throws.
  bool fallback = true;
  /// Copy one batch's reads through the page cache in parallel instead of in the calling thread:
  /// io_uring hands them to the kernel's worker threads (IOSQE_ASYNC); pread splits them into
  /// pieces of read_bytes, read as TBB tasks on the pipeline's threads.
  bool async = false;
};

}  // namespace flowfeed
