#pragma once
/// \file
/// What a pipeline's pools and data sets will take, checked against what the machine offers before
/// any of it is allocated, and the overflow-checked size arithmetic behind the figures.
///
/// The host figure is the smaller of `MemAvailable` (/proc/meminfo) and the room left under the
/// process's cgroup v2 limit (`memory.max` − `memory.current`); pageable and pinned pools and data
/// sets all draw on it. The environment variable FLOWFEED_AVAILABLE_MEMORY replaces it (a byte
/// count, with an optional K, M, G or T suffix in powers of 1024), for tests and for a job that
/// should use less than the whole machine. Device memory is what the registry's probe reports free
/// on the device (`cudaMemGetInfo`); FLOWFEED_AVAILABLE_DEVICE_MEMORY replaces it likewise.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed {

/// a × b, or nullopt when the product does not fit in 64 bits.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) noexcept;
/// a + b, or nullopt when the sum does not fit in 64 bits.
std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) noexcept;
/// "512 B", "3.0 KiB", "1.5 GiB": a byte count as a person reads it.
std::string format_bytes(std::uint64_t bytes);
/// Reads "1073741824", "512M", "16G" (powers of 1024); nullopt for anything else or on overflow.
std::optional<std::uint64_t> parse_bytes(const std::string& text);

/// Memory the machine offers to this process, by kind; nullopt: not known (not checked).
struct MemoryAvailable {
  std::optional<std::uint64_t> host;    ///< pageable and pinned memory together
  std::string host_source;              ///< where the host figure came from, for messages
  std::optional<std::uint64_t> device;  ///< free memory on the pipeline's CUDA device
  std::string device_source;            ///< where the device figure came from
};

/// Reads the host figure (environment override, else /proc and the cgroup), and the device figure
/// from FLOWFEED_AVAILABLE_DEVICE_MEMORY, else from `device_free` when given. Throws ConfigError
/// when an override is not a byte count.
MemoryAvailable available_memory(std::optional<std::uint64_t> device_free = std::nullopt);

/// Applies `pipeline.memory_budget` to what is available: a limit that is set replaces the figure
/// by that share of it, or by its bytes (never more than is available, when that is known);
/// without one, with `auto_default` (`prefetch_depth: auto`), kAutoHostShare of the host figure
/// and kAutoDeviceShare of the device figure. The sources then name the key.
void apply_memory_budget(MemoryAvailable& available, const MemoryBudgetOptions& budget,
                         bool auto_default);

/// One claim on memory: what takes it and which config keys decide its size.
struct MemoryClaim {
  MemoryKind kind = MemoryKind::pageable;
  std::uint64_t bytes = 0;
  std::string what;   ///< e.g. "pool 'load.host' (8 buffers of 1.5 MiB)"
  std::string where;  ///< the config position of the node that asks ("x.yaml:7:5")
  std::string keys;   ///< the keys that drive the size, e.g. "pipeline.prefetch_depth"
};

/// The running total of what a pipeline being built has claimed, by kind. claim() throws
/// ConfigError (exit 2 in the runner) when a claim would take the total past what is available;
/// the message names the claim's keys, the bytes needed and the bytes available, and how to lower
/// them. Not thread-safe (a pipeline is built on one thread).
class MemoryBudget {
 public:
  /// A budget against `available`.
  explicit MemoryBudget(MemoryAvailable available) : available_(std::move(available)) {}
  /// Adds `claim` to the total, or throws ConfigError when it does not fit.
  void claim(const MemoryClaim& claim);
  /// Bytes claimed so far of `kind` (pageable and pinned are counted apart, but checked together
  /// against the host figure).
  std::uint64_t claimed(MemoryKind kind) const noexcept;
  /// What the budget checks against.
  const MemoryAvailable& available() const noexcept { return available_; }

 private:
  MemoryAvailable available_;
  std::uint64_t pageable_ = 0;
  std::uint64_t pinned_ = 0;
  std::uint64_t device_ = 0;
  std::vector<MemoryClaim> claims_;
};

}  // namespace flowfeed
