#pragma once
/// \file
/// Arrays that Python callables return, read in place: numpy arrays, torch CPU tensors, anything
/// with the buffer protocol, `__array_interface__`, `__array__` or DLPack, and Python scalars.
/// Call everything here with the GIL held.

#include <pybind11/numpy.h>

#include <cstddef>
#include <cstdint>
#include <flowfeed/batch.hpp>
#include <optional>
#include <string>
#include <vector>

namespace flowfeed::python {

namespace py = pybind11;

/// One array as a callable returned it, viewed without a copy.
struct ArrayIn {
  py::array array;                  ///< keeps the bytes alive
  std::optional<DType> dtype;       ///< nullopt: a dtype flowfeed does not carry
  std::vector<std::int64_t> shape;  ///< as returned
  std::string dtype_text;           ///< numpy's name of its dtype ("float64")
};

/// Views `value` as an array. A Python scalar (int, float, bool) becomes a 0-d array of `scalar`
/// (nullopt: int64 for an int, float32 for a float). Throws py::error_already_set when numpy
/// cannot view it (the object's own error, e.g. a torch tensor that requires grad).
ArrayIn array_in(const py::handle& value, std::optional<DType> scalar);

/// "[3, 32, 32]"; "[]" for a scalar.
std::string shape_text(const std::vector<std::int64_t>& shape);
/// The numpy dtype of a flowfeed dtype (bfloat16: none; nullopt).
std::optional<py::dtype> numpy_dtype(DType dtype);
/// The same, made anew (numpy_dtype() returns the ones prepare_arrays() made).
std::optional<py::dtype> numpy_dtype_of(DType dtype);
/// Imports numpy and looks up what the functions here use; done by every Python node type's
/// factory, on the thread that builds the pipeline, before any body runs.
void prepare_arrays();

/// Copies `in` (of exactly `bytes` bytes once packed) to `dst` in C order, whatever its strides.
/// With `release_gil`, copies of a MiB or more run with the GIL released (the array is kept
/// alive by `in`).
void copy_packed(const ArrayIn& in, std::byte* dst, std::size_t bytes, bool release_gil);

/// A writable numpy view of `rows` rows of `spec` at `data` (no copy, no ownership: valid only
/// while the caller keeps the memory).
py::array view_rows(const TensorSpec& spec, std::size_t rows, std::byte* data);

}  // namespace flowfeed::python
