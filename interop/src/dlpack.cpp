// Pull-mode batches as DLPack tensors: the batch's holds (handles and exported tensors) are
// counted; the last one gives the batch back to the session, on CUDA after recording the reuse
// event on the consumer's stream(s). See flowfeed/dlpack.hpp for the contract.
#include "flowfeed/dlpack.hpp"

#include <algorithm>
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

#include "stream_sync.hpp"

namespace flowfeed {

namespace detail {

/// One batch the caller holds: its handles and live exported tensors are counted in `refs`.
struct HeldBatch {
  Batch* batch = nullptr;  // null while the slot is free
  DLDevice device{kDLCPU, 0};
  std::atomic<int> refs{0};
  std::atomic<int> handles{0};
  std::atomic<int> tensors{0};
  std::mutex mutex;                    // guards the readers below
  std::vector<std::intptr_t> streams;  // distinct streams the tensors were exported to
  bool unknown_reader = false;         // read on a stream we were not told (-1)
};

class ExportState : public std::enable_shared_from_this<ExportState> {
 public:
  Pipeline* pipeline = nullptr;
  std::weak_ptr<const void> owner;
  std::optional<Session> session;
  std::vector<std::unique_ptr<HeldBatch>> slots;
  std::atomic<std::thread::id> owner_thread{};
  std::atomic<bool> stop{false};
  std::atomic<bool> ended{false};

  std::mutex mutex;  // guards closed, returned and the slots' `batch` while closing
  std::condition_variable cv;
  bool closed = false;
  std::vector<HeldBatch*> returned;  // whose last hold went away off the owner thread
  std::optional<RunReport> final_report;

  std::mutex join_mutex;  // one join event for batches read on several streams
  void* join_event = nullptr;
  int join_device = -1;
  std::map<const BufferPool*, int> pool_device;  // owner thread only

  ~ExportState() { detail::cuda_event_destroy(join_event); }

  /// Drops one hold; the last gives the batch back (or queues it for the owner thread).
  void unref(HeldBatch* held) noexcept {
    if (held->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    record_reuse(*held);
    if (owner_thread.load() == std::this_thread::get_id()) {
      give_back(held);
      return;
    }
    std::lock_guard<std::mutex> lock(mutex);
    if (closed) return;
    returned.push_back(held);
    cv.notify_all();
  }

  /// On CUDA: the reuse event on every stream that reads the batch, so that the upload overwrites
  /// the buffer only after them.
  void record_reuse(HeldBatch& held) noexcept {
    Batch* b = held.batch;
    if (!b || held.device.device_type != kDLCUDA || !b->reuse_event) return;
    std::vector<std::intptr_t> targets;
    {
      std::lock_guard<std::mutex> lock(held.mutex);
      targets = held.streams;
      if (held.unknown_reader && std::find(targets.begin(), targets.end(), 1) == targets.end()) {
        targets.push_back(1);  // the legacy default stream: orders after blocking streams
      }
    }
    if (targets.empty()) return;
    const int device = held.device.device_id;
    try {
      std::lock_guard<std::mutex> lock(join_mutex);
      if (targets.size() > 1 && (!join_event || join_device != device)) {
        detail::cuda_event_destroy(join_event);
        join_event = nullptr;
        join_event = detail::cuda_event_create(device);
        join_device = device;
      }
      // The last stream waits for the others, then carries the reuse event for all of them.
      for (std::size_t i = 0; i + 1 < targets.size(); ++i) {
        detail::cuda_record(targets[i], device, join_event);
        detail::cuda_stream_wait(targets.back(), device, join_event);
      }
      detail::cuda_record(targets.back(), device, b->reuse_event);
    } catch (...) {
      // A failed record (a destroyed stream, a lost context) cannot be reported from a deleter;
      // the upload's own CUDA calls report a broken context.
    }
  }

  /// Returns a batch to the session (owner thread). Never throws.
  void give_back(HeldBatch* held) noexcept {
    Batch* b = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      b = held->batch;
      held->batch = nullptr;
      if (closed || !b) return;
    }
    try {
      session->release(b);
    } catch (...) {
      // Only a batch the session no longer knows (it was closed): nothing to return.
    }
  }

  /// Gives back the batches queued by other threads (owner thread).
  void drain_returned() {
    std::vector<HeldBatch*> batches;
    {
      std::lock_guard<std::mutex> lock(mutex);
      batches.swap(returned);
    }
    for (HeldBatch* h : batches) give_back(h);
  }

  HeldBatch* free_slot() {
    for (auto& s : slots) {
      if (!s->batch && s->refs.load() == 0) return s.get();
    }
    slots.push_back(std::make_unique<HeldBatch>());
    return slots.back().get();
  }

  DLDevice device_of(const Batch& b) {
    const Tier tier = b.newest_tier();
    const BufferPool* pool = b.lease(tier).pool();
    if (!pool || pool->kind() != MemoryKind::device || !detail::cuda_interop_built()) {
      return {kDLCPU, 0};
    }
    auto it = pool_device.find(pool);
    if (it == pool_device.end()) {
      it = pool_device.emplace(pool, detail::cuda_device_of(b.data(tier))).first;
    }
    return {kDLCUDA, it->second};
  }

