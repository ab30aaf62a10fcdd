// flowfeed.Batch and flowfeed.Tensor: a batch's tensors exported without copies through DLPack
// (`__dlpack__`, `__dlpack_device__`), `__cuda_array_interface__` (v3) on CUDA and
// `__array_interface__` on the host.
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.hpp"

namespace flowfeed::python {

namespace {

const char* typestr(DType dtype) {
  switch (dtype) {
    case DType::float32: return "<f4";
    case DType::float16: return "<f2";
    case DType::uint8: return "|u1";
    case DType::int32: return "<i4";
    case DType::int64: return "<i8";
    case DType::uint16: return "<u2";
    case DType::uint32: return "<u4";
    case DType::bfloat16: return "<V2";  // no numpy dtype: raw 2-byte values (DLPack says bfloat16)
  }
  return "|u1";
}

ConsumerStream to_stream(const py::object& stream) {
  if (stream.is_none()) return std::nullopt;
  return stream.cast<std::intptr_t>();
}

constexpr const char* kCapsuleName = "dltensor";

/// A capsule nobody consumed still owns its tensor: delete it (the consumer renames it once it
/// takes the tensor over).
void capsule_destructor(PyObject* capsule) {
  if (!PyCapsule_IsValid(capsule, kCapsuleName)) return;
  auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed && managed->deleter) managed->deleter(managed);
}

}  // namespace

std::size_t tensor_index(const Batch& batch, const std::string& name) {
  const int index = batch.layout->find(name);
  if (index < 0) {
    std::string known;
    for (const auto& t : batch.layout->tensors())
      known += (known.empty() ? "'" : ", '") + t.name + "'";
    throw py::key_error("the batch has no tensor '" + name + "' (it has " + known + ")");
  }
  return static_cast<std::size_t>(index);
}

