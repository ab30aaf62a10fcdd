#include "shard_cache.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "flowfeed/error.hpp"
#include "url.hpp"

namespace flowfeed::remote {

namespace {

namespace fs = std::filesystem;

constexpr const char* kMarker = ".flowfeed-cache";
constexpr const char* kMarkerText = "flowfeed shard cache: every file here was made by flowfeed\n";
constexpr const char* kLockName = "cache.lock";

/// One mutex per process: threads of one process share the flock's open file description, so
/// the flock alone would not keep them apart.
std::mutex& process_mutex() {
  static std::mutex m;
  return m;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// The reservation in a part's name ("<stem>.<bytes>.part"), or -1 when it is not one.
std::int64_t part_reservation(const std::string& name, std::string* stem = nullptr) {
  if (!ends_with(name, ".part")) return -1;
  const std::string body = name.substr(0, name.size() - 5);
  const std::size_t dot = body.rfind('.');
  if (dot == std::string::npos || dot + 1 == body.size()) return -1;
  const std::string digits = body.substr(dot + 1);
  if (digits.size() > 19 || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  if (stem) *stem = body.substr(0, dot);
  return static_cast<std::int64_t>(std::stoull(digits));
}

/// Whether `name` is one of the file names a cache holds.
bool own_name(const std::string& name) {
  if (name == kMarker || name == kLockName) return true;
  if (name.size() < 18 || name[16] != '-') return false;
  if (name.substr(0, 16).find_first_not_of("0123456789abcdef") != std::string::npos) return false;
  return ends_with(name, ".shard") || part_reservation(name) >= 0;
}

[[noreturn]] void refuse(const std::string& dir, const std::string& problem) {
  throw ConfigError({fmt::format("{}: {}", dir, problem)});
}

struct Entry {
  std::string path;
  std::uint64_t bytes = 0;  ///< counted against the budget
  std::int64_t mtime_ns = 0;
  bool part = false;
};

std::vector<Entry> entries(const std::string& dir) {
  std::vector<Entry> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    struct stat st {};
    if (::lstat(e.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    Entry entry;
    entry.path = e.path().string();
    entry.mtime_ns = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    if (ends_with(name, ".shard") && own_name(name)) {
      entry.bytes = static_cast<std::uint64_t>(st.st_size);
    } else if (const std::int64_t reserved = part_reservation(name);
               reserved >= 0 && own_name(name)) {
      entry.bytes = std::max<std::uint64_t>(static_cast<std::uint64_t>(reserved),
                                            static_cast<std::uint64_t>(st.st_size));
      entry.part = true;
    } else {
      continue;
    }
    out.push_back(std::move(entry));
  }
  if (ec) throw DataError(fmt::format("{}: cannot list the cache ({})", dir, ec.message()));
  return out;
}

int open_file(const std::string& path, int flags, mode_t mode = 0644) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

bool try_flock(int fd, int op) {
  int rc;
  do {
    rc = ::flock(fd, op | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  return rc == 0;
}

}  // namespace

/// The cache's lock: the process mutex, then the flock of cache.lock.
class ShardCache::Lock {
 public:
  explicit Lock(const ShardCache& cache) : guard_(process_mutex()), fd_(cache.lock_fd_) {
    int rc;
    do {
      rc = ::flock(fd_, LOCK_EX);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      throw DataError(
          fmt::format("{}: cannot lock the cache ({})", cache.dir_, std::strerror(errno)));
    }
  }
  ~Lock() { ::flock(fd_, LOCK_UN); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  std::lock_guard<std::mutex> guard_;
  int fd_;
};

PinnedShard::~PinnedShard() {
  if (fd_ >= 0) ::close(fd_);
}

PinnedShard::PinnedShard(PinnedShard&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

ShardCache::ShardCache(std::string dir, std::uint64_t budget, double stall_s)
    : dir_(std::move(dir)), budget_(budget), stall_s_(stall_s) {
  if (budget_ == 0) refuse(dir_, "cache_bytes is 0 (the cache must hold at least one shard)");
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_)) {
    refuse(dir_, fmt::format("cannot make the cache directory ({})",
                             ec ? ec.message() : std::string("not a directory")));
  }
  const std::string marker = dir_ + "/" + kMarker;
  // The first file the directory holds that a cache of flowfeed's would not ("" when none): in a
  // directory without the marker, any file.
  const auto stranger = [&](bool marked) {
    for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec)) {
      const std::string name = e.path().filename().string();
      const bool regular = fs::is_regular_file(fs::symlink_status(e.path(), ec));
      if (!marked || !regular || !own_name(name)) return name;
    }
    return std::string();
  };
  bool marked = fs::exists(fs::symlink_status(marker, ec));
  std::string found = stranger(marked);
  // Another run (a rank on this machine) may have made the new directory a cache while this one
  // looked: its marker, lock and parts are not strangers.
  if (!found.empty() && !marked && fs::exists(fs::symlink_status(marker, ec))) {
    marked = true;
    found = stranger(true);
  }
  if (!found.empty()) {
    refuse(dir_,
           fmt::format("holds '{}', which flowfeed did not write (flowfeed removes files in its "
                       "cache, and never one it did not write) give cache_dir an empty or new "
                       "directory",
                       found));
  }
  if (!marked) {
    const int fd = open_file(marker, O_WRONLY | O_CREAT | O_EXCL);
    if (fd < 0 && errno != EEXIST) {
      refuse(dir_, fmt::format("cannot write to the cache directory ({})", std::strerror(errno)));
    }
    if (fd >= 0) {
      const ssize_t n = ::write(fd, kMarkerText, std::strlen(kMarkerText));
      ::close(fd);
      if (n < 0) refuse(dir_, "cannot write to the cache directory");
    }
  }
  lock_fd_ = open_file(dir_ + "/" + kLockName, O_RDWR | O_CREAT);
  if (lock_fd_ < 0) {
    refuse(dir_, fmt::format("cannot make the cache's lock file ({})", std::strerror(errno)));
  }
}

ShardCache::~ShardCache() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

std::string ShardCache::entry_name(const std::string& url) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const char c : url) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  std::string base = url_basename(url);
  if (base.size() > 100) base = base.substr(base.size() - 100);
  for (char& c : base) {
    const bool keep =
        std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
    if (!keep) c = '_';
  }
  return fmt::format("{:016x}-{}.shard", h, base);
}

std::uint64_t ShardCache::used_bytes() const {
  std::uint64_t used = 0;
  for (const Entry& e : entries(dir_)) used += e.bytes;
  return used;
}

std::uint64_t ShardCache::evict_oldest(std::uint64_t target, std::uint64_t& evicted) {
  std::vector<Entry> all = entries(dir_);
  std::uint64_t used = 0;
  for (const Entry& e : all) used += e.bytes;
  std::sort(all.begin(), all.end(),
            [](const Entry& a, const Entry& b) { return a.mtime_ns < b.mtime_ns; });
  for (const Entry& e : all) {
    if (used <= target) break;
    const int fd = open_file(e.path, O_RDONLY);
    if (fd < 0) continue;
    // In use (a reader's shared lock, a live transfer's exclusive one): kept.
    if (try_flock(fd, LOCK_EX) && ::unlink(e.path.c_str()) == 0) {
      used -= e.bytes;
      evicted += e.bytes;
    }
    ::close(fd);
  }
  return used;
}

std::uint64_t ShardCache::make_room(std::uint64_t size, const std::string& url,
                                    std::uint64_t& evicted) {
  if (size > budget_) {
    throw DataError(
        fmt::format("{}: the shard's {} bytes are more than the cache's cache_bytes "
                    "({}) raise the loader's cache_bytes",
                    url, size, budget_));
  }
  const std::uint64_t used = evict_oldest(budget_ - size, evicted);
  if (used + size > budget_) {
    throw DataError(fmt::format(
        "{}: no room in the cache {} for the shard's {} bytes: {} of its cache_bytes ({}) are "
        "shards that this or another run is using raise cache_bytes, or run fewer loaders on "
        "this cache at once",
        url, dir_, size, used, budget_));
  }
  return used + size;
}

std::uint64_t ShardCache::trim() {
  Lock lock(*this);
  std::uint64_t evicted = 0;
  evict_oldest(budget_, evicted);
  return evicted;
}

std::optional<PinnedShard> ShardCache::find(const std::string& url, CacheOutcome& outcome) {
  const std::string path = dir_ + "/" + entry_name(url);
  Lock lock(*this);
  const int fd = open_file(path, O_RDONLY);
  if (fd < 0) return std::nullopt;
  if (!try_flock(fd, LOCK_SH)) {
    ::close(fd);
    return std::nullopt;
  }
  ::futimens(fd, nullptr);  // most recently used
  outcome.hit = true;
  return PinnedShard(path, fd);
}

PinnedShard ShardCache::get(const std::string& url, std::uint64_t size,
                            const std::function<void(int fd, std::uint64_t have)>& fill,
                            CacheOutcome& outcome, const std::function<void(int fd)>& verify) {
  const std::string name = entry_name(url);
  const std::string path = dir_ + "/" + name;
  const std::string stem = name.substr(0, name.size() - 6);
  const std::string part_path = fmt::format("{}/{}.{}.part", dir_, stem, size);
  int fd = -1;
  std::uint64_t have = 0;
  std::int64_t waited_size = -1;  // the other run's part, while we wait for it
  auto progress_at = std::chrono::steady_clock::now();
  for (;;) {
    Lock lock(*this);
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      fd = open_file(path, O_RDONLY);
      if (fd >= 0 && static_cast<std::uint64_t>(st.st_size) == size && try_flock(fd, LOCK_SH)) {
        ::futimens(fd, nullptr);  // most recently used
        outcome.hit = true;
        outcome.used = used_bytes();
        return PinnedShard(path, fd);
      }
      // A copy of another size: the object changed on the server since it was cached.
      if (fd >= 0 && try_flock(fd, LOCK_EX)) ::unlink(path.c_str());
      if (fd >= 0) ::close(fd);
      fd = -1;
      if (::stat(path.c_str(), &st) == 0) {
        throw DataError(
            fmt::format("{}: the cache holds a copy of {} bytes, the server now has {}, "
                        "and another run is reading the old copy (wait for it to end)",
                        url, st.st_size, size));
      }
    }
    // A part of another size is from an older version of the object: removed if no one fetches it.
    for (const Entry& e : entries(dir_)) {
      std::string part_stem;
      const std::string file = fs::path(e.path).filename().string();
      if (e.part && part_reservation(file, &part_stem) >= 0 && part_stem == stem &&
          e.path != part_path) {
        const int old = open_file(e.path, O_RDONLY);
        if (old >= 0 && try_flock(old, LOCK_EX)) ::unlink(e.path.c_str());
        if (old >= 0) ::close(old);
      }
    }
    fd = open_file(part_path, O_RDWR);
    if (fd >= 0) {
      if (!try_flock(fd, LOCK_EX)) {
        // Another run fetches it: wait for its shard (or its end) outside the lock, as long as
        // its transfer makes progress.
        struct stat pst {};
        ::fstat(fd, &pst);
        ::close(fd);
        fd = -1;
        const auto now = std::chrono::steady_clock::now();
        if (static_cast<std::int64_t>(pst.st_size) != waited_size) {
          waited_size = static_cast<std::int64_t>(pst.st_size);
          progress_at = now;
        } else if (now - progress_at > std::chrono::duration<double>(stall_s_)) {
          throw DataError(fmt::format(
              "{}: another run (or rank) is fetching this shard into {} but its transfer has "
              "not grown for {} s (stopped? it holds {}) end that run, or use another cache_dir",
              url, dir_, stall_s_, part_path));
        }
      } else {
        // Left by a run that ended: resume it.
        struct stat pst {};
        ::fstat(fd, &pst);
        have = static_cast<std::uint64_t>(pst.st_size);
        if (have > size && ::ftruncate(fd, 0) == 0) have = 0;
        break;
      }
    } else {
      outcome.used = make_room(size, url, outcome.evicted);
      fd = open_file(part_path, O_RDWR | O_CREAT | O_EXCL);
      if (fd < 0) {
        throw DataError(fmt::format("{}: cannot make {} in the cache ({})", url, part_path,
                                    std::strerror(errno)));
      }
      if (!try_flock(fd, LOCK_EX)) {
        ::close(fd);
        throw DataError(
            fmt::format("{}: cannot lock {} ({})", url, part_path, std::strerror(errno)));
      }
      // The shard's blocks at once (its size unchanged): its copy lies in few extents however
      // many transfers write beside it, and a disk without room for it says so now, before a
      // byte is fetched. A file system that cannot preallocate just writes as it goes.
      if (size > 0 && ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(size)) != 0 &&
          errno == ENOSPC) {
        ::unlink(part_path.c_str());
        ::close(fd);
        throw DataError(fmt::format(
            "{}: no space left on the device of the cache {} for the shard's {} bytes (free "
            "some, or set the loader's cache_dir elsewhere)",
            url, dir_, size));
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  try {
    fill(fd, have);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != size) {
      throw DataError(
          fmt::format("{}: fetched {} bytes, but the shard has {} (not used; it is "
                      "fetched again by the next run)",
                      url, st.st_size, size));
    }
    if (verify) {
      try {
        verify(fd);
      } catch (...) {
        ::unlink(part_path.c_str());  // damaged: fetched again next time, not resumed
        throw;
      }
    }
    Lock lock(*this);
    if (::rename(part_path.c_str(), path.c_str()) != 0) {
      throw DataError(fmt::format("{}: cannot rename {} in the cache ({})", url, part_path,
                                  std::strerror(errno)));
    }
    ::flock(fd, LOCK_SH);
    ::futimens(fd, nullptr);
    outcome.used = std::max(outcome.used, used_bytes());
  } catch (...) {
    ::close(fd);
    throw;
  }
  return PinnedShard(path, fd);
}

}  // namespace flowfeed::remote
