#pragma once
/// \file
/// What a node says about the samples it drops under `on_error: skip`: each one once on stderr as
/// it happens, the first few in full, then only a count at the end of the run; the first ones also
/// go into the report's warnings.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/error.hpp"

namespace flowfeed {

struct RunReport;

/// Thrown by a node under `on_error: skip` when it dropped every sample of a batch: it has counted
/// each (against `pipeline.max_skipped`, in its DropLog) and said so, so the pipeline skips the
/// batch without counting it again.
class BatchDroppedError : public DataError {
 public:
  using DataError::DataError;
};

/// Throws DataError when `report` (of a run or session that ended, not interrupted) delivered no
/// sample because every one was dropped as bad: exit 0 with nothing delivered would pass for
/// success.
void check_something_delivered(const RunReport& report);

/// Removes the rows `dropped` (row numbers in the batch, ascending, fewer than its rows) from
/// `batch`: its bytes in `tier` move down to where a batch of the smaller row count keeps them
/// (BatchLayout packs a shorter batch just as tightly), and `batch.samples` shortens to match.
void remove_rows(Batch& batch, Tier tier, const std::vector<std::size_t>& dropped);

/// A sample that failed in its batch: its row, and why.
struct RowFailure {
  std::size_t row = 0;
  std::string message;
};

/// A node's record of dropped samples. Thread-safe.
class DropLog {
 public:
  /// Dropped samples shown in full on stderr; the rest are counted.
  static constexpr std::size_t kShown = 5;
  /// Dropped samples kept for the report's warnings.
  static constexpr std::size_t kKept = 20;

  /// `who` starts every line, e.g. "node 'load' (webdataset)".
  explicit DropLog(std::string who = {}) : who_(std::move(who)) {}
  void set_who(std::string who) { who_ = std::move(who); }

  /// Counts one dropped sample; `what` says which (file, sample) and why. Prints
  /// `flowfeed: <who>: dropped <what>` on stderr for the first kShown of a run.
  void note(const std::string& what);
  /// Samples noted in this run.
  std::uint64_t count() const;
  /// Adds the count to `report.skipped_samples` and the first notes to its warnings, and prints
  /// `flowfeed: <who>: N samples dropped in all (the first 5 shown above)` when some were not
  /// shown. Then starts over for the next run.
  void finish(RunReport& report);
  /// Forgets this run's notes (a new run starts).
  void reset();
  /// Under `on_error: skip`, drops the failed rows of `batch` (`failures` sorted by row): notes
  /// each (`sample <index> of batch <seq> (epoch <e>): <message>`), fails the run
  /// (std::runtime_error) once more than `max_skipped` samples were dropped in all, throws
  /// BatchDroppedError when every row failed, else removes the rows from `tier` (remove_rows).
  void drop_rows(Batch& batch, Tier tier, const std::vector<RowFailure>& failures, int max_skipped);

 private:
  std::string who_;
  mutable std::mutex mutex_;
  std::uint64_t count_ = 0;
  std::vector<std::string> kept_;
};

}  // namespace flowfeed
