// Parsing: YAML is only converted here, section by section, into values of the schema's types
// (one value at a time: yaml_values.cpp, which reports a value of the wrong type with its
// position); each value then goes through the same checks as one set in C++ (config_checks.cpp),
// and lands in its member through the section's table. Validation proper (types, chain, device)
// is validation.cpp's.

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/parser.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "detail/config_check.hpp"
#include "detail/config_file.hpp"
#include "detail/config_yaml.hpp"
#include "detail/sources.hpp"
#include "detail/text.hpp"
#include "detail/yaml_values.hpp"
#include "flowfeed/memory_budget.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

namespace detail {

namespace {

/// Reads `pipeline.devices` (a list of ordinals, or `all`) into `o`; returns where it was written.
std::string parse_devices(const YAML::Node& pipeline, PipelineOptions& o, Reader& problems) {
  const YAML::Node value = pipeline["devices"];
  const std::string where = problems.where("pipeline.devices", value.Mark());
  if (pipeline["device_id"].IsDefined()) {
    problems.add(
        "pipeline.device_id", pipeline["device_id"].Mark(),
        "set together with pipeline.devices (devices names every device the pipeline uses; "
        "the shared stages run on its first entry) remove one of them");
  }
  if (value.IsScalar() && value.Scalar() == "all") {
    o.all_devices = true;
    return where;
  }
  if (!value.IsSequence()) {
    problems.add("pipeline.devices", value.Mark(),
                 "expected a list of CUDA device ordinals or 'all', got " + describe_scalar(value));
    return where;
  }
  const ParamValue list =
      convert(value, *pipeline_schema().find("devices"), "pipeline.devices", problems);
  if (const auto* ids = std::get_if<std::vector<std::int64_t>>(&list)) {
    if (ids->empty()) {
      problems.add("pipeline.devices", value.Mark(),
                   "an empty list (a pipeline needs at least one device) list one or more "
                   "device ordinals, or leave devices out to use device_id");
    }
    for (std::int64_t id : *ids) o.devices.push_back(static_cast<int>(id));
  }
  return where;
}

/// Reads one limit of `pipeline.memory_budget`: bytes ("16G", 1073741824) or a share ("50%").
void parse_budget_limit(const YAML::Node& value, const std::string& path, BudgetLimit& out,
                        Reader& in) {
  const std::string text = value.IsScalar() ? value.Scalar() : std::string();
  if (!text.empty() && text.back() == '%') {
    double share = 0;
    if (parse_number_text(text.substr(0, text.size() - 1), &share) && share > 0 && share <= 100) {
      out.share = share / 100;
      return;
    }
  } else if (auto bytes = parse_bytes(text); bytes && *bytes > 0) {
    out.bytes = *bytes;
    return;
  }
  in.add(path, value.Mark(),
         "expected a byte count above 0 (1073741824, 512M, 16G) or a share of what is "
         "available (50%), got " +
             describe_scalar(value));
}

/// Reads `pipeline.memory_budget`: a limit for host memory, or a map of `host` and `device`.
void parse_memory_budget(const YAML::Node& value, MemoryBudgetOptions& out, Reader& in) {
  const std::string path = "pipeline.memory_budget";
  if (!value.IsMap()) {
    parse_budget_limit(value, path, out.host, in);
    return;
  }
  static const std::vector<std::string> keys = {"host", "device"};
  for (auto it = value.begin(); it != value.end(); ++it) {
    const std::string key = it->first.Scalar();
    const std::string key_path = path + "." + shortened(key);
    if (key == "host") {
      parse_budget_limit(it->second, key_path, out.host, in);
    } else if (key == "device") {
      parse_budget_limit(it->second, key_path, out.device, in);
    } else {
      in.add(key_path, it->first.Mark(), unknown_key(key, keys));
    }
  }
}

PipelineConfig parse(const YAML::Node& root_in, const std::string& file, const Registry& registry,
                     const std::vector<std::string>& overrides, const LoadDefaults& defaults) {
  YAML::Node root = root_in;
  std::map<std::string, std::string> canonical;
  std::vector<std::string> override_errors;
  if (!root.IsDefined() || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  if (!root.IsMap()) {
    throw ConfigError({SourceLoc{file, root.Mark().line + 1, root.Mark().column + 1}.str() +
                       ": expected a map with pipeline, sampler and nodes, got " +
                       describe_scalar(root)});
  }
  apply_overrides(root, overrides, canonical, override_errors);
  if (!override_errors.empty()) throw ConfigError(override_errors);

  Problems collected(file, canonical);
  Reader problems(collected);
  PipelineConfig config;
  config.file = file;

  // Top level.
  std::map<std::string, YAML::Mark> top_first_at;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.Scalar();
    if (auto [first, inserted] = top_first_at.emplace(key, it->first.Mark()); !inserted) {
      problems.add(shortened(key), it->first.Mark(),
                   "duplicate key (first at line " + std::to_string(first->second.line + 1) +
                       "; YAML would silently keep the first) remove one");
      continue;
    }
    static const std::vector<std::string> top = {"pipeline", "sampler", "nodes"};
    if (std::find(top.begin(), top.end(), key) == top.end()) {
      std::string hint = closest(key, top);
      problems.add(shortened(key), it->first.Mark(),
                   "unknown key" + (hint.empty() ? " (the top level has pipeline, sampler, nodes)"
                                                 : " (did you mean '" + hint + "'?)"));
    }
  }

  Params pp;
  const YAML::Node pipeline = root["pipeline"];
  if (pipeline.IsDefined() && !pipeline.IsNull() && !pipeline.IsMap()) {
    problems.add("pipeline", pipeline.Mark(), "expected a map, got " + describe_scalar(pipeline));
  } else {
    validate_map(pipeline, pipeline_schema(), "pipeline", "", pp, problems,
                 {"devices", "memory_budget"});
  }
  Params sp;
  const YAML::Node sampler = root["sampler"];
  if (sampler.IsDefined() && !sampler.IsNull() && !sampler.IsMap()) {
    problems.add("sampler", sampler.Mark(), "expected a map, got " + describe_scalar(sampler));
  } else {
    validate_map(sampler, sampler_schema(), "sampler", "", sp, problems);
  }
  for (const OptionField& field : pipeline_fields()) {
    auto it = pp.values().find(field.key);
    if (it != pp.values().end()) field.set(config, it->second);
  }
  // An empty path would read as "no checkpoint": the run would start over without a word.
  if (const auto it = pp.values().find("resume_from"); it != pp.values().end()) {
    if (const auto* text = std::get_if<std::string>(&it->second); text && text->empty()) {
      problems.add("pipeline.resume_from", pipeline["resume_from"].Mark(),
                   "the path is empty give the checkpoint directory, or leave resume_from out");
    }
  }
  if (pipeline.IsMap() && pipeline["memory_budget"].IsDefined()) {
    parse_memory_budget(pipeline["memory_budget"], config.pipeline.memory_budget, problems);
  }
  std::string devices_where;
  if (pipeline.IsMap() && pipeline["devices"].IsDefined()) {
    devices_where = parse_devices(pipeline, config.pipeline, problems);
  }
  if (!sp.has("rank") || !sp.has("world")) {
    // mpirun, srun and torchrun say which shard this process is.
    LaunchEnvironment env = launch_environment();
    config.sampler.rank = env.rank;
    config.sampler.world = env.world;
    config.launch_source = env.source;
  }
  for (const OptionField& field : sampler_fields()) {
    auto it = sp.values().find(field.key);
    if (it != sp.values().end()) field.set(config, it->second);
  }

  std::string device_where =
      pipeline.IsMap() && pipeline["device"].IsDefined()
          ? problems.where("pipeline.device", pipeline["device"].Mark())
          : problems.where("pipeline",
                           pipeline.IsDefined() ? pipeline.Mark() : YAML::Mark::null_mark());
  if (pipeline.IsDefined()) config.pipeline_loc = problems.loc(pipeline.Mark());

  const YAML::Node nodes = root["nodes"];
  Positions at;
  at.device = device_where;
  at.devices = devices_where;
  bool nodes_ok = true;
  if (!nodes.IsDefined() || nodes.IsNull()) {
    // Reported by check_config as an empty pipeline.
  } else if (!nodes.IsSequence()) {
    problems.add("nodes", nodes.Mark(), "expected a list of nodes, got " + describe_scalar(nodes));
    nodes_ok = false;
  } else {
    for (std::size_t i = 0; i < nodes.size(); ++i) {
      const YAML::Node n = nodes[i];
      const std::string path = "nodes[" + std::to_string(i) + "]";
      if (!n.IsMap()) {
        problems.add(path, n.Mark(),
                     "expected a map with name and type, got " + describe_scalar(n));
        nodes_ok = false;
        continue;
      }
      Params np;
      validate_map(n, node_schema(), path, "", np, problems, {"params", "sources"});
      NodeSpec spec;
      spec.loc = problems.loc(n.Mark());
      for (const NodeField& field : node_fields()) {
        auto it = np.values().find(field.key);
        if (it != np.values().end()) field.set(spec, it->second);
      }
      at.type.push_back(n["type"].IsDefined() ? problems.where(path + ".type", n["type"].Mark())
                                              : spec.loc.str());
      const YAML::Node params = n["params"];
      const NodeType* type = spec.type.empty() ? nullptr : registry.find(spec.type);
      if (params.IsDefined() && !params.IsNull() && !params.IsMap()) {
        problems.add(path + ".params", params.Mark(),
                     "expected a map, got " + describe_scalar(params));
      } else if (type) {
        // Parse against the declared type's schema with YAML positions; a swap re-checks them. A
        // type this build lacks (a CUDA type without CUDA) has no schema: its host counterpart's
        // stands in, since that is what will run.
        // Without one, its params are not checked: validation reports the type itself.
        const NodeType* schema_type = type;
        if (type->unavailable) {
          const NodeType* other =
              type->counterpart.empty() ? nullptr : registry.find(type->counterpart);
          schema_type = other && !other->unavailable ? other : nullptr;
        }
        if (schema_type) {
          validate_map(params, schema_type->schema, path + ".params",
                       "'" + spec.type + "' requires it", spec.params, problems);
        }
      }
      if (n["sources"].IsDefined())
        parse_sources(n["sources"], type, registry, path, spec, problems);
      // A node without name or type was reported; keep its place so later paths stay right.
      at.yaml_checked.push_back(type != nullptr);
      config.nodes.push_back(std::move(spec));
    }
  }
  if (defaults.implicit_pull && !(pipeline.IsMap() && pipeline["mode"].IsDefined())) {
    // No mode written: a chain without a train node is stepped by the caller's loop.
    const bool train = std::any_of(config.nodes.begin(), config.nodes.end(), [&](const auto& n) {
      const NodeType* type = n.type.empty() ? nullptr : registry.find(n.type);
      return type && type->role == Role::train;
    });
    if (!train) config.pipeline.mode = RunMode::pull;
  }
  if (nodes_ok) {
    if (sampler.IsMap() && sampler["rank"].IsDefined()) {
      at.rank = problems.where("sampler.rank", sampler["rank"].Mark());
    }
    at.locate = [&](const std::string& path) {
      // "sampler.shuffle" → root["sampler"]["shuffle"], "nodes[0].params.pin" →
      // root["nodes"][0]["params"]["pin"], where it was written.
      YAML::Node cur = root;
      std::stringstream keys(path);
      for (std::string key; std::getline(keys, key, '.');) {
        std::size_t index = 0;
        bool indexed = false;
        const std::size_t bracket = key.find('[');
        if (bracket != std::string::npos && key.back() == ']') {
          const char* digits = key.data() + bracket + 1;
          const char* end = key.data() + key.size() - 1;
          const auto [stop, error] = std::from_chars(digits, end, index);
          indexed = error == std::errc() && stop == end;
          if (indexed) key.resize(bracket);
        }
        if (!cur.IsMap() || !cur[key].IsDefined()) {
          return problems.where(path, YAML::Mark::null_mark());
        }
        cur.reset(cur[key]);
        if (indexed) {
          if (!cur.IsSequence() || index >= cur.size()) {
            return problems.where(path, YAML::Mark::null_mark());
          }
          cur.reset(cur[index]);
        }
      }
      return problems.where(path, cur.Mark());
    };
    check_config(config, registry, collected, at);
  }
  collected.throw_if_any();
  return config;
}

}  // namespace

}  // namespace detail

