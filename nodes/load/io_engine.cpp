// The I/O engine: files (buffered, O_DIRECT, mapped), its setup and report, and io_uring reads.
// The pread and mapped reads are in io_pread.cpp.
#include "flowfeed/nodes/detail/io_engine.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

#if FLOWFEED_WITH_URING
#include <liburing.h>
#endif

#include "flowfeed/data_file.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/stats.hpp"
#include "io_pieces.hpp"

namespace flowfeed {

using io_detail::kDirectAlign;
using io_detail::Piece;
using io_detail::PieceCursor;
using io_detail::short_read;

/// One io_uring instance and the reads in flight on it (a slot per read).
struct IoEngine::Ring {
#if FLOWFEED_WITH_URING
  io_uring ring{};
#endif
  std::vector<Piece> slots;
  std::vector<std::uint32_t> free_slots;
};

IoFile::IoFile(IoFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      direct_fd_(std::exchange(other.direct_fd_, -1)),
      size_(other.size_),
      map_(std::exchange(other.map_, nullptr)) {}

IoFile& IoFile::operator=(IoFile&& other) noexcept {
  if (this != &other) {
    IoFile old(std::move(*this));
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    direct_fd_ = std::exchange(other.direct_fd_, -1);
    size_ = other.size_;
    map_ = std::exchange(other.map_, nullptr);
  }
  return *this;
}

IoFile::~IoFile() {
  if (map_) ::munmap(const_cast<std::byte*>(map_), size_);
  if (fd_ >= 0) ::close(fd_);
  if (direct_fd_ >= 0) ::close(direct_fd_);
}

IoEngine::IoEngine(IoOptions options, int callers, std::string owner)
    : options_(options), owner_(std::move(owner)) {
  // Direct pieces are whole multiples of the alignment, so the read size must be one too.
  if (options_.direct) {
    options_.read_bytes = std::max<std::size_t>(
        kDirectAlign, options_.read_bytes - options_.read_bytes % kDirectAlign);
  }
  if (options_.engine == IoOptions::Engine::mmap) {
    if (options_.direct) {
      throw DataError(
          "io: mmap copies from the page cache, so direct: true cannot apply (set io: pread or "
          "io_uring for O_DIRECT reads, or direct: false)");
    }
    engine_ = IoOptions::Engine::mmap;
    return;
  }
  if (options_.engine != IoOptions::Engine::io_uring) return;
  std::string failure;
#if FLOWFEED_WITH_URING
  for (int i = 0; i < std::max(callers, 1); ++i) {
    auto ring = std::make_unique<Ring>();
    const int rc = io_uring_queue_init(static_cast<unsigned>(options_.queue_depth), &ring->ring, 0);
    if (rc < 0) {
      failure = std::string("io_uring_queue_init: ") + std::strerror(-rc);
      break;
    }
    ring->slots.resize(static_cast<std::size_t>(options_.queue_depth));
    for (std::size_t s = ring->slots.size(); s > 0; --s) {
      ring->free_slots.push_back(static_cast<std::uint32_t>(s - 1));
    }
    free_rings_.push_back(ring.get());
    rings_.push_back(std::move(ring));
  }
#else
  (void)callers;
  failure = "this build has no liburing (install liburing-dev and reconfigure)";
#endif
  if (failure.empty()) {
    engine_ = IoOptions::Engine::io_uring;
    return;
  }
  for (auto& ring : rings_) {
#if FLOWFEED_WITH_URING
    io_uring_queue_exit(&ring->ring);
#endif
    ring.reset();
  }
  rings_.clear();
  free_rings_.clear();
  if (!options_.fallback) {
    throw DataError("io: io_uring is unavailable (" + failure +
                    ") set io: pread, or io_fallback: true to fall back to it");
  }
  note("io_uring is unavailable (" + failure + "); reading with pread");
}

IoEngine::~IoEngine() {
#if FLOWFEED_WITH_URING
  for (auto& ring : rings_) io_uring_queue_exit(&ring->ring);
#endif
}

void IoEngine::note(const std::string& line) {
  const std::string text = owner_ + ": " + line;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (std::find(notes_.begin(), notes_.end(), text) != notes_.end()) return;
    notes_.push_back(text);
  }
  std::fprintf(stderr, "flowfeed: %s\n", text.c_str());
}

std::vector<std::string> IoEngine::notes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return notes_;
}

void IoEngine::report(RunReport& report, const std::string& prefix) const {
  report.extra[prefix + ".io_reads"] = static_cast<double>(reads_.load());
  report.extra[prefix + ".io_bytes"] = static_cast<double>(bytes_.load());
  report.extra[prefix + ".io_direct_bytes"] = static_cast<double>(direct_bytes_.load());
  report.extra[prefix + ".io_max_in_flight"] = static_cast<double>(max_in_flight_.load());
  report.extra[prefix + ".io_uring"] = engine_ == IoOptions::Engine::io_uring ? 1.0 : 0.0;
  for (const std::string& n : notes()) report.warnings.push_back(n);
}

