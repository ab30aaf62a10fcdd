#include "interpreter.hpp"

#include <atomic>
#include <flowfeed/error.hpp>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace flowfeed::python {

namespace {

std::atomic<bool> g_ending{false};

bool finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

/// A TBB worker's own thread state, made the first time a body on it calls Python and kept (one
/// PyGILState hold that is never released) until the thread exits.
struct WorkerThreadState {
  bool checked = false;
  PyThreadState* kept = nullptr;
  ~WorkerThreadState() {
    if (!kept || g_ending.load() || !Py_IsInitialized() || finalizing()) return;
    PyEval_RestoreThread(kept);
    PyGILState_Release(PyGILState_UNLOCKED);  // the last hold: deletes the state, frees the GIL
  }
};
thread_local WorkerThreadState t_worker;

std::mutex g_exit_mutex;
std::map<int, std::function<void()>>& exit_stops() {
  static auto* stops = new std::map<int, std::function<void()>>();  // never destroyed
  return *stops;
}
int g_next_key = 0;

void run_exit_stops() {
  std::vector<std::function<void()>> stops;
  {
    std::lock_guard<std::mutex> lock(g_exit_mutex);
    // Newest first: the runs, then what the module registered at import (the callables).
    for (auto it = exit_stops().rbegin(); it != exit_stops().rend(); ++it) {
      stops.push_back(it->second);
    }
  }
  for (auto& stop : stops) {
    try {
      stop();
    } catch (...) {
      // The interpreter is ending: a run that failed while it stopped has nobody to tell.
    }
  }
  g_ending.store(true);
}

}  // namespace

bool interpreter_alive() noexcept {
  return !g_ending.load(std::memory_order_relaxed) && Py_IsInitialized() && !finalizing();
}

BodyGil::BodyGil() {
  if (!interpreter_alive()) {
    throw Error(
        "the Python interpreter is ending (a Python node cannot run after the program's exit "
        "began)");
  }
  if (!t_worker.checked) {
    t_worker.checked = true;
    if (PyGILState_GetThisThreadState() == nullptr) {
      // A thread Python does not know (a TBB worker): one thread state for its life.
      PyGILState_Ensure();
      t_worker.kept = PyEval_SaveThread();
    }
  }
  state_ = static_cast<int>(PyGILState_Ensure());
}

BodyGil::~BodyGil() {
  PyGILState_Release(static_cast<PyGILState_STATE>(state_));
}

PyRef& PyRef::operator=(PyRef&& other) noexcept {
  if (this != &other) {
    drop();
    object_ = std::move(other.object_);
  }
  return *this;
}

PyRef::~PyRef() {
  drop();
}

void PyRef::drop() noexcept {
  if (!object_) return;
  if (!interpreter_alive()) {
    object_.release();  // the interpreter frees it (or already did)
    return;
  }
  if (PyGILState_Check()) {
    object_ = py::object();
    return;
  }
  PyGILState_STATE state = PyGILState_Ensure();
  object_ = py::object();
  PyGILState_Release(state);
}

int stop_at_exit(std::function<void()> stop) {
  std::lock_guard<std::mutex> lock(g_exit_mutex);
  const int key = g_next_key++;
  exit_stops().emplace(key, std::move(stop));
  return key;
}

void forget_at_exit(int key) noexcept {
  std::lock_guard<std::mutex> lock(g_exit_mutex);
  exit_stops().erase(key);
}

void install_exit_hook(py::module_& m) {
  // atexit runs before the interpreter finalizes, while every thread may still take the GIL:
  // the runs end there, so no TBB worker calls into an interpreter that is going away.
  py::module_::import("atexit").attr("register")(
      py::cpp_function([] { run_exit_stops(); }, py::name("_stop_every_run")));
  (void)m;
}

}  // namespace flowfeed::python
