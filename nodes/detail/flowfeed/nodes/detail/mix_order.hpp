#pragma once
// The `mix` loader's order: how many samples each source gives an epoch (the weights apportioned,
// the epoch ending when the first source is exhausted or after a fixed count), and which source
// and which of its samples each position of an epoch is, a pure function of (seed, epoch,
// position), built as a table once per epoch and kept for at most two epochs at a time.

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace flowfeed {

/// The samples each source gives every epoch.
struct MixPlan {
  std::uint64_t epoch_size = 0;       ///< positions per epoch (the mix's data set size)
  std::vector<std::uint64_t> counts;  ///< samples of each source per epoch; they sum to epoch_size
};

/// Apportions an epoch among sources of `sizes` samples with positive `weights` (largest
/// remainder: each count is within 1 of weight share × epoch size). `samples` 0: the epoch ends
/// when the first source is exhausted, i.e. it is the longest epoch in which no source gives more
/// than its size; else the epoch has `samples` positions and a source whose count exceeds its
/// size cycles through it. Throws std::invalid_argument saying why (an empty source, an epoch
/// of more than 2^32 - 1 positions).
MixPlan plan_mix(const std::vector<std::uint64_t>& sizes, const std::vector<double>& weights,
                 std::uint64_t samples);

/// One epoch's table: for each position, its source and that source's sample.
struct MixTable {
  std::uint32_t epoch = 0;
  std::vector<std::uint8_t> source;   ///< the source of each position
  std::vector<std::uint32_t> sample;  ///< the sample of that source
};

/// Builds epoch tables. With `shuffle`, the positions of each source are a random arrangement of
/// the plan's counts drawn from (seed, epoch), and each source's samples come in an order drawn
/// from (seed, epoch, source, cycle); without, the sources interleave as evenly as their counts
/// allow (the source furthest behind its share takes the next position) and give their samples
/// in order, the same every epoch.
class MixOrder {
 public:
  MixOrder(MixPlan plan, std::vector<std::uint64_t> sizes, bool shuffle, std::uint64_t seed);
  const MixPlan& plan() const noexcept { return plan_; }
  /// Whether every epoch's table is the same (unshuffled): one build serves them all.
  bool same_every_epoch() const noexcept { return !shuffle_; }
  /// Fills `table` for `epoch` (its vectors keep their capacity).
  void build(std::uint32_t epoch, MixTable& table) const;
  /// Bytes one table holds, and the scratch a build needs.
  std::uint64_t table_bytes() const noexcept { return plan_.epoch_size * 5; }
  std::uint64_t scratch_bytes() const noexcept;

 private:
  MixPlan plan_;
  std::vector<std::uint64_t> sizes_;
  bool shuffle_;
  std::uint64_t seed_;
};

/// At most two epoch tables, shared by the bodies that fill batches: a body holds its epoch's
/// table while it reads it; a third epoch waits until a table is free (only when an epoch has
/// fewer batches than bodies run at once). An unshuffled order's one table serves every epoch,
/// built once. Thread-safe.
class MixTables {
 public:
  explicit MixTables(const MixOrder& order) : order_(order) {}
  /// The table of `epoch`, built if neither slot holds it; pair with release().
  const MixTable& acquire(std::uint32_t epoch);
  void release(const MixTable& table);

 private:
  struct Slot {
    MixTable table;
    bool built = false;
    int users = 0;
  };
  const MixOrder& order_;
  std::mutex mutex_;
  std::condition_variable freed_;
  Slot slots_[2];
};

}  // namespace flowfeed
