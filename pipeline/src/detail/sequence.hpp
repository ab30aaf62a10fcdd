#pragma once
// The sequence of batches (sequence.cpp): the sampler, where a run starts in this rank's sequence
// (epoch x batches_per_epoch + index in the epoch; pipeline.resume_from, else 0), the source's
// position in it, which batches finished (the resume cursor), and the checkpoints written from
// that. A stream's epochs (Sampler::stream) end where its loader found the end of its data.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "detail/run_cursor.hpp"
#include "flowfeed/checkpoint.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed::detail {

class Chain;

class Sequence {
 public:
  /// At build, once the loader knows the data set's size: the sampler of `epochs` epochs.
  void open(const SamplerOptions& options, std::size_t dataset, std::size_t batch_size, int epochs,
            std::vector<std::size_t> shard_starts = {});
  bool opened() const noexcept { return sampler_ != nullptr; }
  const Sampler& sampler() const noexcept { return *sampler_; }
  std::uint64_t batches_per_epoch() const { return sampler_->batches_per_epoch(); }
  /// Reserves the order the source holds (its bytes were claimed with the sampling order).
  void reserve_order() { source_order_.reserve(sampler_->shard_size()); }
  /// True when the data set is a stream of unknown length.
  bool stream() const noexcept { return sampler_->stream(); }
  /// After the loader: false when `batch` is not delivered. For a stream, a batch with
  /// Batch::end_of_data tells where its epoch's data ended (from then on the source emits no
  /// further batch of that epoch): it keeps its rows when it has some (all of a batch under
  /// drop_last), later ones lie past the end. Then the batches with data are counted against
  /// stop_after: the one past it stops the source. The loader's thread.
  bool keep(const Batch& batch);
  /// For a stream: the run's batches of `epoch` have the seqs [first, end), or nullopt while the
  /// source may still emit some of it.
  std::optional<std::pair<std::uint64_t, std::uint64_t>> stream_epoch_seqs(
      std::uint32_t epoch) const;

  /// At build: the start from the checkpoint `config`'s pipeline.resume_from names, and each
  /// stateful node's state from it.
  void resume_from_checkpoint(const PipelineConfig& config, const Chain& chain);
  /// Pipeline::resume(): every later run starts at `start` (checked by the caller).
  void resume(ResumePoint start, std::uint64_t steps, std::size_t depth);
  /// The cursor back at the start, for `depth` batches in flight.
  void reset_cursor(std::size_t depth);

  /// What a run asks of the sequence (RunOptions' fields of the same names).
  struct RunLimits {
    std::uint64_t stop_after = 0;
    std::uint64_t checkpoint_every = 0;
    std::string checkpoint_dir;
    CheckpointDir* checkpoint = nullptr;
  };
  /// Prepares the source and the cursor for a run or session from the start, with `limits`'
  /// stop_after and periodic checkpoints (std::invalid_argument: checkpoint_every without a
  /// directory; the directory is opened here), for `depth` batches in flight.
  void begin(const RunLimits& limits, std::size_t depth);
  /// True when the source has no further batch in this run (the end, or stop_after); passes the
  /// batches a resumed run had finished out of order first.
  bool exhausted();
  /// Gives `batch` the next position (seq, epoch, index in it) and its samples.
  void assign(Batch& batch);
  /// Counts `batch` finished (the resume cursor).
  void finish(const Batch& batch);

  /// One past the last batch of the last epoch.
  std::uint64_t sequence_end() const {
    return sampler_->batches_per_epoch() * static_cast<std::uint64_t>(epochs_);
  }
  /// Batches the source emits in this run before sequence index x.
  std::uint64_t run_batches_before(std::uint64_t x) const;
  /// Batches a whole run takes from the source; 0 for a stream (not known ahead).
  std::uint64_t expected_batches() const {
    return stream() ? 0 : run_batches_before(sequence_end());
  }
  /// The epoch of the run's batch `seq` (counted from the run's start).
  std::uint64_t epoch_of_run_batch(std::uint64_t seq) const;
  /// The first epoch of the run (a resumed run's is the checkpoint's).
  std::size_t first_epoch() const {
    return static_cast<std::size_t>(start_.first / sampler_->batches_per_epoch());
  }

  /// Pipeline::checkpoint().
  Checkpoint checkpoint() const;
  /// Node name to (type, state), as Pipeline's NodeStates.
  using States = std::map<std::string, std::pair<std::string, std::string>>;
  /// checkpoint() and every stateful node's state in `states`, taken together.
  Checkpoint checkpoint(const Chain& chain, States& states) const;
  void save_checkpoint(const Chain& chain, const std::string& dir) const;
  void save_checkpoint(const Chain& chain, CheckpointDir& dir) const;
  /// After `finished` batches of the run: writes the periodic checkpoint when one is due.
  void checkpoint_after(const Chain& chain, std::uint64_t finished) const;

 private:
  /// checkpoint(chain, states) under the caller's lock.
  Checkpoint gather(const Chain& chain, States& states) const;
  /// A stream's position `x` (epoch × batches_per_epoch + index): the next epoch's start when
  /// `x` lies at or past the known end of its epoch, else `x`.
  std::uint64_t past_stream_end(std::uint64_t x) const;

  int epochs_ = 1;
  std::unique_ptr<Sampler> sampler_;
  ResumePoint start_;
  std::uint64_t resumed_steps_ = 0;
  RunCursor cursor_;
  std::uint64_t source_seq_ = 0;  // the run's next batch
  std::uint64_t source_pos_ = 0;  // the next candidate for the source
  std::size_t source_skip_ = 0;   // start_.skip entries passed
  std::vector<std::uint32_t> source_order_;
  std::uint32_t order_epoch_ = ~0u;  // the epoch source_order_ holds
  std::uint64_t stop_after_ = 0;     // RunOptions::stop_after of the run
  std::uint64_t checkpoint_every_ = 0;
  CheckpointDir* checkpoint_dir_ = nullptr;        // where checkpoint_every writes
  std::unique_ptr<CheckpointDir> own_checkpoint_;  // one run() opened from checkpoint_dir
  mutable std::mutex checkpoint_mutex_;
  // A stream's epochs: the batches with rows of each (known once its end was found; ~0 before)
  // and the run's seq of each one's first and end batches (~0: not reached, not final). Under
  // stream_mutex_, which the source holds while it moves.
  mutable std::mutex stream_mutex_;
  std::vector<std::uint64_t> stream_batches_;
  std::vector<std::uint64_t> stream_first_seq_;
  std::vector<std::uint64_t> stream_end_seq_;
  std::uint64_t stream_delivered_ = 0;  // batches with data the loader gave (stop_after)
  bool stream_stopped_ = false;         // stop_after was reached
};

}  // namespace flowfeed::detail
