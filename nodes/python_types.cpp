// The Python node types' params (one place for the module and pipeline_runner) and their
// placeholders for builds without Python.
#include "flowfeed/nodes/python_types.hpp"

#include <stdexcept>

#include "flowfeed/config.hpp"

namespace flowfeed {

namespace {

void add_callable(Schema& s) {
  s.add_string("callable",
               "the Python callable: a name given to flowfeed.register(), "
               "'package.module:function', or (from a dict config) the object itself")
      .make_required();
}

void add_layout(Schema& s) {
  s.add_string_list("layout",
                    "the tensors of a sample, e.g. ['x: uint8 [224, 224, 3]', 'y: int64'] (from a "
                    "dict config also {'x': {'dtype': 'uint8', 'shape': [224, 224, 3]}}); default: "
                    "those of the first sample");
}

}  // namespace

Schema python_loader_schema() {
  Schema s;
  add_callable(s);
  s.add_int("samples", "the data set's size (0: the __len__ of a Dataset-like callable)", 0)
      .range(0, 4e9);
  s.add_bool("batched",
             "true: the callable takes a list of indices and returns a dict of batch arrays",
             false);
  add_layout(s);
  return s;
}

Schema python_iterable_schema() {
  Schema s;
  add_callable(s);
  s.add_int("samples",
            "samples per epoch, read in order from the iterator (0: a stream of unknown length, "
            "each epoch reads its iterator to the end)",
            0)
      .range(0, 4e9);
  add_layout(s);
  return s;
}

Schema python_transform_schema() {
  Schema s;
  add_callable(s);
  return s;
}

void register_python_placeholders(Registry& registry) {
  struct Placeholder {
    const char* name;
    Role role;
    Schema schema;
  };
  std::vector<Placeholder> types;
  types.push_back({"python", Role::load, python_loader_schema()});
  types.push_back({"python_iterable", Role::load, python_iterable_schema()});
  types.push_back({"python_transform", Role::transform, python_transform_schema()});
  for (Placeholder& p : types) {
    NodeType t;
    t.name = p.name;
    t.role = p.role;
    t.schema = std::move(p.schema);
    t.doc = "unavailable in this build (reconfigure with -DFLOWFEED_PYTHON=ON)";
    t.create = [](const NodeSpec& spec) -> std::unique_ptr<Node> {
      throw std::logic_error("node type '" + spec.type + "' is unavailable in this build");
    };
    t.check = [](const NodeSpec& spec, const PipelineConfig& config) {
      std::size_t i = 0;
      while (i < config.nodes.size() && config.nodes[i].name != spec.name) ++i;
      return std::vector<ConfigProblem>{
          {"nodes[" + std::to_string(i) + "].type",
           "'" + spec.type +
               "' is unavailable in this build (it was built without Python) reconfigure with "
               "-DFLOWFEED_PYTHON=ON (Debian: python3-dev pybind11-dev)"}};
    };
    registry.set(std::move(t));
  }
}

}  // namespace flowfeed
