#include "flowfeed/config.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "detail/text.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {

namespace {

using detail::closest;
using detail::join;

Schema pipeline_schema() {
  Schema s;
  s.add_int("epochs", "passes over the data set", 1).range(1, 1e6);
  s.add_int("batch_size", "samples per batch (default: the loader's, else 64)").range(1, 1e8);
  s.add_int("prefetch_depth", "most batches in flight between source and end of train", 8)
      .range(1, 4096);
  s.add_bool("ordered", "the train node sees batches in sequence order", true);
  s.add_string("device", "auto: CUDA when a GPU is visible, else host", std::string("auto"))
      .one_of({"auto", "cuda", "host"});
  s.add_int("device_id", "CUDA device ordinal", 0).range(0, 1024);
  s.add_int_list("devices",
                 "one upload → train branch per listed CUDA device, or 'all' (default: device_id "
                 "alone); on the host backend the entries only label the branches")
      .range(0, 1024);
  s.add_int("threads", "TBB worker threads (0: one per core)", 0).range(0, 4096);
  s.add_number("stall_timeout_s", "end a run that makes no progress for this long (0: never)", 0.0)
      .range(0, 1e9);
  s.add_string("on_error", "what a data error does: fail the run or skip the batch",
               std::string("fail"))
      .one_of({"fail", "skip"});
  s.add_int("max_skipped", "under on_error: skip, fail once more batches than this were skipped", 0)
      .range(0, 1e12);
  s.add_string("mode",
               "run: the graph ends in a train node (Pipeline::run); pull: no train node, a C++ "
               "loop takes the batches (Pipeline::start)",
               std::string("run"))
      .one_of({"run", "pull"});
  return s;
}

Schema sampler_schema() {
  Schema s;
  s.add_bool("shuffle", "a new permutation every epoch, from (seed, epoch) alone", false);
  s.add_int("seed", "shuffle seed", 0).range(0, 9.2e18);
  s.add_bool("drop_last", "drop the last partial batch of each epoch", false);
  s.add_int("rank", "this shard, 0..world-1 (default: from the launcher's environment, else 0)")
      .range(0, 1e6);
  s.add_int("world", "number of shards (default: from the launcher's environment, else 1)")
      .range(1, 1e6);
  return s;
}

Schema node_schema() {
  Schema s;
  s.add_string("name", "unique node name").make_required();
  s.add_string("type", "registered node type").make_required();
  s.add_int("concurrency", "bodies that may run at once", 1).range(1, 4096);
  s.add_int("streams", "CUDA streams an upload node owns", 1).range(1, 64);
  return s;
}

/// Collects problems, each tied to a key path and a position.
class Problems {
 public:
  Problems(std::string file, std::map<std::string, std::string> overrides)
      : file_(std::move(file)), overrides_(std::move(overrides)) {}

