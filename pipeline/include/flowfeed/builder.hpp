#pragma once
/// \file
/// Building a pipeline from C++ alone: typed options, node types by registry name, or your own
/// Node objects (no registry entry needed). No YAML is involved.
///
///     flowfeed::Pipeline pipeline = flowfeed::PipelineBuilder()
///         .epochs(2).batch_size(64).prefetch_depth(8)
///         .load("synthetic", {{"samples", 1000}, {"sample_shape", {28, 28}}}).concurrency(2)
///         .stage("host_staging")
///         .upload("host_upload")
///         .train("checksum")
///         .build(registry);

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

/// One parameter value written in C++. Converts implicitly from bool, any integer, floating point,
/// a string, or a list of ints (`{28, 28}`), so a parameter list reads like the YAML it replaces.
/// Values are checked against the node type's schema when the pipeline is built, with the same
/// messages as YAML.
class ParamArg {
 public:
  /// A bool parameter.
  ParamArg(bool value) : value_(value) {}
  /// An int parameter.
  ParamArg(int value) : value_(static_cast<std::int64_t>(value)) {}
  /// An int parameter.
  ParamArg(long value) : value_(static_cast<std::int64_t>(value)) {}
  /// An int parameter.
  ParamArg(long long value) : value_(static_cast<std::int64_t>(value)) {}
  /// An int parameter.
  ParamArg(unsigned value) : value_(static_cast<std::int64_t>(value)) {}
  /// An int parameter; throws std::out_of_range above INT64_MAX.
  ParamArg(unsigned long value);
  /// An int parameter; throws std::out_of_range above INT64_MAX.
  ParamArg(unsigned long long value);
  /// A number parameter.
  ParamArg(double value) : value_(value) {}
  /// A number parameter.
  ParamArg(float value) : value_(static_cast<double>(value)) {}
  /// A string parameter.
  ParamArg(const char* value) : value_(std::string(value)) {}
  /// A string parameter.
  ParamArg(std::string value) : value_(std::move(value)) {}
  /// A list-of-int parameter.
  ParamArg(std::vector<std::int64_t> value) : value_(std::move(value)) {}
  /// A list-of-int parameter written in place: `{28, 28}`.
  ParamArg(std::initializer_list<std::int64_t> value) : value_(std::vector<std::int64_t>(value)) {}
  /// A list-of-number parameter: `std::vector<double>{0.5, 0.25}`.
  ParamArg(std::vector<double> value) : value_(std::move(value)) {}

  /// The value as the schema checks it.
  const ParamValue& value() const noexcept { return value_; }

 private:
  ParamValue value_;
};

/// A node's parameters in C++: `{{"samples", 1000}, {"dtype", "uint8"}}`.
using ParamList = std::vector<std::pair<std::string, ParamArg>>;

/// Builds a PipelineConfig, and from it a Pipeline, in C++. Every setter returns the builder so
/// calls chain. Nothing is checked until config() or build(): then every problem is reported at
/// once as a ConfigError, in the same words as for YAML; a node's problems name the file and line
/// of the builder call that added it (`main.cpp:31: nodes[0].params.samples: ...`).
///
/// A node is either a registered type, chosen by name with its params, or a Node object you made
/// yourself (the pipeline takes ownership; no registry entry needed). A builder holding such
/// objects can build one pipeline; otherwise build() may be called again. Not thread-safe.
class PipelineBuilder {
 public:
  /// An empty builder; messages and the report call the config `<c++>` (see name()).
  PipelineBuilder();
  /// Destroys Node objects that no pipeline took.
  ~PipelineBuilder();
  /// Moves the builder, its Node objects included.
  PipelineBuilder(PipelineBuilder&&) noexcept;
  /// Moves the builder, its Node objects included.
  PipelineBuilder& operator=(PipelineBuilder&&) noexcept;

