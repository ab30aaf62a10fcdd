// Validation: the device, the node types (swapped to their backend's counterparts), the chain's
// order and the cross-key rules, and the checks of values set in C++. What YAML and `--set` wrote
// arrives here as values already checked one by one (parse.cpp); C++ values are checked here with
// the same checks (config_checks.cpp).

#include <algorithm>

#include "detail/config_check.hpp"
#include "detail/sources.hpp"
#include "detail/text.hpp"
#include "detail/validate.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed {

namespace detail {

namespace {

/// A placeholder type named by a config: "'<type>' is unavailable in this build (why) fix".
std::string unavailable_message(const NodeType& type) {
  return "'" + type.name + "' is unavailable in this build " +
         (type.unavailable_reason.empty()
              ? std::string("(it needs CUDA) reconfigure with -DFLOWFEED_CUDA=ON")
              : type.unavailable_reason);
}

int role_rank(Role role) {
  switch (role) {
    case Role::load: return 0;
    case Role::staging: return 2;
    case Role::upload: return 3;
    case Role::train: return 5;
    case Role::transform: return -1;
  }
  return -1;
}

/// The chain's order: load first, train last (none in pull mode), staging before upload,
/// transforms anywhere between. Fed the nodes in order, once their roles are resolved.
class ChainRules {
 public:
  explicit ChainRules(const PipelineConfig& config) : config_(config) {}
  /// What is wrong with node i's place in the chain, or "".
  std::string check(std::size_t i) {
    const NodeSpec& node = config_.nodes[i];
    const bool pull = config_.pipeline.mode == RunMode::pull;
    const std::string desc = "'" + node.name + "' (" + role_name(node.role) + ")";
    const int rank = role_rank(node.role);
    std::string problem;
    if (i == 0 && node.role != Role::load) {
      problem = "the first node must be a load node, '" + node.name + "' is a " +
                role_name(node.role) + " node " + kChain;
    } else if (i > 0 && node.role == Role::load) {
      problem = "only the first node may be a load node " + std::string(kChain);
    } else if (pull && node.role == Role::train) {
      problem = "'" + node.name +
                "' is a train node, and a pipeline with mode: pull has none (the caller's loop is "
                "the train step) remove it, or set pipeline.mode: run";
    } else if (!pull && i + 1 == config_.nodes.size() && node.role != Role::train) {
      problem = "the last node must be a train node, '" + node.name + "' is a " +
                role_name(node.role) +
                " node (add a train-role node such as checksum, sleep or mlp)";
    } else if (i + 1 < config_.nodes.size() && node.role == Role::train) {
      problem = "only the last node may be a train node " + std::string(kChain);
    } else if (rank >= 0 && rank <= last_rank_ && i > 0 && node.role != Role::train) {
      problem = desc + " cannot come after " + last_desc_ + " " + kChain;
    } else if (rank >= 0) {
      last_rank_ = std::max(last_rank_, rank);
      last_desc_ = desc;
    }
    return problem;
  }

