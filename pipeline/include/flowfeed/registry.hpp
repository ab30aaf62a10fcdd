#pragma once
/// \file
/// The table of node types a pipeline can be built from, by name.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/range_hooks.hpp"
#include "flowfeed/schema.hpp"

namespace flowfeed {

struct PipelineConfig;  ///< config.hpp

/// One problem a NodeType::check finds: the key it is about and what is wrong.
struct ConfigProblem {
  std::string path;     ///< e.g. "sampler.shuffle"
  std::string message;  ///< "problem (why) fix"
};

/// Which backend a node type runs on.
enum class TypeBackend {
  any,   ///< runs on both (host code, or it picks its implementation from BuildContext::backend)
  host,  ///< host memory only
  cuda,  ///< needs a CUDA device
};

/// One node type: its name, role, parameter schema and factory.
struct NodeType {
  std::string name;                        ///< what YAML writes as `type:`
  Role role = Role::load;                  ///< its place in the chain
  std::string doc;                         ///< one line for `--list-types`
  Schema schema;                           ///< the params it accepts
  TypeBackend backend = TypeBackend::any;  ///< where it can run
  /// For a CUDA type, the host type that replaces it when the pipeline resolves to the host
  /// backend (`device: auto` on a machine with no GPU, or `device: host`); for a host type, the
  /// CUDA type that replaces it under `device: cuda`. Empty: no counterpart.
  std::string counterpart;
  /// True when the type was registered as a placeholder by a build without its family (CUDA, or
  /// images): it exists so that configs name it, but validation rejects it.
  bool unavailable = false;
  /// For a placeholder: why this build lacks the type and how to get it, "(why) fix", following
  /// "'<type>' is unavailable in this build ". Empty: the CUDA family's text.
  std::string unavailable_reason;
  /// Creates the node from its validated spec. Called once per pipeline, and once per branch for
  /// the nodes that `pipeline.devices` replicates.
  std::function<std::unique_ptr<Node>(const NodeSpec& spec)> create;
  /// For a type that combines loaders (`mix`): the keys each entry of its `sources:` list may
  /// have beside `type` and `params` (e.g. `weight`). Without it the type takes no sources.
  std::optional<Schema> sources;

  /// Sets where the type runs and its counterpart on the other backend; returns the type (to
  /// chain after node_type() or factory_type()).
  NodeType& runs_on(TypeBackend where, std::string other = {}) {
    backend = where;
    counterpart = std::move(other);
    return *this;
  }
  /// Optional: checks, at validation, how the rest of the config fits this type (e.g. a loader
  /// that needs a sequential sampler). Returns each problem as {key path, message}, e.g.
  /// {"sampler.shuffle", "... (why) fix"}; the message is placed at the key's position.
  std::function<std::vector<ConfigProblem>(const NodeSpec& spec, const PipelineConfig& config)>
      check;
};

/// Node types by name. A registry is a plain value: build one, add the built-ins and your own
/// types, and pass it to the pipeline. Not thread-safe for writes; reads are safe once built.
class Registry {
 public:
  /// Adds a type; throws std::invalid_argument if the name is taken.
  void add(NodeType type);
  /// Adds a type or replaces the one of the same name (e.g. a user's own `idx` loader).
  void set(NodeType type);
  /// The type called `name`, or null.
  const NodeType* find(const std::string& name) const noexcept;
  /// Every registered name, sorted.
  std::vector<std::string> names() const;

  /// How many CUDA devices are visible; the CUDA node family installs the probe. Without one the
  /// answer is 0.
  int device_count() const;
  /// Installs the function device_count() calls (the CUDA family's cudaGetDeviceCount probe).
  void set_device_probe(std::function<int()> probe) { probe_ = std::move(probe); }
  /// Free memory on CUDA device `device`, for the build's memory check; nullopt when not known
  /// (no probe installed, as without CUDA).
  std::optional<std::uint64_t> device_free_memory(int device) const {
    return memory_probe_ ? memory_probe_(device) : std::nullopt;
  }
  /// Installs the function device_free_memory() calls (the CUDA family's cudaMemGetInfo).
  void set_device_memory_probe(std::function<std::optional<std::uint64_t>(int)> probe) {
    memory_probe_ = std::move(probe);
  }
  /// True when the CUDA family was compiled in (FLOWFEED_CUDA on).
  bool cuda_built() const noexcept { return cuda_built_; }
  /// Set by register_cuda_nodes: whether the real CUDA types (not placeholders) are registered.
  void set_cuda_built(bool built) noexcept { cuda_built_ = built; }
  /// Callbacks around every node body of the pipelines built from this registry (e.g. NVTX ranges
  /// installed by the CUDA family). None by default.
  const RangeHooks& range_hooks() const noexcept { return range_hooks_; }
  void set_range_hooks(RangeHooks hooks) noexcept { range_hooks_ = hooks; }

 private:
  std::map<std::string, NodeType> types_;
  std::function<int()> probe_;
  std::function<std::optional<std::uint64_t>(int)> memory_probe_;
  bool cuda_built_ = false;
  RangeHooks range_hooks_;
};

}  // namespace flowfeed
