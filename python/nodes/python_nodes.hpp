#pragma once
/// \file
/// The node types whose work is Python code: `python` (a map-style loader: fn(index) -> sample,
/// or fn(indices) -> batch), `python_transform` (fn(batch) -> batch on the host batch) and
/// `python_iterable` (samples taken in order from an iterator). Bodies run on the pipeline's TBB
/// workers and hold the GIL only around the Python call (BodyGil).

#include <cstddef>
#include <flowfeed/batch.hpp>
#include <flowfeed/registry.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "callables.hpp"

namespace flowfeed::python {

/// Registers python, python_transform and python_iterable in `registry`; their `callable` params
/// are resolved against `table` (a dict config's objects; may be null) first. The types keep
/// `table`. `before_use`, when given, runs before each check or factory touches Python (an
/// embedding program starts its interpreter there).
void register_python_nodes(Registry& registry, std::shared_ptr<CallableTable> table,
                           std::function<void()> before_use = {});

/// The tensors of a `layout` param: entries "x: uint8 [224, 224, 3]" ("y: int64 []" or "y:
/// int64" for a scalar). Throws std::runtime_error naming the entry that is wrong.
std::vector<TensorSpec> parse_layout(const std::vector<std::string>& entries);

/// Writes what a Python callable returned into a batch's buffer, checking it against the layout:
/// a sample (a dict with the layout's keys, or a tuple in the layout's order) into one row, or a
/// batch (a dict of arrays of `rows` rows) into all of them. A mismatch throws std::runtime_error
/// whose text names the key and both shapes and dtypes. Call with the GIL held.
class RowWriter {
 public:
  RowWriter() = default;
  explicit RowWriter(std::vector<TensorSpec> tensors);
  const std::vector<TensorSpec>& tensors() const noexcept { return tensors_; }
  /// Row `row` of the batch whose tensor `i` starts at `bases[i]`.
  void write_sample(const py::handle& sample, const std::vector<std::byte*>& bases,
                    std::size_t row) const;
  /// Every row of a batch of `rows` rows; `skip(i, array)` may say a returned array is already
  /// in place (a transform's own view).
  void write_batch(const py::handle& batch, const std::vector<std::byte*>& bases, std::size_t rows,
                   const py::dict* views = nullptr) const;

 private:
  /// Checks `in` against tensor `i` (with `lead` rows in front, or none) and copies it.
  void write(const ArrayIn& in, std::size_t i, std::byte* dst, std::optional<std::size_t> lead,
             bool release_gil) const;
  py::handle value_of(const py::handle& out, std::size_t i, bool tuple) const;
  /// std::runtime_error naming a key of `dict` that the layout does not have.
  void check_keys(const py::handle& dict) const;
  std::vector<TensorSpec> tensors_;
  std::vector<PyRef> keys_;  // the names as Python str, made once
};

/// The tensors of what a callable returned first (a sample, or with `batched` a batch whose
/// first dimension is its rows): a dict's keys in order, a tuple's as x, y. Throws
/// std::runtime_error when a value is not an array of a dtype flowfeed carries.
std::vector<TensorSpec> infer_tensors(const py::handle& out, bool batched);

}  // namespace flowfeed::python
