// Pull-mode batches as DLPack tensors: the batch's holds (handles and exported tensors) are
// counted; the last one gives the batch back to the session, on CUDA after releasing it on the
// consumer's stream(s) (the device hand-off, flowfeed/cuda/handoff.hpp). See flowfeed/dlpack.hpp
// for the contract.
#include "flowfeed/dlpack.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "export_state.hpp"
#include "stream_sync.hpp"

namespace flowfeed {

DLDataType to_dlpack_dtype(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return {kDLFloat, 32, 1};
    case DType::float16: return {kDLFloat, 16, 1};
    case DType::uint8: return {kDLUInt, 8, 1};
    case DType::int32: return {kDLInt, 32, 1};
    case DType::int64: return {kDLInt, 64, 1};
    case DType::uint16: return {kDLUInt, 16, 1};
    case DType::uint32: return {kDLUInt, 32, 1};
    case DType::bfloat16: return {kDLBfloat, 16, 1};
  }
  return {kDLUInt, 8, 1};
}

// ---- BatchHandle

BatchHandle::BatchHandle(std::shared_ptr<detail::ExportState> state,
                         detail::HeldBatch* held) noexcept
    : state_(std::move(state)), held_(held) {}

BatchHandle::BatchHandle(const BatchHandle& other) noexcept
    : state_(other.state_), held_(other.held_) {
  if (held_) {
    held_->refs.fetch_add(1);
    held_->handles.fetch_add(1);
  }
}

BatchHandle& BatchHandle::operator=(const BatchHandle& other) noexcept {
  if (this != &other) {
    BatchHandle copy(other);
    *this = std::move(copy);
  }
  return *this;
}

BatchHandle::BatchHandle(BatchHandle&& other) noexcept
    : state_(std::move(other.state_)), held_(std::exchange(other.held_, nullptr)) {}

BatchHandle& BatchHandle::operator=(BatchHandle&& other) noexcept {
  if (this != &other) {
    release();
    state_ = std::move(other.state_);
    held_ = std::exchange(other.held_, nullptr);
  }
  return *this;
}

BatchHandle::~BatchHandle() {
  release();
}

void BatchHandle::release() noexcept {
  if (!held_) return;
  detail::HeldBatch* held = std::exchange(held_, nullptr);
  held->handles.fetch_sub(1);
  state_->unref(held);
  state_.reset();
}

void release_together(BatchHandle* handles, std::size_t count, std::intptr_t stream) noexcept {
  constexpr std::size_t kMostFenced = 64;  // a longer group releases the rest one by one
  std::array<detail::HeldBatch*, kMostFenced> group{};
  std::size_t n = 0;
  detail::ExportState* state = nullptr;
  for (std::size_t i = 0; i < count && n < group.size(); ++i) {
    BatchHandle& h = handles[i];
    if (!h.held_) continue;
    if (!state) state = h.state_.get();
    if (h.state_.get() == state) group[n++] = h.held_;
  }
  if (state) state->fence(group.data(), n, stream);
  for (std::size_t i = 0; i < count; ++i) handles[i].release();
}

const Batch& BatchHandle::batch() const {
  if (!held_ || !held_->batch) throw std::logic_error("BatchHandle: the handle holds no batch");
  return *held_->batch;
}

DLDevice BatchHandle::device() const {
  batch();
  return held_->device;
}

void BatchHandle::note_reader(ConsumerStream stream) const {
  batch();
  if (held_->device.device_type != kDLCUDA || !stream) return;
  std::lock_guard<std::mutex> lock(held_->mutex);
  if (*stream == -1) {
    held_->unknown_reader = true;
  } else if (std::find(held_->streams.begin(), held_->streams.end(), *stream) ==
             held_->streams.end()) {
    held_->streams.push_back(*stream);
  }
}

DLManagedTensor* BatchHandle::to_dlpack(std::string_view name, ConsumerStream stream) const {
  const Batch& b = batch();
  const int index = b.layout->find(name);
  if (index < 0) {
    std::string known;
    for (const auto& t : b.layout->tensors()) known += (known.empty() ? "'" : ", '") + t.name + "'";
    throw std::invalid_argument("the batch has no tensor '" + std::string(name) + "' (it has " +
                                known + ")");
  }
  return to_dlpack(static_cast<std::size_t>(index), stream);
}

void BatchHandle::synchronize(ConsumerStream stream) const {
  const Batch& b = batch();
  if (held_->device.device_type == kDLCPU) {
    if (stream && *stream != -1) {
      throw std::invalid_argument("stream " + std::to_string(*stream) +
                                  ": the batch is in host memory, where the stream must be None "
                                  "(or -1)");
    }
    return;
  }
  if (stream && (*stream == 0 || *stream < -1)) {
    throw std::invalid_argument(
        "stream " + std::to_string(*stream) +
        ": not a CUDA stream value (None or 1: the legacy default stream, 2: the per-thread "
        "default stream, -1: no synchronization, else a cudaStream_t)");
  }
  const std::intptr_t value = stream.value_or(1);
  // Waits only when needed: an upload the upload node saw complete orders nothing (the usual case
  // in pull mode; cuda::ready_pending).
  if (value != -1 && b.sync.ready()) {
    detail::cuda_wait_ready(value, held_->device.device_id, b.sync);
  }
  note_reader(value);
}

