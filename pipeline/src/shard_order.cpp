// The sampler's order: shards — data shards permuted by (seed, epoch), samples shuffled within
// windows of consecutive shards (sampler.hpp describes the order and its properties).

#include "detail/shard_order.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "flowfeed/error.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

namespace {

/// The generator state of epoch `epoch`'s shard order (apart from order: samples' stream).
std::uint64_t shard_state(std::uint64_t seed, std::uint32_t epoch) noexcept {
  return splitmix64(seed ^ splitmix64(epoch + 0x5EEDull) ^ 0x5A4D5ull);
}

/// Fisher–Yates over [first, last) with splitmix64 from `state` (std::shuffle's output differs
/// between standard libraries).
void shuffle_range(std::uint32_t* first, std::uint32_t* last, std::uint64_t& state) noexcept {
  for (auto i = static_cast<std::size_t>(last - first); i > 1; --i) {
    state = splitmix64(state);
    std::swap(first[i - 1], first[static_cast<std::size_t>(state % i)]);
  }
}

}  // namespace

void Sampler::set_shard_starts(const std::vector<std::size_t>& starts) {
  if (options_.shuffle_window < 0) throw std::invalid_argument("shuffle_window must be >= 0");
  shard_starts_.assign(1, 0);
  std::size_t previous = 0;
  for (std::size_t start : starts) {
    if (start < previous || start > dataset_size_) {
      throw std::invalid_argument("shard starts must rise within the data set");
    }
    previous = start;
    if (start > shard_starts_.back() && start < dataset_size_) shard_starts_.push_back(start);
  }
}

std::vector<std::uint32_t> Sampler::shard_sequence(std::uint32_t epoch) const {
  std::vector<std::uint32_t> shards(data_shards());
  std::iota(shards.begin(), shards.end(), 0u);
  if (options_.shuffle && options_.order == SampleOrder::shards) {
    std::uint64_t state = shard_state(options_.seed, epoch);
    shuffle_range(shards.data(), shards.data() + shards.size(), state);
  }
  return shards;
}

std::vector<std::uint32_t> Sampler::shard_window_order(std::uint32_t epoch) const {
  const std::vector<std::uint32_t> shards = shard_sequence(epoch);
  // The windows draw from a stream of their own, apart from the shards' permutation.
  std::uint64_t state = splitmix64(shard_state(options_.seed, epoch) ^ 0x313D0Bull);
  const auto window = static_cast<std::size_t>(options_.shuffle_window);
  std::vector<std::uint32_t> order;
  order.reserve(dataset_size_);
  for (std::size_t first = 0; first < shards.size(); first += std::max<std::size_t>(window, 1)) {
    const std::size_t begin = order.size();
    const std::size_t last = std::min(shards.size(), first + std::max<std::size_t>(window, 1));
    for (std::size_t k = first; k < last; ++k) {
      const std::size_t shard = shards[k];
      const std::size_t end =
          shard + 1 < shard_starts_.size() ? shard_starts_[shard + 1] : dataset_size_;
      for (std::size_t i = shard_starts_[shard]; i < end; ++i) {
        order.push_back(static_cast<std::uint32_t>(i));
      }
    }
    if (window > 0) shuffle_range(order.data() + begin, order.data() + order.size(), state);
  }
  return order;
}

namespace detail {

void check_shard_order(const Checkpoint& c, const Sampler& sampler, const std::string& where) {
  const SamplerOptions& o = sampler.options();
  if (!c.shuffle || !o.shuffle) return;  // unshuffled, both orders are 0, 1, 2, ...
  auto fail = [&](const char* key, const std::string& problem) {
    throw ConfigError({fmt::format("{}: sampler.{}: {}", where, key, problem)});
  };
  auto name = [](SampleOrder order) { return order == SampleOrder::shards ? "shards" : "samples"; };
  if (c.order != o.order) {
    fail("order", fmt::format("the checkpoint was written with order: {}, this run has order: {} "
                              "(a resume continues the same sample order) set sampler.order: {}",
                              name(c.order), name(o.order), name(c.order)));
  }
  if (c.order != SampleOrder::shards) return;
  if (c.shuffle_window != static_cast<std::uint64_t>(o.shuffle_window)) {
    fail("shuffle_window",
         fmt::format("the checkpoint was written with shuffle_window: {}, this run has "
                     "shuffle_window: {} (it decides which samples are shuffled together) set "
                     "sampler.shuffle_window: {}",
                     c.shuffle_window, o.shuffle_window, c.shuffle_window));
  }
  if (c.data_shards != sampler.data_shards()) {
    fail("data_shards",
         fmt::format("the checkpoint was written for {} data shards, this run's loader has {} "
                     "(every epoch's order permutes the shards) resume with the same shards",
                     c.data_shards, sampler.data_shards()));
  }
}

}  // namespace detail

}  // namespace flowfeed