IoFile IoEngine::open(const std::string& path) {
  IoFile file;
  file.path_ = path;
  DataFile data(path);  // a regular file, or DataError naming what it is
  file.size_ = data.size();
  file.fd_ = data.release();
  if (engine_ == IoOptions::Engine::mmap && file.size_ > 0) {
    void* map = ::mmap(nullptr, file.size_, PROT_READ, MAP_SHARED, file.fd_, 0);
    if (map == MAP_FAILED) {
      const int error = errno;
      if (!options_.fallback) {
        throw DataError(path + ": cannot map (" + std::strerror(error) +
                        ") set io: pread, or io_fallback: true to read it with pread");
      }
      note(path + ": cannot map (" + std::strerror(error) + "); reading it with pread");
    } else {
      file.map_ = static_cast<const std::byte*>(map);
    }
  }
  if (options_.direct) {
    file.direct_fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (file.direct_fd_ < 0) {
      const int error = errno;
      if (!options_.fallback) {
        throw DataError(path + ": cannot open with O_DIRECT (" + std::strerror(error) +
                        ") set direct: false, or io_fallback: true to read it through the page "
                        "cache");
      }
      note(path + ": O_DIRECT is unavailable (" + std::strerror(error) +
           "); reading it through the page cache");
    }
  }
  return file;
}

void IoEngine::read(const ReadRequest* requests, std::size_t count) {
  if (engine_ != IoOptions::Engine::io_uring) {
    if (options_.async) {
      read_pread_parallel(requests, count);
    } else {
      read_pread(requests, count);
    }
    return;
  }
  Ring* ring = take_ring();
  try {
    read_uring(*ring, requests, count);
  } catch (...) {
    give_ring(ring);
    throw;
  }
  give_ring(ring);
}

IoEngine::Ring* IoEngine::take_ring() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (free_rings_.empty()) {
    throw std::logic_error("io: more concurrent reads than the rings made for them");
  }
  Ring* ring = free_rings_.back();
  free_rings_.pop_back();
  return ring;
}

void IoEngine::give_ring(Ring* ring) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  free_rings_.push_back(ring);
}

void IoEngine::read_uring(Ring& ring, const ReadRequest* requests, std::size_t count) {
#if FLOWFEED_WITH_URING
  PieceCursor cursor(requests, count, options_.read_bytes);
  int in_flight = 0;
  // The first failure: reported once every read in flight has completed (they write into the
  // caller's buffer, which goes back to its pool when this call throws).
  std::string failed_path;
  std::uint64_t failed_offset = 0;
  int failed_error = 0;
  std::size_t failed_missing = 0;
  bool failed = false;
  auto queue = [&](std::uint32_t slot) {
    const Piece& p = ring.slots[slot];
    io_uring_sqe* sqe = io_uring_get_sqe(&ring.ring);
    // A slot per sqe: the ring has queue_depth entries and at most queue_depth reads are out.
    io_uring_prep_read(sqe, p.direct ? p.file->direct_fd_ : p.file->fd_, p.dst,
                       static_cast<unsigned>(p.bytes), p.offset);
    io_uring_sqe_set_data64(sqe, slot);
    if (options_.async && !p.direct) io_uring_sqe_set_flags(sqe, IOSQE_ASYNC);
    ++in_flight;
    reads_.fetch_add(1, std::memory_order_relaxed);
  };
  for (;;) {
    while (!failed && !ring.free_slots.empty()) {
      Piece p;
      if (!cursor.next(p)) break;
      const std::uint32_t slot = ring.free_slots.back();
      ring.free_slots.pop_back();
      ring.slots[slot] = p;
      queue(slot);
    }
    if (in_flight == 0) break;
    int peak = max_in_flight_.load(std::memory_order_relaxed);
    while (in_flight > peak && !max_in_flight_.compare_exchange_weak(peak, in_flight)) {
    }
    const int rc = io_uring_submit_and_wait(&ring.ring, 1);
    if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
      // The ring itself failed (a kernel failure, not a data error): the run ends.
      throw std::runtime_error(std::string("io_uring_submit_and_wait: ") + std::strerror(-rc));
    }
    io_uring_cqe* cqe = nullptr;
    unsigned head = 0;
    unsigned seen = 0;
    io_uring_for_each_cqe(&ring.ring, head, cqe) {
      ++seen;
      --in_flight;
      const auto slot = static_cast<std::uint32_t>(io_uring_cqe_get_data64(cqe));
      Piece& p = ring.slots[slot];
      const int res = cqe->res;
      bool again = false;
      if (res == -EINTR || res == -EAGAIN) {
        again = true;
      } else if (res == -EINVAL && p.direct) {
        note(p.file->path_ + ": O_DIRECT read refused (" + std::strerror(EINVAL) +
             "); reading it through the page cache");
        p.direct = false;
        again = true;
      } else if (res <= 0) {
        // The failure at the lowest offset is the one reported (several reads may fail).
        if (!failed || (p.file->path_ == failed_path && p.offset < failed_offset)) {
          failed = true;
          failed_path = p.file->path_;
          failed_offset = p.offset;
          failed_error = -res;
          failed_missing = p.bytes;
        }
      } else {
        const auto got = static_cast<std::size_t>(res);
        bytes_.fetch_add(got, std::memory_order_relaxed);
        if (p.direct) direct_bytes_.fetch_add(got, std::memory_order_relaxed);
        p.offset += got;
        p.dst += got;
        p.bytes -= got;
        again = p.bytes > 0;  // a short read: ask for the rest (buffered: it may be unaligned)
        if (again) p.direct = false;
      }
      // The rest of a short read is asked for even after another read failed: the failure at
      // the lowest offset wins, whichever completes first.
      if (again) {
        queue(slot);
      } else {
        ring.free_slots.push_back(slot);
      }
    }
    io_uring_cq_advance(&ring.ring, seen);
  }
  if (failed) short_read(failed_path, failed_offset, failed_error, failed_missing);
#else
  (void)ring;
  read_pread(requests, count);
#endif
}

}  // namespace flowfeed