  /// The config's name in messages and in RunReport::config (default `<c++>`).
  PipelineBuilder& name(std::string name);
  /// `pipeline.epochs`: passes over the data set (1..1e6).
  PipelineBuilder& epochs(int epochs, std::source_location where = std::source_location::current());
  /// `pipeline.batch_size`: samples per batch; 0 takes the loader's, else 64.
  PipelineBuilder& batch_size(std::size_t samples,
                              std::source_location where = std::source_location::current());
  /// `pipeline.prefetch_depth`: most batches in flight between source and end of train (1..4096).
  PipelineBuilder& prefetch_depth(int batches,
                                  std::source_location where = std::source_location::current());
  /// `pipeline.prefetch_depth: auto`: pools for the most the memory budget allows, the effective
  /// depth set by the tuner while the pipeline runs (docs/AUTOTUNE.md).
  PipelineBuilder& auto_prefetch_depth();
  /// `pipeline.memory_budget`: bytes of host and device memory pools and data sets may take (0:
  /// not set).
  PipelineBuilder& memory_budget(std::uint64_t host_bytes, std::uint64_t device_bytes = 0);
  /// `pipeline.thread_budget`: most node bodies the tuner lets run at once (0: the threads).
  PipelineBuilder& thread_budget(int bodies,
                                 std::source_location where = std::source_location::current());
  /// `pipeline.ordered`: the train step (or the pull loop) sees batches in sequence order.
  PipelineBuilder& ordered(bool ordered = true);
  /// `pipeline.device`: automatic (CUDA when a GPU is visible), cuda or host.
  PipelineBuilder& device(DeviceChoice device);
  /// `pipeline.device_id`: CUDA device ordinal.
  PipelineBuilder& device_id(int id, std::source_location where = std::source_location::current());
  /// `pipeline.devices`: one upload → train branch per listed device (an empty list: device_id
  /// alone).
  PipelineBuilder& devices(std::vector<int> ids,
                           std::source_location where = std::source_location::current());
  /// `pipeline.devices: all`: one branch per visible CUDA device.
  PipelineBuilder& all_devices(std::source_location where = std::source_location::current());
  /// `pipeline.threads`: TBB worker threads; 0 = one per core.
  PipelineBuilder& threads(int threads,
                           std::source_location where = std::source_location::current());
  /// `pipeline.stall_timeout_s`: end a run that makes no progress for this long; 0 = never.
  PipelineBuilder& stall_timeout(double seconds,
                                 std::source_location where = std::source_location::current());
  /// `pipeline.on_error` and `pipeline.max_skipped`.
  PipelineBuilder& on_error(OnError policy, int max_skipped = 0,
                            std::source_location where = std::source_location::current());
  /// `sampler.shuffle: true` with `sampler.seed`: a new permutation every epoch.
  PipelineBuilder& shuffle(std::uint64_t seed,
                           std::source_location where = std::source_location::current());
  /// `sampler.drop_last`.
  PipelineBuilder& drop_last(bool drop = true);
  /// `sampler.rank` and `sampler.world`: this process reads shard `rank` of `world`.
  PipelineBuilder& shard(int rank, int world,
                         std::source_location where = std::source_location::current());
  /// `pipeline.mode`. When not set it follows the nodes: `pull` (step the pipeline with
  /// Pipeline::start()) when no train node was added, else `run`.
  PipelineBuilder& mode(RunMode mode, std::source_location where = std::source_location::current());
  /// `pipeline.resume_from`: continue from this checkpoint directory (checkpoint.hpp).
  PipelineBuilder& resume_from(std::string checkpoint);
  /// Replaces the whole `pipeline:` section (its mode too).
  PipelineBuilder& options(const PipelineOptions& options);
  /// Replaces the whole `sampler:` section.
  PipelineBuilder& sampler(const SamplerOptions& options);

  /// Names the node added last (default: its role, "load", "transform", "stage", "upload" or
  /// "train", numbered from the second of a role on: "transform_2"). Names must be unique.
  /// Throws std::logic_error when no node was added yet (as do concurrency() and streams()).
  PipelineBuilder& named(std::string name);
  /// Bodies of the node added last that may run at once (default 1; a train node stays at 1).
  PipelineBuilder& concurrency(int bodies);
  /// `concurrency: auto` for the node added last: the tuner sets its bodies while it runs.
  PipelineBuilder& auto_concurrency();
  /// CUDA streams the node added last owns (an upload node; default 1).
  PipelineBuilder& streams(int streams);

  /// Adds the loader: a registered load type with its params.
  PipelineBuilder& load(std::string type, ParamList params = {},
                        std::source_location where = std::source_location::current());
  /// Adds the loader: your own object.
  PipelineBuilder& load(std::unique_ptr<LoaderNode> node,
                        std::source_location where = std::source_location::current());
  /// Adds a transform (anywhere between load and train; e.g. host normalization before upload).
  PipelineBuilder& transform(std::string type, ParamList params = {},
                             std::source_location where = std::source_location::current());
  /// Adds a transform: your own object.
  PipelineBuilder& transform(std::unique_ptr<Node> node,
                             std::source_location where = std::source_location::current());
  /// Adds the staging node (e.g. `host_staging`, `pinned_staging`).
  PipelineBuilder& stage(std::string type, ParamList params = {},
                         std::source_location where = std::source_location::current());
  /// Adds the staging node: your own object.
  PipelineBuilder& stage(std::unique_ptr<Node> node,
                         std::source_location where = std::source_location::current());
  /// Adds the upload node (e.g. `host_upload`, `cuda_upload`).
  PipelineBuilder& upload(std::string type, ParamList params = {},
                          std::source_location where = std::source_location::current());
  /// Adds the upload node: your own object.
  PipelineBuilder& upload(std::unique_ptr<Node> node,
                          std::source_location where = std::source_location::current());
  /// Adds the train node (last). Leave it out to step the pipeline with Pipeline::start() (the
  /// builder then sets `pipeline.mode: pull`).
  PipelineBuilder& train(std::string type, ParamList params = {},
                         std::source_location where = std::source_location::current());
  /// Adds the train node: your own object.
  PipelineBuilder& train(std::unique_ptr<Node> node,
                         std::source_location where = std::source_location::current());

  /// The validated config (defaults filled, device resolved). Throws ConfigError listing every
  /// problem, or std::logic_error when the builder holds Node objects (they are not in
  /// `registry`; use build()).
  PipelineConfig config(const Registry& registry) const;
  /// Validates and builds the pipeline (every node created, every pool allocated). Throws
  /// ConfigError, DataError, NodeError or CudaError like the Pipeline constructor, and
  /// std::logic_error when called again on a builder whose Node objects were already used.
  Pipeline build(const Registry& registry);

 private:
  PipelineBuilder& add(Role role, std::string type, ParamList params, std::unique_ptr<Node> object,
                       const std::source_location& where);
  NodeSpec& last(const char* setter);
  PipelineConfig prepared() const;
  void note(const std::string& path, const std::source_location& where);

  PipelineConfig config_;
  std::vector<std::unique_ptr<Node>> objects_;  ///< parallel to config_.nodes; null: by type
  bool objects_used_ = false;
  bool mode_set_ = false;
};

}  // namespace flowfeed
