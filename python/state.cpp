// Pipeline.state_dict() and Pipeline.load_state_dict(): the resume cursor (docs/RESUME.md) and the
// nodes' saved states as plain Python values, picklable, so that a training loop keeps them beside
// its model (torch.save). The fields are those of a checkpoint's manifest, checked as strictly.
#include <fmt/format.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <limits>
#include <string>

#include "bindings.hpp"

namespace flowfeed::python {

namespace {

constexpr const char* kFormat = "flowfeed state";
constexpr const char* kWhere = "state_dict";

/// Reads the fields of a state dict; every problem is a ConfigError naming the field, as a
/// checkpoint file's are: `state_dict: cursor.world: 0 is out of range (1 to 16777216)`.
class StateFields {
 public:
  explicit StateFields(const py::handle& root) : root_(root) {}

  [[noreturn]] static void fail(const std::string& key, const std::string& problem) {
    throw ConfigError({fmt::format("{}: {}: {}", kWhere, key, problem)});
  }
  [[noreturn]] static void corrupt(const std::string& key, const char* what, const py::handle& v) {
    fail(key, fmt::format("expected {}, found {} (the state is corrupt or not one that "
                          "Pipeline.state_dict() returned) load a state it returned",
                          what, shown(v)));
  }
  static std::string shown(const py::handle& v) {
    return fmt::format("{} ({})", py::repr(v).cast<std::string>(),
                       py::str(py::type::of(v).attr("__name__")).cast<std::string>());
  }

  /// The value at a dotted key ("cursor.epoch"), through dicts.
  py::handle at(const std::string& key) const {
    py::handle node = root_;
    std::size_t begin = 0;
    for (;;) {
      const std::size_t dot = key.find('.', begin);
      const std::string part = key.substr(begin, dot - begin);
      if (!py::isinstance<py::dict>(node) || !node.cast<py::dict>().contains(part)) {
        fail(key,
             "missing (the state is incomplete or not one that Pipeline.state_dict() "
             "returned) load a state it returned");
      }
      node = node.cast<py::dict>()[py::str(part)];
      if (dot == std::string::npos) return node;
      begin = dot + 1;
    }
  }
  static std::uint64_t count_of(const std::string& key, const py::handle& v) {
    // bool is an int in Python; a flag where a count belongs is still a corrupt state.
    if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr())) {
      corrupt(key, "a non-negative integer", v);
    }
    const unsigned long long n = PyLong_AsUnsignedLongLong(v.ptr());
    if (n == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      fail(key, fmt::format("{} is out of range (0 to {})", py::repr(v).cast<std::string>(),
                            std::numeric_limits<std::uint64_t>::max()));
    }
    return n;
  }
  std::uint64_t count(const std::string& key) const { return count_of(key, at(key)); }
  bool flag(const std::string& key) const {
    const py::handle v = at(key);
    if (!PyBool_Check(v.ptr())) corrupt(key, "True or False", v);
    return v.cast<bool>();
  }
  std::string text(const std::string& key) const {
    const py::handle v = at(key);
    if (!py::isinstance<py::str>(v)) corrupt(key, "a str", v);
    return v.cast<std::string>();
  }

 private:
  py::handle root_;
};

