#pragma once
/// \file
/// Parameters of a node type: their declared schema and their validated values.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "flowfeed/error.hpp"

namespace flowfeed {

/// The type of a parameter.
enum class ParamType { boolean, integer, number, string, int_list };
/// "bool", "int", "number", "string" or "list of int".
const char* param_type_name(ParamType type) noexcept;

/// A parameter's value: one of the ParamType alternatives (monostate = unset).
using ParamValue = std::variant<std::monostate, bool, std::int64_t, double, std::string,
                                std::vector<std::int64_t>>;

/// The declaration of one parameter: its name, type, default, allowed range or choices and doc.
struct ParamSpec {
  std::string name;
  ParamType type = ParamType::integer;
  ParamValue default_value;  ///< monostate: no default (the param is optional unless `required`)
  bool required = false;
  std::optional<double> min, max;    ///< inclusive range for int/number (and for int_list items)
  std::vector<std::string> choices;  ///< allowed values for a string; empty = any
  std::string doc;

  /// Fluent setters, so schemas read as one declaration per line.
  ParamSpec& range(double lo, double hi) {
    min = lo;
    max = hi;
    return *this;
  }
  ParamSpec& at_least(double lo) {
    min = lo;
    return *this;
  }
  ParamSpec& one_of(std::vector<std::string> values) {
    choices = std::move(values);
    return *this;
  }
  ParamSpec& make_required() {
    required = true;
    return *this;
  }
};

/// The parameters a node type accepts. Unknown keys, missing required ones, wrong types, values
/// out of range and strings outside `choices` are config errors, reported with the key's position.
class Schema {
 public:
  ParamSpec& add_bool(std::string name, std::string doc, std::optional<bool> def = std::nullopt);
  ParamSpec& add_int(std::string name, std::string doc,
                     std::optional<std::int64_t> def = std::nullopt);
  ParamSpec& add_number(std::string name, std::string doc,
                        std::optional<double> def = std::nullopt);
  ParamSpec& add_string(std::string name, std::string doc,
                        std::optional<std::string> def = std::nullopt);
  ParamSpec& add_int_list(std::string name, std::string doc,
                          std::optional<std::vector<std::int64_t>> def = std::nullopt);

  const std::vector<ParamSpec>& params() const noexcept { return params_; }
  /// The spec called `name`, or null.
  const ParamSpec* find(const std::string& name) const noexcept;

 private:
  ParamSpec& add(ParamSpec spec);
  std::vector<ParamSpec> params_;
};

/// Validated parameter values of one node, each with the place it was written. After validation
/// every declared parameter with a default is present; getters for a missing or mistyped value
/// throw std::logic_error (a node asked for a parameter its schema does not declare).
class Params {
 public:
  void set(const std::string& name, ParamValue value, SourceLoc loc = {});
  bool has(const std::string& name) const noexcept;
  bool get_bool(const std::string& name) const;
  std::int64_t get_int(const std::string& name) const;
  /// Accepts an integer value too.
  double get_number(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  const std::vector<std::int64_t>& get_int_list(const std::string& name) const;
  /// Where the value was written (empty file when it came from a default or from C++).
  SourceLoc loc(const std::string& name) const;
  const std::map<std::string, ParamValue>& values() const noexcept { return values_; }

 private:
  const ParamValue& at(const std::string& name) const;
  std::map<std::string, ParamValue> values_;
  std::map<std::string, SourceLoc> locs_;
};

}  // namespace flowfeed
