#include "flowfeed/pool.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <new>
#include <stdexcept>

#include "flowfeed/error.hpp"
#include "flowfeed/memory_budget.hpp"

namespace flowfeed {

namespace {
std::atomic<std::uint64_t> g_allocations{0};
constexpr std::align_val_t kHostAlignment{4096};
/// Counts one loan: acquisitions always; buffers in use and their high-water mark when the loan
/// takes a free buffer (`first`), not when it shares one already lent.
void count_loan(std::atomic<std::uint64_t>& acquisitions, std::atomic<std::size_t>& in_use,
                std::atomic<std::size_t>& high_water, bool first) noexcept {
  acquisitions.fetch_add(1, std::memory_order_relaxed);
  if (!first) return;
  const std::size_t used = in_use.fetch_add(1, std::memory_order_relaxed) + 1;
  std::size_t hw = high_water.load(std::memory_order_relaxed);
  while (used > hw && !high_water.compare_exchange_weak(hw, used, std::memory_order_relaxed)) {
  }
}

}  // namespace

std::uint64_t allocation_count() noexcept {
  return g_allocations.load(std::memory_order_relaxed);
}
void note_allocation() noexcept {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
}

const char* memory_kind_name(MemoryKind kind) noexcept {
  switch (kind) {
    case MemoryKind::pageable: return "pageable";
    case MemoryKind::pinned: return "pinned";
    case MemoryKind::device: return "device";
  }
  return "?";
}

Allocator Allocator::host() {
  return {[](std::size_t bytes) -> void* { return ::operator new(bytes, kHostAlignment); },
          [](void* p) { ::operator delete(p, kHostAlignment); }};
}

Lease::Lease(Lease&& other) noexcept
    : pool_(other.pool_), index_(other.index_), data_(other.data_) {
  other.pool_ = nullptr;
  other.data_ = nullptr;
}

Lease& Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    reset();
    pool_ = other.pool_;
    index_ = other.index_;
    data_ = other.data_;
    other.pool_ = nullptr;
    other.data_ = nullptr;
  }
  return *this;
}

void Lease::reset() noexcept {
  if (pool_) {
    pool_->release(index_);
    pool_ = nullptr;
    data_ = nullptr;
  }
}

BufferPool::BufferPool(std::string name, MemoryKind kind, std::size_t count, std::size_t bytes,
                       Allocator allocator)
    : name_(std::move(name)), kind_(kind), bytes_(bytes), allocator_(std::move(allocator)) {
  allocate(count);
}

void BufferPool::allocate(std::size_t count) {
  const std::size_t bytes = bytes_;
  buffers_.reserve(count);
  free_.reserve(count);
  loans_.assign(count, 0);
  try {
    for (std::size_t i = 0; i < count; ++i) {
      buffers_.push_back(static_cast<std::byte*>(allocator_.allocate(bytes == 0 ? 1 : bytes)));
      note_allocation();
    }
  } catch (...) {
    const std::size_t done = buffers_.size();
    for (auto* b : buffers_) allocator_.deallocate(b);
    buffers_.clear();
    const std::string what = fmt::format(
        "pool '{}' ({} memory): cannot allocate buffer {} of {} ({} buffers of {} bytes = {})",
        name_, memory_kind_name(kind_), done + 1, count, count, bytes,
        checked_mul(count, bytes) ? format_bytes(*checked_mul(count, bytes)) : "over 16 EiB");
    try {
      throw;
    } catch (const std::bad_alloc&) {
      throw Error(what + ": out of memory (std::bad_alloc)");
    } catch (const CudaError& e) {
      throw CudaError(what + ": " + e.what(), e.code(), e.sticky());
    } catch (const std::exception& e) {
      throw Error(what + ": " + e.what());
    }
  }
  for (std::size_t i = count; i-- > 0;) free_.push_back(i);
}

BufferPool::~BufferPool() {
  for (auto* b : buffers_) allocator_.deallocate(b);
}

Lease BufferPool::acquire() {
  std::size_t index;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) {
      throw std::logic_error("buffer pool '" + name_ + "' is empty (" +
                             std::to_string(buffers_.size()) +
                             " buffers, all in use): the in-flight bound was broken");
    }
    index = free_.back();
    free_.pop_back();
    loans_[index] = 1;
  }
  count_loan(acquisitions_, in_use_, high_water_, true);
  return Lease(this, index, buffers_[index]);
}

Lease BufferPool::acquire_at(std::size_t index) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (index >= buffers_.size()) {
      throw std::logic_error("buffer pool '" + name_ + "' has no buffer " + std::to_string(index) +
                             " (" + std::to_string(buffers_.size()) + " buffers)");
    }
    first = loans_[index]++ == 0;
    if (first) {
      auto it = std::find(free_.begin(), free_.end(), index);
      *it = free_.back();
      free_.pop_back();
    }
  }
  count_loan(acquisitions_, in_use_, high_water_, first);
  return Lease(this, index, buffers_[index]);
}

void BufferPool::release(std::size_t index) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (--loans_[index] > 0) return;
  in_use_.fetch_sub(1, std::memory_order_relaxed);
  free_.push_back(index);
}

std::size_t BufferPool::available() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return free_.size();
}

void BufferPool::reset_counters() noexcept {
  high_water_.store(in_use_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  acquisitions_.store(0, std::memory_order_relaxed);
}

}  // namespace flowfeed
