#pragma once
/// \file
/// Which batches of this rank's sequence have finished, for Pipeline::checkpoint().

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace flowfeed::detail {

/// The batches of a run that finished the train step (or were released in pull mode), by their
/// index in this rank's sequence (epoch × batches_per_epoch + index in the epoch): every index
/// below next() and the ones after it that finished out of order. finish() and next() may be
/// called from several threads at once.
class RunCursor {
 public:
  /// Starts a run at `first`, with `skip` (ascending, after `first`) finished already; at most
  /// `in_flight` batches are admitted past the first unfinished one at any time.
  void reset(std::uint64_t first, const std::vector<std::uint64_t>& skip, std::size_t in_flight);
  /// Batches [from, to) will never come (a stream's epoch ended before them; from is above every
  /// index seen so far, and gaps come in rising order): the cursor passes over them.
  void skip_range(std::uint64_t from, std::uint64_t to);
  /// Marks batch `index` finished. Allocates only when finished batches run further ahead of the
  /// oldest unfinished one than ever before in the run.
  void finish(std::uint64_t index);
  /// The first unfinished batch; `ahead` (when given) gets the finished ones after it.
  std::uint64_t next(std::vector<std::uint64_t>* ahead = nullptr) const;
  /// Batches finished since reset() (not counting `skip`).
  std::uint64_t finished() const;

 private:
  /// Moves next_ past finished and skipped batches.
  void advance();
  /// `index` counted without the gaps below it: where done_ keeps it.
  std::uint64_t dense(std::uint64_t index) const;
  /// The index whose dense() is `d`.
  std::uint64_t sparse(std::uint64_t d) const;

  mutable std::mutex mutex_;
  std::vector<std::uint8_t> done_;  // done_[dense(i) % size]: batch i finished, for dense(i) in
                                    // [dense(next_), +size)
  std::vector<std::pair<std::uint64_t, std::uint64_t>> gaps_;  // skip_range()s, rising
  std::vector<std::uint64_t> skip_;  // finished before the run (ascending)
  std::size_t skip_pos_ = 0;         // skip_ entries below next_
  std::uint64_t next_ = 0;
  std::uint64_t finished_ = 0;
};

}  // namespace flowfeed::detail
