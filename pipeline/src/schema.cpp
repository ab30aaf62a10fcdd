#include "flowfeed/schema.hpp"

#include <stdexcept>

namespace flowfeed {

const char* param_type_name(ParamType type) noexcept {
  switch (type) {
    case ParamType::boolean: return "bool";
    case ParamType::integer: return "int";
    case ParamType::number: return "number";
    case ParamType::string: return "string";
    case ParamType::int_list: return "list of int";
    case ParamType::string_list: return "string or list of strings";
    case ParamType::number_list: return "list of number";
  }
  return "?";
}

namespace {

/// A param of `type` named `name`, with its default when `def` holds one.
template <typename T>
ParamSpec typed_spec(std::string name, std::string doc, ParamType type, std::optional<T> def) {
  ParamSpec s{std::move(name), type, {}, false, {}, {}, {}, std::move(doc)};
  if (def) s.default_value = std::move(*def);
  return s;
}

}  // namespace

ParamSpec& Schema::add(ParamSpec spec) {
  for (const auto& p : params_) {
    if (p.name == spec.name)
      throw std::invalid_argument("param '" + spec.name + "' declared twice");
  }
  params_.push_back(std::move(spec));
  return params_.back();
}

ParamSpec& Schema::add_bool(std::string name, std::string doc, std::optional<bool> def) {
  return add(typed_spec(std::move(name), std::move(doc), ParamType::boolean, std::move(def)));
}

ParamSpec& Schema::add_int(std::string name, std::string doc, std::optional<std::int64_t> def) {
  return add(typed_spec(std::move(name), std::move(doc), ParamType::integer, std::move(def)));
}

ParamSpec& Schema::add_number(std::string name, std::string doc, std::optional<double> def) {
  return add(typed_spec(std::move(name), std::move(doc), ParamType::number, std::move(def)));
}

ParamSpec& Schema::add_string(std::string name, std::string doc, std::optional<std::string> def) {
  return add(typed_spec(std::move(name), std::move(doc), ParamType::string, std::move(def)));
}

ParamSpec& Schema::add_int_list(std::string name, std::string doc,
                                std::optional<std::vector<std::int64_t>> def) {
  return add(typed_spec(std::move(name), std::move(doc), ParamType::int_list, std::move(def)));
}

ParamSpec& Schema::add_string_list(std::string name, std::string doc,
                                   std::optional<std::vector<std::string>> def) {
  return add(typed_spec(std::move(name), std::move(doc), ParamType::string_list, std::move(def)));
}

ParamSpec& Schema::add_number_list(std::string name, std::string doc,
                                   std::optional<std::vector<double>> def) {
  return add(typed_spec(std::move(name), std::move(doc), ParamType::number_list, std::move(def)));
}

const ParamSpec* Schema::find(const std::string& name) const noexcept {
  for (const auto& p : params_) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

void Params::set(const std::string& name, ParamValue value, SourceLoc loc) {
  values_[name] = std::move(value);
  locs_[name] = std::move(loc);
}

bool Params::has(const std::string& name) const noexcept {
  auto it = values_.find(name);
  return it != values_.end() && !std::holds_alternative<std::monostate>(it->second);
}

const ParamValue& Params::at(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end() || std::holds_alternative<std::monostate>(it->second)) {
    throw std::logic_error("param '" + name + "' is not set (is it declared in the schema?)");
  }
  return it->second;
}

namespace {
template <class T>
const T& get_as(const ParamValue& v, const std::string& name, const char* type) {
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw std::logic_error("param '" + name + "' is not a " + type);
}
}  // namespace

bool Params::get_bool(const std::string& name) const {
  return get_as<bool>(at(name), name, "bool");
}
std::int64_t Params::get_int(const std::string& name) const {
  return get_as<std::int64_t>(at(name), name, "int");
}
double Params::get_number(const std::string& name) const {
  const ParamValue& v = at(name);
  if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<double>(*i);
  return get_as<double>(v, name, "number");
}
const std::string& Params::get_string(const std::string& name) const {
  return get_as<std::string>(at(name), name, "string");
}
const std::vector<std::int64_t>& Params::get_int_list(const std::string& name) const {
  return get_as<std::vector<std::int64_t>>(at(name), name, "list of int");
}
std::vector<std::string> Params::get_string_list(const std::string& name) const {
  const ParamValue& v = at(name);
  if (const auto* s = std::get_if<std::string>(&v)) return {*s};
  return get_as<std::vector<std::string>>(v, name, "string or list of strings");
}
const std::vector<double>& Params::get_number_list(const std::string& name) const {
  return get_as<std::vector<double>>(at(name), name, "list of number");
}
SourceLoc Params::loc(const std::string& name) const {
  auto it = locs_.find(name);
  return it == locs_.end() ? SourceLoc{} : it->second;
}

}  // namespace flowfeed
