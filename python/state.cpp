// Pipeline.state_dict() and Pipeline.load_state_dict(): the resume cursor (docs/RESUME.md) and the
// nodes' saved states as plain Python values, picklable, so that a training loop keeps them beside
// its model (torch.save). The fields are those of a checkpoint's manifest, checked as strictly.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <optional>
#include <string>

#include "bindings.hpp"

namespace flowfeed::python {

namespace {

constexpr const char* kFormat = "flowfeed state";
constexpr const char* kWhere = "state_dict";

/// Reads the fields of a state dict; every problem is a ConfigError naming the field, as a
/// checkpoint file's are: `state_dict: cursor.world: 0 is out of range (1 to 16777216)`.
class StateFields final : public CursorFields {
 public:
  explicit StateFields(const py::handle& root) : root_(root) {}

  std::string noun() const override { return "state"; }
  std::string remedy() const override { return kRemedy; }
  std::string other_kind_remedy() const override { return kRemedy; }
  std::string newer_remedy() const override { return "load it with the flowfeed that made it"; }
  [[noreturn]] void fail(const std::string& key, const std::string& problem) const override {
    fail_at(key, problem);
  }
  [[noreturn]] static void fail_at(const std::string& key, const std::string& problem) {
    throw ConfigError({fmt::format("{}: {}: {}", kWhere, key, problem)});
  }
  [[noreturn]] static void corrupt(const std::string& key, const char* what, const py::handle& v) {
    fail_at(key, fmt::format("expected {}, found {} (the state is corrupt or not one that "
                             "Pipeline.state_dict() returned) load a state it returned",
                             what, shown_value(v)));
  }
  static std::string shown_value(const py::handle& v) {
    return fmt::format("{} ({})", py::repr(v).cast<std::string>(),
                       py::str(py::type::of(v).attr("__name__")).cast<std::string>());
  }
  std::string shown(const std::string& key) const override {
    const py::handle v = find(key);
    return v ? py::repr(v).cast<std::string>() : std::string("nothing");
  }
  std::string quoted(const std::string& text) const override {
    return py::repr(py::str(text)).cast<std::string>();
  }
  /// The value at a dotted key ("cursor.epoch"), through dicts.
  py::handle at(const std::string& key) const {
    const py::handle v = find(key);
    if (!v) {
      fail(key,
           "missing (the state is incomplete or not one that Pipeline.state_dict() returned) "
           "load a state it returned");
    }
    return v;
  }
  std::uint64_t count(const std::string& key) const override {
    const py::handle v = at(key);
    const std::optional<std::uint64_t> n = count_of(v);
    if (!n && PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) {
      fail(key, fmt::format("{} is out of range (0 to 18446744073709551615)",
                            py::repr(v).cast<std::string>()));
    }
    if (!n) corrupt(key, "a non-negative integer", v);
    return *n;
  }
  bool flag(const std::string& key) const override {
    const py::handle v = at(key);
    if (!PyBool_Check(v.ptr())) corrupt(key, "True or False", v);
    return v.cast<bool>();
  }
  std::string text(const std::string& key) const override {
    const py::handle v = at(key);
    if (!py::isinstance<py::str>(v)) corrupt(key, "a str", v);
    return v.cast<std::string>();
  }
  std::vector<std::uint64_t> counts(const std::string& key) const override {
    const py::handle list = at(key);
    std::vector<std::uint64_t> out;
    if (py::isinstance<py::list>(list)) {
      for (const py::handle& v : list) {
        const std::optional<std::uint64_t> n = count_of(v);
        if (!n) break;
        out.push_back(*n);
      }
      if (out.size() == py::len(list)) return out;
    }
    corrupt(key, "a list of non-negative integers", list);
  }
  bool text_is(const std::string& key, const std::string& value) const override {
    const py::handle v = find(key);
    return v && py::isinstance<py::str>(v) && v.cast<std::string>() == value;
  }

 private:
  static constexpr const char* kRemedy = "load a state that Pipeline.state_dict() returned";

  py::handle find(const std::string& key) const {
    py::handle node = root_;
    std::size_t begin = 0;
    for (;;) {
      const std::size_t dot = key.find('.', begin);
      const std::string part = key.substr(begin, dot - begin);
      if (!py::isinstance<py::dict>(node) || !node.cast<py::dict>().contains(part)) return {};
      node = node.cast<py::dict>()[py::str(part)];
      if (dot == std::string::npos) return node;
      begin = dot + 1;
    }
  }
  /// `v` as a count, or nothing when it is not an int from 0 to 2^64 - 1 (a bool is an int in
  /// Python; a flag where a count belongs is still a corrupt state).
  static std::optional<std::uint64_t> count_of(const py::handle& v) {
    if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr())) return std::nullopt;
    const unsigned long long n = PyLong_AsUnsignedLongLong(v.ptr());
    if (n == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      return std::nullopt;
    }
    return n;
  }

  py::handle root_;
};

Checkpoint read_state(const py::handle& state, NodeStates& states) {
  if (!py::isinstance<py::dict>(state)) {
    StateFields::fail_at(
        "state", fmt::format("expected the dict Pipeline.state_dict() returned, found {}",
                             py::str(py::type::of(state).attr("__name__")).cast<std::string>()));
  }
  const StateFields f(state);
  Checkpoint c = read_cursor(f, kFormat);
  const py::handle nodes = f.at("nodes");
  if (!py::isinstance<py::dict>(nodes)) StateFields::corrupt("nodes", "a dict", nodes);
  for (const auto& [name, entry] : nodes.cast<py::dict>()) {
    if (!py::isinstance<py::str>(name)) StateFields::corrupt("nodes", "node names (str)", name);
    const std::string key = "nodes." + name.cast<std::string>();
    const std::string type = f.text(key + ".type");
    const py::handle bytes = f.at(key + ".state");
    if (!py::isinstance<py::bytes>(bytes)) StateFields::corrupt(key + ".state", "bytes", bytes);
    states[name.cast<std::string>()] = {type, bytes.cast<std::string>()};
  }
  return c;
}

}  // namespace

py::dict state_dict(PipelineHolder& h) {
  h.check_idle();
  Pipeline& pipeline = h.get();
  if (h.session) {
    // Batches whose last tensor was freed on another thread count once the session took them
    // back; report() does that first.
    try {
      h.session->report();
    } catch (const std::exception&) {
    }
  }
  NodeStates states;
  const Checkpoint c = pipeline.checkpoint(states);
  // The manifest's fields, as Python values; the nodes' states inline instead of in files.
  py::dict d = py::module_::import("json").attr("loads")(checkpoint_json(c));
  d["format"] = kFormat;
  py::dict nodes;
  for (const auto& [name, state] : states) {
    py::dict entry;
    entry["type"] = state.first;
    entry["state"] = py::bytes(state.second);
    nodes[py::str(name)] = entry;
  }
  d["nodes"] = nodes;
  return d;
}

void load_state_dict(PipelineHolder& h, const py::handle& state) {
  h.check_idle();
  Pipeline& pipeline = h.get();
  if (h.session) {
    if (!h.session->finished() || h.peeked) {
      throw std::runtime_error(
          "load_state_dict: a run is going (call it before the first batch, after the run ended, "
          "or after stop())");
    }
    h.end_session();
  }
  NodeStates states;
  const Checkpoint c = read_state(state, states);
  pipeline.resume(c, states, kWhere);
}

}  // namespace flowfeed::python
