#pragma once
/// \file
/// Remote shards fetched while a pipeline runs: a small pool of transfers (the loader's
/// `transfers`) fetches them into the cache in the order the sampler will read them, as far
/// ahead as the cache's byte budget allows; the loader's bodies wait for the shard they need.
/// docs/REMOTE.md ("Fetched during the run") describes the rules.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "flowfeed/remote/remote_files.hpp"

namespace flowfeed {

namespace remote {
class PinnedShard;
}

/// The files of one loader named by URL, fetched during the run. Made by RemoteFiles::stream();
/// owns `transfers` threads (made at construction, joined by the destructor: nothing else is
/// started). A file is held (pinned in the cache: never evicted) from the moment its transfer
/// starts until no acquire() holds it and done() said it is not needed again; the bytes held
/// never pass the cache's budget, except for files acquire() asks for while nothing else can
/// be let go. Thread-safe.
class ShardStream {
 public:
  ~ShardStream();
  ShardStream(const ShardStream&) = delete;
  ShardStream& operator=(const ShardStream&) = delete;

  /// Makes every transfer and wait end soon after `*flag` becomes true (a run being cancelled):
  /// acquire() then throws remote::Cancelled; transfers start again when it is false again.
  /// Call before the first plan().
  void set_cancel(const std::atomic<bool>* flag) noexcept { run_cancel_ = flag; }

  /// The files (indices into the URLs) in the order they will be read, e.g. the epoch's shard
  /// sequence: they are wanted again (each until done()), and the transfers fetch them in this
  /// order, skipping those held, as far ahead as the budget allows.
  void plan(const std::vector<std::size_t>& order);

  /// Waits until file `i` is complete in the cache (fetched first, ahead of the plan, when no
  /// transfer has it), holds it and returns its local path. The time waited counts as network
  /// wait. DataError (URL and status) when its fetch failed for good; remote::Cancelled when the
  /// run is cancelled.
  std::string acquire(std::size_t i);
  /// Ends one acquire() of file `i`.
  void release(std::size_t i);
  /// File `i` is not read again until the next plan(): once no acquire() holds it, it may be
  /// evicted.
  void done(std::size_t i);

  /// Waits until the first `count` files of the plan are complete (or failed: DataError). The
  /// build calls it, so that a wrong URL or credential fails the build, not the run.
  void wait_for_first(std::size_t count);

  /// Bytes held now, and the most held at once.
  std::uint64_t held_bytes() const;
  std::uint64_t peak_held_bytes() const;

 private:
  friend class RemoteFiles;
  ShardStream(RemoteFiles& files, std::vector<std::string> urls, std::vector<std::uint64_t> sizes);

  enum class State { idle, fetching, ready, failed };
  struct File;
  void work();
  /// acquire(i); `at_build` (wait_for_first): the wait is not counted in the stats and ends on
  /// interrupt_builds() too.
  std::string acquire(std::size_t i, bool at_build);
  /// Under mutex_: the next file to fetch (a file acquire() waits for first, then the plan's
  /// next idle file when it fits the budget), or nullopt.
  std::optional<std::size_t> next_file();
  /// Under mutex_: lets go of prefetched files no acquire() holds, last in the plan first, until
  /// `bytes` more fit the budget. True when they fit.
  bool make_room(std::uint64_t bytes);
  void unhold(File& f);
  /// Under mutex_: a transfer of a file no acquire() waits for is running.
  bool fetching_ahead() const;
  bool run_cancelled() const noexcept {
    return run_cancel_ && run_cancel_->load(std::memory_order_relaxed);
  }

  RemoteFiles& files_;
  std::vector<std::string> urls_;
  std::vector<File> state_;
  std::vector<std::size_t> plan_;
  std::size_t cursor_ = 0;           ///< plan_ before it is started or held
  std::vector<std::size_t> demand_;  ///< files acquire() waits for, not yet started
  std::uint64_t held_ = 0;           ///< bytes of files fetching or held
  std::uint64_t peak_held_ = 0;
  std::uint64_t budget_ = 0;
  const std::atomic<bool>* run_cancel_ = nullptr;
  std::atomic<bool> stop_{false};
  /// Guards the files' state; transfers wait on work_, acquire() on changed_.
  mutable std::mutex mutex_;
  std::condition_variable changed_;  ///< a file's state changed: for acquire()'s waits
  /// Something a transfer thread may act on: a plan, a demand, room in the budget, a stop. Kept
  /// apart from changed_ so that a body's release does not wake every transfer thread.
  std::condition_variable work_;
  std::vector<std::thread> threads_;
};

}  // namespace flowfeed
