#pragma once
/// \file
/// Pipeline configuration: the YAML schema, parsed once into plain validated structs.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flowfeed/error.hpp"
#include "flowfeed/node.hpp"

namespace flowfeed {

class Registry;  ///< registry.hpp

/// `pipeline.device`.
enum class DeviceChoice { automatic, cuda, host };
/// `pipeline.on_error`.
enum class OnError { fail, skip };
/// `sampler.order`: how an epoch's permutation is made (see Sampler).
enum class SampleOrder { samples, shards };
/// `pipeline.mode`: who takes the batches at the end of the chain.
enum class RunMode {
  run,   ///< a train node, inside the graph (Pipeline::run)
  pull,  ///< the caller's own loop; the chain has no train node (Pipeline::start)
};

/// One kind's part of `pipeline.memory_budget`: a byte count, or a share of what the machine
/// offers (memory_budget.hpp). Neither set: no limit beyond what is available.
struct BudgetLimit {
  std::uint64_t bytes = 0;  ///< used when share is 0; 0 with share 0: not set
  double share = 0;         ///< 0 < share <= 1: this share of what is available
  /// True when a limit was written.
  bool set() const noexcept { return bytes > 0 || share > 0; }
};

/// `pipeline.memory_budget`: what the pipeline's pools and data sets may take, by kind.
struct MemoryBudgetOptions {
  BudgetLimit host;    ///< pageable and pinned host memory together
  BudgetLimit device;  ///< memory on the pipeline's CUDA device
};

/// Default share of available host memory that `prefetch_depth: auto` sizes its pools for when
/// `pipeline.memory_budget` sets no host limit.
inline constexpr double kAutoHostShare = 0.5;
/// The same for free device memory.
inline constexpr double kAutoDeviceShare = 0.8;

/// The `pipeline:` section.
struct PipelineOptions {
  int epochs = 1;              ///< passes over the data set
  std::size_t batch_size = 0;  ///< 0: take the loader's preferred size, else 64
  int prefetch_depth = 8;      ///< most batches in flight between source and end of train
  /// `prefetch_depth: auto`: the pools are sized for the largest depth memory_budget allows
  /// (Pipeline::plan().prefetch_depth; this config keeps what was written) and the tuner moves the
  /// effective depth below it.
  bool auto_prefetch_depth = false;
  bool ordered = true;                            ///< train sees batches in sequence order
  DeviceChoice device = DeviceChoice::automatic;  ///< which backend the types resolve to
  int device_id = 0;                              ///< CUDA device ordinal
  /// `pipeline.devices`: one upload → train branch per entry (CUDA ordinals; on the host backend
  /// only branch labels). Empty: one branch on `device_id`. Validation resolves `all` into the
  /// visible devices and sets `device_id` to the first entry (the shared stages' device).
  std::vector<int> devices;
  bool all_devices = false;  ///< `devices: all`, before validation resolves it
  int threads = 0;           ///< TBB arena size; 0 = the core count
  /// Most node bodies the tuner lets run at once, over every synchronous node; 0: the arena's
  /// threads.
  int thread_budget = 0;
  MemoryBudgetOptions memory_budget;  ///< `pipeline.memory_budget`
  double stall_timeout_s = 0;         ///< end a run that makes no progress for this long; 0 = never
  OnError on_error = OnError::fail;
  int max_skipped = 0;          ///< under `skip`, the run fails once more batches were skipped
  RunMode mode = RunMode::run;  ///< run(): ends in a train node; pull: start() and a C++ loop
  /// A checkpoint directory (or its pipeline.json) to continue from; `{rank}` is replaced by the
  /// rank. Empty: start at the beginning. See checkpoint.hpp.
  std::string resume_from;
};

/// The `sampler:` section: which samples form each batch.
struct SamplerOptions {
  bool shuffle = false;    ///< a new permutation every epoch, from (seed, epoch) alone
  std::uint64_t seed = 0;  ///< shuffle seed
  bool drop_last = false;  ///< drop the last partial batch of each epoch
  int rank = 0;            ///< this shard, 0..world-1
  int world = 1;           ///< number of shards
  /// `samples`: one permutation of all samples; `shards`: the loader's data shards (its files)
  /// permuted, each read whole, samples shuffled within windows of `shuffle_window` shards.
  SampleOrder order = SampleOrder::samples;
  /// Under order: shards, the data shards whose samples are shuffled together (consecutive in the
  /// epoch's shard permutation); 0: no sample shuffle, each shard is read front to back.
  int shuffle_window = 4;
};

/// A whole validated config.
struct PipelineConfig {
  std::string file;                 ///< file name or "<string>"
  PipelineOptions pipeline;         ///< the `pipeline:` section
  SamplerOptions sampler;           ///< the `sampler:` section
  std::vector<NodeSpec> nodes;      ///< in chain order
  Backend backend = Backend::host;  ///< resolved from pipeline.device
  /// Why that backend: "device: auto found 1 CUDA device", "device: host", ... (the report's).
  std::string device_reason;
  SourceLoc pipeline_loc;  ///< where `pipeline:` was written
  /// The launcher whose environment set sampler.rank/world ("" when none or set in the file).
  std::string launch_source;
  /// Where C++ code set `pipeline.*` and `sampler.*` keys (PipelineBuilder records its calls);
  /// validate_config names these places in its messages. Empty for YAML.
  std::map<std::string, SourceLoc> option_locs;
};

/// What load_config_file() and load_config_string() fill in where a config is silent.
struct LoadDefaults {
  /// A config that does not set `pipeline.mode` (neither in the file nor by an override) and whose
  /// chain has no train node gets `mode: pull` (the Python module's Pipeline(...), whose loop is
  /// the train step). Off (the runner): such a config has mode: run, and its chain must end in a
  /// train node. An explicit `mode: run` is never changed.
  bool implicit_pull = false;
};

/// Loads and validates a YAML file. `overrides` are `key.path=value` strings (`--set`), applied
/// before validation; nodes are addressed by name (`nodes.load.concurrency=8`). Throws ConfigError
/// listing every problem found.
PipelineConfig load_config_file(const std::string& path, const Registry& registry,
                                const std::vector<std::string>& overrides = {},
                                const LoadDefaults& defaults = {});
/// The same for YAML text; `name` is used in messages.
PipelineConfig load_config_string(const std::string& yaml, const Registry& registry,
                                  const std::vector<std::string>& overrides = {},
                                  const std::string& name = "<string>",
                                  const LoadDefaults& defaults = {});

/// Validates a config built in C++ (no YAML): fills parameter defaults, checks every parameter and
/// the chain, resolves the device. Throws ConfigError.
void validate_config(PipelineConfig& config, const Registry& registry);

/// Lists every key of the config schema with its type, default and doc, and each registered node
/// type with its params (the runner's `--list-types`).
std::string describe_schema(const Registry& registry);

}  // namespace flowfeed
