// Python values into batch rows: the layout param, the layout of a first sample, and the checked
// copy of each array into the pool lease.
#include <cctype>
#include <charconv>
#include <cstring>
#include <stdexcept>

#include "flowfeed/drop_log.hpp"
#include "python_nodes.hpp"

namespace flowfeed::python {

namespace {

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

constexpr const char* kDtypes = "float32, float16, uint8, int32, int64, uint16, uint32";

std::string described(const std::vector<std::int64_t>& shape, const std::string& dtype) {
  return shape_text(shape) + " " + dtype;
}

}  // namespace

std::vector<TensorSpec> parse_layout(const std::vector<std::string>& entries) {
  std::vector<TensorSpec> out;
  for (const std::string& entry : entries) {
    const auto fail = [&](const std::string& why) {
      throw std::runtime_error("'" + entry + "': " + why +
                               " (an entry reads 'x: uint8 [224, 224, 3]', or 'y: int64' for a "
                               "scalar)");
    };
    const auto colon = entry.find(':');
    if (colon == std::string::npos) fail("no ':' after the tensor's name");
    TensorSpec spec;
    spec.name = trim(entry.substr(0, colon));
    if (spec.name.empty()) fail("the tensor has no name");
    std::string rest = trim(entry.substr(colon + 1));
    const auto open = rest.find('[');
    const std::string dtype = trim(rest.substr(0, open));
    const std::optional<DType> parsed = parse_dtype(dtype);
    if (!parsed || *parsed == DType::bfloat16) {
      fail("dtype '" + dtype + "' is not one of " + kDtypes);
    }
    spec.dtype = *parsed;
    if (open != std::string::npos) {
      const auto close = rest.find(']', open);
      if (close == std::string::npos || !trim(rest.substr(close + 1)).empty()) {
        fail("the shape is not one [...] at the end");
      }
      std::string dims = rest.substr(open + 1, close - open - 1);
      std::size_t at = 0;
      while (!trim(dims).empty() && at <= dims.size()) {
        const auto comma = std::min(dims.find(',', at), dims.size());
        const std::string d = trim(dims.substr(at, comma - at));
        std::int64_t v = 0;
        auto [end, ec] = std::from_chars(d.data(), d.data() + d.size(), v);
        if (d.empty() || ec != std::errc() || end != d.data() + d.size() || v < 1) {
          fail("dimension '" + d + "' is not a positive integer");
        }
        spec.shape.push_back(v);
        at = comma + 1;
      }
    }
    for (const TensorSpec& t : out) {
      if (t.name == spec.name) fail("tensor '" + spec.name + "' is declared twice");
    }
    if (!spec.checked_sample_bytes()) fail("the shape's size overflows 64 bits");
    out.push_back(std::move(spec));
  }
  return out;
}

std::vector<TensorSpec> infer_tensors(const py::handle& out, bool batched) {
  std::vector<std::pair<std::string, py::handle>> values;
  if (py::isinstance<py::dict>(out)) {
    for (const auto& [key, value] : out.cast<py::dict>()) {
      if (!py::isinstance<py::str>(key)) {
        throw std::runtime_error("key " + py::repr(key).cast<std::string>() +
                                 " is not a str (a tensor's name)");
      }
      values.emplace_back(key.cast<std::string>(), value);
    }
  } else if (py::isinstance<py::tuple>(out) && py::len(out) >= 1 && py::len(out) <= 2) {
    const char* names[] = {"x", "y"};
    std::size_t i = 0;
    for (const auto& value : out) values.emplace_back(names[i++], value);
  } else {
    throw std::runtime_error(
        "returned a " + py::str(py::type::handle_of(out).attr("__name__")).cast<std::string>() +
        ", not a dict of arrays ({\"x\": ..., \"y\": ...}) or an (x, y) tuple");
  }
  if (values.empty()) throw std::runtime_error("returned an empty dict (no tensor)");
  std::vector<TensorSpec> tensors;
  for (const auto& [name, value] : values) {
    const ArrayIn in = array_in(value, std::nullopt);
    if (!in.dtype) {
      throw std::runtime_error("key '" + name + "' has dtype " + dtype_text(in) +
                               ", which flowfeed does not carry (" + kDtypes +
                               ") convert it (e.g. .astype(numpy.float32)) or declare "
                               "params.layout");
    }
    TensorSpec spec{name, *in.dtype, in.shape};
    if (batched) {
      if (in.shape.empty()) {
        throw std::runtime_error("key '" + name +
                                 "' is a scalar, not a batch (its first dimension is the rows)");
      }
      spec.shape.erase(spec.shape.begin());
    }
    tensors.push_back(std::move(spec));
  }
  return tensors;
}

RowWriter::RowWriter(std::vector<TensorSpec> tensors) : tensors_(std::move(tensors)) {
  for (const TensorSpec& t : tensors_) keys_.emplace_back(py::str(t.name));
}

py::handle RowWriter::value_of(const py::handle& out, std::size_t i, bool tuple) const {
  if (tuple) return PyTuple_GET_ITEM(out.ptr(), static_cast<py::ssize_t>(i));
  PyObject* v = PyDict_GetItemWithError(out.ptr(), keys_[i].get().ptr());
  if (!v) {
    if (PyErr_Occurred()) throw py::error_already_set();
    std::string names;
    for (const TensorSpec& t : tensors_) names += (names.empty() ? "" : ", ") + t.name;
    throw std::runtime_error("key '" + tensors_[i].name + "' is missing (the layout has " + names +
                             ")");
  }
  return v;
}

void RowWriter::write(const ArrayIn& in, std::size_t i, std::byte* dst,
                      std::optional<std::size_t> lead, bool release_gil) const {
  const TensorSpec& t = tensors_[i];
  std::vector<std::int64_t> want = t.shape;
  if (lead) want.insert(want.begin(), static_cast<std::int64_t>(*lead));
  if (in.shape != want || in.dtype != t.dtype) {
    throw std::runtime_error("key '" + t.name + "' has shape " +
                             described(in.shape, dtype_text(in)) + ", the layout says " +
                             described(want, dtype_name(t.dtype)));
  }
  copy_packed(in, dst, t.sample_bytes() * (lead ? *lead : 1), release_gil);
}

void RowWriter::write_sample(const py::handle& sample, const std::vector<std::byte*>& bases,
                             std::size_t row) const {
  const bool tuple = py::isinstance<py::tuple>(sample);
  if (tuple) {
    if (py::len(sample) != tensors_.size()) {
      throw std::runtime_error("returned a tuple of " + std::to_string(py::len(sample)) +
                               " values, the layout has " + std::to_string(tensors_.size()) +
                               " tensors");
    }
  } else if (!py::isinstance<py::dict>(sample)) {
    throw std::runtime_error(
        "returned a " + py::str(py::type::handle_of(sample).attr("__name__")).cast<std::string>() +
        ", not a dict of arrays or a tuple");
  } else {
    check_keys(sample);
  }
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const py::handle value = value_of(sample, i, tuple);
    const ArrayIn in = array_in(value, tensors_[i].dtype);
    write(in, i, bases[i] + row * tensors_[i].sample_bytes(), std::nullopt, true);
  }
}

