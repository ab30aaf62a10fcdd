#pragma once
/// \file
/// The interpreter as seen from the pipeline's threads: the GIL taken around a Python call on a
/// TBB worker (each worker keeps one thread state for its life), references that may be dropped
/// on any thread, and the end of the interpreter (every run stopped first).

#include <pybind11/pybind11.h>

#include <functional>

namespace flowfeed::python {

namespace py = pybind11;

/// False once the interpreter is ending (the module's atexit hook ran): a node body then fails
/// its batch instead of taking the GIL, and references are left to the interpreter.
bool interpreter_alive() noexcept;

/// Holds the GIL for the scope, on any thread: a Python thread (which may hold it already) or a
/// TBB worker, which is given one thread state the first time and keeps it until it exits
/// (making one per call costs microseconds). Throws flowfeed::Error once the interpreter is
/// ending. Never hold one while waiting for the pipeline.
class BodyGil {
 public:
  BodyGil();
  ~BodyGil();
  BodyGil(const BodyGil&) = delete;
  BodyGil& operator=(const BodyGil&) = delete;

 private:
  int state_;  // PyGILState_STATE
};

/// A strong reference to a Python object that may be dropped on any thread: its destructor takes
/// the GIL when the thread does not hold it, and leaves the object alone once the interpreter is
/// ending (its memory goes with the interpreter).
class PyRef {
 public:
  PyRef() = default;
  explicit PyRef(py::object object) : object_(std::move(object)) {}
  PyRef(PyRef&&) noexcept = default;
  PyRef& operator=(PyRef&& other) noexcept;
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef();
  /// The object (use with the GIL held).
  const py::object& get() const noexcept { return object_; }
  explicit operator bool() const noexcept { return static_cast<bool>(object_); }

 private:
  void drop() noexcept;
  py::object object_;
};

/// Registers `stop` to run when the interpreter ends (before it finalizes), and returns a key for
/// forget_at_exit(). `stop` runs with the GIL held and must end the run (releasing the GIL while
/// it waits).
int stop_at_exit(std::function<void()> stop);
/// Removes what stop_at_exit() registered under `key`.
void forget_at_exit(int key) noexcept;
/// Installs the atexit hook that stops every registered run and marks the interpreter as
/// ending. Called once, from the module's init.
void install_exit_hook(py::module_& m);

}  // namespace flowfeed::python
