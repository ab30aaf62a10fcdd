#pragma once
/// \file
/// What a run reports: totals, per-node and per-pool figures.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace flowfeed {

/// Figures of one node.
struct NodeReport {
  std::string name;
  std::string type;
  std::string role;
  int concurrency = 1;
  std::uint64_t items = 0;
  double busy_seconds = 0;  ///< time inside the node's body, summed over threads
  double utilization = 0;   ///< busy / (wall × concurrency)
  std::uint64_t failures = 0;
};

/// Figures of one buffer pool.
struct PoolReport {
  std::string name;
  std::string kind;
  std::size_t buffers = 0;
  std::size_t bytes = 0;  ///< total bytes (buffers × buffer size)
  std::size_t high_water = 0;
  std::uint64_t acquisitions = 0;
};

/// Figures of the train node; fields a train node does not set stay negative.
struct TrainReport {
  double stall_fraction = -1;  ///< share of the train node's wall time spent waiting for a batch
  double loss = -1;            ///< mean training loss of the last epoch
  double accuracy = -1;        ///< test accuracy at the end (or training accuracy without eval)
  double test_loss = -1;
  double steps_per_second = -1;
  std::vector<std::map<std::string, double>> epochs;  ///< per-epoch figures
};

/// Everything a run measured.
struct RunReport {
  std::string config;
  std::string device;         ///< "host" or "cuda:N (name)"
  std::string device_reason;  ///< why that device was picked
  int epochs = 0;
  int rank = 0;             ///< this process's shard
  int world = 1;            ///< number of shards
  std::string rank_source;  ///< the launcher whose environment gave rank/world, or ""

  std::uint64_t batches = 0;          ///< batches the train node took (skipped ones not counted)
  std::uint64_t samples = 0;          ///< samples in those batches
  std::uint64_t skipped_batches = 0;  ///< batches skipped under `on_error: skip`
  std::uint64_t skipped_samples = 0;  ///< samples in the skipped batches
  std::uint64_t bytes_uploaded = 0;
  double seconds = 0;
  double batches_per_second = 0;
  double samples_per_second = 0;
  double upload_gbps = 0;
  int prefetch_depth = 0;
  int max_in_flight = 0;  ///< measured
  std::uint64_t allocations_after_build = 0;
  std::size_t device_pool_bytes = 0;
  bool interrupted = false;
  std::vector<NodeReport> nodes;
  std::vector<PoolReport> pools;
  std::vector<std::uint64_t> stream_copies;  ///< copies per upload stream
  TrainReport train;
  /// Batches skipped under `on_error: skip`, with their messages (the first 20).
  std::vector<std::string> warnings;
  /// Extra figures nodes add (name → value).
  std::map<std::string, double> extra;

  /// The report as JSON (the schema is documented in the README).
  std::string to_json() const;
  /// A human-readable summary table.
  std::string to_table() const;
};

}  // namespace flowfeed
