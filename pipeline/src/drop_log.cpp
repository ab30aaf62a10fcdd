#include "flowfeed/drop_log.hpp"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>

#include "flowfeed/stats.hpp"

namespace flowfeed {

void check_something_delivered(const RunReport& report) {
  if (report.interrupted || report.samples > 0 || report.skipped_samples == 0) return;
  throw DataError(fmt::format(
      "the run delivered no sample: all {} were dropped as bad under pipeline.on_error: skip ({} "
      "batches skipped; the errors are above, and under \"warnings\" in --report) fix or remove "
      "the bad data",
      report.skipped_samples, report.skipped_batches));
}

void remove_rows(Batch& batch, Tier tier, const std::vector<std::size_t>& dropped) {
  // A tensor's new place starts no later than its old one and ends before the next tensor's old
  // place, so copying the tensors in order, each row forward, never overwrites a byte still to be
  // read.
  const std::size_t rows = batch.rows();
  const std::size_t kept_rows = rows - dropped.size();
  auto* base = reinterpret_cast<std::uint8_t*>(batch.data(tier));
  const BatchLayout& layout = *batch.layout;
  for (std::size_t t = 0; t < layout.tensors().size(); ++t) {
    const std::size_t bytes = layout.tensors()[t].sample_bytes();
    const std::uint8_t* from = base + layout.offset(t, rows);
    std::uint8_t* to = base + layout.offset(t, kept_rows);
    std::size_t kept = 0;
    std::size_t next_drop = 0;
    for (std::size_t row = 0; row < rows; ++row) {
      if (next_drop < dropped.size() && dropped[next_drop] == row) {
        ++next_drop;
        continue;
      }
      if (to + kept * bytes != from + row * bytes) {
        std::memmove(to + kept * bytes, from + row * bytes, bytes);
      }
      if (t == 0) batch.samples[kept] = batch.samples[row];
      ++kept;
    }
  }
  batch.samples.resize(kept_rows);
}

void DropLog::drop_rows(Batch& batch, Tier tier, const std::vector<RowFailure>& failures,
                        int max_skipped) {
  // Every dropped sample counts, one by one, against max_skipped, and is said once.
  for (const RowFailure& f : failures) {
    note(fmt::format("sample {} of batch {} (epoch {}): {}", batch.samples[f.row], batch.seq,
                     batch.epoch, f.message));
  }
  const std::uint64_t dropped = count();
  if (dropped > static_cast<std::uint64_t>(max_skipped)) {
    throw std::runtime_error(fmt::format("{} ({} {} dropped, more than pipeline.max_skipped = {})",
                                         failures.front().message, dropped,
                                         dropped == 1 ? "sample" : "samples", max_skipped));
  }
  if (failures.size() == batch.rows()) {
    // Nothing left to deliver: the batch is skipped as a whole, its samples counted above.
    throw BatchDroppedError(
        fmt::format("every sample of the batch is bad; the first: {}", failures.front().message));
  }
  std::vector<std::size_t> rows;
  rows.reserve(failures.size());
  for (const RowFailure& f : failures) rows.push_back(f.row);
  remove_rows(batch, tier, rows);
}

void DropLog::note(const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++count_;
  if (count_ <= kShown) {
    // One write per line, so lines from several nodes do not interleave.
    const std::string line = fmt::format("flowfeed: {}: dropped {}\n", who_, what);
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }
  if (kept_.size() < kKept) kept_.push_back(what);
}

std::uint64_t DropLog::count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

void DropLog::finish(RunReport& report) {
  std::lock_guard<std::mutex> lock(mutex_);
  report.skipped_samples += count_;
  for (const std::string& w : kept_) {
    if (report.warnings.size() >= kKept) break;
    report.warnings.push_back(fmt::format("skipped: {}: dropped {}", who_, w));
  }
  if (count_ > kShown) {
    const std::string line = fmt::format(
        "flowfeed: {}: {} samples dropped in all (pipeline.on_error: skip; the first "
        "{} are shown above)\n",
        who_, count_, kShown);
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }
  count_ = 0;
  kept_.clear();
}

void DropLog::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  count_ = 0;
  kept_.clear();
}

}  // namespace flowfeed
