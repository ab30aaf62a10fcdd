#include "flowfeed/sampler.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>

namespace flowfeed {

namespace {

bool read_int(const char* name, int* out) {
  const char* text = std::getenv(name);
  if (!text) return false;
  const char* end = text + std::strlen(text);
  auto [p, ec] = std::from_chars(text, end, *out);
  if (ec != std::errc() || p != end || *out < 0) {
    throw ConfigError({std::string("environment: ") + name + "='" + text +
                       "' is not a non-negative integer (set by the launcher) fix or unset it"});
  }
  return true;
}

}  // namespace

LaunchEnvironment launch_environment() {
  struct Launcher {
    const char* rank;
    const char* world;
    const char* local;
    const char* source;
  };
  for (const Launcher& l : {Launcher{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_*"},
                            Launcher{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_*"},
                            Launcher{"RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK/WORLD_SIZE"}}) {
    LaunchEnvironment env;
    const bool has_rank = read_int(l.rank, &env.rank);
    const bool has_world = read_int(l.world, &env.world);
    if (!has_rank && !has_world) continue;
    if (!has_rank || !has_world) {
      throw ConfigError({std::string("environment: ") + (has_rank ? l.rank : l.world) +
                         " is set but " + (has_rank ? l.world : l.rank) +
                         " is not (a launcher sets both) set both or neither"});
    }
    if (env.world < 1 || env.rank >= env.world) {
      throw ConfigError({std::string("environment: ") + l.rank + "=" + std::to_string(env.rank) +
                         " is out of range (" + l.world + "=" + std::to_string(env.world) + ")"});
    }
    read_int(l.local, &env.local_rank);
    env.source = l.source;
    return env;
  }
  return {};
}

std::uint64_t splitmix64(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

Sampler::Sampler(const SamplerOptions& options, std::size_t dataset_size, std::size_t batch_size,
                 const std::vector<std::size_t>& shard_starts)
    : options_(options), dataset_size_(dataset_size), batch_size_(batch_size) {
  if (options.world < 1 || options.rank < 0 || options.rank >= options.world) {
    throw std::invalid_argument("sampler rank must be in [0, world)");
  }
  if (batch_size == 0) throw std::invalid_argument("batch size must be positive");
  if (dataset_size == kUnknownSize) {
    if (options.world != 1 || options.shuffle) {
      throw std::invalid_argument("a stream is read in order by one rank (no shuffle, world 1)");
    }
    stream_ = true;
    dataset_size_ = 0;
    shard_size_ = 0;
    return;
  }
  const auto world = static_cast<std::size_t>(options.world);
  const auto rank = static_cast<std::size_t>(options.rank);
  shard_size_ = dataset_size / world + (rank < dataset_size % world ? 1 : 0);
  if (options.order == SampleOrder::shards) set_shard_starts(shard_starts);
}

std::size_t Sampler::batches_per_epoch() const noexcept {
  if (stream_) return stream_batches();
  return options_.drop_last ? shard_size_ / batch_size_
                            : (shard_size_ + batch_size_ - 1) / batch_size_;
}

std::vector<std::uint32_t> Sampler::epoch_order(std::uint32_t epoch) const {
  std::vector<std::uint32_t> perm;
  if (stream_) return perm;
  if (options_.shuffle && options_.order == SampleOrder::shards) {
    perm = shard_window_order(epoch);
  } else {
    perm.resize(dataset_size_);
    std::iota(perm.begin(), perm.end(), 0u);
  }
  if (options_.shuffle && options_.order == SampleOrder::samples) {
    // Fisher–Yates with splitmix64 (std::shuffle's output differs between standard libraries).
    std::uint64_t state = splitmix64(options_.seed ^ splitmix64(epoch + 0x5EEDull));
    for (std::size_t i = perm.size(); i > 1; --i) {
      state = splitmix64(state);
      std::size_t j = static_cast<std::size_t>(state % i);
      std::swap(perm[i - 1], perm[j]);
    }
  }
  if (options_.world == 1) return perm;
  std::vector<std::uint32_t> shard;
  shard.reserve(shard_size_);
  for (std::size_t i = static_cast<std::size_t>(options_.rank); i < perm.size();
       i += static_cast<std::size_t>(options_.world)) {
    shard.push_back(perm[i]);
  }
  return shard;
}

void Sampler::batch_samples(const std::vector<std::uint32_t>& order, std::size_t index,
                            std::vector<std::uint32_t>& out) const {
  if (stream_) {
    out.resize(batch_size_);
    // index < stream_batches(): every position fits 32 bits.
    const auto first = static_cast<std::uint32_t>(index * batch_size_);
    std::iota(out.begin(), out.end(), first);
    return;
  }
  std::size_t first = index * batch_size_;
  std::size_t last = std::min(first + batch_size_, order.size());
  out.assign(order.begin() + static_cast<std::ptrdiff_t>(first),
             order.begin() + static_cast<std::ptrdiff_t>(last));
}

}  // namespace flowfeed
