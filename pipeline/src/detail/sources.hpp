#pragma once
// A node's `sources:` list (NodeType::sources, e.g. `mix`): read from YAML with positions, then
// each entry's loader type resolved and checked like a node's, whichever way it was written.

#include <yaml-cpp/yaml.h>

#include <string>

#include "detail/config_check.hpp"
#include "detail/yaml_values.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/registry.hpp"

namespace flowfeed::detail {

/// Reads `sources` (node `path`'s list) into `spec.sources`: each entry a map with `type`, `params`
/// (checked against the type's schema, when the type is known) and the keys of the node type's
/// NodeType::sources schema. A node type that takes no sources is reported by check_sources.
void parse_sources(const YAML::Node& sources, const NodeType* type, const Registry& registry,
                   const std::string& path, NodeSpec& spec, Reader& in);

/// Resolves each source's type (NodeSpec::sources[i].create) and reports sources on a type that
/// takes none, a type that is unknown, not a loader or itself combines loaders, and a combining
/// type without sources. `checked`: the params and keys were checked while YAML was read; else
/// they are checked here (a config built in C++).
void check_sources(NodeSpec& node, const NodeType& type, const Registry& registry,
                   const std::string& path, bool checked, Problems& problems);

}  // namespace flowfeed::detail
