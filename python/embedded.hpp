#pragma once
/// \file
/// The interpreter pipeline_runner embeds for the Python node types (pybind11's embed): started
/// the first time a Python type is checked or built, on the main thread, which then releases the
/// GIL so that node bodies on every thread take it (interpreter.hpp). No Python header here: the
/// runner's own code stays free of them.

#include <flowfeed/registry.hpp>

namespace flowfeed::python {

/// One embedded interpreter for the program's life. Not thread-safe: use from the main thread.
class EmbeddedPython {
 public:
  EmbeddedPython() = default;
  /// Finalizes the interpreter if it was started; every pipeline must be gone by then.
  ~EmbeddedPython();
  EmbeddedPython(const EmbeddedPython&) = delete;
  EmbeddedPython& operator=(const EmbeddedPython&) = delete;
  /// Starts the interpreter once (without its signal handlers: the program keeps its own; the
  /// current directory first on sys.path, as `python -c` has it) and releases the GIL.
  void start();

 private:
  void* main_ = nullptr;  // PyThreadState of the main thread while the GIL is released
};

/// Registers the Python node types in `registry`, starting `python` the first time one is used.
/// `python` must outlive every pipeline built from `registry`.
void register_embedded_python_nodes(Registry& registry, EmbeddedPython& python);

}  // namespace flowfeed::python
