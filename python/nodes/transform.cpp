// python_transform: fn(batch) on the host batch, whose arrays are writable numpy views of the
// lease; changed in place, or new arrays of the same layout copied back.
#include "transform.hpp"

#include <fmt/format.h>

#include <flowfeed/error.hpp>

namespace flowfeed::python {

PythonTransform::PythonTransform(PyRef fn) : fn_(std::move(fn)) {}

void PythonTransform::setup(BuildContext& context) {
  cancelled_ = &context.cancelled();
  BodyGil gil;
  writer_ = std::make_unique<RowWriter>(context.layout().tensors());
}

void PythonTransform::process(Batch& batch) {
  if (cancelled_ && cancelled_->load(std::memory_order_relaxed)) {
    throw RunCancelled("the run is being cancelled");
  }
  const Tier tier = batch.newest_tier();
  const std::vector<TensorSpec>& tensors = batch.layout->tensors();
  std::vector<std::byte*> bases;
  for (std::size_t i = 0; i < tensors.size(); ++i) bases.push_back(batch.tensor(tier, i));
  BodyGil gil;
  try {
    py::dict views;
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      views[py::str(tensors[i].name)] = view_rows(tensors[i], batch.rows(), bases[i]);
    }
    py::object out = fn_.get()(views);
    if (!out.is_none() && !out.is(views)) writer_->write_batch(out, bases, batch.rows(), &views);
  } catch (const py::error_already_set& e) {
    throw DataError(python_failure(e));
  } catch (const DataError&) {
    throw;
  } catch (const std::exception& e) {
    throw DataError(e.what());
  }
}

}  // namespace flowfeed::python
