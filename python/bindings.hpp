#pragma once
/// \file
/// What the Python module's two halves share: the object that owns a pipeline and its pull run
/// (kept alive by every batch and exported tensor), and the Batch/Tensor bindings.

#include <pybind11/pybind11.h>

#include <flowfeed/dlpack.hpp>
#include <flowfeed/registry.hpp>
#include <memory>
#include <optional>
#include <vector>

#include "registration_hook.hpp"

namespace flowfeed::python {

namespace py = pybind11;

/// A pipeline, its registry and its current pull run. Held by shared_ptr: the Python Pipeline,
/// its batches and every tensor exported from them share it, so the pool memory they point into
/// lives as long as any of them.
struct PipelineHolder : std::enable_shared_from_this<PipelineHolder> {
  Registry registry;
  std::optional<Pipeline> pipeline;
  std::unique_ptr<TensorSession> session;  // the current run; after `pipeline`, destroyed first
  BatchHandle peeked;                      // the first batch of the next epoch, already taken
  std::optional<RunReport> last_report;    // of the last run that ended
  bool waiting = false;                    // a thread waits in next() (the GIL released)
  bool python_nodes = false;               // a node runs Python: Ctrl-C cancels at once
  int exit_key = -1;                       // its entry in the atexit hook's list (interpreter.hpp)
  bool closed = false;                     // close() was called: `pipeline` goes with the last hold

  ~PipelineHolder();
  /// The pipeline, or ValueError once closed.
  Pipeline& get();
  /// Starts a run unless one is going (a finished run is ended first).
  void ensure_session();
  /// The next batch of the run (the peeked one first): the GIL is released while waiting; Ctrl-C
  /// stops the run, drains it and raises KeyboardInterrupt. Empty at the end of the run.
  BatchHandle next();
  /// Ends the current run: held batches go back, in-flight ones drain; keeps its report.
  void end_session() noexcept;
  /// Raises RuntimeError while another thread waits in next(): a pipeline is stepped by one
  /// thread at a time.
  void check_idle() const;
};

/// While it lives on the main thread (a pipeline being built, the GIL released), a Ctrl-C also
/// interrupts the build's transfers (interrupt_builds()), so that the build ends within a second;
/// Python's own handler then raises KeyboardInterrupt. Elsewhere it does nothing.
class BuildInterruptScope {
 public:
  BuildInterruptScope();
  ~BuildInterruptScope();
  BuildInterruptScope(const BuildInterruptScope&) = delete;
  BuildInterruptScope& operator=(const BuildInterruptScope&) = delete;

 private:
  bool active_ = false;
};

/// flowfeed.Pipeline(config, overrides, test_nodes): `config` a path (a FIFO too), YAML text or a
/// dict, `overrides` a dict, a list of "key=value" or one such string (pipeline_config.cpp).
/// test_nodes: also runs the registrars that extensions added (registration_hook.hpp); ValueError
/// when none did.
std::shared_ptr<PipelineHolder> make_pipeline(const py::object& config, const py::object& overrides,
                                              bool test_nodes);
/// The registrars extensions added through the module's RegistrationHook (main thread, GIL held).
std::vector<Registrar>& test_registrars();

/// Pipeline.state_dict(): the resume cursor and the nodes' states as plain Python values
/// (state.cpp).
py::dict state_dict(PipelineHolder& holder);
/// Pipeline.load_state_dict(state): checks `state` as a checkpoint file is checked, then every
/// later run starts there (Pipeline::resume). Between runs only.
void load_state_dict(PipelineHolder& holder, const py::handle& state);

/// Takes the batches of one epoch of a holder's run (or, with `whole_run`, every batch left in
/// it). At the end of the epoch the next epoch's first batch stays in the holder for the next
/// cursor.
class EpochCursor {
 public:
  EpochCursor(std::shared_ptr<PipelineHolder> holder, bool whole_run)
      : holder_(std::move(holder)), whole_run_(whole_run) {}
  /// The next batch, or an empty handle once the epoch (or the run) ended.
  BatchHandle next();
  const std::shared_ptr<PipelineHolder>& holder() const noexcept { return holder_; }

 private:
  std::shared_ptr<PipelineHolder> holder_;
  bool whole_run_;
  std::int64_t epoch_ = -1;
  bool done_ = false;
};

/// The index of tensor `name` in the batch's layout; KeyError naming the tensors it has.
std::size_t tensor_index(const Batch& batch, const std::string& name);
/// A DLPack capsule ("dltensor") owning `managed` until a consumer takes it (deleted with the
/// capsule otherwise, or here if the capsule cannot be made).
py::capsule dlpack_capsule(DLManagedTensor* managed);

/// Registers Batch and Tensor.
void bind_batch(py::module_& m);
/// A Python Batch for a handle taken from `holder`'s run.
py::object make_batch(std::shared_ptr<PipelineHolder> holder, BatchHandle handle);
/// Registers the views iterator and the buffer view it imports.
void bind_views(py::module_& m);
/// Pipeline.views(names, importer, stream): see its docstring (module.cpp).
py::object make_views(std::shared_ptr<PipelineHolder> holder, const py::object& names,
                      const py::object& importer, const py::object& stream);
/// The array-API stream value of a Python stream argument: None, an int, or an object with
/// `cuda_stream` (torch.cuda.Stream; 0 there is the legacy default stream) or `ptr` (CuPy).
ConsumerStream stream_value(const py::object& stream);

}  // namespace flowfeed::python
