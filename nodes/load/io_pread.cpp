// The I/O engine's pread reads, serial or split into pieces read as parallel tasks, and its copies
// from mapped files (the same paths: a mapped piece is a memcpy instead of a pread).
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <mutex>

#include "flowfeed/nodes/detail/io_engine.hpp"
#include "io_pieces.hpp"

namespace flowfeed {

using io_detail::Piece;
using io_detail::PieceCursor;
using io_detail::short_read;

void IoEngine::read_pread(const ReadRequest* requests, std::size_t count) {
  PieceCursor cursor(requests, count, options_.read_bytes);
  Piece p;
  if (max_in_flight_.load(std::memory_order_relaxed) < 1) max_in_flight_.store(1);
  while (cursor.next(p)) {
    if (p.file->map_) {
      if (p.offset >= p.file->size_ || p.bytes > p.file->size_ - p.offset) {
        const std::uint64_t start = std::max(p.offset, p.file->size_);
        short_read(p.file->path_, start, 0, p.offset + p.bytes - start);
      }
      std::memcpy(p.dst, p.file->map_ + p.offset, p.bytes);
      reads_.fetch_add(1, std::memory_order_relaxed);
      bytes_.fetch_add(p.bytes, std::memory_order_relaxed);
      continue;
    }
    std::size_t done = 0;
    while (done < p.bytes) {
      const int fd = p.direct ? p.file->direct_fd_ : p.file->fd_;
      const ssize_t got =
          ::pread(fd, p.dst + done, p.bytes - done, static_cast<off_t>(p.offset + done));
      reads_.fetch_add(1, std::memory_order_relaxed);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0 && errno == EINVAL && p.direct) {
        // The file system opened the file direct but refuses this read: read it buffered.
        note(p.file->path_ + ": O_DIRECT read refused (" + std::strerror(EINVAL) +
             "); reading it through the page cache");
        p.direct = false;
        continue;
      }
      if (got < 0) short_read(p.file->path_, p.offset + done, errno, 0);
      if (got == 0) short_read(p.file->path_, p.offset + done, 0, p.bytes - done);
      bytes_.fetch_add(static_cast<std::uint64_t>(got), std::memory_order_relaxed);
      if (p.direct) direct_bytes_.fetch_add(static_cast<std::uint64_t>(got));
      done += static_cast<std::size_t>(got);
      // After a short read the rest may start unaligned (the end of a file that shrank).
      if (done < p.bytes) p.direct = false;
    }
  }
}

void IoEngine::read_pread_parallel(const ReadRequest* requests, std::size_t count) {
  // Chunks of read_bytes, each read by one task; the first failure in (request, offset) order is
  // the one reported, once every chunk has finished, whichever thread met it first.
  std::mutex failure_mutex;
  std::size_t failed_request = count;
  std::uint64_t failed_offset = 0;
  std::exception_ptr failure;
  // Pieces end at multiples of read_bytes in the file (aligned for O_DIRECT, whose read_bytes is
  // a multiple of 4 KiB), so each piece keeps the alignment its request had.
  const std::uint64_t step = options_.read_bytes;
  auto read_chunk = [&](std::size_t r, std::uint64_t chunk) {
    const ReadRequest& q = requests[r];
    const std::uint64_t begin = std::max(q.offset, chunk * step);
    const std::uint64_t end = std::min(q.offset + q.bytes, (chunk + 1) * step);
    const ReadRequest part{q.file, begin, static_cast<std::size_t>(end - begin),
                           q.dst + (begin - q.offset)};
    const int now = pread_in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
    int peak = max_in_flight_.load(std::memory_order_relaxed);
    while (now > peak && !max_in_flight_.compare_exchange_weak(peak, now)) {
    }
    try {
      read_pread(&part, 1);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (r < failed_request || (r == failed_request && part.offset < failed_offset)) {
        failed_request = r;
        failed_offset = part.offset;
        failure = std::current_exception();
      }
    }
    pread_in_flight_.fetch_sub(1, std::memory_order_relaxed);
  };
  // Isolated: while this body waits for its chunks, its thread takes only those chunks, never
  // another node's body (which could wait in turn).
  tbb::this_task_arena::isolate([&] {
    tbb::parallel_for(std::size_t{0}, count, [&](std::size_t r) {
      const ReadRequest& q = requests[r];
      if (q.bytes == 0) return;
      const std::uint64_t first = q.offset / step;
      const std::uint64_t last = (q.offset + q.bytes - 1) / step;
      if (first == last) {
        read_chunk(r, first);
        return;
      }
      tbb::parallel_for(first, last + 1, [&](std::uint64_t c) { read_chunk(r, c); });
    });
  });
  if (failure) std::rethrow_exception(failure);
}

}  // namespace flowfeed
