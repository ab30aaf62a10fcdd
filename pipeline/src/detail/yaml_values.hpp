#pragma once
/// \file
/// YAML values read against a schema (private to flowfeed_pipeline): a value converted to its
/// spec's type and checked, a map read key by key, problems reported at YAML positions.

#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "detail/config_check.hpp"
#include "flowfeed/schema.hpp"

namespace flowfeed::detail {

/// Reports problems at YAML positions (or at the `--set` override that wrote the value).
class Reader {
 public:
  explicit Reader(Problems& problems) : problems_(problems) {}
  SourceLoc loc(const YAML::Mark& mark) const {
    if (mark.is_null()) return SourceLoc{problems_.file(), 0, 0};
    return SourceLoc{problems_.file(), mark.line + 1, mark.column + 1};
  }
  /// Where the value at `path` was written, kept with it for later checks (a node's own checks
  /// of its params): the `--set` override that wrote it (as the file, with no line), else `mark`.
  SourceLoc value_loc(const std::string& path, const YAML::Mark& mark) const {
    std::string by_override = problems_.override_at(path);
    if (!by_override.empty()) return SourceLoc{std::move(by_override), 0, 0};
    return loc(mark);
  }
  std::string where(const std::string& path, const YAML::Mark& mark) const {
    return problems_.where(path, loc(mark));
  }
  void add(const std::string& path, const YAML::Mark& mark, const std::string& what) {
    problems_.add_at(where(path, mark), path, what);
  }
  Problems& problems() { return problems_; }

 private:
  Problems& problems_;
};

/// How a value reads in a message: its quoted text, "a list", "a map" or "nothing".
std::string describe_scalar(const YAML::Node& n);
/// A number (integer or floating) from its text; false when it is not one.
bool parse_number_text(const std::string& text, double* out);
/// Converts one YAML value to its spec's type, then checks it (range, choices) with check_value.
/// Adds a problem and returns monostate when it is of the wrong type or fails a check.
ParamValue convert(const YAML::Node& value, const ParamSpec& spec, const std::string& path,
                   Reader& in);
/// Reads a YAML map against a schema into `out`: duplicate and unknown keys are reported, each
/// value converted and checked, then missing keys reported or defaulted (finish_section). Keys
/// in `extra` are allowed and skipped.
void validate_map(const YAML::Node& map, const Schema& schema, const std::string& path,
                  const std::string& required_why, Params& out, Reader& in,
                  const std::vector<std::string>& extra = {});

}  // namespace flowfeed::detail
