// YAML values read against a schema: scalars converted to the schema's types (a value of the
// wrong type is reported with its position), checked like values set in C++, and maps read key by
// key (duplicates and unknown keys reported, missing ones defaulted).

#include "detail/yaml_values.hpp"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "detail/config_check.hpp"
#include "detail/config_yaml.hpp"
#include "detail/text.hpp"

namespace flowfeed::detail {

std::string describe_scalar(const YAML::Node& n) {
  if (n.IsNull()) return "nothing";
  if (n.IsScalar()) return detail::quoted(n.Scalar());
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "an undefined value";
}

namespace {

bool parse_int_text(const std::string& text, std::int64_t* out, std::string* why) {
  const char* b = text.data();
  const char* e = b + text.size();
  const char* digits = (b != e && (*b == '-' || *b == '+')) ? b + 1 : b;
  if (digits != e && *digits == '0' && e - digits > 1) {
    // 010 (octal to YAML 1.1) is said so; 0x10, 0o17 and 0.5 are no ints here, and not octal.
    const char second = digits[1];
    if (second == 'x' || second == 'X' || second == 'o' || second == 'O' || second == 'b' ||
        second == 'B') {
      *why = " (hexadecimal, octal and binary forms are not read) write it in decimal";
    } else if (std::all_of(digits, e, [](char c) { return c >= '0' && c <= '9'; })) {
      *why = " (a leading zero would make YAML read it as octal) write it without the zero";
    }
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

}  // namespace

bool parse_number_text(const std::string& text, double* out) {
  if (text.empty()) return false;
  const char* b = text.data();
  const char* e = b + text.size();
  if (*b == '+') ++b;
  auto [p, ec] = std::from_chars(b, e, *out);
  return ec == std::errc() && p == e && std::isfinite(*out);
}

namespace {

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

/// "expected <what>, got <the value>" at `path`, where `got` is.
ParamValue expected_at(Reader& in, const std::string& path, const char* what, const YAML::Node& got,
                       const std::string& why = "") {
  in.add(path, got.Mark(), std::string("expected ") + what + ", got " + describe_scalar(got) + why);
  return ParamValue{};
}

/// A list of `T` (`list`, e.g. "a list of ints"), each item (`item`, "an int") parsed by `parse`
/// and checked against the spec's range at its own position; every bad item is reported.
template <typename T, typename Parse>
ParamValue read_list(const YAML::Node& value, const ParamSpec& spec, const std::string& path,
                     Reader& in, const char* list, const char* item_what, Parse parse) {
  if (!value.IsSequence()) return expected_at(in, path, list, value);
  std::vector<T> out;
  bool ok = true;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const YAML::Node item = value[i];
    const std::string item_path = path + "[" + std::to_string(i) + "]";
    T x;
    std::string why;
    if (!item.IsScalar() || !parse(item.Scalar(), &x, &why)) {
      expected_at(in, item_path, item_what, item, why);
      ok = false;
    } else if (check_range(x, spec, item_path, in.where(item_path, item.Mark()), in.problems())) {
      out.push_back(x);
    } else {
      ok = false;
    }
  }
  if (!ok) return {};
  return out;
}

/// `value` as parse(text, &x) reads it, when it is a scalar that `parse` accepts.
template <class T, class Parse>
std::optional<T> scalar(const YAML::Node& value, Parse parse) {
  T x;
  if (!value.IsScalar() || !parse(value.Scalar(), &x)) return std::nullopt;
  return x;
}

}  // namespace

/// Converts one YAML value to its spec's type, then checks it (range, choices) with check_value.
/// Adds a problem and returns monostate when it is of the wrong type or fails a check.
ParamValue convert(const YAML::Node& value, const ParamSpec& spec, const std::string& path,
                   Reader& in) {
  const YAML::Mark mark = value.Mark();
  if (value.IsNull() || (value.IsScalar() && value.Scalar() == "~")) {
    in.add(path, mark, std::string("missing value (expected ") + param_type_name(spec.type) + ")");
    return {};
  }
  auto expected = [&](const std::string& item_path, const char* what, const YAML::Node& got,
                      const std::string& why = "") {
    return expected_at(in, item_path, what, got, why);
  };
  ParamValue v;
  if (spec.or_auto && value.IsScalar() && value.Scalar() == "auto") return std::string("auto");
  switch (spec.type) {
    case ParamType::boolean:
      if (const auto b = scalar<bool>(value, parse_bool_text)) {
        v = *b;
        break;
      }
      return expected(path, "true or false", value);
    case ParamType::integer: {
      std::int64_t i;
      std::string why;
      if (!value.IsScalar() || !parse_int_text(value.Scalar(), &i, &why)) {
        return expected(path, spec.or_auto ? "an int or auto" : "an int", value, why);
      }
      v = i;
      break;
    }
    case ParamType::number:
      if (const auto d = scalar<double>(value, parse_number_text)) {
        v = *d;
        break;
      }
      return expected(path, "a number", value);
    case ParamType::string:
      if (!value.IsScalar()) return expected(path, "a string", value);
      v = value.Scalar();
      break;
    case ParamType::int_list:
      return read_list<std::int64_t>(value, spec, path, in, "a list of ints", "an int",
                                     [](const std::string& text, std::int64_t* x,
                                        std::string* why) { return parse_int_text(text, x, why); });
    case ParamType::string_list: {
      if (value.IsScalar()) {
        v = value.Scalar();
        break;
      }
      if (!value.IsSequence() || value.size() == 0) {
        return expected(path, "a string or a non-empty list of strings", value);
      }
      std::vector<std::string> out;
      for (std::size_t i = 0; i < value.size(); ++i) {
        const YAML::Node item = value[i];
        if (!item.IsScalar()) {
          return expected(path + "[" + std::to_string(i) + "]", "a string", item);
        }
        out.push_back(item.Scalar());
      }
      v = std::move(out);
      break;
    }
    case ParamType::number_list:
      return read_list<double>(value, spec, path, in, "a list of numbers", "a number",
                               [](const std::string& text, double* x, std::string*) {
                                 return parse_number_text(text, x);
                               });
  }
  if (!check_value(v, spec, path, in.where(path, mark), in.problems())) return {};
  return v;
}

/// Reads a YAML map against a schema into `out`: duplicate and unknown keys are reported, each
/// value converted and checked, then missing keys reported or defaulted (finish_section). Keys
/// in `extra` are allowed and skipped.
void validate_map(const YAML::Node& map, const Schema& schema, const std::string& path,
                  const std::string& required_why, Params& out, Reader& in,
                  const std::vector<std::string>& extra) {
  std::map<std::string, YAML::Mark> first_at;
  std::vector<std::string> known = key_names(schema);
  for (const auto& e : extra) {
    if (!schema.find(e)) known.push_back(e);
  }
  std::vector<std::string> written;
  if (map.IsDefined() && !map.IsNull()) {
    for (auto it = map.begin(); it != map.end(); ++it) {
      const std::string key = it->first.Scalar();
      const std::string key_path = path.empty() ? shortened(key) : path + "." + shortened(key);
      if (first_at.count(key)) {
        const YAML::Mark& f = first_at[key];
        in.add(key_path, it->first.Mark(),
               "duplicate key (first at line " + std::to_string(f.line + 1) +
                   "; YAML would silently keep the first) remove one");
        continue;
      }
      first_at[key] = it->first.Mark();
      if (std::find(extra.begin(), extra.end(), key) != extra.end()) continue;
      const ParamSpec* spec = schema.find(key);
      if (!spec) {
        in.add(key_path, it->first.Mark(), unknown_key(key, known));
        continue;
      }
      written.push_back(key);
      ParamValue v = convert(it->second, *spec, key_path, in);
      if (!std::holds_alternative<std::monostate>(v)) {
        out.set(key, std::move(v), in.value_loc(key_path, it->second.Mark()));
      }
    }
  }
  const YAML::Mark at = map.IsDefined() ? map.Mark() : YAML::Mark::null_mark();
  finish_section(
      out, schema, path, [&](const std::string& key_path) { return in.where(key_path, at); },
      required_why, in.problems(), written);
}

}  // namespace flowfeed::detail
