#include "flowfeed/nodes/detail/streamed_shards.hpp"

#include <algorithm>

#include "flowfeed/error.hpp"
#include "flowfeed/nodes/detail/file_set.hpp"

namespace flowfeed {

StreamedShards::StreamedShards(std::unique_ptr<ShardStream> stream,
                               std::unique_ptr<Sampler> sampler, std::vector<std::size_t> starts,
                               std::size_t files_per_shard, Open open, Close close)
    : stream_(std::move(stream)),
      sampler_(std::move(sampler)),
      starts_(std::move(starts)),
      files_per_shard_(files_per_shard),
      open_(std::move(open)),
      close_(std::move(close)),
      uses_(starts_.size()) {
  if (starts_.size() >= 2 && starts_[1] > 0) {
    bool even = true;
    for (std::size_t s = 0; s < starts_.size() && even; ++s) even = starts_[s] == s * starts_[1];
    if (even) uniform_ = starts_[1];
  }
  begin_epoch(0, std::nullopt);
}

std::size_t StreamedShards::shard_of(std::uint32_t sample) const {
  if (uniform_) return std::min<std::size_t>(sample / uniform_, starts_.size() - 1);
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), std::size_t{sample});
  return static_cast<std::size_t>(it - starts_.begin()) - 1;
}

void StreamedShards::begin_epoch(std::uint32_t epoch, std::optional<std::uint64_t> first_batch) {
  std::lock_guard<std::mutex> lock(epochs_);
  const Sampler& sampler = *sampler_;
  if (static_cast<std::int64_t>(epoch) > planned_) {
    planned_ = epoch;
    std::vector<std::size_t> files;
    for (const std::uint32_t shard : sampler.shard_sequence(epoch)) {
      for (std::size_t f = 0; f < files_per_shard_; ++f) {
        files.push_back(files_per_shard_ * std::size_t{shard} + f);
      }
    }
    stream_->plan(files);
  }
  // At build the epoch a run starts in is not known (a resume starts part way): only the plan.
  if (!first_batch || left_.count(epoch) != 0) return;
  // The samples of each shard this rank reads this epoch: its full batches (or all of them) from
  // the first one seen (a resumed epoch starts part way; a batch before it that comes later
  // makes a shard close early, to be opened again: never read while closed).
  const std::vector<std::uint32_t> order = sampler.epoch_order(epoch);
  const std::size_t read =
      std::min<std::size_t>(order.size(), sampler.batches_per_epoch() * sampler.batch_size());
  std::vector<std::uint64_t> left(starts_.size(), 0);
  for (std::size_t k = std::min<std::size_t>(read, *first_batch * sampler.batch_size()); k < read;
       ++k) {
    ++left[shard_of(order[k])];
  }
  left_[epoch] = std::move(left);
  // Epochs two back are over (a batch of one more than that is being read).
  while (!left_.empty() && left_.begin()->first + 1 < epoch) left_.erase(left_.begin());
}

StreamedShards::Hold StreamedShards::hold(const Batch& batch) {
  begin_epoch(batch.epoch, batch.index_in_epoch);
  std::vector<std::pair<std::size_t, std::uint64_t>> touched;
  for (const std::uint32_t sample : batch.samples) {
    const std::size_t s = shard_of(sample);
    if (!touched.empty() && touched.back().first == s) {
      ++touched.back().second;
      continue;
    }
    const auto seen =
        std::find_if(touched.begin(), touched.end(), [&](const auto& t) { return t.first == s; });
    if (seen == touched.end()) {
      touched.emplace_back(s, 1);
    } else {
      ++seen->second;
    }
  }
  Hold hold(this, batch.epoch);
  for (const auto& [shard, count] : touched) {
    open(shard);
    hold.add(shard, count);
  }
  return hold;
}

void StreamedShards::open(std::size_t shard) {
  Use& use = uses_[shard];
  std::lock_guard<std::mutex> lock(use.mutex);
  if (use.open) {
    ++use.users;
    return;
  }
  std::vector<std::string> paths;
  const std::size_t first = files_per_shard_ * shard;
  try {
    for (std::size_t f = 0; f < files_per_shard_; ++f) paths.push_back(stream_->acquire(first + f));
    open_(shard, paths);
  } catch (...) {
    for (std::size_t f = 0; f < paths.size(); ++f) stream_->release(first + f);
    throw;
  }
  use.open = true;
  ++use.users;
}

void StreamedShards::unhold(
    std::uint32_t epoch,
    const std::vector<std::pair<std::size_t, std::uint64_t>>& shards) noexcept {
  for (const auto& [shard, count] : shards) {
    bool finished = false;
    {
      std::lock_guard<std::mutex> lock(epochs_);
      const auto it = left_.find(epoch);
      if (it != left_.end()) {
        std::uint64_t& left = it->second[shard];
        left -= std::min(left, count);
        finished = left == 0;
      }
    }
    Use& use = uses_[shard];
    std::lock_guard<std::mutex> lock(use.mutex);
    if (--use.users > 0 || !finished || !use.open) continue;
    // Read to its end this epoch: closed, and let go (the cache may evict it).
    close_(shard);
    use.open = false;
    for (std::size_t f = files_per_shard_ * shard; f < files_per_shard_ * (shard + 1); ++f) {
      stream_->release(f);
      stream_->done(f);
    }
  }
}

StreamedShards::Hold hold_streamed(StreamedShards* streaming, const RemoteFiles* remote,
                                   const Batch& batch) {
  if (!streaming) return StreamedShards::Hold();
  try {
    return streaming->hold(batch);
  } catch (const DataError& e) {
    throw DataError(name_urls(remote, e.what()));
  }
}

}  // namespace flowfeed