namespace {

/// Fills `t`'s DLTensor with tensor `index` of `b` (shape [rows, sample shape...], row-major
/// strides) on `device`.
void describe(detail::ExportedTensor& t, const Batch& b, std::size_t index, DLDevice device) {
  if (index >= b.layout->tensors().size()) {
    throw std::invalid_argument("tensor index " + std::to_string(index) + " is out of range");
  }
  const TensorSpec& spec = b.layout->tensors()[index];
  t.shape.reserve(spec.shape.size() + 1);
  t.shape.push_back(static_cast<std::int64_t>(b.rows()));
  t.shape.insert(t.shape.end(), spec.shape.begin(), spec.shape.end());
  t.strides.assign(t.shape.size(), 1);
  for (std::size_t i = t.shape.size() - 1; i > 0; --i) {
    t.strides[i - 1] = t.strides[i] * t.shape[i];
  }
  DLTensor& dl = t.managed.dl_tensor;
  dl.data = b.tensor(b.newest_tier(), index);
  dl.device = device;
  dl.ndim = static_cast<std::int32_t>(t.shape.size());
  dl.dtype = to_dlpack_dtype(spec.dtype);
  dl.shape = t.shape.data();
  dl.strides = t.strides.data();
  dl.byte_offset = 0;
  t.managed.manager_ctx = &t;
}

}  // namespace

DLManagedTensor* BatchHandle::to_dlpack(std::size_t index, ConsumerStream stream) const {
  const Batch& b = batch();
  auto t = std::make_unique<detail::ExportedTensor>();
  describe(*t, b, index, held_->device);
  synchronize(stream);
  t->state = state_;
  t->owner = state_->owner.lock();
  t->held = held_;
  t->managed.deleter = &detail::ExportedTensor::deleter;
  held_->refs.fetch_add(1);
  held_->tensors.fetch_add(1);
  return &t.release()->managed;
}

DLManagedTensor* BatchHandle::to_dlpack_view(std::size_t index) const {
  const Batch& b = batch();
  auto t = std::make_unique<detail::ExportedTensor>();
  describe(*t, b, index, held_->device);
  t->owner = state_->owner.lock();
  t->managed.deleter = &detail::ExportedTensor::view_deleter;
  return &t.release()->managed;
}

// ---- TensorSession

TensorSession::TensorSession(Pipeline& pipeline, std::weak_ptr<const void> owner)
    : state_(std::make_shared<detail::ExportState>()) {
  state_->pipeline = &pipeline;
  state_->owner = std::move(owner);
  state_->session.emplace(pipeline.start());
  const auto depth = static_cast<std::size_t>(pipeline.plan().prefetch_depth);
  for (std::size_t i = 0; i < depth; ++i) {
    state_->slots.push_back(std::make_unique<detail::HeldBatch>());
  }
}

TensorSession::~TensorSession() {
  close();
}

void TensorSession::close() noexcept {
  state_->owner_thread = std::this_thread::get_id();
  state_->close();
}

void TensorSession::request_stop() noexcept {
  state_->stop.store(true);
  state_->pipeline->request_stop();
}

std::size_t TensorSession::held() const noexcept {
  return state_->session ? state_->session->held() : 0;
}

bool TensorSession::finished() const noexcept {
  return state_->ended.load() || !state_->session || state_->session->finished();
}

RunReport TensorSession::report() {
  detail::ExportState& st = *state_;
  st.owner_thread = std::this_thread::get_id();
  if (!st.session) {
    if (st.final_report) return *st.final_report;
    throw std::logic_error("TensorSession::report: the run ended without a report");
  }
  st.drain_returned();
  return st.session->report();
}

BatchHandle TensorSession::next() {
  detail::ExportState& st = *state_;
  st.owner_thread = std::this_thread::get_id();
  st.drain_returned();
  if (!st.session || st.ended) return {};
  const PipelineOptions& options = st.pipeline->config().pipeline;
  const auto depth = static_cast<std::size_t>(st.pipeline->plan().prefetch_depth);
  if (st.session->held() >= depth) {
    // Every batch in flight is the caller's: wait for one to come back from another thread.
    const double timeout = options.stall_timeout_s > 0 ? options.stall_timeout_s : 10.0;
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(st.mutex);
    while (st.returned.empty()) {
      if (st.stop.load()) return {};  // nothing more can come before the caller gives one back
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited >= timeout) throw AllBatchesHeld(st.held_message(timeout));
      // Short slices: request_stop() from a signal handler cannot notify.
      st.cv.wait_for(lock, std::chrono::milliseconds(20));
    }
    lock.unlock();
    st.drain_returned();
  }
  Batch* b = st.session->next();
  if (!b) {
    st.ended = true;
    return {};
  }
  detail::HeldBatch* held = nullptr;
  DLDevice device{kDLCPU, 0};
  try {
    held = st.free_slot();
    device = st.device_of(*b);
  } catch (...) {
    st.session->release(b);
    throw;
  }
  held->device = device;
  {
    std::lock_guard<std::mutex> lock(held->mutex);
    held->streams.clear();
    held->unknown_reader = false;
  }
  held->fenced = false;
  held->tensors = 0;
  held->handles = 1;
  held->refs = 1;
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    held->batch = b;
  }
  return BatchHandle(state_, held);
}

}  // namespace flowfeed
