#include "flowfeed/nodes/detail/mix_order.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "flowfeed/sampler.hpp"

namespace flowfeed {

namespace {

constexpr std::uint64_t kMaxPositions = std::numeric_limits<std::uint32_t>::max();
// Keep the arrangement's and the sources' streams apart from each other and from the sampler's.
constexpr std::uint64_t kArrangementSalt = 0x6D69782D6172726EULL;
constexpr std::uint64_t kSourceSalt = 0x6D69782D736F7572ULL;

__extension__ typedef unsigned __int128 Wide;  // for the multiply-shift below

/// Uniform draws from a key: splitmix64 of consecutive counters.
class Draws {
 public:
  explicit Draws(std::uint64_t key) : state_(splitmix64(key)) {}
  /// Uniform in [0, n), n > 0 (multiply-shift; the bias is below n / 2^64).
  std::uint64_t below(std::uint64_t n) {
    const Wide x = static_cast<Wide>(splitmix64(state_++)) * n;
    return static_cast<std::uint64_t>(x >> 64);
  }

 private:
  std::uint64_t state_;
};

std::uint64_t key_of(std::uint64_t seed, std::uint64_t a, std::uint64_t b, std::uint64_t c) {
  return splitmix64(splitmix64(splitmix64(seed ^ a) ^ b) ^ c);
}

std::vector<std::uint64_t> apportion(const std::vector<double>& shares, std::uint64_t total) {
  std::vector<std::uint64_t> counts(shares.size());
  std::vector<double> fraction(shares.size());
  std::uint64_t given = 0;
  for (std::size_t k = 0; k < shares.size(); ++k) {
    const double exact = shares[k] * static_cast<double>(total);
    counts[k] = std::min<std::uint64_t>(static_cast<std::uint64_t>(std::floor(exact)), total);
    fraction[k] = exact - static_cast<double>(counts[k]);
    given += counts[k];
  }
  std::vector<std::size_t> by(shares.size());
  std::iota(by.begin(), by.end(), std::size_t{0});
  std::stable_sort(by.begin(), by.end(),
                   [&](std::size_t a, std::size_t b) { return fraction[a] > fraction[b]; });
  // Rounding may leave the floors summing past `total` by an ulp's worth; never below 0 left.
  for (std::size_t i = 0; given < total; i = (i + 1) % by.size(), ++given) ++counts[by[i]];
  for (std::size_t i = by.size(); given > total; ++i) {
    std::size_t k = by[(by.size() - 1) - (i % by.size())];
    if (counts[k] > 0) {
      --counts[k];
      --given;
    }
  }
  return counts;
}

}  // namespace

MixPlan plan_mix(const std::vector<std::uint64_t>& sizes, const std::vector<double>& weights,
                 std::uint64_t samples) {
  if (sizes.empty() || sizes.size() != weights.size()) {
    throw std::invalid_argument("a mix needs one weight per source");
  }
  const double total_weight = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> shares;
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == 0) {
      throw std::invalid_argument("source " + std::to_string(k) +
                                  " has no samples (a mix draws from every source)");
    }
    if (!(weights[k] > 0) || !std::isfinite(weights[k])) {
      throw std::invalid_argument("source " + std::to_string(k) + " has weight " +
                                  std::to_string(weights[k]) + " (weights must be above 0)");
    }
    shares.push_back(weights[k] / total_weight);
  }
  MixPlan plan;
  if (samples > 0) {
    plan.epoch_size = samples;
  } else {
    // The longest epoch in which no source is asked for more than it has: the source with the
    // smallest size / share runs out first.
    double longest = std::numeric_limits<double>::infinity();
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      longest = std::min(longest, std::floor(static_cast<double>(sizes[k]) / shares[k]));
    }
    plan.epoch_size = longest >= static_cast<double>(kMaxPositions) + 1
                          ? kMaxPositions + 1
                          : std::max<std::uint64_t>(1, static_cast<std::uint64_t>(longest));
  }
  if (plan.epoch_size > kMaxPositions) {
    throw std::invalid_argument(
        "an epoch of " + std::to_string(plan.epoch_size) +
        " samples is more than a data set may have (2^32 - 1: sample indices are 32-bit)");
  }
  plan.counts = apportion(shares, plan.epoch_size);
  if (samples == 0) {
    // Rounding up a remainder may ask one more of the source that runs out: shorten the epoch.
    for (;;) {
      bool fits = true;
      for (std::size_t k = 0; k < sizes.size(); ++k) fits = fits && plan.counts[k] <= sizes[k];
      if (fits || plan.epoch_size == 1) break;
      --plan.epoch_size;
      plan.counts = apportion(shares, plan.epoch_size);
    }
  }
  return plan;
}