namespace detail {

namespace {

// Records where each YAML document starts; ignores everything else.
struct DocumentStarts final : YAML::EventHandler {
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

}  // namespace

std::vector<YAML::Mark> document_starts(const std::string& yaml, std::size_t at_most) {
  std::istringstream in(yaml);
  YAML::Parser parser(in);
  DocumentStarts starts;
  while (starts.marks.size() < at_most && parser.HandleNextDocument(starts)) {
  }
  return starts.marks;
}

}  // namespace detail

PipelineConfig load_config_string(const std::string& yaml, const Registry& registry,
                                  const std::vector<std::string>& overrides,
                                  const std::string& name, const LoadDefaults& defaults) {
  YAML::Node root;
  try {
    const std::vector<YAML::Mark> starts = detail::document_starts(yaml, 2);
    if (starts.size() > 1) {
      const YAML::Mark at = starts[1];
      const std::string where = SourceLoc{name, at.line + 1, at.column + 1}.str();
      const auto pos = static_cast<std::size_t>(at.pos);
      if (pos < yaml.size() && yaml.compare(pos, 3, "---") != 0 &&
          yaml.compare(pos, 3, "...") != 0) {
        // Not a document marker: the parser gave up on the first document here.
        const auto c = static_cast<unsigned char>(yaml[pos]);
        const std::string shown =
            std::isprint(c) ? std::string(1, yaml[pos]) : fmt::format("\\x{:02x}", c);
        throw ConfigError(
            {where + ": invalid YAML (unexpected '" + shown + "': the document ended before it)"});
      }
      throw ConfigError({where + ": a second YAML document (a config is one document; '---' starts "
                                 "another, which would be ignored) remove it, or merge it into the "
                                 "first"});
    }
    if (!starts.empty()) root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    throw ConfigError({SourceLoc{name, e.mark.line + 1, e.mark.column + 1}.str() +
                       ": invalid YAML (" + e.msg + ")"});
  }
  return detail::parse(root, name, registry, overrides, defaults);
}

PipelineConfig load_config_file(const std::string& path, const Registry& registry,
                                const std::vector<std::string>& overrides,
                                const LoadDefaults& defaults) {
  return load_config_string(detail::read_config_file(path), registry, overrides, path, defaults);
}

}  // namespace flowfeed
