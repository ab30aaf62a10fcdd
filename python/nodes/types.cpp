// The Python node types' schemas, config checks and factories.
#include <flowfeed/config.hpp>
#include <flowfeed/error.hpp>
#include <flowfeed/extend.hpp>
#include <flowfeed/nodes/python_types.hpp>

#include "loaders.hpp"
#include "transform.hpp"

namespace flowfeed::python {

namespace {

/// The index of node `name` in the config, for key paths ("nodes[0].params.callable").
std::string node_path(const NodeSpec& spec, const PipelineConfig& config) {
  for (std::size_t i = 0; i < config.nodes.size(); ++i) {
    if (config.nodes[i].name == spec.name) return "nodes[" + std::to_string(i) + "]";
  }
  return "nodes." + spec.name;
}

bool dataset_like(const py::handle& object) {
  return py::hasattr(object, "__getitem__") && py::hasattr(object, "__len__") &&
         !PyFunction_Check(object.ptr()) && !PyMethod_Check(object.ptr());
}

/// What a python node calls: the function itself, or a Dataset-like object's __getitem__ (or,
/// batched, its __getitems__). Throws std::runtime_error saying why none fits.
py::object map_callable(const ResolvedCallable& c, bool batched) {
  if (dataset_like(c.object)) {
    if (!batched) return c.object.attr("__getitem__");
    if (py::hasattr(c.object, "__getitems__")) return c.object.attr("__getitems__");
    throw std::runtime_error(c.display +
                             " is a Dataset-like object without __getitems__ (batched: true "
                             "calls it with a list of indices) give it __getitems__, or set "
                             "batched: false");
  }
  if (!PyCallable_Check(c.object.ptr())) {
    throw std::runtime_error(c.display + " is neither callable nor Dataset-like (__getitem__ and " +
                             "__len__)");
  }
  return c.object;
}

/// The size a python loader reads: params.samples, else the object's __len__.
std::size_t map_samples(const ResolvedCallable& c, std::int64_t samples) {
  if (samples > 0) return static_cast<std::size_t>(samples);
  if (dataset_like(c.object)) return py::len(c.object);
  throw std::runtime_error("params.samples is required for " + c.display +
                           " (a function has no size; a Dataset-like object gives __len__)");
}

std::vector<ConfigProblem> check_python(const NodeSpec& spec, const PipelineConfig& config,
                                        const CallableTable* table, Role role) {
  std::vector<ConfigProblem> out;
  const std::string at = node_path(spec, config) + ".params.";
  if (!spec.params.has("callable")) return out;
  BodyGil gil;
  std::optional<ResolvedCallable> c;
  try {
    c = resolve_callable(spec.params.get_string("callable"), table);
  } catch (const std::exception& e) {
    out.push_back({at + "callable", e.what()});
  }
  if (spec.params.has("layout")) {
    try {
      parse_layout(spec.params.get_string_list("layout"));
    } catch (const std::exception& e) {
      out.push_back({at + "layout", e.what()});
    }
  }
  if (spec.type == "python" && c) {
    const bool batched = spec.params.get_bool("batched");
    try {
      map_callable(*c, batched);
      // samples is absent when its own value was refused (out of range): that is said already.
      if (spec.params.has("samples") && spec.params.get_int("samples") == 0 &&
          !dataset_like(c->object)) {
        // Not written, so it has no position: the message sits at the node's params.
        out.push_back({node_path(spec, config) + ".params",
                       "samples is required for " + c->display +
                           " (a function has no size; a Dataset-like object gives __len__) set "
                           "the data set's size"});
      }
    } catch (const std::exception& e) {
      out.push_back({at + "callable", e.what()});
    }
  }
  if (spec.type == "python_iterable") {
    const std::string why = " (python_iterable '" + spec.name + "' reads its samples in order)";
    if (config.sampler.shuffle) {
      out.push_back({"sampler.shuffle", "true does not fit" + why + " set sampler.shuffle: false"});
    }
    if (config.sampler.world > 1) {
      out.push_back({"sampler.world", std::to_string(config.sampler.world) + " shards do not fit" +
                                          why +
                                          " run one process, or use the python type (map-style)"});
    }
    if (spec.concurrency != 1 || spec.auto_concurrency) {
      out.push_back(
          {node_path(spec, config) + ".concurrency", "must be 1" + why + " leave it out"});
    }
    if (c && !PyCallable_Check(c->object.ptr())) {
      if (!py::hasattr(c->object, "__iter__")) {
        out.push_back({at + "callable", c->display +
                                            " is neither callable nor iterable pass a generator "
                                            "function or an iterable"});
      } else if (py::iter(c->object).is(c->object)) {
        out.push_back({at + "callable", c->display +
                                            " is an iterator, which can be read once (each epoch "
                                            "reads the samples anew) pass the generator function "
                                            "or a re-iterable object"});
      }
    }
  }
  if (role == Role::transform && config.backend == Backend::cuda) {
    for (const NodeSpec& n : config.nodes) {
      if (n.name == spec.name) break;
      if (n.role == Role::upload) {
        out.push_back({node_path(spec, config) + ".type",
                       "python_transform after the upload node '" + n.name +
                           "' would see device memory (Python transforms read host batches) "
                           "place it before the staging node"});
        break;
      }
    }
  }
  return out;
}

LoaderOptions loader_options(const NodeSpec& spec) {
  LoaderOptions o;
  if (spec.params.has("layout")) o.tensors = parse_layout(spec.params.get_string_list("layout"));
  if (spec.params.has("batched")) o.batched = spec.params.get_bool("batched");
  return o;
}

/// The tensors of the first sample (index 0) when params.layout declares none; a declared layout
/// is checked against it the same way every sample is.
std::vector<TensorSpec> first_sample_tensors(const py::object& out, bool batched) {
  try {
    return infer_tensors(out, batched);
  } catch (const std::exception& e) {
    throw DataError(sample_failure(0, e.what()));
  }
}

std::unique_ptr<Node> make_map_loader(const NodeSpec& spec, const CallableTable* table) {
  BodyGil gil;
  prepare_arrays();
  const ResolvedCallable c = resolve_callable(spec.params.get_string("callable"), table);
  LoaderOptions o = loader_options(spec);
  py::object fn = map_callable(c, o.batched);
  o.samples = map_samples(c, spec.params.get_int("samples"));
  if (o.tensors.empty()) {
    py::object first;
    try {
      if (o.batched) {
        py::list indices;
        indices.append(0);
        first = fn(indices);
      } else {
        first = fn(py::int_(0));
      }
    } catch (const py::error_already_set& e) {
      throw DataError(sample_failure(0, python_failure(e)));
    }
    o.tensors = first_sample_tensors(first, o.batched);
  }
  return std::make_unique<PythonMapLoader>(std::move(o), PyRef(std::move(fn)));
}

std::unique_ptr<Node> make_iterable_loader(const NodeSpec& spec, const CallableTable* table) {
  BodyGil gil;
  prepare_arrays();
  const ResolvedCallable c = resolve_callable(spec.params.get_string("callable"), table);
  LoaderOptions o = loader_options(spec);
  o.samples = static_cast<std::size_t>(spec.params.get_int("samples"));
  if (o.tensors.empty()) {
    py::object first;
    try {
      py::object it = make_iterator(c.object);
      PyObject* item = PyIter_Next(it.ptr());
      if (!item) {
        if (PyErr_Occurred()) throw py::error_already_set();
        throw DataError("the iterable " + c.display + " gave no sample");
      }
      first = py::reinterpret_steal<py::object>(item);
    } catch (const py::error_already_set& e) {
      throw DataError(sample_failure(0, python_failure(e)));
    }
    o.tensors = first_sample_tensors(first, false);
  }
  return std::make_unique<PythonIterableLoader>(std::move(o), PyRef(c.object));
}

std::unique_ptr<Node> make_transform(const NodeSpec& spec, const CallableTable* table) {
  BodyGil gil;
  prepare_arrays();
  const ResolvedCallable c = resolve_callable(spec.params.get_string("callable"), table);
  if (!PyCallable_Check(c.object.ptr())) {
    throw std::runtime_error(c.display + " is not callable");
  }
  return std::make_unique<PythonTransform>(PyRef(c.object));
}

}  // namespace

void register_python_nodes(Registry& registry, std::shared_ptr<CallableTable> table,
                           std::function<void()> before_use) {
  // Every entry point that touches Python (the checks, the factories) starts the interpreter
  // first when it is embedded (pipeline_runner); the module's is running already.
  auto ready = [before_use] {
    if (before_use) before_use();
  };
  // One Python type: made by `make` once the interpreter is ready, checked as its `role`.
  using Make = std::unique_ptr<Node> (*)(const NodeSpec&, const CallableTable*);
  auto add = [&](const char* name, Role role, Schema schema, Make make, const char* doc) {
    NodeType t = factory_type(
        name, role, std::move(schema),
        [table, ready, make](const NodeSpec& spec) {
          ready();
          return make(spec, table.get());
        },
        doc);
    t.check = [table, ready, role](const NodeSpec& spec, const PipelineConfig& config) {
      ready();
      return check_python(spec, config, table.get(), role);
    };
    registry.set(std::move(t));
  };
  add("python", Role::load, python_loader_schema(), make_map_loader,
      "a map-style loader in Python: fn(index) -> {'x': array, ...} (or a Dataset's "
      "__getitem__), or fn(indices) -> a batch; rows are written straight into the batch");
  add("python_iterable", Role::load, python_iterable_schema(), make_iterable_loader,
      "samples read in order from a Python iterator (a generator function or an iterable), "
      "made anew each epoch");
  add("python_transform", Role::transform, python_transform_schema(), make_transform,
      "fn(batch) on the host batch: a dict of writable numpy views of its tensors, changed in "
      "place, or a dict of new arrays of the same layout returned");
}

}  // namespace flowfeed::python