  std::string held_message(double waited_s) const {
    std::ostringstream out;
    const auto depth = pipeline->config().pipeline.prefetch_depth;
    out << "run stalled: the caller holds all " << depth
        << " batches the pipeline may have in flight (pipeline.prefetch_depth) and none came back "
           "for "
        << waited_s << " s:";
    for (const auto& s : slots) {
      const Batch* b = s->batch;
      if (!b) continue;
      const int tensors = s->tensors.load();
      out << " batch " << b->seq << " (epoch " << b->epoch << ": "
          << (s->handles.load() > 0 ? "not released" : "released") << ", " << tensors
          << (tensors == 1 ? " exported tensor" : " exported tensors") << " alive);";
    }
    out << " a batch goes back once it was released and every tensor taken from it was freed "
           "(release batches and drop tensors kept across steps, or raise "
           "pipeline.prefetch_depth)";
    return out.str();
  }

  void close() noexcept {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (closed && !session) return;
    }
    if (session) {
      try {
        if (!session->finished()) pipeline->request_stop();
        drain_returned();
        for (auto& s : slots) {
          if (s->batch) record_reuse(*s);  // tensors may still be alive: order the next upload
          give_back(s.get());
        }
        // After the stop, next() hands out what is in flight, then ends (and closes) the run.
        while (Batch* b = session->next()) session->release(b);
      } catch (...) {
        // The run failed; the report below still says how far it got.
      }
      try {
        final_report = session->report();
      } catch (...) {
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      closed = true;
      returned.clear();
    }
    session.reset();
    ended = true;
  }
};

/// An exported tensor: the DLManagedTensor and what it points into.
struct ExportedTensor {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::shared_ptr<ExportState> state;
  std::shared_ptr<const void> owner;
  HeldBatch* held = nullptr;

  static void deleter(DLManagedTensor* self) {
    auto* t = static_cast<ExportedTensor*>(self->manager_ctx);
    t->held->tensors.fetch_sub(1);
    t->state->unref(t->held);
    delete t;
  }
};

}  // namespace detail

DLDataType to_dlpack_dtype(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return {kDLFloat, 32, 1};
    case DType::float16: return {kDLFloat, 16, 1};
    case DType::uint8: return {kDLUInt, 8, 1};
    case DType::int32: return {kDLInt, 32, 1};
    case DType::int64: return {kDLInt, 64, 1};
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

DLManagedTensor* BatchHandle::to_dlpack(std::size_t index, ConsumerStream stream) const {
  const Batch& b = batch();
  if (index >= b.layout->tensors().size()) {
    throw std::invalid_argument("tensor index " + std::to_string(index) + " is out of range");
  }
  const DLDevice device = held_->device;
  if (device.device_type == kDLCPU) {
    if (stream && *stream != -1) {
      throw std::invalid_argument("stream " + std::to_string(*stream) +
                                  ": the batch is in host memory, where the stream must be None "
                                  "(or -1)");
    }
  } else {
    if (stream && (*stream == 0 || *stream < -1)) {
      throw std::invalid_argument(
          "stream " + std::to_string(*stream) +
          ": not a CUDA stream value (None or 1: the legacy default stream, 2: the per-thread "
          "default stream, -1: no synchronization, else a cudaStream_t)");
    }
    const std::intptr_t value = stream.value_or(1);
    if (value != -1 && b.ready_event)
      detail::cuda_stream_wait(value, device.device_id, b.ready_event);
    note_reader(value);
  }

  const TensorSpec& spec = b.layout->tensors()[index];
  auto t = std::make_unique<detail::ExportedTensor>();
  t->shape.reserve(spec.shape.size() + 1);
  t->shape.push_back(static_cast<std::int64_t>(b.rows()));
  t->shape.insert(t->shape.end(), spec.shape.begin(), spec.shape.end());
  t->strides.assign(t->shape.size(), 1);
  for (std::size_t i = t->shape.size() - 1; i > 0; --i) {
    t->strides[i - 1] = t->strides[i] * t->shape[i];
  }
  t->state = state_;
  t->owner = state_->owner.lock();
  t->held = held_;
  DLTensor& dl = t->managed.dl_tensor;
  dl.data = b.tensor(b.newest_tier(), index);
  dl.device = device;
  dl.ndim = static_cast<std::int32_t>(t->shape.size());
  dl.dtype = to_dlpack_dtype(spec.dtype);
  dl.shape = t->shape.data();
  dl.strides = t->strides.data();
  dl.byte_offset = 0;
  t->managed.manager_ctx = t.get();
  t->managed.deleter = &detail::ExportedTensor::deleter;
  held_->refs.fetch_add(1);
  held_->tensors.fetch_add(1);
  return &t.release()->managed;
}

// ---- TensorSession

TensorSession::TensorSession(Pipeline& pipeline, std::weak_ptr<const void> owner)
    : state_(std::make_shared<detail::ExportState>()) {
  state_->pipeline = &pipeline;
  state_->owner = std::move(owner);
  state_->session.emplace(pipeline.start());
  const auto depth = static_cast<std::size_t>(pipeline.config().pipeline.prefetch_depth);
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
  const auto depth = static_cast<std::size_t>(options.prefetch_depth);
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
