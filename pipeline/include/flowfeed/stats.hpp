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
  std::string name;            ///< `nodes[].name`
  std::string type;            ///< the type that ran
  std::string role;            ///< "load", "transform", "staging", "upload" or "train"
  int concurrency = 1;         ///< bodies allowed at once
  std::uint64_t items = 0;     ///< batches it processed
  double busy_seconds = 0;     ///< time inside the node's body, summed over threads
  double utilization = 0;      ///< busy / (wall × concurrency)
  std::uint64_t failures = 0;  ///< batches it failed on (skipped ones included)
};

/// Figures of one buffer pool.
struct PoolReport {
  std::string name;                ///< "node.pool"
  std::string kind;                ///< "pageable", "pinned" or "device"
  std::size_t buffers = 0;         ///< buffers in the pool (allocated once)
  std::size_t bytes = 0;           ///< total bytes (buffers × buffer size)
  std::size_t high_water = 0;      ///< the most buffers on loan at once
  std::uint64_t acquisitions = 0;  ///< leases handed out during the run
};

/// Figures of the train node; fields a train node does not set stay negative.
struct TrainReport {
  double stall_fraction = -1;    ///< share of the train node's wall time spent waiting for a batch
  double loss = -1;              ///< mean training loss of the last epoch
  double accuracy = -1;          ///< test accuracy at the end (or training accuracy without eval)
  double test_loss = -1;         ///< mean loss on the test set at the end
  double steps_per_second = -1;  ///< train steps per second of the train node's busy time
  std::vector<std::map<std::string, double>> epochs;  ///< per-epoch figures
};

/// Everything a run measured.
struct RunReport {
  std::string config;         ///< the config's file name, "<string>" or the builder's name
  std::string device;         ///< "host" or "cuda:N (name)"
  std::string device_reason;  ///< why that device was picked
  int epochs = 0;             ///< epochs the config asked for
  int rank = 0;               ///< this process's shard
  int world = 1;              ///< number of shards
  std::string rank_source;    ///< the launcher whose environment gave rank/world, or ""

  std::uint64_t batches = 0;          ///< batches the train node (or the caller's release()) took
  std::uint64_t samples = 0;          ///< their samples (skipped batches not counted)
  std::uint64_t skipped_batches = 0;  ///< skipped under `on_error: skip`
  std::uint64_t skipped_samples = 0;  ///< samples in the skipped batches
  std::uint64_t bytes_uploaded = 0;   ///< bytes of the batches counted in `batches`
  double seconds = 0;                 ///< wall time of the run
  double batches_per_second = 0;      ///< batches / seconds
  double samples_per_second = 0;      ///< samples / seconds
  double upload_gbps = 0;             ///< bytes_uploaded / seconds, in GB/s
  int prefetch_depth = 0;             ///< the in-flight bound
  int max_in_flight = 0;              ///< measured
  std::uint64_t allocations_after_build = 0;  ///< buffer allocations during the run (0)
  std::size_t device_pool_bytes = 0;          ///< device memory held by pools
  bool interrupted = false;       ///< stopped early (request_stop/abort, or a session ended early)
  std::vector<NodeReport> nodes;  ///< per node, in chain order
  std::vector<PoolReport> pools;  ///< per pool
  std::vector<std::uint64_t> stream_copies;  ///< copies per upload stream
  TrainReport train;  ///< the train step's figures (in pull mode: the caller's waiting)
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
