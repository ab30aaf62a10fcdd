#pragma once
/// \file
/// What the Python module's two halves share: the object that owns a pipeline and its pull run
/// (kept alive by every batch and exported tensor), and the Batch/Tensor bindings.

#include <pybind11/pybind11.h>

#include <flowfeed/dlpack.hpp>
#include <flowfeed/registry.hpp>
#include <memory>
#include <optional>

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

  ~PipelineHolder();
  /// The pipeline, or RuntimeError once closed.
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

/// Registers Batch and Tensor.
void bind_batch(py::module_& m);
/// A Python Batch for a handle taken from `holder`'s run.
py::object make_batch(std::shared_ptr<PipelineHolder> holder, BatchHandle handle);

}  // namespace flowfeed::python
