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
  bool asynchronous = false;   ///< work completes after submit() (busy counts submit() only)
  /// Sampled (RunOptions::stats) slot-seconds: a slot of the node was free, no batch waited for it,
  /// and some in-flight batch had not reached the node yet (or the source was not emitting).
  double wait_input_seconds = 0;
  /// Sampled slot-seconds: a slot was free, no batch waited for it, and every prefetch slot was
  /// held by batches at or past this node (it could only get work once a later stage freed one).
  double wait_output_seconds = 0;
  /// Sampled slot-seconds: a batch waited at the node with a slot free, for a worker thread.
  double wait_cpu_seconds = 0;
  /// Asynchronous nodes: sampled seconds with at least one batch submitted and not completed.
  double pending_seconds = 0;
  /// Most batches that had reached the node and not yet started in it (train: those waiting in the
  /// sequencer count too).
  std::uint64_t queue_high_water = 0;
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

/// Figures of one `pipeline.devices` branch (its upload node to its train node).
struct BranchReport {
  int branch = 0;                    ///< 0..N-1, in the order `pipeline.devices` lists them
  int device = 0;                    ///< its `pipeline.devices` entry
  std::uint64_t batches = 0;         ///< batches its train node took (seq % N == branch)
  std::uint64_t samples = 0;         ///< their samples
  std::uint64_t bytes_uploaded = 0;  ///< their bytes, copied to this branch's device
  double train_busy_seconds = 0;     ///< its train node's busy time
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

/// One decision of the tuner (`concurrency: auto`, `prefetch_depth: auto`; docs/AUTOTUNE.md).
struct TuningDecision {
  double seconds = 0;       ///< since the run started
  std::uint64_t batch = 0;  ///< batches finished by then
  std::string knob;  ///< "nodes.load.concurrency" or "pipeline.prefetch_depth"; "" for a note
  int from = 0;      ///< the value before
  int to = 0;        ///< the value after
  std::string why;   ///< the model's figures that made the change (or the note)
};

/// What the tuner did in a run, and the proof that memory stayed within the budget.
struct TuningReport {
  bool active = false;                    ///< the tuner ran in this run
  std::vector<TuningDecision> decisions;  ///< in order: changes, and notes when the state changed
  std::map<std::string, int> settled;     ///< every auto knob → its value at the end
  std::string yaml;                       ///< those values as YAML lines to paste
  std::string state;                      ///< the last note: fed, or the limit that stopped it
  double settled_seconds = 0;             ///< when the last change was made
  std::uint64_t settled_batches = 0;      ///< batches finished by then
  int thread_budget = 0;                  ///< most bodies at once over the synchronous nodes
  int max_prefetch_depth = 0;             ///< the depth the pools were sized for
  bool depth_capped_by_memory = false;    ///< a smaller depth than wanted, to fit the budget
  std::uint64_t host_budget_bytes = 0;    ///< the host limit the pools were checked against
  std::uint64_t host_pool_bytes = 0;      ///< host memory the pools and data sets hold
  std::uint64_t device_budget_bytes = 0;  ///< the device limit (0: not known)
  std::uint64_t device_pool_bytes = 0;    ///< device memory the pools hold
  bool within_budget = true;  ///< pool bytes ≤ budget, no allocation after build, in flight ≤ max
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
  bool interrupted = false;  ///< stopped early (request_stop/abort, or a session ended early)
  int threads = 0;           ///< worker threads of the run's arena
  bool sampled = false;      ///< the sampled figures (waits, full_fraction) were measured
  /// Sampled share of the run during which prefetch_depth batches were in flight (limiter shut).
  double full_fraction = 0;
  /// The node the verdict blames (empty when it blames none).
  std::string bottleneck;
  /// One line: what limits the run and what to change, e.g. "train-bound: train busy 98%".
  std::string verdict;
  std::vector<NodeReport> nodes;             ///< per node, in chain order
  std::vector<PoolReport> pools;             ///< per pool
  std::vector<std::uint64_t> stream_copies;  ///< copies per upload stream (all branches, in order)
  /// Per `pipeline.devices` branch, when there are several (empty otherwise).
  std::vector<BranchReport> branches;
  TrainReport train;    ///< the train step's figures (in pull mode: the caller's waiting)
  TuningReport tuning;  ///< `auto` knobs: the tuner's decisions and the budget's proof
  /// Batches skipped under `on_error: skip`, with their messages (the first 20), then what nodes
  /// noted in finish() (e.g. a loader that fell back from io_uring to pread).
  std::vector<std::string> warnings;
  /// Extra figures nodes add (name → value).
  std::map<std::string, double> extra;

  /// The report as JSON (the schema is documented in docs/REPORT.md).
  std::string to_json() const;
  /// A human-readable summary table.
  std::string to_table() const;
};

/// What limits a run, read from its figures (the rules are in docs/REPORT.md).
struct Verdict {
  std::string bottleneck;  ///< node name, or empty
  std::string text;        ///< e.g. "load-bound: raise nodes.load.concurrency (busy 100% at 4)"
};
/// Diagnoses a finished run from its report (nodes in chain order, the train node last). `pull`:
/// a pull session's report, whose train step is the caller's loop (`train.stall_fraction` is its
/// wait inside next()) and whose nodes may all be the bottleneck.
Verdict diagnose(const RunReport& report, bool pull = false);

}  // namespace flowfeed
