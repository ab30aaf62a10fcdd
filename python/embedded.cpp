#include "embedded.hpp"

#include <pybind11/embed.h>

#include "interpreter.hpp"
#include "nodes/python_nodes.hpp"

namespace flowfeed::python {

void EmbeddedPython::start() {
  if (main_) return;
  py::initialize_interpreter(/*init_signal_handlers=*/false);
  py::module_::import("sys").attr("path").attr("insert")(0, "");
  main_ = PyEval_SaveThread();
}

EmbeddedPython::~EmbeddedPython() {
  if (!main_) return;
  PyEval_RestoreThread(static_cast<PyThreadState*>(main_));
  mark_interpreter_ending();
  py::finalize_interpreter();
}

void register_embedded_python_nodes(Registry& registry, EmbeddedPython& python) {
  register_python_nodes(registry, nullptr, [&python] { python.start(); });
}

}  // namespace flowfeed::python