Checkpoint read_state(const py::handle& state, NodeStates& states) {
  if (!py::isinstance<py::dict>(state)) {
    StateFields::fail(
        "state", fmt::format("expected the dict Pipeline.state_dict() returned, found "
                             "{}",
                             py::str(py::type::of(state).attr("__name__")).cast<std::string>()));
  }
  const StateFields f(state);
  const py::handle format = f.at("format");
  if (!py::isinstance<py::str>(format) || format.cast<std::string>() != kFormat) {
    StateFields::fail("format", fmt::format("expected '{}', found {} (not a flowfeed state) load "
                                            "a state that Pipeline.state_dict() returned",
                                            kFormat, StateFields::shown(format)));
  }
  Checkpoint c;
  const std::uint64_t version = f.count("version");
  if (version == 0 || version > static_cast<std::uint64_t>(Checkpoint::kVersion)) {
    StateFields::fail("version",
                      version == 0
                          ? std::string("0 is not a state version (the state is corrupt) load a "
                                        "state that Pipeline.state_dict() returned")
                          : fmt::format("{} is newer than this build reads (version {}; made by a "
                                        "newer flowfeed) load it with the flowfeed that made it",
                                        version, Checkpoint::kVersion));
  }
  c.version = static_cast<int>(version);
  c.seed = f.count("sampler.seed");
  c.shuffle = f.flag("sampler.shuffle");
  c.drop_last = f.flag("sampler.drop_last");
  c.dataset_size = f.count("sampler.dataset_size");
  if (version >= 2 && f.text("sampler.order") != "samples") {
    if (f.text("sampler.order") != "shards") {
      StateFields::corrupt("sampler.order", "'samples' or 'shards'", f.at("sampler.order"));
    }
    c.order = SampleOrder::shards;
    c.shuffle_window = f.count("sampler.shuffle_window");
    c.data_shards = f.count("sampler.data_shards");
  }
  const std::uint64_t epoch = f.count("cursor.epoch");
  if (epoch > std::numeric_limits<std::uint32_t>::max()) {
    StateFields::fail("cursor.epoch", fmt::format("{} is out of range (0 to {})", epoch,
                                                  std::numeric_limits<std::uint32_t>::max()));
  }
  c.epoch = static_cast<std::uint32_t>(epoch);
  c.samples = f.count("cursor.samples");
  const std::uint64_t world = f.count("cursor.world");
  const std::uint64_t rank = f.count("cursor.rank");
  c.batch_size = f.count("cursor.batch_size");
  c.global_batch = f.count("cursor.global_batch");
  c.steps = f.count("cursor.steps");
  if (world < 1 || world > (1u << 24)) {
    StateFields::fail("cursor.world", fmt::format("{} is out of range (1 to 16777216)", world));
  }
  if (rank >= world) {
    StateFields::fail("cursor.rank", fmt::format("{} is not below cursor.world {}", rank, world));
  }
  c.world = static_cast<int>(world);
  c.rank = static_cast<int>(rank);
  if (c.batch_size < 1) StateFields::fail("cursor.batch_size", "0 is out of range (at least 1)");
  std::uint64_t product = 0;
  if (__builtin_mul_overflow(c.batch_size, world, &product) || c.global_batch != product) {
    StateFields::fail("cursor.global_batch",
                      fmt::format("{} is not cursor.world {} x cursor.batch_size {} (the state is "
                                  "corrupt) load a state that Pipeline.state_dict() returned",
                                  c.global_batch, world, c.batch_size));
  }
  if (c.samples % c.global_batch != 0 || (c.samples > 0 && c.samples >= c.dataset_size)) {
    StateFields::fail(
        "cursor.samples",
        fmt::format("{} is not a whole number of global batches of {} inside the data set of {} "
                    "samples (the state is corrupt) load a state that Pipeline.state_dict() "
                    "returned",
                    c.samples, c.global_batch, c.dataset_size));
  }
  const py::handle ahead = f.at("cursor.finished_ahead");
  if (!py::isinstance<py::list>(ahead)) {
    StateFields::corrupt("cursor.finished_ahead", "a list of integers", ahead);
  }
  for (const py::handle& a : ahead) {
    const std::uint64_t n = StateFields::count_of("cursor.finished_ahead", a);
    if (n == 0 || (!c.finished_ahead.empty() && n <= c.finished_ahead.back())) {
      StateFields::fail("cursor.finished_ahead",
                        fmt::format("{} is not a list of ascending positive integers (the state "
                                    "is corrupt) load a state that Pipeline.state_dict() returned",
                                    py::repr(ahead).cast<std::string>()));
    }
    c.finished_ahead.push_back(n);
  }
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
  py::dict sampler;
  sampler["seed"] = c.seed;
  sampler["shuffle"] = c.shuffle;
  sampler["drop_last"] = c.drop_last;
  sampler["dataset_size"] = c.dataset_size;
  if (c.order == SampleOrder::shards) {
    sampler["order"] = "shards";
    sampler["shuffle_window"] = c.shuffle_window;
    sampler["data_shards"] = c.data_shards;
  }
  py::dict cursor;
  cursor["epoch"] = c.epoch;
  cursor["samples"] = c.samples;
  cursor["world"] = c.world;
  cursor["rank"] = c.rank;
  cursor["batch_size"] = c.batch_size;
  cursor["global_batch"] = c.global_batch;
  py::list ahead;
  for (std::uint64_t a : c.finished_ahead) ahead.append(a);
  cursor["finished_ahead"] = ahead;
  cursor["steps"] = c.steps;
  py::dict nodes;
  for (const auto& [name, state] : states) {
    py::dict entry;
    entry["type"] = state.first;
    entry["state"] = py::bytes(state.second);
    nodes[py::str(name)] = entry;
  }
  py::dict d;
  d["format"] = kFormat;
  d["version"] = c.order == SampleOrder::shards ? 2 : 1;  // 1: readable by older builds
  d["sampler"] = sampler;
  d["cursor"] = cursor;
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