void RowWriter::check_keys(const py::handle& dict) const {
  // A dict of the layout's size holds only its keys, or value_of finds one missing.
  if (py::len(dict) == tensors_.size()) return;
  for (const auto& [key, value] : dict.cast<py::dict>()) {
    bool known = false;
    for (const auto& k : keys_) known = known || k.get().equal(key);
    if (!known) {
      throw std::runtime_error("key " + py::repr(key).cast<std::string>() +
                               " is not in the layout");
    }
  }
}

void RowWriter::write_batch(const py::handle& batch, const std::vector<std::byte*>& bases,
                            std::size_t rows, const py::dict* views) const {
  if (!py::isinstance<py::dict>(batch)) {
    throw std::runtime_error(
        "returned a " + py::str(py::type::handle_of(batch).attr("__name__")).cast<std::string>() +
        ", not a dict of batch arrays (or None after changing the batch in place)");
  }
  check_keys(batch);
  for (std::size_t i = 0; i < tensors_.size(); ++i) {
    const py::handle value = value_of(batch, i, false);
    if (views) {
      const py::handle view = (*views)[keys_[i].get()];
      if (value.is(view)) continue;  // changed in place, if at all
      ArrayIn in = array_in(value, tensors_[i].dtype);
      // A new array that reads the buffer it is copied into (a reversed view, say) is copied out
      // first, so the copy never reads bytes it already wrote.
      if (py::module_::import("numpy").attr("may_share_memory")(in.array, view).cast<bool>()) {
        in.array = in.array.attr("copy")();
      }
      write(in, i, bases[i], rows, true);
      continue;
    }
    write(array_in(value, tensors_[i].dtype), i, bases[i], rows, true);
  }
}

}  // namespace flowfeed::python