py::capsule dlpack_capsule(DLManagedTensor* managed) {
  PyObject* capsule = PyCapsule_New(managed, kCapsuleName, &capsule_destructor);
  if (!capsule) {
    managed->deleter(managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

/// One tensor of a batch; holds the batch (it does not go back while a Tensor or a tensor exported
/// from it is alive).
class Tensor {
 public:
  Tensor(std::shared_ptr<PipelineHolder> holder, BatchHandle handle, std::size_t index)
      : holder_(std::move(holder)), handle_(std::move(handle)), index_(index) {
    const Batch& b = handle_.batch();
    const TensorSpec& spec = b.layout->tensors()[index];
    dtype_ = spec.dtype;
    name_ = spec.name;
    shape_.push_back(static_cast<std::int64_t>(b.rows()));
    shape_.insert(shape_.end(), spec.shape.begin(), spec.shape.end());
    data_ = reinterpret_cast<std::uintptr_t>(b.tensor(b.newest_tier(), index));
    device_ = handle_.device();
    upload_stream_ = reinterpret_cast<std::uintptr_t>(b.sync.stream());
  }

  py::capsule dlpack(const py::object& stream, const py::object& max_version,
                     const py::object& dl_device, const py::object& copy) {
    if (!copy.is_none() && copy.cast<bool>()) {
      throw py::buffer_error("flowfeed exports its buffers without copies (copy=True asked)");
    }
    if (!dl_device.is_none()) {
      auto asked = dl_device.cast<std::pair<int, int>>();
      if (asked.first != device_.device_type || asked.second != device_.device_id) {
        throw py::buffer_error("the tensor lives on device (" +
                               std::to_string(device_.device_type) + ", " +
                               std::to_string(device_.device_id) + "), not on the one asked");
      }
    }
    // Versioned capsules need DLPack >= 1.0; every consumer also takes the unversioned one.
    (void)max_version;
    return dlpack_capsule(handle_.to_dlpack(index_, to_stream(stream)));
  }

  py::tuple dlpack_device() const {
    return py::make_tuple(static_cast<int>(device_.device_type), device_.device_id);
  }

  py::dict cuda_array_interface() {
    if (device_.device_type != kDLCUDA) {
      throw py::attribute_error("__cuda_array_interface__: the tensor is in host memory");
    }
    // The consumer synchronizes on the upload stream; its own stream is unknown to us, so the
    // reuse event goes on the legacy default stream too (see docs/PYTHON.md).
    handle_.note_reader(-1);
    py::dict d = interface();
    d["stream"] = upload_stream_ ? py::object(py::int_(upload_stream_)) : py::object(py::none());
    return d;
  }

  py::dict array_interface() const {
    if (device_.device_type != kDLCPU) {
      throw py::attribute_error("__array_interface__: the tensor is in device memory");
    }
    return interface();
  }

  /// What __array_interface__ and __cuda_array_interface__ (version 3) share: shape, type, the
  /// data pointer (writable), C order.
  py::dict interface() const {
    py::dict d;
    d["shape"] = shape_tuple();
    d["typestr"] = typestr(dtype_);
    d["data"] = py::make_tuple(data_, false);
    d["version"] = 3;
    d["strides"] = py::none();
    return d;
  }

  py::tuple shape_tuple() const {
    py::tuple t(shape_.size());
    for (std::size_t i = 0; i < shape_.size(); ++i) t[i] = py::int_(shape_[i]);
    return t;
  }
  std::string dtype() const { return dtype_name(dtype_); }
  const std::string& name() const { return name_; }
  std::uintptr_t data_ptr() const { return data_; }
  std::string repr() const {
    std::string s = "flowfeed.Tensor('" + name_ + "', " + dtype() + ", [";
    for (std::size_t i = 0; i < shape_.size(); ++i)
      s += (i ? ", " : "") + std::to_string(shape_[i]);
    return s + "], " +
           (device_.device_type == kDLCUDA ? "cuda:" + std::to_string(device_.device_id)
                                           : std::string("cpu")) +
           ")";
  }

 private:
  std::shared_ptr<PipelineHolder> holder_;
  BatchHandle handle_;
  std::size_t index_;
  DType dtype_ = DType::float32;
  std::string name_;
  std::vector<std::int64_t> shape_;
  std::uintptr_t data_ = 0;
  std::uintptr_t upload_stream_ = 0;
  DLDevice device_{kDLCPU, 0};
};

/// A batch taken from a pipeline: its tensors by name, and release().
class PyBatch {
 public:
  PyBatch(std::shared_ptr<PipelineHolder> holder, BatchHandle handle)
      : holder_(std::move(holder)), handle_(std::move(handle)) {
    const Batch& b = handle_.batch();
    seq_ = b.seq;
    epoch_ = b.epoch;
    index_in_epoch_ = b.index_in_epoch;
  }

  Tensor get(const std::string& name) {
    return Tensor(holder_, handle_, tensor_index(live(), name));
  }
  std::vector<std::string> keys() {
    std::vector<std::string> k;
    for (const auto& t : live().layout->tensors()) k.push_back(t.name);
    return k;
  }
  bool contains(const std::string& name) { return live().layout->find(name) >= 0; }
  std::size_t rows() { return live().rows(); }
  std::vector<std::uint32_t> samples() { return live().samples; }
  void release(const py::object& stream) {
    if (!handle_) return;
    if (!stream.is_none()) handle_.note_reader(to_stream(stream));
    handle_.release();
  }
  bool released() const { return !handle_; }
  std::uint64_t seq() const { return seq_; }
  std::uint32_t epoch() const { return epoch_; }
  std::uint64_t index_in_epoch() const { return index_in_epoch_; }
  std::string repr() const {
    return "flowfeed.Batch(seq=" + std::to_string(seq_) + ", epoch=" + std::to_string(epoch_) +
           (handle_ ? ")" : ", released)");
  }

 private:
  const Batch& live() {
    if (!handle_) {
      throw py::value_error("batch " + std::to_string(seq_) +
                            " was released: its tensors can no longer be taken");
    }
    return handle_.batch();
  }
  std::shared_ptr<PipelineHolder> holder_;
  BatchHandle handle_;
  std::uint64_t seq_ = 0;
  std::uint32_t epoch_ = 0;
  std::uint64_t index_in_epoch_ = 0;
};

py::object make_batch(std::shared_ptr<PipelineHolder> holder, BatchHandle handle) {
  return py::cast(PyBatch(std::move(holder), std::move(handle)));
}

void bind_batch(py::module_& m) {
  py::class_<Tensor>(m, "Tensor",
                     "One tensor of a batch, in the pipeline's buffer (no copy). Import it with "
                     "torch.from_dlpack, numpy.from_dlpack (host backend), cupy.from_dlpack or "
                     "jax.dlpack.from_dlpack. Holds its batch until it and every tensor exported "
                     "from it are gone.")
      .def("__dlpack__", &Tensor::dlpack, py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none(),
           "A DLPack capsule. On CUDA, `stream` (None or 1: legacy default, 2: per-thread default, "
           "a cudaStream_t, -1: no synchronization) is made to wait on the batch's ready event and "
           "gets the reuse event when the batch goes back.")
      .def("__dlpack_device__", &Tensor::dlpack_device)
      .def_property_readonly("__cuda_array_interface__", &Tensor::cuda_array_interface)
      .def_property_readonly("__array_interface__", &Tensor::array_interface)
      .def_property_readonly("shape", &Tensor::shape_tuple)
      .def_property_readonly("dtype", &Tensor::dtype, "e.g. 'float32'")
      .def_property_readonly("name", &Tensor::name)
      .def_property_readonly("data_ptr", &Tensor::data_ptr)
      .def_property_readonly("device", &Tensor::dlpack_device, "(DLPack device type, id)")
      .def("__repr__", &Tensor::repr);

  py::class_<PyBatch>(m, "Batch",
                      "A batch taken from a Pipeline. batch['x'] is a Tensor. The batch goes back "
                      "to the pipeline once it was released (release(), the end of a with block, "
                      "or the object being freed) and every tensor taken from it was freed.")
      .def("__getitem__", &PyBatch::get)
      .def("__contains__", &PyBatch::contains)
      .def("keys", &PyBatch::keys, "The tensor names, in buffer order.")
      .def("release", &PyBatch::release, py::arg("stream") = py::none(),
           "Gives the batch back (once its exported tensors are freed too). On CUDA, `stream` "
           "(array-API value) is a stream that read the tensors without __dlpack__: the reuse "
           "event is recorded on it as well.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__",
           [](PyBatch& self, const py::object&, const py::object&, const py::object&) {
             self.release(py::none());
             return false;
           })
      .def_property_readonly("released", &PyBatch::released)
      .def_property_readonly("seq", &PyBatch::seq, "Position in the whole run: 0, 1, 2, ...")
      .def_property_readonly("epoch", &PyBatch::epoch)
      .def_property_readonly("index_in_epoch", &PyBatch::index_in_epoch)
      .def_property_readonly("rows", &PyBatch::rows, "Samples in the batch.")
      .def_property_readonly("samples", &PyBatch::samples, "Data-set indices of the rows.")
      .def("__repr__", &PyBatch::repr);
}

}  // namespace flowfeed::python
