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
  gaps_.clear();
  skip_pos_ = 0;
  next_ = first;
  finished_ = 0;
  advance();
}

std::uint64_t RunCursor::dense(std::uint64_t index) const {
  std::uint64_t below = 0;  // the gaps' batches below index
  for (const auto& [from, to] : gaps_) {
    if (to <= index) below += to - from;
  }
  return index - below;
}

std::uint64_t RunCursor::sparse(std::uint64_t d) const {
  for (const auto& [from, to] : gaps_) {
    if (d >= from) d += to - from;
  }
  return d;
}

void RunCursor::skip_range(std::uint64_t from, std::uint64_t to) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (from >= to) return;
  gaps_.emplace_back(from, to);
  advance();
}

void RunCursor::advance() {
  for (;;) {
    while (skip_pos_ < skip_.size() && skip_[skip_pos_] < next_) ++skip_pos_;
    bool gap = false;
    for (const auto& [from, to] : gaps_) {
      if (from == next_) {
        next_ = to;
        gap = true;
      }
    }
    if (gap) continue;
    const std::size_t slot = dense(next_) % done_.size();
    if (skip_pos_ < skip_.size() && skip_[skip_pos_] == next_) {
      ++next_;
    } else if (done_[slot]) {
      done_[slot] = 0;
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
  const std::uint64_t first = dense(next_);
  const std::uint64_t at = dense(index);
  if (at >= first + done_.size()) {
    // The in-flight bound limits how many batches are unfinished, not how far the finished ones
    // run ahead of the oldest unfinished one (an unordered run, or one branch of several, may
    // overtake a slow batch many times over): grow, rarely, by doubling.
    std::vector<std::uint8_t> wider(
        std::max<std::size_t>(2 * done_.size(), static_cast<std::size_t>(at - first) + 1));
    for (std::uint64_t d = first; d < first + done_.size(); ++d) {
      wider[d % wider.size()] = done_[d % done_.size()];
    }
    done_ = std::move(wider);
  }
  done_[at % done_.size()] = 1;
  advance();
}

std::uint64_t RunCursor::next(std::vector<std::uint64_t>* ahead) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ahead) {
    ahead->clear();
    std::size_t s = skip_pos_;
    const std::uint64_t first = dense(next_);
    for (std::uint64_t d = first + 1; d < first + done_.size(); ++d) {
      const std::uint64_t i = sparse(d);
      for (; s < skip_.size() && skip_[s] < i; ++s) {
        if (skip_[s] > next_) ahead->push_back(skip_[s]);
      }
      if (done_[d % done_.size()]) ahead->push_back(i);
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
