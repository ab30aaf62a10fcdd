#pragma once
/// \file
/// The figures the staging nodes (host_staging, pinned_staging) report, counted from their bodies.

#include <atomic>
#include <cstdint>
#include <string>

#include "flowfeed/stats.hpp"

namespace flowfeed {

/// Bytes a staging node copied into its own buffers and batches it passed through in the buffer
/// the loader filled; finish() reports them as `<name>.copied_bytes` and
/// `<name>.passed_through_batches` and starts the next run from zero.
class StagingCounts {
 public:
  void copied(std::uint64_t bytes) noexcept { copied_.fetch_add(bytes, std::memory_order_relaxed); }
  void passed() noexcept { passed_.fetch_add(1, std::memory_order_relaxed); }
  void finish(RunReport& report, const std::string& name) {
    report.extra[name + ".copied_bytes"] = static_cast<double>(copied_.exchange(0));
    report.extra[name + ".passed_through_batches"] = static_cast<double>(passed_.exchange(0));
  }

 private:
  std::atomic<std::uint64_t> copied_{0};
  std::atomic<std::uint64_t> passed_{0};
};

}  // namespace flowfeed
