// What one run or pull session counted.

#include "detail/run_counters.hpp"

namespace flowfeed::detail {

void RunCounters::begin(int branches, int epochs, std::size_t first_epoch) {
  in_flight_ = 0;
  max_in_flight_ = 0;
  produced_ = consumed_ = skipped_ = past_end_ = skipped_samples_ = bytes_ = samples_ = 0;
  const auto n = static_cast<std::size_t>(branches);
  if (branches_ != branches || !branch_batches_) {
    branches_ = branches;
    branch_batches_ = std::make_unique<std::atomic<std::uint64_t>[]>(n);
    branch_samples_ = std::make_unique<std::atomic<std::uint64_t>[]>(n);
    branch_bytes_ = std::make_unique<std::atomic<std::uint64_t>[]>(n);
  }
  for (std::size_t b = 0; b < n; ++b) {
    branch_batches_[b] = 0;
    branch_samples_[b] = 0;
    branch_bytes_[b] = 0;
  }
  epoch_done_.assign(n, std::vector<std::uint64_t>(static_cast<std::size_t>(epochs)));
  // A resumed run's first epoch is the checkpoint's; the ones before it never end in this run.
  next_epoch_end_.assign(n, first_epoch);
  std::lock_guard<std::mutex> lock(warn_mutex_);
  warnings_.clear();
}

void RunCounters::note_in_flight() noexcept {
  const int n = in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
  int m = max_in_flight_.load(std::memory_order_relaxed);
  while (n > m && !max_in_flight_.compare_exchange_weak(m, n)) {
  }
}

std::uint64_t RunCounters::count_finished(const Batch& b, std::uint64_t upload_bytes) noexcept {
  if (!b.skipped) {
    // Only batches that reached a device buffer were uploaded (a resident run's batches carry only
    // indices).
    if (b.device) bytes_.fetch_add(upload_bytes, std::memory_order_relaxed);
    samples_.fetch_add(b.rows(), std::memory_order_relaxed);
  }
  if (b.past_end) past_end_.fetch_add(1, std::memory_order_relaxed);
  in_flight_.fetch_sub(1, std::memory_order_relaxed);
  return consumed_.fetch_add(1, std::memory_order_relaxed) + 1;
}

void RunCounters::count_branch(int branch, const Batch& b, std::uint64_t upload_bytes) noexcept {
  const std::size_t i = ix(branch);
  branch_batches_[i].fetch_add(1, std::memory_order_relaxed);
  branch_samples_[i].fetch_add(b.rows(), std::memory_order_relaxed);
  if (b.device) branch_bytes_[i].fetch_add(upload_bytes, std::memory_order_relaxed);
}

RunCounters::Branch RunCounters::branch(int branch) const noexcept {
  const std::size_t i = ix(branch);
  return {branch_batches_[i].load(), branch_samples_[i].load(), branch_bytes_[i].load()};
}

void RunCounters::warn(std::string warning) {
  std::lock_guard<std::mutex> lock(warn_mutex_);
  if (warnings_.size() < 20) warnings_.push_back(std::move(warning));
}

std::vector<std::string> RunCounters::warnings() const {
  std::lock_guard<std::mutex> lock(warn_mutex_);
  return warnings_;
}

}  // namespace flowfeed::detail
