#pragma once
// Config validation's shared parts: the schemas of the fixed sections, the problem collector, the
// one set of value checks that every value goes through (from YAML, `--set` or C++), and the
// key-to-member tables of the `pipeline:` and `sampler:` sections.

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/schema.hpp"

namespace flowfeed::detail {

/// The `pipeline:` section's keys.
const Schema& pipeline_schema();
/// The `sampler:` section's keys.
const Schema& sampler_schema();
/// The keys of a `nodes[]` entry (its params are the type's schema).
const Schema& node_schema();

/// Collects problems, each tied to a key path and a position; thrown together as one ConfigError.
class Problems {
 public:
  /// `overrides`: canonical key path -> `key=value` as typed after `--set`.
  Problems(std::string file, std::map<std::string, std::string> overrides)
      : file_(std::move(file)), overrides_(std::move(overrides)) {}

  /// Adds "where: path: what" (no path part when `path` is empty).
  void add_at(const std::string& where, const std::string& path, const std::string& what);
  /// Where the value at `path` came from: "--set key=value" when an override wrote it, else `loc`.
  std::string where(const std::string& path, const SourceLoc& loc) const;
  /// "--set key=value" when an override wrote the value at `path` (or a map above it), else "".
  std::string override_at(const std::string& path) const;
  void throw_if_any() const;
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  std::map<std::string, std::string> overrides_;
  std::vector<std::string> lines_;
  std::size_t unlisted_ = 0;  ///< problems past ConfigError::kMaxListedProblems
};

/// A number as messages print it (integers without a fraction).
std::string format_number(double v);
/// "must be between 1 and 8", "must be at least 1", ...
std::string range_text(const ParamSpec& spec);
/// The text after "unknown key" for `key` among `known` (a did-you-mean, or the keys known).
std::string unknown_key(const std::string& key, const std::vector<std::string>& known);
/// The names of a schema's keys, in declaration order.
std::vector<std::string> key_names(const Schema& schema);

/// Checks one number against the spec's range: "N is out of range (must be ...)". True: in range.
bool check_range(double x, const ParamSpec& spec, const std::string& path, const std::string& where,
                 Problems& problems);
/// The same for an int, quoted exactly as written (9223372036854775807, not 9.22337e+18).
bool check_range(std::int64_t x, const ParamSpec& spec, const std::string& path,
                 const std::string& where, Problems& problems);
/// Checks a value against its spec: its type (a mismatch quotes what was given), range and
/// choices. Every value of a config goes through it, whichever way it was written. True: valid.
bool check_value(const ParamValue& v, const ParamSpec& spec, const std::string& path,
                 const std::string& where, Problems& problems);
/// After a section's keys were checked: reports each required key missing from `values` (at
/// `where(key path)`; `required_why` when the key has no doc) and fills the defaults of the
/// others. Keys in `written` were there but invalid: neither missing nor defaulted.
void finish_section(Params& values, const Schema& schema, const std::string& path,
                    const std::function<std::string(const std::string&)>& where,
                    const std::string& required_why, Problems& problems,
                    const std::vector<std::string>& written = {});
/// Checks a node's params written in C++ (or kept across a type swap) against its type's schema
/// with check_value and finish_section, as YAML's are.
void check_params(NodeSpec& node, const Schema& schema, const std::string& path,
                  Problems& problems);

/// One key of a fixed section and the member it lands in: `set` stores a checked value, `get`
/// reads the member back as a value to check (nothing: unset, e.g. batch_size 0).
struct OptionField {
  const char* key;
  std::function<void(PipelineConfig&, const ParamValue&)> set;
  std::function<std::optional<ParamValue>(const PipelineConfig&)> get;
};
/// The `pipeline:` keys and their members (`devices` is read apart: it may be `all`).
const std::vector<OptionField>& pipeline_fields();
/// The `sampler:` keys and their members.
const std::vector<OptionField>& sampler_fields();
/// The keys of a `nodes[]` entry and their NodeSpec members.
struct NodeField {
  const char* key;
  std::function<void(NodeSpec&, const ParamValue&)> set;
  std::function<ParamValue(const NodeSpec&)> get;
};
const std::vector<NodeField>& node_fields();

/// Resolves the device, swaps types to their counterparts, checks the chain, every node's params
/// and the cross-key rules. The `*_where` arguments name where YAML wrote a key (empty: the
/// config's file or the C++ call that set it); `yaml_checked[i]`: node i's params were checked
/// while YAML was read.
struct Positions {
  std::string device;
  std::vector<std::string> type;
  std::vector<bool> yaml_checked;
  std::string rank;
  std::string devices;
  /// Where the key at a path (e.g. "sampler.shuffle") was written, for the problems node types
  /// find (NodeType::check); unset: the C++ call that set it, else the config's file.
  std::function<std::string(const std::string& path)> locate;
};
void check_config(PipelineConfig& config, const Registry& registry, Problems& problems,
                  const Positions& at);

}  // namespace flowfeed::detail
