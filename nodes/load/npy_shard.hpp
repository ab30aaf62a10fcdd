#pragma once
// The npy loader's shards and, for shards named by URL and read during the run, the state of
// their stream (nodes/load/npy_remote.cpp; docs/REMOTE.md).
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "flowfeed/nodes/detail/io_engine.hpp"
#include "flowfeed/nodes/detail/npy_file.hpp"
#include "flowfeed/nodes/npy.hpp"
#include "flowfeed/remote/shard_stream.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

struct NpyLoader::Shard {
  std::unique_ptr<NpyFile> features;  ///< its header (a shard named by URL: named by it)
  std::unique_ptr<NpyFile> labels;    ///< its header; for a local file, the rows too
  IoFile file;  ///< the features, opened by the engine (a streamed shard: while it is open)
  std::unique_ptr<NpyFile> labels_data;  ///< a fetched labels file: the cached copy
  std::uint64_t features_bytes = 0;      ///< a URL's object sizes (0 for a local file)
  std::uint64_t labels_bytes = 0;

  const NpyFile& label_rows() const { return labels_data ? *labels_data : *labels; }
};

/// Shards fetched during the run: shard s is the stream's files 2s (features) and 2s + 1
/// (labels). A shard is open (its files held in the cache and opened) from the first batch
/// that reads it until every sample of it in the epoch was read and no batch reads it.
struct NpyLoader::Streaming {
  explicit Streaming(std::size_t shards) : uses(shards) {}
  struct Use {
    std::mutex mutex;
    int users = 0;  ///< batches reading it now
    bool open = false;
  };
  std::unique_ptr<ShardStream> stream;
  std::unique_ptr<Sampler> sampler;  ///< the run's order: which shards come next
  std::vector<Use> uses;
  std::mutex epochs;  ///< guards left and planned
  /// Per epoch begun: the samples of each shard this rank has not read yet.
  std::map<std::uint32_t, std::vector<std::uint64_t>> left;
  std::int64_t planned = -1;  ///< the newest epoch given to the stream's plan
};

/// The shards one batch reads, held while it reads them (released by the destructor).
class NpyLoader::ShardHold {
 public:
  ShardHold() = default;
  ShardHold(NpyLoader* loader, std::uint32_t epoch) : loader_(loader), epoch_(epoch) {}
  ShardHold(ShardHold&& other) noexcept
      : loader_(std::exchange(other.loader_, nullptr)),
        epoch_(other.epoch_),
        shards_(std::move(other.shards_)) {}
  ShardHold& operator=(ShardHold&&) = delete;
  ShardHold(const ShardHold&) = delete;
  ~ShardHold() {
    if (loader_) loader_->unhold_shards(epoch_, shards_);
  }
  /// `shard` is held; the batch reads `samples` of its samples.
  void add(std::size_t shard, std::uint64_t samples) { shards_.emplace_back(shard, samples); }

 private:
  NpyLoader* loader_ = nullptr;
  std::uint32_t epoch_ = 0;
  std::vector<std::pair<std::size_t, std::uint64_t>> shards_;
};

}  // namespace flowfeed