 private:
  static constexpr const char* kChain =
      "(the chain is load → transform* → staging → upload → transform* → train)";
  const PipelineConfig& config_;
  int last_rank_ = -1;
  std::string last_desc_;
};

}  // namespace

void check_config(PipelineConfig& config, const Registry& registry, Problems& problems,
                  const Positions& at) {
  const std::string& device_where = at.device.empty() ? config.file : at.device;
  const std::string& devices_where = at.devices.empty() ? config.file : at.devices;
  const std::vector<std::string>& type_where = at.type;
  const std::vector<bool>& yaml_checked = at.yaml_checked;
  const std::string& rank_where = at.rank;
  const bool cuda_built = registry.cuda_built();
  std::vector<int>& devices = config.pipeline.devices;
  // device: auto picks CUDA only when every device the pipeline names is visible.
  const int highest = config.pipeline.all_devices ? 0
                      : devices.empty()           ? config.pipeline.device_id
                                        : *std::max_element(devices.begin(), devices.end());
  switch (config.pipeline.device) {
    case DeviceChoice::host:
      config.backend = Backend::host;
      config.device_reason = "device: host";
      break;
    case DeviceChoice::cuda:
      config.device_reason = "device: cuda";
      if (!cuda_built) {
        problems.add_at(device_where, "pipeline.device",
                        "cuda is unavailable in this build (flowfeed was built without CUDA) "
                        "reconfigure with -DFLOWFEED_CUDA=ON, or use device: auto");
      } else {
        int n = registry.device_count();
        if (n == 0) {
          problems.add_at(device_where, "pipeline.device",
                          "cuda was asked for but no CUDA device is visible "
                          "(cudaGetDeviceCount found none) use device: auto or device: host");
        } else if (devices.empty() && !config.pipeline.all_devices &&
                   config.pipeline.device_id >= n) {
          problems.add_at(device_where, "pipeline.device_id",
                          std::to_string(config.pipeline.device_id) + " is out of range (" +
                              std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") +
                              " visible)");
        }
        for (std::size_t i = 0; n > 0 && i < devices.size(); ++i) {
          if (devices[i] < n) continue;
          problems.add_at(devices_where, "pipeline.devices[" + std::to_string(i) + "]",
                          std::to_string(devices[i]) + " is out of range (" + std::to_string(n) +
                              " CUDA device" + (n == 1 ? "" : "s") + " visible)");
        }
      }
      config.backend = Backend::cuda;
      break;
    case DeviceChoice::automatic: {
      const int n = cuda_built ? registry.device_count() : 0;
      config.backend = n > highest ? Backend::cuda : Backend::host;
      const std::string found =
          std::to_string(n) + " CUDA device" + (n == 1 ? "" : "s") + " visible";
      config.device_reason =
          !cuda_built ? "device: auto, and this build has no CUDA (FLOWFEED_CUDA=OFF): host types"
          : n == 0    ? "device: auto, and no CUDA device is visible: host types"
          : config.backend == Backend::host
              ? "device: auto, " +
                    (devices.empty() ? "device_id " : std::string("devices up to ")) +
                    std::to_string(highest) + " but " + found + ": host types"
              : "device: auto, " + found;
      break;
    }
  }

  if (config.pipeline.all_devices) {
    const int n = config.backend == Backend::cuda ? registry.device_count() : 0;
    if (n > 0) {
      devices.clear();
      for (int d = 0; d < n; ++d) devices.push_back(d);
      config.pipeline.all_devices = false;
    } else {
      problems.add_at(devices_where, "pipeline.devices",
                      "'all' means every visible CUDA device, and the pipeline runs on the host (" +
                          config.device_reason +
                          ") list the branches explicitly, e.g. [0, 1], or leave devices out");
    }
  }
  if (!devices.empty()) config.pipeline.device_id = devices.front();

  if (config.nodes.empty()) {
    problems.add_at(config.file, "nodes",
                    "the pipeline has no nodes (a pipeline needs at least a load and a train "
                    "node) add a `nodes:` list");
    return;
  }

  std::map<std::string, std::size_t> names;
  std::vector<std::string> known_types = registry.names();
  ChainRules chain_rules(config);
  const bool pull = config.pipeline.mode == RunMode::pull;
  for (std::size_t i = 0; i < config.nodes.size(); ++i) {
    NodeSpec& node = config.nodes[i];
    const std::string path = "nodes[" + std::to_string(i) + "]";
    const std::string& twhere = i < type_where.size() ? type_where[i] : node.loc.str();
    if (node.declared_type.empty()) node.declared_type = node.type;
    if (!node.name.empty()) {
      auto [it, inserted] = names.emplace(node.name, i);
      if (!inserted) {
        problems.add_at(node.loc.str(), path + ".name",
                        "duplicate node name " + detail::quoted(node.name) +
                            " (first declared at " + config.nodes[it->second].loc.str() +
                            ") names must be unique");
      }
    }
    if (node.declared_type.empty()) continue;  // reported as a missing key
    const NodeType* type = registry.find(node.declared_type);
    if (!type) {
      std::string hint = closest(node.declared_type, known_types);
      problems.add_at(twhere, path + ".type",
                      "unknown node type " + detail::quoted(node.declared_type) + " (" +
                          (hint.empty() ? "" : "did you mean '" + hint + "'? ") +
                          "known types: " + join(known_types) + ")");
      continue;
    }
    // Swap to the counterpart that fits the backend.
    if (config.backend == Backend::host &&
        (type->backend == TypeBackend::cuda || type->unavailable)) {
      const NodeType* other =
          type->counterpart.empty() ? nullptr : registry.find(type->counterpart);
      if (other && !other->unavailable) {
        type = other;
      } else if (type->unavailable) {
        problems.add_at(twhere, path + ".type", unavailable_message(*type));
        continue;
      } else {
        problems.add_at(twhere, path + ".type",
                        "'" + type->name +
                            "' needs a CUDA device (the pipeline runs on the host: " +
                            (config.pipeline.device == DeviceChoice::host
                                 ? std::string("device: host")
                                 : std::string("no CUDA device is visible")) +
                            ") pick a host type");
        continue;
      }
    } else if (config.backend == Backend::cuda && type->backend == TypeBackend::host &&
               !type->counterpart.empty()) {
      const NodeType* other = registry.find(type->counterpart);
      if (other && !other->unavailable) type = other;
    }
    if (type->unavailable) {
      problems.add_at(twhere, path + ".type", unavailable_message(*type));
      continue;
    }
    const bool swapped = type->name != node.declared_type;
    if (swapped && i < yaml_checked.size() && yaml_checked[i]) {
      // Defaults filled from the declared type's schema are not the counterpart's: keep only the
      // params the YAML (or --set) wrote, and check those against the counterpart below.
      Params written;
      for (const auto& [key, value] : node.params.values()) {
        SourceLoc loc = node.params.loc(key);
        if (!loc.file.empty()) written.set(key, value, std::move(loc));
      }
      node.params = std::move(written);
    }
    node.type = type->name;
    node.role = type->role;
    // Params parsed from YAML were checked against the declared type with their positions; check
    // again only what YAML did not (C++-built configs, and types swapped for their counterpart).
    if (swapped || i >= yaml_checked.size() || !yaml_checked[i]) {
      check_params(node, type->schema, path, problems);
    }
    check_sources(node, *type, registry, path, i < yaml_checked.size() && yaml_checked[i],
                  problems);

    if (node.role == Role::train && node.concurrency != 1) {
      problems.add_at(node.loc.str(), path + ".concurrency",
                      "a train node runs serially (concurrency must be 1, got " +
                          std::to_string(node.concurrency) + ")");
    }
    if (node.role != Role::upload && node.streams != 1) {
      problems.add_at(node.loc.str(), path + ".streams",
                      "streams applies to upload nodes only ('" + node.name + "' is a " +
                          role_name(node.role) + " node)");
    }
    const std::string chain = chain_rules.check(i);
    if (!chain.empty()) problems.add_at(twhere, path + ".type", chain);
  }
  if (devices.size() > 1) {
    const std::string count = std::to_string(devices.size()) + " devices";
    const auto upload = std::find_if(config.nodes.begin(), config.nodes.end(),
                                     [](const NodeSpec& n) { return n.role == Role::upload; });
    if (pull) {
      problems.add_at(devices_where, "pipeline.devices",
                      count +
                          " need mode: run (a branch per device ends in its own train node; "
                          "pull mode hands every batch to one caller loop) list one device, or "
                          "set pipeline.mode: run");
    } else if (upload == config.nodes.end()) {
      problems.add_at(devices_where, "pipeline.devices",
                      count +
                          " replicate the chain from its upload node on, and this chain has "
                          "none add an upload node (cuda_upload or host_upload) before the "
                          "train node");
    }
  }
  // Each node type's own checks of the rest of the config (e.g. a loader that needs a sequential
  // sampler).
  for (const NodeSpec& node : config.nodes) {
    const NodeType* type = node.type.empty() ? nullptr : registry.find(node.type);
    if (!type || !type->check) continue;
    // A param with a default or a required one that is not set failed its own check (reported
    // above): the type's checks, which may read any of them, wait for a config that has them all.
    const auto& declared = type->schema.params();
    if (std::any_of(declared.begin(), declared.end(), [&](const ParamSpec& param) {
          return (param.required || !std::holds_alternative<std::monostate>(param.default_value)) &&
                 !node.params.has(param.name);
        })) {
      continue;
    }
    for (const ConfigProblem& p : type->check(node, config)) {
      std::string where = at.locate ? at.locate(p.path) : "";
      if (where.empty()) {
        auto set_at = config.option_locs.find(p.path);
        where = set_at != config.option_locs.end() && !set_at->second.file.empty()
                    ? set_at->second.str()
                    : config.file;
      }
      problems.add_at(where, p.path, p.message);
    }
  }
  if (config.sampler.rank >= config.sampler.world) {
    auto set_at = config.option_locs.find("sampler.rank");
    const std::string where = !rank_where.empty()                  ? rank_where
                              : set_at != config.option_locs.end() ? set_at->second.str()
                                                                   : config.file;
    problems.add_at(where, "sampler.rank",
                    std::to_string(config.sampler.rank) +
                        " is out of range (rank must be below "
                        "world = " +
                        std::to_string(config.sampler.world) + ")");
  }
}

/// Checks `pipeline:`, `sampler:` and node settings set in C++ with the checks YAML's values went
/// through, reading each member through its section's table.
void check_options(const PipelineConfig& config, Problems& problems) {
  auto check = [&](const std::vector<OptionField>& fields, const Schema& schema,
                   const std::string& section) {
    for (const OptionField& field : fields) {
      const std::optional<ParamValue> value = field.get(config);
      if (!value) continue;
      const std::string path = section + "." + field.key;
      auto it = config.option_locs.find(path);
      const std::string where = it != config.option_locs.end() && !it->second.file.empty()
                                    ? it->second.str()
                                    : config.file;
      check_value(*value, *schema.find(field.key), path, where, problems);
    }
  };
  check(pipeline_fields(), pipeline_schema(), "pipeline");
  check(sampler_fields(), sampler_schema(), "sampler");
  // YAML reads memory_budget's shares from percentages; C++ sets them directly.
  const MemoryBudgetOptions& budget = config.pipeline.memory_budget;
  for (const auto& [key, limit] : {std::pair{"host", &budget.host}, {"device", &budget.device}}) {
    if (limit->share < 0 || limit->share > 1) {
      problems.add_at(
          config.file, std::string("pipeline.memory_budget.") + key,
          format_number(limit->share) + " is out of range (a share must be above 0 and at most 1)");
    }
  }
  const Schema& schema = node_schema();
  for (std::size_t i = 0; i < config.nodes.size(); ++i) {
    const NodeSpec& n = config.nodes[i];
    const std::string path = "nodes[" + std::to_string(i) + "]";
    Params values;
    for (const NodeField& field : node_fields()) {
      const ParamValue value = field.get(n);
      // An empty name is an unset one; an empty type is reported with the types below.
      if (const auto* text = std::get_if<std::string>(&value); text && text->empty()) {
        if (std::string(field.key) == "type") values.set(field.key, value);
        continue;
      }
      check_value(value, *schema.find(field.key), path + "." + field.key, n.loc.str(), problems);
      values.set(field.key, value);
    }
    const std::string where = n.loc.str();
    finish_section(
        values, schema, path, [&](const std::string&) { return where; }, "", problems);
  }
}

}  // namespace detail

std::vector<std::string> detail::chain_problems(const PipelineConfig& config) {
  std::vector<std::string> problems;
  ChainRules rules(config);
  for (std::size_t i = 0; i < config.nodes.size(); ++i) {
    const std::string problem = rules.check(i);
    if (problem.empty()) continue;
    problems.push_back(config.nodes[i].loc.str() + ": nodes[" + std::to_string(i) +
                       "].type: " + problem);
  }
  return problems;
}

void validate_config(PipelineConfig& config, const Registry& registry) {
  if (config.file.empty()) config.file = "<c++>";
  detail::Problems problems(config.file, {});
  for (auto& node : config.nodes) {
    if (node.loc.file.empty()) node.loc.file = config.file;
  }
  detail::check_options(config, problems);
  detail::Positions at;
  auto devices_at = config.option_locs.find("pipeline.devices");
  if (devices_at != config.option_locs.end()) at.devices = devices_at->second.str();
  detail::check_config(config, registry, problems, at);
  problems.throw_if_any();
}

}  // namespace flowfeed
