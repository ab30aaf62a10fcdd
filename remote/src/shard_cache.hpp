#pragma once
// The cache directory: complete shards (`<hash>-<name>.shard`), transfers in progress
// (`<hash>-<name>.<bytes>.part`, the bytes reserved for them in the name), a lock file and a
// marker. Every change to what the directory holds is made under an flock of `cache.lock`, so
// runs and ranks on one machine share it; a shard in use is held with a shared flock, which
// eviction (an exclusive, non-blocking flock) respects.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace flowfeed::remote {

/// A shard held in the cache: its path, and the shared flock that keeps it from eviction.
class PinnedShard {
 public:
  PinnedShard(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PinnedShard();
  PinnedShard(PinnedShard&& other) noexcept;
  PinnedShard& operator=(PinnedShard&&) = delete;
  PinnedShard(const PinnedShard&) = delete;
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

/// What one get() did.
struct CacheOutcome {
  bool hit = false;           ///< found complete
  std::uint64_t evicted = 0;  ///< bytes of other shards removed to make room
  std::uint64_t used = 0;     ///< bytes the cache held (and reserved) after it
};

class ShardCache {
 public:
  /// Makes `dir` (and its parents) when missing; ConfigError when it holds a file flowfeed did
  /// not write, or `budget` is 0. A shard another run fetches is waited for while its temporary
  /// file grows; one that has not grown for `stall_s` seconds is a DataError.
  ShardCache(std::string dir, std::uint64_t budget, double stall_s = 60);
  ~ShardCache();
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  /// The shard of `url` (`size` bytes), pinned: from the cache, or made by `fill(fd, have)`,
  /// which writes bytes [have, size) into the open temporary file (bytes a dead run left there
  /// are resumed, not fetched again). Waits while another run fetches the same shard. DataError
  /// when the shard does not fit the budget next to the shards in use.
  /// `verify(fd)`, when given, checks the complete file before it is renamed; when it throws,
  /// the temporary file is removed (it is not resumed).
  PinnedShard get(const std::string& url, std::uint64_t size,
                  const std::function<void(int fd, std::uint64_t have)>& fill,
                  CacheOutcome& outcome, const std::function<void(int fd)>& verify = {});

  /// Evicts the least recently used shards not in use (and transfers a dead run left) until the
  /// cache holds at most the budget; returns the bytes removed. A cache filled under a larger
  /// budget shrinks to this run's.
  std::uint64_t trim();

  /// The complete shard of `url` when the cache has one (whatever its size), pinned and marked
  /// most recently used; nullopt otherwise.
  std::optional<PinnedShard> find(const std::string& url, CacheOutcome& outcome);

  const std::string& dir() const noexcept { return dir_; }
  std::uint64_t budget() const noexcept { return budget_; }
  /// The bytes of complete shards and reservations in the directory now (as eviction counts).
  std::uint64_t used_bytes() const;
  /// The file name a URL's shard has in the cache ("<16 hex>-<name>.shard").
  static std::string entry_name(const std::string& url);

 private:
  class Lock;
  /// Under the directory lock: removes the oldest shards not in use until at most `target` bytes
  /// remain (adding what it removed to `evicted`); returns the bytes left.
  std::uint64_t evict_oldest(std::uint64_t target, std::uint64_t& evicted);
  std::uint64_t make_room(std::uint64_t size, const std::string& url, std::uint64_t& evicted);

  std::string dir_;
  std::uint64_t budget_;
  double stall_s_;
  int lock_fd_ = -1;
};

}  // namespace flowfeed::remote
