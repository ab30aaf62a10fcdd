#include "callables.hpp"

#include <stdexcept>
#include <vector>

namespace flowfeed::python {

namespace {

std::map<std::string, PyRef>& registered() {
  static auto* names = new std::map<std::string, PyRef>();  // emptied at exit, never destroyed
  return *names;
}

std::string display_name(const py::handle& object) {
  if (py::hasattr(object, "__qualname__")) return py::str(object.attr("__qualname__"));
  return py::str(py::type::handle_of(object).attr("__name__")).cast<std::string>() + " object";
}

bool is_python_node(const py::handle& type) {
  if (!py::isinstance<py::str>(type)) return false;
  const auto t = type.cast<std::string>();
  return t == "python" || t == "python_transform" || t == "python_iterable";
}

std::string key_text(const py::handle& key) {
  return py::isinstance<py::str>(key) ? "'" + key.cast<std::string>() + "'"
                                      : py::repr(key).cast<std::string>();
}

[[noreturn]] void not_writable(const std::string& path, const py::handle& value) {
  throw py::type_error(
      path + ": a " + py::str(py::type::handle_of(value).attr("__name__")).cast<std::string>() +
      " cannot be written in a config (dicts, lists, str, int, float, bool and None; a callable "
      "object only as the params.callable of a python, python_transform or python_iterable node)");
}

py::object plain(const py::handle& value, const std::string& path);

py::object layout_list(const py::handle& layout, const std::string& path) {
  if (!py::isinstance<py::dict>(layout)) return plain(layout, path);
  py::list out;
  for (const auto& [name, entry] : layout.cast<py::dict>()) {
    const std::string at = path + "[" + key_text(name) + "]";
    if (!py::isinstance<py::str>(name)) throw py::type_error(at + ": a tensor name is a str");
    if (!py::isinstance<py::dict>(entry) || !entry.cast<py::dict>().contains("dtype")) {
      throw py::type_error(at + ": a tensor is {\"dtype\": \"uint8\", \"shape\": [224, 224, 3]}");
    }
    const py::dict spec = entry.cast<py::dict>();
    std::string shape = "[";
    if (spec.contains("shape")) {
      bool first = true;
      for (const auto& d : spec["shape"]) {
        shape += (first ? "" : ", ") + py::str(d).cast<std::string>();
        first = false;
      }
    }
    out.append(name.cast<std::string>() + ": " + py::str(spec["dtype"]).cast<std::string>() + " " +
               shape + "]");
  }
  return out;
}

py::object plain(const py::handle& value, const std::string& path) {
  if (value.is_none() || py::isinstance<py::str>(value) || PyBool_Check(value.ptr()) ||
      PyLong_CheckExact(value.ptr()) || PyFloat_Check(value.ptr())) {
    return py::reinterpret_borrow<py::object>(value);
  }
  if (py::isinstance<py::dict>(value)) {
    py::dict out;
    for (const auto& [key, item] : value.cast<py::dict>()) {
      if (!py::isinstance<py::str>(key)) {
        throw py::type_error(path + ": key " + key_text(key) + " is not a str");
      }
      out[key] = plain(item, path + "[" + key_text(key) + "]");
    }
    return out;
  }
  if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    py::list out;
    std::size_t i = 0;
    for (const auto& item : value) out.append(plain(item, path + "[" + std::to_string(i++) + "]"));
    return out;
  }
  if (PyIndex_Check(value.ptr()))
    return py::reinterpret_steal<py::object>(PyNumber_Index(value.ptr()));
  if (py::hasattr(value, "__fspath__")) return py::module_::import("os").attr("fspath")(value);
  not_writable(path, value);
}

}  // namespace

std::string CallableTable::add(py::object object) {
  const std::string name =
      "<object " + std::to_string(objects_.size() + 1) + ": " + display_name(object) + ">";
  objects_.emplace(name, PyRef(std::move(object)));
  return name;
}

py::object CallableTable::find(const std::string& name) const {
  auto it = objects_.find(name);
  return it == objects_.end() ? py::object() : it->second.get();
}

void register_callable(const std::string& name, py::object fn) {
  if (name.empty() || name.find(':') != std::string::npos) {
    throw std::invalid_argument("flowfeed.register: '" + name +
                                "' cannot name a callable (a name is not empty and has no ':', "
                                "which marks 'package.module:function')");
  }
  registered()[name] = PyRef(std::move(fn));
}

void clear_registered_callables() {
  registered().clear();
}