  void add(const std::string& path, const YAML::Mark& mark, const std::string& what) {
    add_at(where(path, mark), path, what);
  }
  void add_at(const std::string& where, const std::string& path, const std::string& what) {
    std::string line = where + ": ";
    if (!path.empty()) line += path + ": ";
    line += what;
    lines_.push_back(std::move(line));
  }
  std::string where(const std::string& path, const YAML::Mark& mark) const {
    for (const auto& [p, text] : overrides_) {
      if (path == p || path.rfind(p + ".", 0) == 0 || path.rfind(p + "[", 0) == 0) {
        return "--set " + text;
      }
    }
    return loc(mark).str();
  }
  SourceLoc loc(const YAML::Mark& mark) const {
    if (mark.is_null()) return SourceLoc{file_, 0, 0};
    return SourceLoc{file_, mark.line + 1, mark.column + 1};
  }
  bool empty() const { return lines_.empty(); }
  void throw_if_any() const {
    if (!lines_.empty()) throw ConfigError(lines_);
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::map<std::string, std::string> overrides_;  // canonical path -> "key=value" as typed
  std::vector<std::string> lines_;
};

std::string describe_scalar(const YAML::Node& n) {
  if (n.IsNull()) return "nothing";
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "an undefined value";
}

std::string format_number(double v) {
  if (std::floor(v) == v && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string range_text(const ParamSpec& spec) {
  if (spec.min && spec.max) {
    return "must be between " + format_number(*spec.min) + " and " + format_number(*spec.max);
  }
  if (spec.min) return "must be at least " + format_number(*spec.min);
  return "must be at most " + format_number(*spec.max);
}

bool parse_int_text(const std::string& text, std::int64_t* out, std::string* why) {
  const char* b = text.data();
  const char* e = b + text.size();
  const char* digits = (b != e && (*b == '-' || *b == '+')) ? b + 1 : b;
  if (digits != e && *digits == '0' && e - digits > 1) {
    *why = " (a leading zero would make YAML read it as octal) write it without the zero";
    return false;
  }
  if (b != e && *b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, *out);
  if (ec == std::errc::result_out_of_range) {
    *why = " (too large)";
    return false;
  }
  return ec == std::errc() && p == e && b != e;
}

bool parse_number_text(const std::string& text, double* out) {
  if (text.empty()) return false;
  const char* b = text.data();
  const char* e = b + text.size();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, *out);
  return ec == std::errc() && p == e && std::isfinite(*out);
}

bool parse_bool_text(const std::string& text, bool* out) {
  if (text == "true" || text == "True" || text == "TRUE") {
    *out = true;
    return true;
  }
  if (text == "false" || text == "False" || text == "FALSE") {
    *out = false;
    return true;
  }
  return false;
}

/// Converts one YAML value against its spec; adds a problem and returns monostate on failure.
ParamValue convert(const YAML::Node& value, const ParamSpec& spec, const std::string& path,
                   Problems& problems) {
  const YAML::Mark mark = value.Mark();
  if (value.IsNull() || (value.IsScalar() && value.Scalar() == "~")) {
    problems.add(path, mark,
                 std::string("missing value (expected ") + param_type_name(spec.type) + ")");
    return {};
  }
  auto check_range = [&](double v) {
    if ((spec.min && v < *spec.min) || (spec.max && v > *spec.max)) {
      problems.add(path, mark, format_number(v) + " is out of range (" + range_text(spec) + ")");
      return false;
    }
    return true;
  };
  auto expected = [&](const char* what, const YAML::Node& got, const std::string& why = "") {
    problems.add(path, got.Mark(),
                 std::string("expected ") + what + ", got " + describe_scalar(got) + why);
  };
  switch (spec.type) {
    case ParamType::boolean: {
      bool b;
      if (!value.IsScalar() || !parse_bool_text(value.Scalar(), &b)) {
        expected("true or false", value);
        return {};
      }
      return b;
    }
    case ParamType::integer: {
      std::int64_t i;
      std::string why;
      if (!value.IsScalar() || !parse_int_text(value.Scalar(), &i, &why)) {
        expected("an int", value, why);
        return {};
      }
      if (!check_range(static_cast<double>(i))) return {};
      return i;
    }
    case ParamType::number: {
      double d;
      if (!value.IsScalar() || !parse_number_text(value.Scalar(), &d)) {
        expected("a number", value);
        return {};
      }
      if (!check_range(d)) return {};
      return d;
    }
    case ParamType::string: {
      if (!value.IsScalar()) {
        expected("a string", value);
        return {};
      }
      const std::string& s = value.Scalar();
      if (!spec.choices.empty() &&
          std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
        std::string hint = closest(s, spec.choices);
        problems.add(path, mark,
                     "'" + s + "' is not one of " + join(spec.choices, ", ") +
                         (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
        return {};
      }
      return s;
    }
    case ParamType::int_list: {
      if (!value.IsSequence()) {
        expected("a list of ints", value);
        return {};
      }
      std::vector<std::int64_t> out;
      bool ok = true;
      for (std::size_t i = 0; i < value.size(); ++i) {
        const YAML::Node item = value[i];
        std::int64_t v;
        std::string why;
        std::string item_path = path + "[" + std::to_string(i) + "]";
        if (!item.IsScalar() || !parse_int_text(item.Scalar(), &v, &why)) {
          problems.add(item_path, item.Mark(),
                       "expected an int, got " + describe_scalar(item) + why);
          ok = false;
          continue;
        }
        if ((spec.min && v < *spec.min) || (spec.max && v > *spec.max)) {
          problems.add(item_path, item.Mark(),
                       format_number(static_cast<double>(v)) + " is out of range (" +
                           range_text(spec) + ")");
          ok = false;
          continue;
        }
        out.push_back(v);
      }
      if (!ok) return {};
      return out;
    }
    case ParamType::number_list: {
      if (!value.IsSequence()) {
        expected("a list of numbers", value);
        return {};
      }
      std::vector<double> out;
      bool ok = true;
      for (std::size_t i = 0; i < value.size(); ++i) {
        const YAML::Node item = value[i];
        double v;
        const std::string item_path = path + "[" + std::to_string(i) + "]";
        if (!item.IsScalar() || !parse_number_text(item.Scalar(), &v)) {
          problems.add(item_path, item.Mark(), "expected a number, got " + describe_scalar(item));
          ok = false;
        } else if ((spec.min && v < *spec.min) || (spec.max && v > *spec.max)) {
          problems.add(item_path, item.Mark(),
                       format_number(v) + " is out of range (" + range_text(spec) + ")");
          ok = false;
        } else {
          out.push_back(v);
        }
      }
      if (!ok) return {};
      return out;
    }
  }
  return {};
}

/// Validates a YAML map against a schema into `out`. Keys in `extra` are allowed and skipped.
void validate_map(const YAML::Node& map, const Schema& schema, const std::string& path,
                  const std::string& required_why, Params& out, Problems& problems,
                  const std::vector<std::string>& extra = {}) {
  std::set<std::string> seen;
  std::map<std::string, YAML::Mark> first_at;
  std::vector<std::string> known;
  for (const auto& p : schema.params()) known.push_back(p.name);
  for (const auto& e : extra) known.push_back(e);
  if (map.IsDefined() && !map.IsNull()) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string key_path = path.empty() ? key : path + "." + key;
      if (first_at.count(key)) {
        const YAML::Mark& f = first_at[key];
        problems.add(key_path, it->first.Mark(),
                     "duplicate key (first at line " + std::to_string(f.line + 1) +
                         "; YAML would silently keep the first) remove one");
        continue;
      }
      first_at[key] = it->first.Mark();
      if (std::find(extra.begin(), extra.end(), key) != extra.end()) continue;
      const ParamSpec* spec = schema.find(key);
      if (!spec) {
        std::string hint = closest(key, known);
        problems.add(key_path, it->first.Mark(),
                     "unknown key" + (!hint.empty()   ? " (did you mean '" + hint + "'?)"
                                      : known.empty() ? std::string(" (this takes no keys)")
                                                      : " (known keys: " + join(known) + ")"));
        continue;
      }
      seen.insert(key);
      ParamValue v = convert(it->second, *spec, key_path, problems);
      if (!std::holds_alternative<std::monostate>(v)) {
        out.set(key, std::move(v), problems.loc(it->second.Mark()));
      }
    }
  }
  for (const auto& spec : schema.params()) {
    if (seen.count(spec.name)) continue;
    if (spec.required) {
      const std::string key_path = path.empty() ? spec.name : path + "." + spec.name;
      std::string why = spec.doc.empty() ? required_why : spec.doc;
      problems.add(key_path, map.IsDefined() ? map.Mark() : YAML::Mark::null_mark(),
                   "missing required key" + (why.empty() ? "" : " (" + why + ")"));
    } else if (!std::holds_alternative<std::monostate>(spec.default_value)) {
      out.set(spec.name, spec.default_value);
    }
  }
}

/// A value set from C++, as a message quotes it.
std::string describe_value(const ParamValue& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (const auto* i = std::get_if<std::int64_t>(&v)) return std::to_string(*i);
  if (const auto* d = std::get_if<double>(&v)) return format_number(*d);
  if (const auto* s = std::get_if<std::string>(&v)) return "'" + *s + "'";
  if (std::holds_alternative<std::vector<std::int64_t>>(v) ||
      std::holds_alternative<std::vector<double>>(v))
    return "a list";
  return "nothing";
}

/// Checks a value set from C++ against its spec (C++-built configs get the same checks).
void check_value(const ParamValue& v, const ParamSpec& spec, const std::string& path,
                 const std::string& where, Problems& problems) {
  auto bad = [&](const std::string& what) {
    // Type mismatches quote what was given, as the YAML messages do.
    const bool mismatch = what.rfind("expected ", 0) == 0;
    problems.add_at(where, path, mismatch ? what + ", got " + describe_value(v) : what);
  };
  auto in_range = [&](double x) {
    return !((spec.min && x < *spec.min) || (spec.max && x > *spec.max));
  };
  switch (spec.type) {
    case ParamType::boolean:
      if (!std::holds_alternative<bool>(v)) bad("expected true or false");
      break;
    case ParamType::integer:
      if (!std::holds_alternative<std::int64_t>(v)) {
        bad("expected an int");
      } else if (!in_range(static_cast<double>(std::get<std::int64_t>(v)))) {
        bad(format_number(static_cast<double>(std::get<std::int64_t>(v))) + " is out of range (" +
            range_text(spec) + ")");
      }
      break;
    case ParamType::number: {
      double x;
      if (const auto* i = std::get_if<std::int64_t>(&v)) {
        x = static_cast<double>(*i);
      } else if (const auto* d = std::get_if<double>(&v)) {
        x = *d;
      } else {
        bad("expected a number");
        break;
      }
      if (!in_range(x)) bad(format_number(x) + " is out of range (" + range_text(spec) + ")");
      break;
    }
    case ParamType::string:
      if (!std::holds_alternative<std::string>(v)) {
        bad("expected a string");
      } else if (!spec.choices.empty() &&
                 std::find(spec.choices.begin(), spec.choices.end(), std::get<std::string>(v)) ==
                     spec.choices.end()) {
        const std::string hint = closest(std::get<std::string>(v), spec.choices);
        bad("'" + std::get<std::string>(v) + "' is not one of " + join(spec.choices, ", ") +
            (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
      }
      break;
    case ParamType::int_list:
      if (!std::holds_alternative<std::vector<std::int64_t>>(v)) {
        bad("expected a list of ints");
      } else {
        for (auto x : std::get<std::vector<std::int64_t>>(v)) {
          if (!in_range(static_cast<double>(x))) {
            bad(format_number(static_cast<double>(x)) + " is out of range (" + range_text(spec) +
                ")");
          }
        }
      }
      break;
    case ParamType::number_list:
      if (!std::holds_alternative<std::vector<double>>(v)) {
        bad("expected a list of numbers");
      } else {
        for (double x : std::get<std::vector<double>>(v)) {
          if (!in_range(x)) bad(format_number(x) + " is out of range (" + range_text(spec) + ")");
        }
      }
      break;
  }
}

/// Fills defaults and checks the params of a node built in C++ (or after a type swap).
void check_params(NodeSpec& node, const Schema& schema, const std::string& path,
                  Problems& problems) {
  Params checked;
  std::vector<std::string> known;
  for (const auto& p : schema.params()) known.push_back(p.name);
  for (const auto& [key, value] : node.params.values()) {
    const std::string key_path = path + ".params." + key;
    SourceLoc loc = node.params.loc(key);
    std::string where = loc.file.empty() ? node.loc.str() : loc.str();
    const ParamSpec* spec = schema.find(key);
    if (!spec) {
      std::string hint = closest(key, known);
      problems.add_at(
          where, key_path,
          "unknown key" + (hint.empty() ? " (" + node.type + " has params: " +
                                              (known.empty() ? "none" : join(known)) + ")"
                                        : " (did you mean '" + hint + "'?)"));
      continue;
    }
    check_value(value, *spec, key_path, where, problems);
    checked.set(key, value, loc);
  }
  for (const auto& spec : schema.params()) {
    if (checked.has(spec.name)) continue;
    if (spec.required) {
      problems.add_at(node.loc.str(), path + ".params." + spec.name,
                      "missing required key" + (spec.doc.empty() ? "" : " (" + spec.doc + ")"));
    } else if (!std::holds_alternative<std::monostate>(spec.default_value)) {
      checked.set(spec.name, spec.default_value);
    }
  }
  node.params = std::move(checked);
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

/// Resolves the device, swaps types to their counterparts, checks the chain and every node's
/// params. `where_of(i)` names node i's position for messages.
void check_config(PipelineConfig& config, const Registry& registry, Problems& problems,
                  const std::string& device_where, const std::vector<std::string>& type_where,
                  const std::vector<bool>& yaml_checked, const std::string& rank_where,
                  const std::string& devices_where) {
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
  int last_rank = -1;
  std::string last_desc;
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
                        "duplicate node name '" + node.name + "' (first declared at " +
                            config.nodes[it->second].loc.str() + ") names must be unique");
      }
    }
    if (node.declared_type.empty()) continue;  // reported as a missing key
    const NodeType* type = registry.find(node.declared_type);
    if (!type) {
      std::string hint = closest(node.declared_type, known_types);
      problems.add_at(twhere, path + ".type",
                      "unknown node type '" + node.declared_type + "' (" +
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
        problems.add_at(twhere, path + ".type",
                        "'" + type->name +
                            "' is unavailable in this build (it needs CUDA) "
                            "reconfigure with -DFLOWFEED_CUDA=ON");
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
      problems.add_at(twhere, path + ".type",
                      "'" + type->name +
                          "' is unavailable in this build (it needs CUDA) "
                          "reconfigure with -DFLOWFEED_CUDA=ON");
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
    // Chain order: load first, train last, staging before upload, transforms anywhere between.
    const std::string desc = "'" + node.name + "' (" + role_name(node.role) + ")";
    int rank = role_rank(node.role);
    bool misplaced = true;
    if (i == 0 && node.role != Role::load) {
      problems.add_at(twhere, path + ".type",
                      "the first node must be a load node, '" + node.name + "' is a " +
                          role_name(node.role) +
                          " node (the chain is load → transform* → "
                          "staging → upload → transform* → train)");
    } else if (i > 0 && node.role == Role::load) {
      problems.add_at(twhere, path + ".type",
                      "only the first node may be a load node (the chain is load → "
                      "transform* → staging → upload → transform* → train)");
    } else if (pull && node.role == Role::train) {
      problems.add_at(twhere, path + ".type",
                      "'" + node.name +
                          "' is a train node, and a pipeline with mode: pull has "
                          "none (the caller's loop is the train step) remove it, or set "
                          "pipeline.mode: run");
    } else if (!pull && i + 1 == config.nodes.size() && node.role != Role::train) {
      problems.add_at(twhere, path + ".type",
                      "the last node must be a train node, '" + node.name + "' is a " +
                          role_name(node.role) +
                          " node (add a train-role node such as "
                          "checksum, sleep or mlp)");
    } else if (i + 1 < config.nodes.size() && node.role == Role::train) {
      problems.add_at(twhere, path + ".type",
                      "only the last node may be a train node (the chain is load → "
                      "transform* → staging → upload → transform* → train)");
    } else if (rank >= 0 && rank <= last_rank && i > 0 && node.role != Role::train) {
      problems.add_at(twhere, path + ".type",
                      desc + " cannot come after " + last_desc +
                          " (the chain is load → transform* → staging → upload → transform* → "
                          "train)");
    } else {
      misplaced = false;
    }
    if (rank >= 0 && !misplaced) {
      last_rank = std::max(last_rank, rank);
      last_desc = desc;
    }
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

/// Canonical path of an override, with nodes addressed by index; adds a problem when it names
/// no node.
struct Override {
  std::vector<std::string> keys;  // e.g. {"nodes", "0", "params", "delay_ms"}
  std::string canonical;          // nodes[0].params.delay_ms
  std::string text;
  std::string value;
};

void apply_overrides(YAML::Node& root, const std::vector<std::string>& overrides,
                     std::map<std::string, std::string>& canonical,
                     std::vector<std::string>& errors) {
  for (const auto& text : overrides) {
    auto eq = text.find('=');
    if (eq == std::string::npos || eq == 0) {
      errors.push_back("--set " + text + ": expected key.path=value");
      continue;
    }
    std::string path = text.substr(0, eq);
    std::string value = text.substr(eq + 1);
    std::vector<std::string> keys;
    std::stringstream ss(path);
    for (std::string k; std::getline(ss, k, '.');) keys.push_back(k);
    if (std::find(keys.begin(), keys.end(), "") != keys.end()) {
      errors.push_back("--set " + text + ": empty key in '" + path + "'");
      continue;
    }
    YAML::Node parsed;
    try {
      parsed = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      errors.push_back("--set " + text + ": value is not valid YAML (" + e.msg + ")");
      continue;
    }
    std::string canon;
    YAML::Node cur = root;
    bool ok = true;
    std::size_t first_key = 0;
    if (keys[0] == "nodes") {
      // Nodes are addressed by name: nodes.NAME.key...
      YAML::Node nodes = root["nodes"];
      std::vector<std::string> names;
      bool found = false;
      if (keys.size() >= 2 && nodes.IsSequence()) {
        for (std::size_t n = 0; n < nodes.size(); ++n) {
          if (!nodes[n].IsMap()) continue;  // reported by validation
          YAML::Node name = nodes[n]["name"];
          if (name.IsScalar()) names.push_back(name.Scalar());
          if (name.IsScalar() && name.Scalar() == keys[1]) {
            cur.reset(nodes[n]);
            canon = "nodes[" + std::to_string(n) + "]";
            found = true;
            break;
          }
        }
      }
      if (keys.size() < 3) {
        errors.push_back("--set " + text + ": name a node and one of its keys (e.g. nodes." +
                         (keys.size() == 2 ? keys[1] : std::string("load")) + ".concurrency=2)");
        continue;
      }
      if (!found) {
        std::string hint = closest(keys[1], names);
        errors.push_back(
            "--set " + text + ": no node named '" + keys[1] + "'" +
            (hint.empty() ? " (nodes: " + join(names) + ")" : " (did you mean '" + hint + "'?)"));
        continue;
      }
      first_key = 2;
    }
    for (std::size_t i = first_key; i < keys.size() && ok; ++i) {
      canon += (canon.empty() ? "" : ".") + keys[i];
      if (i + 1 == keys.size()) {
        cur[keys[i]] = parsed;
      } else {
        YAML::Node next = cur[keys[i]];
        if (!next.IsDefined() || next.IsNull()) {
          cur[keys[i]] = YAML::Node(YAML::NodeType::Map);
          next = cur[keys[i]];
        }
        if (!next.IsMap()) {
          errors.push_back("--set " + text + ": '" + keys[i] + "' is not a map");
          ok = false;
          break;
        }
        cur.reset(next);
      }
    }
    if (ok) canonical[canon] = text;
  }
}

/// Reads `pipeline.devices` (a list of ordinals, or `all`) into `o`; returns where it was written.
std::string parse_devices(const YAML::Node& pipeline, PipelineOptions& o, Problems& problems) {
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

PipelineConfig parse(const YAML::Node& root_in, const std::string& file, const Registry& registry,
                     const std::vector<std::string>& overrides) {
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

  Problems problems(file, canonical);
  PipelineConfig config;
  config.file = file;

  // Top level.
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.Scalar();
    static const std::vector<std::string> top = {"pipeline", "sampler", "nodes"};
    if (std::find(top.begin(), top.end(), key) == top.end()) {
      std::string hint = closest(key, top);
      problems.add(key, it->first.Mark(),
                   "unknown key" + (hint.empty() ? " (the top level has pipeline, sampler, nodes)"
                                                 : " (did you mean '" + hint + "'?)"));
    }
  }

  Params pp;
  const YAML::Node pipeline = root["pipeline"];
  if (pipeline.IsDefined() && !pipeline.IsNull() && !pipeline.IsMap()) {
    problems.add("pipeline", pipeline.Mark(), "expected a map, got " + describe_scalar(pipeline));
  } else {
    validate_map(pipeline, pipeline_schema(), "pipeline", "", pp, problems, {"devices"});
  }
  Params sp;
  const YAML::Node sampler = root["sampler"];
  if (sampler.IsDefined() && !sampler.IsNull() && !sampler.IsMap()) {
    problems.add("sampler", sampler.Mark(), "expected a map, got " + describe_scalar(sampler));
  } else {
    validate_map(sampler, sampler_schema(), "sampler", "", sp, problems);
  }
  auto& o = config.pipeline;
  if (pp.has("epochs")) o.epochs = static_cast<int>(pp.get_int("epochs"));
  if (pp.has("batch_size")) o.batch_size = static_cast<std::size_t>(pp.get_int("batch_size"));
  if (pp.has("prefetch_depth")) o.prefetch_depth = static_cast<int>(pp.get_int("prefetch_depth"));
  if (pp.has("ordered")) o.ordered = pp.get_bool("ordered");
  if (pp.has("device")) {
    const auto& d = pp.get_string("device");
    o.device = d == "cuda"   ? DeviceChoice::cuda
               : d == "host" ? DeviceChoice::host
                             : DeviceChoice::automatic;
  }
  if (pp.has("device_id")) o.device_id = static_cast<int>(pp.get_int("device_id"));
  std::string devices_where = config.file;
  if (pipeline.IsMap() && pipeline["devices"].IsDefined()) {
    devices_where = parse_devices(pipeline, o, problems);
  }
  if (pp.has("threads")) o.threads = static_cast<int>(pp.get_int("threads"));
  if (pp.has("stall_timeout_s")) o.stall_timeout_s = pp.get_number("stall_timeout_s");
  if (pp.has("on_error"))
    o.on_error = pp.get_string("on_error") == "skip" ? OnError::skip : OnError::fail;
  if (pp.has("max_skipped")) o.max_skipped = static_cast<int>(pp.get_int("max_skipped"));
  if (pp.has("mode")) o.mode = pp.get_string("mode") == "pull" ? RunMode::pull : RunMode::run;
  auto& s = config.sampler;
  if (sp.has("shuffle")) s.shuffle = sp.get_bool("shuffle");
  if (sp.has("seed")) s.seed = static_cast<std::uint64_t>(sp.get_int("seed"));
  if (sp.has("drop_last")) s.drop_last = sp.get_bool("drop_last");
  if (!sp.has("rank") || !sp.has("world")) {
    // mpirun, srun and torchrun say which shard this process is.
    LaunchEnvironment env = launch_environment();
    s.rank = env.rank;
    s.world = env.world;
    config.launch_source = env.source;
  }
  if (sp.has("rank")) s.rank = static_cast<int>(sp.get_int("rank"));
  if (sp.has("world")) s.world = static_cast<int>(sp.get_int("world"));

  std::string device_where =
      pipeline.IsMap() && pipeline["device"].IsDefined()
          ? problems.where("pipeline.device", pipeline["device"].Mark())
          : problems.where("pipeline",
                           pipeline.IsDefined() ? pipeline.Mark() : YAML::Mark::null_mark());
  if (pipeline.IsDefined()) config.pipeline_loc = problems.loc(pipeline.Mark());

  const YAML::Node nodes = root["nodes"];
  std::vector<std::string> type_where;
  std::vector<bool> yaml_checked;
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
      validate_map(n, node_schema(), path, "", np, problems, {"params"});
      NodeSpec spec;
      spec.loc = problems.loc(n.Mark());
      if (np.has("name")) spec.name = np.get_string("name");
      if (np.has("type")) spec.type = spec.declared_type = np.get_string("type");
      if (np.has("concurrency")) spec.concurrency = static_cast<int>(np.get_int("concurrency"));
      if (np.has("streams")) spec.streams = static_cast<int>(np.get_int("streams"));
      type_where.push_back(n["type"].IsDefined() ? problems.where(path + ".type", n["type"].Mark())
                                                 : spec.loc.str());
      const YAML::Node params = n["params"];
      const NodeType* type = spec.type.empty() ? nullptr : registry.find(spec.type);
      if (params.IsDefined() && !params.IsNull() && !params.IsMap()) {
        problems.add(path + ".params", params.Mark(),
                     "expected a map, got " + describe_scalar(params));
      } else if (type) {
        // Parse against the declared type's schema with YAML positions; a swap re-checks them.
        validate_map(params, type->schema, path + ".params", "'" + spec.type + "' requires it",
                     spec.params, problems);
      }
      // A node without name or type was reported; keep its place so later paths stay right.
      yaml_checked.push_back(type != nullptr);
      config.nodes.push_back(std::move(spec));
    }
  }
  if (nodes_ok) {
    std::string rank_where = sampler.IsMap() && sampler["rank"].IsDefined()
                                 ? problems.where("sampler.rank", sampler["rank"].Mark())
                                 : "";
    check_config(config, registry, problems, device_where, type_where, yaml_checked, rank_where,
                 devices_where);
  }
  problems.throw_if_any();
  return config;
}

}  // namespace

PipelineConfig load_config_string(const std::string& yaml, const Registry& registry,
                                  const std::vector<std::string>& overrides,
                                  const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::ParserException& e) {
    throw ConfigError({SourceLoc{name, e.mark.line + 1, e.mark.column + 1}.str() +
                       ": invalid YAML (" + e.msg + ")"});
  }
  return parse(root, name, registry, overrides);
}

PipelineConfig load_config_file(const std::string& path, const Registry& registry,
                                const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ConfigError({path + ": cannot open config (" + std::strerror(errno) + ")"});
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return load_config_string(ss.str(), registry, overrides, path);
}

namespace {

/// Checks `pipeline:` and `sampler:` values set in C++ against the same schemas YAML is read with.
void check_options(const PipelineConfig& config, Problems& problems) {
  const Schema pipeline = pipeline_schema();
  const Schema sampler = sampler_schema();
  auto check = [&](const Schema& schema, const std::string& section, const std::string& key,
                   ParamValue value) {
    const std::string path = section + "." + key;
    auto it = config.option_locs.find(path);
    const std::string where =
        it != config.option_locs.end() && !it->second.file.empty() ? it->second.str() : config.file;
    check_value(value, *schema.find(key), path, where, problems);
  };
  auto i64 = [](auto v) { return ParamValue(static_cast<std::int64_t>(v)); };
  const PipelineOptions& o = config.pipeline;
  check(pipeline, "pipeline", "epochs", i64(o.epochs));
  // 0 means "the loader's size, else 64"; YAML cannot write it, C++ may leave it unset.
  if (o.batch_size != 0) check(pipeline, "pipeline", "batch_size", i64(o.batch_size));
  check(pipeline, "pipeline", "prefetch_depth", i64(o.prefetch_depth));
  check(pipeline, "pipeline", "device_id", i64(o.device_id));
  if (!o.devices.empty()) {
    check(pipeline, "pipeline", "devices",
          ParamValue(std::vector<std::int64_t>(o.devices.begin(), o.devices.end())));
  }
  check(pipeline, "pipeline", "threads", i64(o.threads));
  check(pipeline, "pipeline", "stall_timeout_s", ParamValue(o.stall_timeout_s));
  check(pipeline, "pipeline", "max_skipped", i64(o.max_skipped));
  const SamplerOptions& s = config.sampler;
  // A seed above INT64_MAX would wrap negative; clamp it so the range message shows it as large.
  check(sampler, "sampler", "seed",
        i64(std::min<std::uint64_t>(s.seed, std::numeric_limits<std::int64_t>::max())));
  check(sampler, "sampler", "rank", i64(s.rank));
  check(sampler, "sampler", "world", i64(s.world));
  // Node settings YAML checks with node_schema(); a C++-built node has not been through it.
  const Schema node = node_schema();
  for (std::size_t i = 0; i < config.nodes.size(); ++i) {
    const NodeSpec& n = config.nodes[i];
    const std::string path = "nodes[" + std::to_string(i) + "]";
    if (n.name.empty()) {
      problems.add_at(n.loc.str(), path + ".name", "missing required key (unique node name)");
    }
    check_value(ParamValue(static_cast<std::int64_t>(n.concurrency)), *node.find("concurrency"),
                path + ".concurrency", n.loc.str(), problems);
    check_value(ParamValue(static_cast<std::int64_t>(n.streams)), *node.find("streams"),
                path + ".streams", n.loc.str(), problems);
  }
}

}  // namespace

void validate_config(PipelineConfig& config, const Registry& registry) {
  if (config.file.empty()) config.file = "<c++>";
  Problems problems(config.file, {});
  for (auto& node : config.nodes) {
    if (node.loc.file.empty()) node.loc.file = config.file;
  }
  check_options(config, problems);
  auto devices_at = config.option_locs.find("pipeline.devices");
  check_config(config, registry, problems, config.file, {}, {}, "",
               devices_at != config.option_locs.end() ? devices_at->second.str() : config.file);
  problems.throw_if_any();
}

std::string describe_schema(const Registry& registry) {
  std::ostringstream os;
  auto print = [&](const Schema& schema, const std::string& indent) {
    for (const auto& p : schema.params()) {
      os << indent << p.name << " (" << param_type_name(p.type);
      if (p.required) os << ", required";
      if (const auto* b = std::get_if<bool>(&p.default_value))
        os << ", default " << (*b ? "true" : "false");
      if (const auto* i = std::get_if<std::int64_t>(&p.default_value)) os << ", default " << *i;
      if (const auto* d = std::get_if<double>(&p.default_value))
        os << ", default " << format_number(*d);
      if (const auto* s = std::get_if<std::string>(&p.default_value))
        os << ", default '" << *s << "'";
      if (const auto* l = std::get_if<std::vector<std::int64_t>>(&p.default_value)) {
        os << ", default [";
        for (std::size_t i = 0; i < l->size(); ++i) os << (i ? ", " : "") << (*l)[i];
        os << "]";
      }
      if (const auto* l = std::get_if<std::vector<double>>(&p.default_value)) {
        os << ", default [";
        for (std::size_t i = 0; i < l->size(); ++i) os << (i ? ", " : "") << format_number((*l)[i]);
        os << "]";
      }
      if (p.min || p.max) os << ", " << range_text(p);
      if (!p.choices.empty()) os << ", one of " << join(p.choices, "|");
      os << "): " << p.doc << "\n";
    }
  };
  os << "pipeline:\n";
  print(pipeline_schema(), "  ");
  os << "sampler:\n";
  print(sampler_schema(), "  ");
  os << "nodes[]:\n";
  print(node_schema(), "  ");
  os << "  params: the node type's params, below\n\nnode types:\n";
  for (const auto& name : registry.names()) {
    const NodeType* t = registry.find(name);
    os << "  " << name << " (" << role_name(t->role);
    if (t->backend == TypeBackend::cuda) os << ", cuda";
    if (t->unavailable) os << ", unavailable in this build";
    if (!t->counterpart.empty()) os << ", counterpart " << t->counterpart;
    os << "): " << t->doc << "\n";
    print(t->schema, "    ");
  }
  return os.str();
}

}  // namespace flowfeed
