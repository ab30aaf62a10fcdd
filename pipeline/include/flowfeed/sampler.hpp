#pragma once
/// \file
/// Which samples form each batch: sequential or shuffled per epoch, sharded by rank.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"

namespace flowfeed {

/// Deterministic batch sampler. The order of an epoch depends only on (seed, epoch, rank, world)
/// and the data set size — never on timing — so every run and every rank agree. Shards are
/// strided over the epoch's permutation: rank r takes positions r, r+world, r+2·world, …, so the
/// shards of one epoch are disjoint and together cover the data set.
class Sampler {
 public:
  /// A sampler over `dataset_size` samples in batches of `batch_size` (rank/world from
  /// `options`, which must be valid: rank < world).
  Sampler(const SamplerOptions& options, std::size_t dataset_size, std::size_t batch_size);

  /// Samples in this rank's shard.
  std::size_t shard_size() const noexcept { return shard_size_; }
  /// Batches per epoch for this rank (the last may be partial unless drop_last).
  std::size_t batches_per_epoch() const noexcept;
  /// Samples in a full batch.
  std::size_t batch_size() const noexcept { return batch_size_; }
  /// Samples in the data set.
  std::size_t dataset_size() const noexcept { return dataset_size_; }
  /// The options it was made with.
  const SamplerOptions& options() const noexcept { return options_; }
  /// world × batch_size: one batch from every rank. Step k of every rank together takes positions
  /// [k × global_batch, (k + 1) × global_batch) of the epoch's permutation, so a global cursor
  /// that counts whole global batches means the same on every rank and for any world size with
  /// the same global batch.
  std::size_t global_batch() const noexcept {
    return batch_size_ * static_cast<std::size_t>(options_.world);
  }
  /// Data set indices of this rank's shard for `epoch`, in visiting order.
  std::vector<std::uint32_t> epoch_order(std::uint32_t epoch) const;
  /// Fills `out` with the samples of batch `index` of an epoch order (`order` from epoch_order).
  void batch_samples(const std::vector<std::uint32_t>& order, std::size_t index,
                     std::vector<std::uint32_t>& out) const;

 private:
  SamplerOptions options_;
  std::size_t dataset_size_;
  std::size_t batch_size_;
  std::size_t shard_size_;
};

/// Rank and world size as a launcher set them in the environment.
struct LaunchEnvironment {
  int rank = 0;        ///< this process, 0..world-1
  int world = 1;       ///< processes in the job
  int local_rank = 0;  ///< this process among those on its machine (picks its GPU)
  /// Which launcher's variables were read: "OMPI_COMM_WORLD_*" (mpirun), "SLURM_*" (srun),
  /// "RANK/WORLD_SIZE" (torchrun), or empty when none is set (a single process).
  std::string source;
};

/// Reads rank and world size from the standard launchers' variables, first match wins:
/// OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK, SLURM_PROCID/NTASKS/LOCALID, RANK/WORLD_SIZE/LOCAL_RANK.
/// Throws ConfigError naming the variable when a value is not a number or the rank is out of range.
LaunchEnvironment launch_environment();

/// splitmix64: the one mixing function behind seeded choices in flowfeed.
std::uint64_t splitmix64(std::uint64_t x) noexcept;

}  // namespace flowfeed