ResolvedCallable resolve_callable(const std::string& name, const CallableTable* table) {
  if (table) {
    if (py::object object = table->find(name)) return {object, display_name(object)};
  }
  auto it = registered().find(name);
  if (it != registered().end()) return {it->second.get(), name};
  const auto colon = name.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == name.size()) {
    std::string names;
    for (const auto& [n, ref] : registered()) names += (names.empty() ? "" : ", ") + n;
    throw std::runtime_error("'" + name +
                             "' is neither a name given to flowfeed.register() (registered: " +
                             (names.empty() ? "none" : names) + ") nor 'package.module:function'");
  }
  const std::string module = name.substr(0, colon);
  py::object object;
  try {
    object = py::module_::import(module.c_str());
  } catch (const py::error_already_set& e) {
    throw std::runtime_error(
        "'" + name + "': importing " + module +
        " failed: " + py::str(py::type::handle_of(e.value()).attr("__name__")).cast<std::string>() +
        ": " + py::str(e.value()).cast<std::string>());
  }
  std::string path = module;
  std::size_t at = colon + 1;
  while (at <= name.size()) {
    const auto dot = std::min(name.find('.', at), name.size());
    const std::string attr = name.substr(at, dot - at);
    if (!py::hasattr(object, attr.c_str())) {
      throw std::runtime_error("'" + name + "': " + path + " has no attribute '" + attr + "'");
    }
    object = object.attr(attr.c_str());
    path += (path == module ? ":" : ".") + attr;
    at = dot + 1;
  }
  return {object, name};
}

std::string python_failure(const py::error_already_set& e) {
  try {
    py::module_ traceback = py::module_::import("traceback");
    const std::string type =
        py::str(py::type::handle_of(e.value()).attr("__name__")).cast<std::string>();
    std::string head = type;
    const std::string text = py::str(e.value()).cast<std::string>();
    if (!text.empty()) head += ": " + text;
    if (e.trace()) {
      py::list frames = traceback.attr("extract_tb")(e.trace());
      if (!frames.empty()) {
        py::object last = frames[frames.size() - 1];
        head += " (at " + py::str(last.attr("filename")).cast<std::string>() + ":" +
                py::str(last.attr("lineno")).cast<std::string>() + " in " +
                py::str(last.attr("name")).cast<std::string>() + ")";
      }
    }
    std::string trace;
    for (const auto& line : traceback.attr("format_exception")(e.type(), e.value(), e.trace())) {
      trace += line.cast<std::string>();
    }
    while (!trace.empty() && trace.back() == '\n') trace.pop_back();
    return head + "\n" + trace;
  } catch (...) {
    return e.what();
  }
}

std::string dict_config_text(const py::dict& config, CallableTable& table) {
  py::dict converted;
  for (const auto& [key, value] : config) {
    if (!py::isinstance<py::str>(key)) {
      throw py::type_error("config: key " + key_text(key) + " is not a str");
    }
    const std::string section = key.cast<std::string>();
    const std::string path = "config[" + key_text(key) + "]";
    if (section != "nodes" ||
        !(py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value))) {
      converted[key] = plain(value, path);
      continue;
    }
    py::list nodes;
    std::size_t i = 0;
    for (const auto& node : value) {
      const std::string at = path + "[" + std::to_string(i++) + "]";
      if (!py::isinstance<py::dict>(node)) {
        nodes.append(plain(node, at));
        continue;
      }
      const py::dict n = node.cast<py::dict>();
      const bool python = n.contains("type") && is_python_node(n["type"]);
      py::dict out;
      for (const auto& [k, v] : n) {
        const std::string kat = at + "[" + key_text(k) + "]";
        if (!python || !py::isinstance<py::str>(k) || k.cast<std::string>() != "params" ||
            !py::isinstance<py::dict>(v)) {
          if (!py::isinstance<py::str>(k)) throw py::type_error(kat + ": key is not a str");
          out[k] = plain(v, kat);
          continue;
        }
        py::dict params;
        for (const auto& [pk, pv] : v.cast<py::dict>()) {
          const std::string pat = kat + "[" + key_text(pk) + "]";
          const std::string pname = py::isinstance<py::str>(pk) ? pk.cast<std::string>() : "";
          if (pname == "callable" && !py::isinstance<py::str>(pv)) {
            params[pk] = table.add(py::reinterpret_borrow<py::object>(pv));
          } else if (pname == "layout") {
            params[pk] = layout_list(pv, pat);
          } else {
            params[pk] = plain(pv, pat);
          }
        }
        out[k] = params;
      }
      nodes.append(out);
    }
    converted[key] = nodes;
  }
  return py::module_::import("json")
             .attr("dumps")(converted, py::arg("indent") = 2)
             .cast<std::string>() +
         "\n";
}

}  // namespace flowfeed::python
