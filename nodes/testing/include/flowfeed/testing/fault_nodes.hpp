#pragma once
/// \file
/// Test-only node types that fail on purpose, one per role, so that every failure path of a
/// pipeline can be exercised: fault_load, fault_transform, fault_staging, fault_upload,
/// fault_train. They are registered only by an explicit register_fault_nodes() call (the tests, and
/// pipeline_runner --enable-fault-nodes), never by register_builtin_nodes().
///
/// Every fault type takes these params:
///   mode      throw | data_error | corrupt | stall (fault_train: no corrupt)
///   at_batch  sequence number of the first faulty batch (0-based, counted across epochs)
///   count     consecutive faulty batches from at_batch (default 1)
///   fires     faults over the node's life, 0 = no limit: `fires: 1` fails one run and lets the
///             next run of the same pipeline pass
///   stall_s   how long a stall lasts (default 60); it ends early when the run is cancelled
///   file      the file a data error names (default fault.bin)
/// fault_upload also takes `in_submit` (throw from submit() instead of failing the completion).
/// fault_load takes every param of `synthetic` too and produces the same data, so `checksum`
/// verifies it.

#include <atomic>
#include <cstdint>
#include <string>

#include "flowfeed/batch.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

/// What a fault node does to a faulty batch.
enum class FaultMode {
  fail,        ///< throws std::runtime_error (`mode: throw`)
  data_error,  ///< throws DataError naming a file and a byte offset
  corrupt,     ///< flips the bits of the batch's first byte of x (a checksum sink catches it)
  stall,       ///< blocks for stall_s, or until the run is cancelled
};

/// Params shared by every fault type.
struct FaultOptions {
  FaultMode mode = FaultMode::fail;
  std::int64_t at_batch = 0;
  std::int64_t count = 1;
  std::int64_t fires = 0;
  double stall_s = 60;
  std::string file = "fault.bin";
  bool in_submit = false;  ///< fault_upload only
};

/// Decides which batches are faulty and carries out the fault; shared by the fault node types.
/// Thread-safe (a node may run several bodies at once).
class FaultInjector {
 public:
  FaultInjector(FaultOptions options, std::string type);
  /// Keeps the pipeline's cancellation flag (so that a stall ends when the run is cancelled).
  void bind(const BuildContext& context) noexcept { cancelled_ = &context.cancelled(); }
  /// True when `batch` is faulty; counts one firing.
  bool hits(const Batch& batch) noexcept;
  /// The exception a `throw` or `data_error` fault raises for `batch`.
  std::exception_ptr error(const Batch& batch) const;
  /// Blocks for stall_s, checking for cancellation every few milliseconds.
  void stall() const noexcept;
  /// Flips the bits of the first byte of tensor 0 in `tier`.
  static void corrupt(Batch& batch, Tier tier) noexcept;
  /// Carries out the fault on a synchronous node whose output lives in `tier`, if `batch` is
  /// faulty: throws, stalls or corrupts.
  void apply(Batch& batch, Tier tier);
  const FaultOptions& options() const noexcept { return options_; }

 private:
  FaultOptions options_;
  std::string type_;
  std::atomic<std::int64_t> fired_{0};
  const std::atomic<bool>* cancelled_ = nullptr;
};

/// Parses the fault params of a validated spec.
FaultOptions fault_options_from(const Params& params);

/// Registers fault_load, fault_transform, fault_staging, fault_upload and fault_train.
void register_fault_nodes(Registry& registry);

}  // namespace flowfeed
