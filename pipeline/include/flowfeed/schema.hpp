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
enum class ParamType { boolean, integer, number, string, int_list, string_list, number_list };
/// "bool", "int", "number", "string", "list of int", "string or list of strings" or "list of
/// number".
const char* param_type_name(ParamType type) noexcept;

/// A parameter's value: one of the ParamType alternatives (monostate = unset).
using ParamValue =
    std::variant<std::monostate, bool, std::int64_t, double, std::string, std::vector<std::int64_t>,
                 std::vector<std::string>, std::vector<double>>;

/// The declaration of one parameter: its name, type, default, allowed range or choices and doc.
struct ParamSpec {
  std::string name;                     ///< the key under `params:`
  ParamType type = ParamType::integer;  ///< what a value must be
  ParamValue default_value;  ///< monostate: no default (the param is optional unless `required`)
  bool required = false;     ///< a config that leaves it out is an error
  std::optional<double> min, max;    ///< inclusive range for int/number (and for list items)
  std::vector<std::string> choices;  ///< allowed values for a string; empty = any
  std::string doc;       ///< one line for users; also the "why" of a missing required key
  bool or_auto = false;  ///< an int that may also be the string `auto` (the tuner picks it)

  /// Fluent setters, so schemas read as one declaration per line. Sets an inclusive range.
  ParamSpec& range(double lo, double hi) {
    min = lo;
    max = hi;
    return *this;
  }
  /// Sets an inclusive lower bound.
  ParamSpec& at_least(double lo) {
    min = lo;
    return *this;
  }
  /// Restricts a string to these values (messages suggest the closest).
  ParamSpec& one_of(std::vector<std::string> values) {
    choices = std::move(values);
    return *this;
  }
  /// Lets an int be written `auto` too (pipeline.prefetch_depth, nodes[].concurrency).
  ParamSpec& allow_auto() {
    or_auto = true;
    return *this;
  }
  /// Makes the param required (it then needs no default).
  ParamSpec& make_required() {
    required = true;
    return *this;
  }
};

/// The parameters a node type accepts. Unknown keys, missing required ones, wrong types, values
/// out of range and strings outside `choices` are config errors, reported with the key's position.
class Schema {
 public:
  /// Declares a bool param (`def`: its default, none when nullopt); returns the spec to refine.
  /// Every add_ throws std::invalid_argument when `name` is declared twice.
  ParamSpec& add_bool(std::string name, std::string doc, std::optional<bool> def = std::nullopt);
  /// Declares an int param.
  ParamSpec& add_int(std::string name, std::string doc,
                     std::optional<std::int64_t> def = std::nullopt);
  /// Declares a number param (an int value is accepted too).
  ParamSpec& add_number(std::string name, std::string doc,
                        std::optional<double> def = std::nullopt);
  /// Declares a string param.
  ParamSpec& add_string(std::string name, std::string doc,
                        std::optional<std::string> def = std::nullopt);
  /// Declares a list-of-int param (`range` bounds each item).
  ParamSpec& add_int_list(std::string name, std::string doc,
                          std::optional<std::vector<std::int64_t>> def = std::nullopt);
  /// Declares a param that takes one string or a list of strings (e.g. file paths or globs); a
  /// single string reads as a list of one.
  ParamSpec& add_string_list(std::string name, std::string doc,
                             std::optional<std::vector<std::string>> def = std::nullopt);
  /// Declares a list-of-number param (`range` bounds each item; YAML ints are accepted).
  ParamSpec& add_number_list(std::string name, std::string doc,
                             std::optional<std::vector<double>> def = std::nullopt);

  /// Every declared param, in declaration order.
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
  /// Sets a value and where it was written (validation checks it against the schema).
  void set(const std::string& name, ParamValue value, SourceLoc loc = {});
  /// True when `name` has a value (given, or a default).
  bool has(const std::string& name) const noexcept;
  /// The bool value of `name`.
  bool get_bool(const std::string& name) const;
  /// The int value of `name`.
  std::int64_t get_int(const std::string& name) const;
  /// Accepts an integer value too.
  double get_number(const std::string& name) const;
  /// The string value of `name`.
  const std::string& get_string(const std::string& name) const;
  /// The list-of-int value of `name`.
  const std::vector<std::int64_t>& get_int_list(const std::string& name) const;
  /// The strings of a string-list param (a single string gives a list of one).
  std::vector<std::string> get_string_list(const std::string& name) const;
  /// The list-of-number value of `name`.
  const std::vector<double>& get_number_list(const std::string& name) const;
  /// Where the value was written (the PipelineBuilder call for C++; empty file for a default).
  SourceLoc loc(const std::string& name) const;
  /// Every value by name.
  const std::map<std::string, ParamValue>& values() const noexcept { return values_; }

 private:
  const ParamValue& at(const std::string& name) const;
  std::map<std::string, ParamValue> values_;
  std::map<std::string, SourceLoc> locs_;
};

}  // namespace flowfeed
