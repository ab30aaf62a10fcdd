#include "detail/sources.hpp"

#include <utility>
#include <vector>

#include "detail/text.hpp"

namespace flowfeed::detail {

namespace {

const Schema& no_keys() {
  static const Schema schema;
  return schema;
}

std::string entry_path(const std::string& path, std::size_t i) {
  return path + ".sources[" + std::to_string(i) + "]";
}

}  // namespace

void parse_sources(const YAML::Node& sources, const NodeType* type, const Registry& registry,
                   const std::string& path, NodeSpec& spec, Reader& in) {
  if (sources.IsNull()) return;
  if (!sources.IsSequence()) {
    in.add(path + ".sources", sources.Mark(),
           "expected a list of sources, each { type: ..., params: {...} }, got " +
               describe_scalar(sources));
    return;
  }
  const Schema& keys = type && type->sources ? *type->sources : no_keys();
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const YAML::Node entry = sources[i];
    const std::string at = entry_path(path, i);
    SourceSpec source;
    source.loc = in.loc(entry.Mark());
    if (!entry.IsMap()) {
      in.add(at, entry.Mark(),
             "expected a map with type and params, got " + describe_scalar(entry));
      spec.sources.push_back(std::move(source));
      continue;
    }
    validate_map(entry, keys, at, "", source.keys, in, {"type", "params"});
    const YAML::Node name = entry["type"];
    if (!name.IsDefined()) {
      in.add(at + ".type", entry.Mark(), "missing required key (a source names its loader type)");
    } else if (!name.IsScalar()) {
      in.add(at + ".type", name.Mark(), "expected a type name, got " + describe_scalar(name));
    } else {
      source.type = name.Scalar();
      source.loc = in.loc(name.Mark());
    }
    const YAML::Node params = entry["params"];
    const NodeType* source_type = source.type.empty() ? nullptr : registry.find(source.type);
    if (params.IsDefined() && !params.IsNull() && !params.IsMap()) {
      in.add(at + ".params", params.Mark(), "expected a map, got " + describe_scalar(params));
    } else if (source_type) {
      validate_map(params, source_type->schema, at + ".params", "'" + source.type + "' requires it",
                   source.params, in);
    }
    spec.sources.push_back(std::move(source));
  }
}

void check_sources(NodeSpec& node, const NodeType& type, const Registry& registry,
                   const std::string& path, bool checked, Problems& problems) {
  if (!type.sources) {
    if (!node.sources.empty()) {
      problems.add_at(node.loc.str(), path + ".sources",
                      "'" + type.name +
                          "' takes no sources (only a type that combines loaders does, e.g. "
                          "mix) remove them");
    }
    return;
  }
  if (node.sources.empty()) {
    problems.add_at(node.loc.str(), path + ".sources",
                    "missing required key ('" + type.name +
                        "' combines the loaders listed under sources) add sources: [{ type: "
                        "..., params: {...} }, ...]");
    return;
  }
  const std::vector<std::string> known = registry.names();
  for (std::size_t i = 0; i < node.sources.size(); ++i) {
    SourceSpec& source = node.sources[i];
    const std::string at = entry_path(path, i);
    if (source.loc.file.empty()) source.loc = node.loc;
    const std::string where = source.loc.str();
    if (source.type.empty()) {
      // A YAML entry without a usable type was reported as it was read.
      if (!checked) problems.add_at(where, at + ".type", "missing required key");
      continue;
    }
    const NodeType* source_type = registry.find(source.type);
    if (!source_type) {
      const std::string hint = closest(source.type, known);
      problems.add_at(where, at + ".type",
                      "unknown node type " + detail::quoted(source.type) + " (" +
                          (hint.empty() ? "" : "did you mean '" + hint + "'? ") +
                          "known types: " + join(known) + ")");
      continue;
    }
    if (source_type->role != Role::load) {
      problems.add_at(where, at + ".type",
                      "'" + source.type + "' is a " + role_name(source_type->role) +
                          " type (a source of '" + type.name + "' is a loader) pick a load type");
      continue;
    }
    if (source_type->sources) {
      problems.add_at(where, at + ".type",
                      "'" + source.type + "' cannot be a source (it combines loaders itself) " +
                          "list its sources here instead");
      continue;
    }
    if (source_type->unavailable) {
      problems.add_at(where, at + ".type", "'" + source.type + "' is unavailable in this build");
      continue;
    }
    if (!checked) {
      NodeSpec as_node;
      as_node.params = std::move(source.params);
      as_node.loc = source.loc;
      check_params(as_node, source_type->schema, at, problems);
      source.params = std::move(as_node.params);
      Params keys;
      const std::vector<std::string> names = key_names(*type.sources);
      for (const auto& [key, value] : source.keys.values()) {
        const ParamSpec* spec = type.sources->find(key);
        if (!spec) {
          problems.add_at(where, at + "." + key, unknown_key(key, names));
          continue;
        }
        check_value(value, *spec, at + "." + key, where, problems);
        keys.set(key, value, source.keys.loc(key));
      }
      finish_section(
          keys, *type.sources, at, [&](const std::string&) { return where; }, "", problems);
      source.keys = std::move(keys);
    }
    source.create = source_type->create;
  }
}

}  // namespace flowfeed::detail
