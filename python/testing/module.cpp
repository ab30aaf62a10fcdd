// The test extension `flowfeed_testing`: the test-only node types (fault_*, and late_write on CUDA
// builds) for the Python tests, which the `flowfeed` module does not contain. Importing it hands
// them to flowfeed's RegistrationHook; `flowfeed.Pipeline(..., test_nodes=True)` then registers
// them. Built in the build tree (build/python-testing), never installed or packed by pip.
#include <pybind11/pybind11.h>

#include "flowfeed/testing/fault_nodes.hpp"
#include "flowfeed/testing/late_write.hpp"
#include "registration_hook.hpp"

namespace py = pybind11;

namespace {

void register_test_nodes(flowfeed::Registry& registry) {
  flowfeed::register_fault_nodes(registry);
  flowfeed::register_late_write(registry);
}

}  // namespace

PYBIND11_MODULE(flowfeed_testing, m) {
  using flowfeed::python::RegistrationHook;
  m.doc() = "flowfeed's test-only node types, for flowfeed.Pipeline(..., test_nodes=True).";
  const py::object capsule = py::module_::import("flowfeed").attr("_registration_hook");
  auto* hook = static_cast<RegistrationHook*>(
      PyCapsule_GetPointer(capsule.ptr(), RegistrationHook::kCapsule));
  if (hook == nullptr) throw py::error_already_set();
  if (hook->version != RegistrationHook::kVersion) {
    throw py::import_error(
        "flowfeed_testing: the flowfeed module's registration hook is version " +
        std::to_string(hook->version) + ", this extension needs " +
        std::to_string(RegistrationHook::kVersion) +
        " (the module and the extension come from different builds) use both from one build tree");
  }
  hook->add_test_registrar(&register_test_nodes);
  flowfeed::Registry types;
  register_test_nodes(types);
  py::list names;
  for (const std::string& name : types.names()) names.append(name);
  m.attr("node_types") = names;
}