MixOrder::MixOrder(MixPlan plan, std::vector<std::uint64_t> sizes, bool shuffle, std::uint64_t seed)
    : plan_(std::move(plan)), sizes_(std::move(sizes)), shuffle_(shuffle), seed_(seed) {}

std::uint64_t MixOrder::scratch_bytes() const noexcept {
  if (!shuffle_) return 0;
  return *std::max_element(sizes_.begin(), sizes_.end()) * 4;
}

void MixOrder::build(std::uint32_t epoch, MixTable& table) const {
  const std::uint64_t n = plan_.epoch_size;
  const std::size_t k_count = plan_.counts.size();
  table.epoch = epoch;
  table.source.resize(n);
  table.sample.resize(n);
  if (shuffle_) {
    std::uint64_t at = 0;
    for (std::size_t k = 0; k < k_count; ++k) {
      std::fill_n(table.source.begin() + static_cast<std::ptrdiff_t>(at), plan_.counts[k],
                  static_cast<std::uint8_t>(k));
      at += plan_.counts[k];
    }
    Draws draws(key_of(seed_, kArrangementSalt, epoch, 0));
    for (std::uint64_t i = n; i > 1; --i)
      std::swap(table.source[i - 1], table.source[draws.below(i)]);
  } else {
    // Largest deficit first: position p goes to the source furthest below (p + 1) x its share.
    std::vector<std::uint64_t> taken(k_count, 0);
    for (std::uint64_t p = 0; p < n; ++p) {
      std::size_t best = k_count;
      double best_deficit = 0;
      for (std::size_t k = 0; k < k_count; ++k) {
        if (taken[k] == plan_.counts[k]) continue;
        const double deficit = static_cast<double>(p + 1) * static_cast<double>(plan_.counts[k]) /
                                   static_cast<double>(n) -
                               static_cast<double>(taken[k]);
        if (best == k_count || deficit > best_deficit) {
          best = k;
          best_deficit = deficit;
        }
      }
      table.source[p] = static_cast<std::uint8_t>(best);
      ++taken[best];
    }
  }
  // Each source's samples in its order, cycle after cycle, to its positions in turn.
  std::vector<std::uint32_t> cycle;
  for (std::size_t k = 0; k < k_count; ++k) {
    const std::uint64_t size = sizes_[k];
    std::uint64_t rank = 0;
    std::uint64_t filled = 0;  // samples of the current cycle drawn so far (shuffle)
    for (std::uint64_t p = 0; p < n; ++p) {
      if (table.source[p] != k) continue;
      const std::uint64_t in_cycle = rank % size;
      if (!shuffle_) {
        table.sample[p] = static_cast<std::uint32_t>(in_cycle);
      } else {
        if (in_cycle == 0) {
          // A new cycle: a fresh partial Fisher-Yates of [0, size), drawn as far as needed.
          const std::uint64_t c = rank / size;
          const std::uint64_t need = std::min(size, plan_.counts[k] - rank);
          cycle.resize(size);
          std::iota(cycle.begin(), cycle.end(), std::uint32_t{0});
          Draws draws(key_of(seed_, kSourceSalt + k, epoch, c));
          for (std::uint64_t i = 0; i < need; ++i) {
            std::swap(cycle[i], cycle[i + draws.below(size - i)]);
          }
          filled = 0;
        }
        table.sample[p] = cycle[filled++];
      }
      ++rank;
    }
  }
}

const MixTable& MixTables::acquire(std::uint32_t epoch) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    Slot* free = nullptr;
    for (Slot& s : slots_) {
      if (s.built && (s.table.epoch == epoch || order_.same_every_epoch())) {
        ++s.users;
        return s.table;
      }
      if (s.users == 0 && (!free || !s.built || (free->built && s.table.epoch < free->table.epoch)))
        free = &s;
    }
    if (free) {
      free->built = false;
      order_.build(epoch, free->table);
      free->built = true;
      ++free->users;
      return free->table;
    }
    freed_.wait(lock);
  }
}

void MixTables::release(const MixTable& table) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Slot& s : slots_) {
      if (&s.table == &table) --s.users;
    }
  }
  freed_.notify_all();
}

}  // namespace flowfeed
