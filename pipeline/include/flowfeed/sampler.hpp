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
///
/// The epoch's permutation (the global order) is, with `shuffle`:
/// - order: samples — a uniform permutation of all samples (Fisher–Yates);
/// - order: shards — the loader's data shards (its files; LoaderNode::shard_starts) permuted, then
///   cut into windows of `shuffle_window` consecutive shards of that permutation; each window's
///   samples fill the next positions of the order, shuffled among themselves (shuffle_window 0:
///   not shuffled, each shard front to back). So every sample of the shard at place p of the
///   shard permutation comes before every sample of the shard at place q whenever
///   q / shuffle_window > p / shuffle_window (in particular q ≥ p + shuffle_window), and the
///   samples of one window are the positions [start, end) of the order that their shards' sizes
///   give. Ranks stride over this order as over any other, so resume and a change of world size
///   work unchanged; every rank reads the same window of shards at a time.
/// Without shuffle both orders are 0, 1, 2, … .
///
/// A stream (`dataset_size` kUnknownSize, node.hpp; one rank, no shuffle) has no order to make:
/// batch k of every epoch takes the stream's positions [k × batch_size, (k + 1) × batch_size), and
/// an epoch has at most stream_batches() of them (positions stay below 2^32), ending earlier where
/// the loader finds the end of its data.
class Sampler {
 public:
  /// A sampler over `dataset_size` samples in batches of `batch_size` (rank/world from
  /// `options`, which must be valid: rank < world). `shard_starts`: the first sample of each of
  /// the loader's data shards, rising (LoaderNode::shard_starts; empty shards and a first 0 may
  /// be left out), read under order: shards; empty: one shard. std::invalid_argument when they
  /// fall or pass `dataset_size`.
  Sampler(const SamplerOptions& options, std::size_t dataset_size, std::size_t batch_size,
          const std::vector<std::size_t>& shard_starts = {});

  /// Samples in this rank's shard (0 for a stream: not known).
  std::size_t shard_size() const noexcept { return shard_size_; }
  /// Batches per epoch for this rank (the last may be partial unless drop_last); for a stream,
  /// the most an epoch may have (stream_batches()).
  std::size_t batches_per_epoch() const noexcept;
  /// True when the data set is a stream of unknown length (made with kUnknownSize).
  bool stream() const noexcept { return stream_; }
  /// The most batches an epoch of a stream may have: its positions fit 32 bits.
  std::size_t stream_batches() const noexcept { return (std::size_t{1} << 32) / batch_size_; }
  /// Samples in a full batch.
  std::size_t batch_size() const noexcept { return batch_size_; }
  /// Samples in the data set (0 for a stream: not known).
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
  /// Data set indices of this rank's shard for `epoch`, in visiting order (empty for a stream).
  std::vector<std::uint32_t> epoch_order(std::uint32_t epoch) const;
  /// The data shards the order reads: under order: shards, the loader's non-empty shards (1 when
  /// it names none); under order: samples, 1.
  std::size_t data_shards() const noexcept {
    return shard_starts_.empty() ? 1 : shard_starts_.size();
  }
  /// The data shards of `epoch` in the order they are read (indices into the loader's non-empty
  /// shards): under order: shards with shuffle, a permutation fixed by (seed, epoch); else 0, 1,
  /// 2, … . Shard k of it is read in window k / shuffle_window: what a prefetcher fetches next.
  std::vector<std::uint32_t> shard_sequence(std::uint32_t epoch) const;
  /// Fills `out` with the samples of batch `index` of an epoch order (`order` from epoch_order;
  /// for a stream, the batch's positions in it).
  void batch_samples(const std::vector<std::uint32_t>& order, std::size_t index,
                     std::vector<std::uint32_t>& out) const;

 private:
  SamplerOptions options_;
  std::size_t dataset_size_;
  std::size_t batch_size_;
  std::size_t shard_size_;
  bool stream_ = false;
  /// Under order: shards, the first sample of each non-empty data shard, rising from 0.
  std::vector<std::size_t> shard_starts_;
  /// Keeps the non-empty shards of `starts` (the constructor's check).
  void set_shard_starts(const std::vector<std::size_t>& starts);
  /// The global order of `epoch` under order: shards with shuffle.
  std::vector<std::uint32_t> shard_window_order(std::uint32_t epoch) const;
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
