#pragma once
/// \file
/// A file loader's shards named by URL and fetched during the run (docs/REMOTE.md, "Fetched
/// during the run"): the stream is planned in each epoch's shard order, a batch holds the shards
/// it reads while it reads them (waiting for their transfers), and a shard whose samples of the
/// epoch have all been read is closed and let go, so the cache may evict it. The `npy` and
/// `webdataset` loaders use it; they open and close the cached files of a shard.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/remote/remote_files.hpp"
#include "flowfeed/remote/shard_stream.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

class StreamedShards {
 public:
  /// Opens shard `s` from the local paths of its files in the cache (throws DataError when they
  /// are not what the build read of them).
  using Open = std::function<void(std::size_t shard, const std::vector<std::string>& paths)>;
  /// Closes shard `s` (its files are let go after it returns). Must not throw.
  using Close = std::function<void(std::size_t shard)>;

  /// Shard s is the stream's files [s × files_per_shard, (s + 1) × files_per_shard); `starts`
  /// gives each shard's first sample; `sampler` is the run's order. Plans epoch 0.
  StreamedShards(std::unique_ptr<ShardStream> stream, std::unique_ptr<Sampler> sampler,
                 std::vector<std::size_t> starts, std::size_t files_per_shard, Open open,
                 Close close);

  ShardStream& stream() noexcept { return *stream_; }

  /// The shards one batch reads, held while it reads them (released by the destructor).
  class Hold {
   public:
    Hold() = default;
    Hold(StreamedShards* owner, std::uint32_t epoch) : owner_(owner), epoch_(epoch) {}
    Hold(Hold&& other) noexcept
        : owner_(std::exchange(other.owner_, nullptr)),
          epoch_(other.epoch_),
          shards_(std::move(other.shards_)) {}
    Hold& operator=(Hold&&) = delete;
    Hold(const Hold&) = delete;
    ~Hold() {
      if (owner_) owner_->unhold(epoch_, shards_);
    }
    /// `shard` is held; the batch reads `samples` of its samples.
    void add(std::size_t shard, std::uint64_t samples) { shards_.emplace_back(shard, samples); }

   private:
    StreamedShards* owner_ = nullptr;
    std::uint32_t epoch_ = 0;
    std::vector<std::pair<std::size_t, std::uint64_t>> shards_;
  };

  /// Opens (waits for) the shards `batch` reads and holds them until the Hold ends. DataError
  /// from the fetch or from Open; remote::Cancelled when the run is cancelled.
  Hold hold(const Batch& batch);

 private:
  struct Use {
    std::mutex mutex;
    int users = 0;  ///< batches reading it now
    bool open = false;
  };
  /// The stream's plan for `epoch`, and the samples of each shard in it from batch `first_batch`
  /// on (the first batch of the epoch this loader sees; nullopt at build: the plan only).
  void begin_epoch(std::uint32_t epoch, std::optional<std::uint64_t> first_batch);
  void open(std::size_t shard);
  /// Ends a batch's hold: a shard read to its end this epoch is closed and let go.
  void unhold(std::uint32_t epoch,
              const std::vector<std::pair<std::size_t, std::uint64_t>>& shards) noexcept;
  std::size_t shard_of(std::uint32_t sample) const;

  std::unique_ptr<ShardStream> stream_;
  std::unique_ptr<Sampler> sampler_;
  std::vector<std::size_t> starts_;
  /// The samples of every shard when shard s starts at s × uniform_ (all but the last of one
  /// size, the common case): a sample's shard is a division. 0: found by a search of starts_.
  std::size_t uniform_ = 0;
  std::size_t files_per_shard_;
  Open open_;
  Close close_;
  std::vector<Use> uses_;
  std::mutex epochs_;  ///< guards left_ and planned_
  /// Per epoch begun: the samples of each shard this rank has not read yet.
  std::map<std::uint32_t, std::vector<std::uint64_t>> left_;
  std::int64_t planned_ = -1;  ///< the newest epoch given to the stream's plan
};

/// `streaming`'s hold of the shards `batch` reads (an empty hold when `streaming` is null), with
/// its DataErrors naming the shards' URLs rather than their cached copies.
StreamedShards::Hold hold_streamed(StreamedShards* streaming, const RemoteFiles* remote,
                                   const Batch& batch);

}  // namespace flowfeed
