#include "arrays.hpp"

#include <cstring>

namespace flowfeed::python {

namespace {

std::optional<DType> dtype_of(const py::array& array) {
  // Read from numpy's descriptor directly: a lookup per array per sample would cost more than
  // the copy of a small one.
  const auto* d = py::detail::array_descriptor_proxy(py::detail::array_proxy(array.ptr())->descr);
  const char kind = d->kind;
  // array::itemsize(): numpy 2 moved the descriptor's elsize, which pybind11 3's proxy lacks.
  const auto size = static_cast<std::size_t>(array.itemsize());
  // Only the machine's byte order: a swapped array would be copied as raw bytes.
  if (d->byteorder == '>') return std::nullopt;
  if (kind == 'f' && size == 4) return DType::float32;
  if (kind == 'f' && size == 2) return DType::float16;
  if (kind == 'u' && size == 1) return DType::uint8;
  if (kind == 'u' && size == 2) return DType::uint16;
  if (kind == 'u' && size == 4) return DType::uint32;
  if (kind == 'i' && size == 4) return DType::int32;
  if (kind == 'i' && size == 8) return DType::int64;
  return std::nullopt;
}

/// numpy's functions and the dtypes flowfeed carries, looked up once (prepare_arrays()) and kept
/// for the life of the process: never destroyed, so nothing is dropped after the interpreter.
struct Numpy {
  py::object asarray;
  py::object from_dlpack;                        // None before numpy 1.22
  std::vector<std::optional<py::dtype>> dtypes;  // by DType
};
Numpy* g_numpy = nullptr;

const Numpy& numpy() {
  if (!g_numpy) prepare_arrays();
  return *g_numpy;
}

void copy_strided(const std::byte* src, const std::vector<std::int64_t>& shape,
                  const py::ssize_t* strides, std::size_t dim, std::size_t item, std::byte*& dst) {
  if (dim + 1 == shape.size() && strides[dim] == static_cast<py::ssize_t>(item)) {
    const std::size_t bytes = static_cast<std::size_t>(shape[dim]) * item;
    std::memcpy(dst, src, bytes);
    dst += bytes;
    return;
  }
  for (std::int64_t i = 0; i < shape[dim]; ++i) {
    const std::byte* at = src + i * strides[dim];
    if (dim + 1 == shape.size()) {
      std::memcpy(dst, at, item);
      dst += item;
    } else {
      copy_strided(at, shape, strides, dim + 1, item, dst);
    }
  }
}

}  // namespace

void prepare_arrays() {
  if (g_numpy) return;
  // The GIL serializes this: no C++ lock, which a thread waiting with the GIL held could deadlock.
  py::module_ np = py::module_::import("numpy");
  auto* n = new Numpy;
  n->asarray = np.attr("asarray");
  n->from_dlpack =
      py::hasattr(np, "from_dlpack") ? py::object(np.attr("from_dlpack")) : py::object(py::none());
  for (int d = 0; d <= static_cast<int>(DType::bfloat16); ++d) {
    n->dtypes.push_back(numpy_dtype_of(static_cast<DType>(d)));
  }
  if (!g_numpy) g_numpy = n;
}

std::optional<py::dtype> numpy_dtype(DType dtype) {
  return numpy().dtypes[static_cast<std::size_t>(dtype)];
}

std::optional<py::dtype> numpy_dtype_of(DType dtype) {
  switch (dtype) {
    case DType::float32: return py::dtype("float32");
    case DType::float16: return py::dtype("float16");
    case DType::uint8: return py::dtype("uint8");
    case DType::int32: return py::dtype("int32");
    case DType::int64: return py::dtype("int64");
    case DType::uint16: return py::dtype("uint16");
    case DType::uint32: return py::dtype("uint32");
    case DType::bfloat16: return std::nullopt;
  }
  return std::nullopt;
}

ArrayIn array_in(const py::handle& value, std::optional<DType> scalar) {
  ArrayIn in;
  if (py::isinstance<py::array>(value)) {
    in.array = py::reinterpret_borrow<py::array>(value);
  } else if (PyBool_Check(value.ptr()) || PyLong_Check(value.ptr()) || PyFloat_Check(value.ptr())) {
    DType as = scalar ? *scalar : (PyFloat_Check(value.ptr()) ? DType::float32 : DType::int64);
    const std::optional<py::dtype> dt = numpy_dtype(as);
    in.array = numpy().asarray(value, dt ? py::object(*dt) : py::object(py::none()));
  } else {
    py::object viewed = numpy().asarray(value);
    py::array a = py::reinterpret_borrow<py::array>(viewed);
    // numpy 1.24 does not read DLPack itself: an object it could only wrap is tried that way.
    if (a.dtype().kind() == 'O' && py::hasattr(value, "__dlpack__") &&
        !numpy().from_dlpack.is_none()) {
      viewed = numpy().from_dlpack(value);
    }
    in.array = py::reinterpret_borrow<py::array>(viewed);
  }
  in.dtype = dtype_of(in.array);
  in.shape.assign(in.array.shape(), in.array.shape() + in.array.ndim());
  return in;
}

std::string dtype_text(const ArrayIn& in) {
  return py::str(in.array.dtype()).cast<std::string>();
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
  }
  return s + "]";
}

void copy_packed(const ArrayIn& in, std::byte* dst, std::size_t bytes, bool release_gil) {
  if (bytes == 0) return;
  const auto* src = static_cast<const std::byte*>(in.array.data());
  const bool contiguous = (in.array.flags() & py::array::c_style) != 0 || in.shape.empty();
  const py::ssize_t* strides = in.array.strides();
  const auto item = static_cast<std::size_t>(in.array.itemsize());
  auto copy = [&] {
    if (contiguous) {
      std::memcpy(dst, src, bytes);
    } else {
      std::byte* at = dst;
      copy_strided(src, in.shape, strides, 0, item, at);
    }
  };
  // From 64 KiB a copy takes longer than handing the GIL to another body and back.
  constexpr std::size_t kReleaseAt = std::size_t{64} << 10;
  if (release_gil && bytes >= kReleaseAt) {
    py::gil_scoped_release nogil;
    copy();
  } else {
    copy();
  }
}

py::array view_rows(const TensorSpec& spec, std::size_t rows, std::byte* data) {
  std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(rows)};
  for (std::int64_t d : spec.shape) shape.push_back(static_cast<py::ssize_t>(d));
  const std::optional<py::dtype> dt = numpy_dtype(spec.dtype);
  if (!dt) {
    throw std::runtime_error("tensor '" + spec.name + "' is " + dtype_name(spec.dtype) +
                             ", which numpy has no dtype for");
  }
  // A base object makes numpy leave the memory alone (not owned) and keeps the view writable.
  py::capsule base(data, [](void*) {});
  return py::array(*dt, shape, data, base);
}

}  // namespace flowfeed::python
