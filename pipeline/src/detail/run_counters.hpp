#pragma once
// What one run (or pull session) counted (run_counters.cpp): batches admitted, finished and
// skipped, samples and bytes delivered, the batches in flight, each branch's figures, each train
// node's finished batches per epoch, and the warnings for the report.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "flowfeed/batch.hpp"

namespace flowfeed::detail {

class RunCounters {
 public:
  /// Before a run: every count back to 0; `branches` train nodes of `epochs` epochs each, the
  /// first whose end may run `first_epoch` (a resumed run's).
  void begin(int branches, int epochs, std::size_t first_epoch);

  // The source and the end of the chain.
  /// Counts a batch the source emitted; returns the count.
  std::uint64_t count_produced() noexcept {
    return produced_.fetch_add(1, std::memory_order_relaxed) + 1;
  }
  /// Counts a batch that reached the first node (the in-flight figures).
  void note_in_flight() noexcept;
  /// Counts a finished batch (`upload_bytes`: its bytes when it reached a device buffer, its
  /// samples unless skipped); returns the batches finished so far.
  std::uint64_t count_finished(const Batch& batch, std::uint64_t upload_bytes) noexcept;
  std::uint64_t produced() const noexcept { return produced_.load(std::memory_order_relaxed); }
  std::uint64_t consumed() const noexcept { return consumed_.load(std::memory_order_relaxed); }
  /// For the recorder, which samples them while a run goes.
  const std::atomic<std::uint64_t>& produced_counter() const noexcept { return produced_; }
  const std::atomic<std::uint64_t>& consumed_counter() const noexcept { return consumed_; }
  int max_in_flight() const noexcept { return max_in_flight_.load(); }
  std::uint64_t samples() const noexcept { return samples_.load(); }
  std::uint64_t bytes() const noexcept { return bytes_.load(); }

  // Skipped batches (`on_error: skip`).
  /// Counts a skipped batch; returns the count.
  std::uint64_t count_skipped() noexcept { return skipped_.fetch_add(1) + 1; }
  void count_skipped_samples(std::uint64_t n) noexcept {
    skipped_samples_.fetch_add(n, std::memory_order_relaxed);
  }
  std::uint64_t skipped() const noexcept { return skipped_.load(); }
  /// Batches dropped past the end of a stream's epoch (Batch::past_end).
  std::uint64_t past_end() const noexcept { return past_end_.load(); }
  std::uint64_t skipped_samples() const noexcept { return skipped_samples_.load(); }

  // `pipeline.devices` branches.
  struct Branch {
    std::uint64_t batches = 0;
    std::uint64_t samples = 0;
    std::uint64_t bytes = 0;
  };
  /// Counts a finished batch of branch `branch` (`upload_bytes` as count_finished).
  void count_branch(int branch, const Batch& batch, std::uint64_t upload_bytes) noexcept;
  Branch branch(int branch) const noexcept;

  // Epoch ends, per train node (one per branch).
  /// Counts a finished batch of `epoch` for branch `branch`'s train node.
  void count_epoch_batch(int branch, std::uint32_t epoch) { ++epoch_done_[ix(branch)][epoch]; }
  /// The first epoch of `branch` whose end has not run, when all `share` of its batches have
  /// finished (it counts as ended from then on); else nullopt.
  template <class Share>
  std::optional<std::uint32_t> take_ended_epoch(int branch, Share share) {
    const std::vector<std::uint64_t>& done = epoch_done_[ix(branch)];
    std::size_t& next = next_epoch_end_[ix(branch)];
    if (next >= done.size() || done[next] != share(static_cast<std::uint32_t>(next))) {
      return std::nullopt;
    }
    return static_cast<std::uint32_t>(next++);
  }

  // Warnings for the report (the first 20).
  void warn(std::string warning);
  std::vector<std::string> warnings() const;

 private:
  static std::size_t ix(int branch) noexcept { return static_cast<std::size_t>(branch); }

  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  std::atomic<std::uint64_t> produced_{0};
  std::atomic<std::uint64_t> consumed_{0};
  std::atomic<std::uint64_t> skipped_{0};
  std::atomic<std::uint64_t> past_end_{0};
  std::atomic<std::uint64_t> skipped_samples_{0};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<std::uint64_t> samples_{0};
  int branches_ = 1;
  std::unique_ptr<std::atomic<std::uint64_t>[]> branch_batches_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> branch_samples_;
  std::unique_ptr<std::atomic<std::uint64_t>[]> branch_bytes_;
  // Per train node: its finished batches of each epoch, and the first epoch whose end_epoch()
  // has not run.
  std::vector<std::vector<std::uint64_t>> epoch_done_;
  std::vector<std::size_t> next_epoch_end_;
  mutable std::mutex warn_mutex_;
  std::vector<std::string> warnings_;
};

}  // namespace flowfeed::detail
