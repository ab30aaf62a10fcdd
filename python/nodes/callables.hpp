#pragma once
/// \file
/// What a Python node's `callable` param names: an object a dict config passed (under a name the
/// pipeline generated), a name given to flowfeed.register(), or "package.module:function".
/// Everything here runs with the GIL held.

#include <cstddef>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "../interpreter.hpp"

namespace flowfeed::python {

/// The callable objects of one pipeline's dict config, by the names written into its config
/// text in their place. Owned (shared) by the pipeline's node types.
class CallableTable {
 public:
  /// Keeps `object` and returns the name the config uses for it, e.g. "<object 1: load_sample>".
  std::string add(py::object object);
  /// The object kept under `name`, or null.
  py::object find(const std::string& name) const;

 private:
  std::map<std::string, PyRef> objects_;
};

/// flowfeed.register(name, fn): makes `fn` (a function, or a Dataset-like object) available to
/// every config under `name`, replacing an earlier one. Throws std::invalid_argument for an
/// empty name or one with ':' (that form names "module:function").
void register_callable(const std::string& name, py::object fn);
/// Drops every registered callable (at the interpreter's exit).
void clear_registered_callables();

/// A `callable` resolved to its object.
struct ResolvedCallable {
  py::object object;    ///< as given or imported
  std::string display;  ///< how messages name it: "load_sample", "pkg.data:read", "MyData object"
};

/// Resolves `name`: `table`'s objects, then registered names, then "package.module:attr" (the
/// module imported, attr looked up, dots for nested attributes). Throws std::runtime_error with
/// the reason (no such name; the import's own error) when it cannot.
ResolvedCallable resolve_callable(const std::string& name, const CallableTable* table);

/// How a callable's failure reads in a message: "ValueError: bad value (at data.py:12 in
/// load)\nTraceback (most recent call last):\n  ...", from the exception now set (`e`).
std::string python_failure(const py::error_already_set& e);

/// Turns a Python dict with the YAML's structure into the JSON text of a config (JSON is YAML),
/// indented so that a position names a line. In each node of a python type, a `callable` that is
/// not a string goes into `table` and its generated name is written instead; a `layout` dict
/// ({"x": {"dtype": "uint8", "shape": [2, 3]}}) becomes the list form (["x: uint8 [2, 3]"]).
/// Throws py::type_error naming the key path of a value a config cannot hold.
std::string dict_config_text(const py::dict& config, CallableTable& table);

}  // namespace flowfeed::python
