#pragma once
/// \file
/// Pipeline configuration: the YAML schema, parsed once into plain validated structs.

#include <cstdint>
#include <string>
#include <vector>

#include "flowfeed/error.hpp"
#include "flowfeed/node.hpp"

namespace flowfeed {

class Registry;

/// `pipeline.device`.
enum class DeviceChoice { automatic, cuda, host };
/// `pipeline.on_error`.
enum class OnError { fail, skip };

/// The `pipeline:` section.
struct PipelineOptions {
  int epochs = 1;
  std::size_t batch_size = 0;  ///< 0: take the loader's preferred size, else 64
  int prefetch_depth = 8;      ///< most batches in flight between source and end of train
  bool ordered = true;         ///< train sees batches in sequence order
  DeviceChoice device = DeviceChoice::automatic;
  int device_id = 0;
  int threads = 0;             ///< TBB arena size; 0 = the core count
  double stall_timeout_s = 0;  ///< end a run that makes no progress for this long; 0 = never
  OnError on_error = OnError::fail;
  int max_skipped = 0;  ///< under `skip`, the run fails once more batches were skipped
};

/// The `sampler:` section: which samples form each batch.
struct SamplerOptions {
  bool shuffle = false;
  std::uint64_t seed = 0;
  bool drop_last = false;
  int rank = 0;   ///< this shard, 0..world-1
  int world = 1;  ///< number of shards
};

/// A whole validated config.
struct PipelineConfig {
  std::string file;  ///< file name or "<string>"
  PipelineOptions pipeline;
  SamplerOptions sampler;
  std::vector<NodeSpec> nodes;      ///< in chain order
  Backend backend = Backend::host;  ///< resolved from pipeline.device
  SourceLoc pipeline_loc;           ///< where `pipeline:` was written
  /// The launcher whose environment set sampler.rank/world ("" when none or set in the file).
  std::string launch_source;
};

/// Loads and validates a YAML file. `overrides` are `key.path=value` strings (`--set`), applied
/// before validation; nodes are addressed by name (`nodes.load.concurrency=8`). Throws ConfigError
/// listing every problem found.
PipelineConfig load_config_file(const std::string& path, const Registry& registry,
                                const std::vector<std::string>& overrides = {});
/// The same for YAML text; `name` is used in messages.
PipelineConfig load_config_string(const std::string& yaml, const Registry& registry,
                                  const std::vector<std::string>& overrides = {},
                                  const std::string& name = "<string>");

/// Validates a config built in C++ (no YAML): fills parameter defaults, checks every parameter and
/// the chain, resolves the device. Throws ConfigError.
void validate_config(PipelineConfig& config, const Registry& registry);

/// Lists every key of the config schema with its type, default and doc, and each registered node
/// type with its params (the runner's `--list-types`).
std::string describe_schema(const Registry& registry);

}  // namespace flowfeed
