#include "detail/run_cursor.hpp"

#include <algorithm>
#include <utility>

namespace flowfeed::detail {

void RunCursor::reset(std::uint64_t first, const std::vector<std::uint64_t>& skip,
                      std::size_t in_flight) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Batches finish at most in_flight + 1 past the first unfinished one (the source holds one
  // more). A resumed run's skipped ones may lie anywhere in the run (a checkpoint gives them), so
  // they stay a list: memory follows their number, not their distance.
  done_.assign(in_flight * 2 + 2, 0);
  skip_ = skip;
  skip_pos_ = 0;
  next_ = first;
  finished_ = 0;
  advance();
}

void RunCursor::advance() {
  for (;;) {
    while (skip_pos_ < skip_.size() && skip_[skip_pos_] < next_) ++skip_pos_;
    if (skip_pos_ < skip_.size() && skip_[skip_pos_] == next_) {
      ++next_;
    } else if (done_[next_ % done_.size()]) {
      done_[next_ % done_.size()] = 0;
      ++next_;
    } else {
      return;
    }
  }
}

void RunCursor::finish(std::uint64_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++finished_;
  if (index < next_) return;  // never: each batch finishes once
  if (index >= next_ + done_.size()) {
    // The in-flight bound limits how many batches are unfinished, not how far the finished ones
    // run ahead of the oldest unfinished one (an unordered run, or one branch of several, may
    // overtake a slow batch many times over): grow, rarely, by doubling.
    std::vector<std::uint8_t> wider(
        std::max<std::size_t>(2 * done_.size(), static_cast<std::size_t>(index - next_) + 1));
    for (std::uint64_t i = next_; i < next_ + done_.size(); ++i) {
      wider[i % wider.size()] = done_[i % done_.size()];
    }
    done_ = std::move(wider);
  }
  done_[index % done_.size()] = 1;
  advance();
}

std::uint64_t RunCursor::next(std::vector<std::uint64_t>* ahead) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ahead) {
    ahead->clear();
    std::size_t s = skip_pos_;
    for (std::uint64_t i = next_ + 1; i < next_ + done_.size(); ++i) {
      for (; s < skip_.size() && skip_[s] < i; ++s) {
        if (skip_[s] > next_) ahead->push_back(skip_[s]);
      }
      if (done_[i % done_.size()]) ahead->push_back(i);
    }
    for (; s < skip_.size(); ++s) {
      if (skip_[s] > next_) ahead->push_back(skip_[s]);
    }
  }
  return next_;
}

std::uint64_t RunCursor::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

}  // namespace flowfeed::detail
