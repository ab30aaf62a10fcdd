// Pipeline.views(): batches whose tensors come back already imported into a framework. Each buffer
// of the pool is imported once (through a DLPack view that does not hold a batch) and the tensor
// object is reused whenever that buffer holds the batch, so a batch costs a wait on the consumer's
// stream and no framework import.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"

namespace flowfeed::python {

namespace {

/// One buffer's tensor, handed to an importer once: `__dlpack__` gives its capsule (whatever the
/// stream: the views iterator orders each batch itself).
class BufferView {
 public:
  BufferView(DLManagedTensor* managed, DLDevice device) : managed_(managed), device_(device) {}
  BufferView(BufferView&& other) noexcept
      : managed_(std::exchange(other.managed_, nullptr)), device_(other.device_) {}
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;
  BufferView& operator=(BufferView&&) = delete;
  ~BufferView() {
    if (managed_) managed_->deleter(managed_);
  }

  py::capsule dlpack(const py::object&, const py::object&, const py::object&,
                     const py::object& copy) {
    if (!copy.is_none() && copy.cast<bool>()) {
      throw py::buffer_error("flowfeed exports its buffers without copies (copy=True asked)");
    }
    if (!managed_) throw py::buffer_error("the buffer view was already imported");
    return dlpack_capsule(std::exchange(managed_, nullptr));
  }
  py::tuple dlpack_device() const {
    return py::make_tuple(static_cast<int>(device_.device_type), device_.device_id);
  }

 private:
  DLManagedTensor* managed_;
  DLDevice device_;
};

/// What a Views object and its epoch iterators share: the names, the importer, the stream and
/// the imported tensor of each pool buffer (kept across epochs and runs: the pools are allocated
/// once).
struct ViewsState {
  using Key = std::pair<const void*, std::size_t>;  // the buffer and the batch's rows

  std::shared_ptr<PipelineHolder> holder;
  std::vector<std::string> names;
  bool single = false;
  py::object importer;
  ConsumerStream stream;
  std::vector<std::size_t> indices;              // empty until the first batch
  std::vector<std::map<Key, py::object>> cache;  // per name

  void resolve(const Batch& b) {
    std::vector<std::size_t> resolved;  // all or nothing: an unknown name leaves none resolved
    for (const std::string& name : names) resolved.push_back(tensor_index(b, name));
    indices = std::move(resolved);
    cache.resize(indices.size());
  }
};

/// One epoch of a Views object.
class ViewIterator {
 public:
  explicit ViewIterator(std::shared_ptr<ViewsState> state)
      : state_(std::move(state)), cursor_(state_->holder, false) {
    // Batches go back in groups of a quarter of the batches in flight (at most 8), with one
    // event recorded on the stream for the group instead of one per batch; one at a time below 8
    // and under prefetch_depth: auto (whose tuner may keep fewer in flight than the pools hold).
    const Pipeline& pipeline = state_->holder->get();
    const int depth = pipeline.plan().prefetch_depth;
    if (depth >= 8 && !pipeline.config().pipeline.auto_prefetch_depth) {
      group_ = std::min<std::size_t>(8, static_cast<std::size_t>(depth) / 4);
    }
    returning_.reserve(group_);
  }

  py::object next() {
    // The batch handed out last goes back first (with those before it, once a group is full),
    // after the work the caller queued on the stream for it.
    if (current_) returning_.push_back(std::move(current_));
    if (returning_.size() >= group_) give_back();
    BatchHandle handle = cursor_.next();
    if (!handle) {
      give_back();
      throw py::stop_iteration();
    }
    ViewsState& st = *state_;
    const Batch& b = handle.batch();
    if (st.indices.empty()) st.resolve(b);
    handle.synchronize(st.stream);
    py::tuple out(st.indices.size());
    for (std::size_t i = 0; i < st.indices.size(); ++i) {
      const ViewsState::Key key{b.tensor(b.newest_tier(), st.indices[i]), b.rows()};
      auto found = st.cache[i].find(key);
      if (found == st.cache[i].end()) {
        BufferView view(handle.to_dlpack_view(st.indices[i]), handle.device());
        py::object imported = st.importer(py::cast(std::move(view)));
        found = st.cache[i].emplace(key, std::move(imported)).first;
      }
      out[i] = found->second;
    }
    current_ = std::move(handle);
    if (st.single) return out[0];
    return out;
  }

 private:
  /// Releases the batches read so far: on CUDA with one event on the stream for all of them.
  void give_back() noexcept {
    if (returning_.empty()) return;
    const ConsumerStream& stream = state_->stream;
    release_together(returning_.data(), returning_.size(), stream.value_or(1));
    returning_.clear();
  }

  std::shared_ptr<ViewsState> state_;
  EpochCursor cursor_;
  std::size_t group_ = 1;
  std::vector<BatchHandle> returning_;  // read, not yet given back
  BatchHandle current_;
};

/// What Pipeline.views() returns: each iteration is the next epoch.
class Views {
 public:
  explicit Views(std::shared_ptr<ViewsState> state) : state_(std::move(state)) {}
  ViewIterator epoch() {
    state_->holder->ensure_session();
    return ViewIterator(state_);
  }

 private:
  std::shared_ptr<ViewsState> state_;
};

}  // namespace

ConsumerStream stream_value(const py::object& stream) {
  if (stream.is_none()) return std::nullopt;
  if (py::hasattr(stream, "cuda_stream")) {
    const auto value = stream.attr("cuda_stream").cast<std::intptr_t>();
    return value == 0 ? 1 : value;  // torch's default stream: the legacy default stream
  }
  if (py::hasattr(stream, "ptr")) {
    const auto value = stream.attr("ptr").cast<std::intptr_t>();
    return value == 0 ? 1 : value;  // CuPy's null stream
  }
  return stream.cast<std::intptr_t>();
}

py::object make_views(std::shared_ptr<PipelineHolder> holder, const py::object& names,
                      const py::object& importer, const py::object& stream) {
  std::vector<std::string> list;
  const bool single = py::isinstance<py::str>(names);
  if (single) {
    list.push_back(names.cast<std::string>());
  } else {
    for (const auto& name : names) list.push_back(py::str(name).cast<std::string>());
  }
  if (list.empty()) throw py::value_error("views: name at least one tensor (e.g. ['x', 'y'])");
  if (!PyCallable_Check(importer.ptr())) {
    throw py::type_error("views: importer must be callable (e.g. torch.from_dlpack)");
  }
  auto state = std::make_shared<ViewsState>();
  state->holder = std::move(holder);
  state->names = std::move(list);
  state->single = single;
  state->importer = importer;
  state->stream = stream_value(stream);
  return py::cast(Views(std::move(state)));
}

void bind_views(py::module_& m) {
  py::class_<BufferView>(m, "BufferView",
                         "One pool buffer's tensor, for an importer (made by Pipeline.views).")
      .def("__dlpack__", &BufferView::dlpack, py::arg("stream") = py::none(),
           py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
           py::arg("copy") = py::none())
      .def("__dlpack_device__", &BufferView::dlpack_device);
  py::class_<ViewIterator>(m, "ViewIterator")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &ViewIterator::next);
  py::class_<Views>(m, "Views",
                    "Tensors of each batch already imported, one import per pool buffer (made by "
                    "Pipeline.views). Iterating it gives the next epoch; iterate the same object "
                    "every epoch to keep its imports.")
      .def("__iter__", &Views::epoch);
}

}  // namespace flowfeed::python
