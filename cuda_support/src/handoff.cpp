// The device hand-off (flowfeed/cuda/handoff.hpp): the only code that reads or writes the fields
// of a DeviceSync.
#include "flowfeed/cuda/handoff.hpp"

#include "flowfeed/cuda/check.hpp"

namespace flowfeed::cuda {

/// DeviceSync's typed view: its fields are opaque (void*) in the public header, which includes no
/// CUDA header.
struct SyncAccess {
  static cudaEvent_t ready(const DeviceSync& s) noexcept {
    return static_cast<cudaEvent_t>(s.ready_);
  }
  static cudaEvent_t reuse(const DeviceSync& s) noexcept {
    return static_cast<cudaEvent_t>(s.reuse_);
  }
  static bool ready_seen_complete(const DeviceSync& s) noexcept {
    return s.ready_ == s.ready_complete_;
  }
  static void* stream(const DeviceSync& s) noexcept { return s.stream_; }
  static std::uint64_t order(const DeviceSync& s) noexcept { return s.order_; }
  static FenceSlot* fence(const DeviceSync& s) noexcept { return s.fence_; }

  /// A producer's buffer handed on: ready behind `ready` on `stream`, not yet seen complete.
  static void hand_on(DeviceSync& s, cudaEvent_t ready, cudaEvent_t reuse, FenceSlot* fence,
                      cudaStream_t stream, std::uint64_t order, int stream_index) noexcept {
    s.ready_ = ready;
    s.ready_complete_ = nullptr;
    s.reuse_ = reuse;
    s.fence_ = fence;
    s.stream_ = stream;
    s.order_ = order;
    s.stream_index_ = stream_index;
  }
  /// The same buffer behind a new ready event; reuse, fence and stream_index stay.
  static void hand_on_in_place(DeviceSync& s, cudaEvent_t ready, cudaStream_t stream) noexcept {
    s.ready_ = ready;
    s.ready_complete_ = nullptr;
    s.stream_ = stream;
    s.order_ = 0;
  }
  static void mark_complete(DeviceSync& s) noexcept { s.ready_complete_ = s.ready_; }
};

void wait_ready(const DeviceSync& sync, cudaStream_t stream) {
  if (!sync.ready()) return;
  FLOWFEED_CUDA_CHECK(cudaStreamWaitEvent(stream, SyncAccess::ready(sync), 0));
}

void wait_ready_all(const DeviceSync* const* group, std::size_t count, cudaStream_t stream) {
  struct Newest {
    void* stream;
    std::uint64_t order;
    const DeviceSync* sync;
  };
  // Producer streams are few (an upload's `streams`, a transform's one): a short linear search in
  // a fixed array; past its end a batch is waited on alone, which is as correct.
  constexpr std::size_t kStreams = 32;
  Newest newest[kStreams];
  std::size_t streams = 0;
  for (std::size_t g = 0; g < count; ++g) {
    const DeviceSync& s = *group[g];
    const std::uint64_t order = SyncAccess::order(s);
    void* const on = SyncAccess::stream(s);
    if (order == 0 || !on) {
      wait_ready(s, stream);
      continue;
    }
    std::size_t i = 0;
    while (i < streams && newest[i].stream != on) ++i;
    if (i == kStreams) {
      wait_ready(s, stream);
      continue;
    }
    if (i == streams) newest[streams++] = {on, 0, nullptr};
    if (order > newest[i].order) newest[i] = {on, order, &s};
  }
  for (std::size_t i = 0; i < streams; ++i) wait_ready(*newest[i].sync, stream);
}

bool ready_pending(const DeviceSync& sync) {
  if (!sync.ready() || SyncAccess::ready_seen_complete(sync)) return false;
  // An event that already completed orders nothing: a prefetched batch's upload usually has, and
  // the query costs less than queueing a wait on the reader's stream.
  const cudaError_t state = cudaEventQuery(SyncAccess::ready(sync));
  if (state == cudaSuccess) return false;
  if (state != cudaErrorNotReady) check(state, "cudaEventQuery");
  return true;
}

void synchronize_ready(const DeviceSync& sync) {
  if (!sync.ready()) return;
  FLOWFEED_CUDA_CHECK(cudaEventSynchronize(SyncAccess::ready(sync)));
}

void release_after(const DeviceSync& sync, cudaStream_t stream) {
  if (!sync.wants_release()) return;
  FLOWFEED_CUDA_CHECK(cudaEventRecord(SyncAccess::reuse(sync), stream));
}

void ReuseFences::create(std::size_t events) {
  for (std::size_t i = 0; i < events; ++i) {
    cudaEvent_t e = nullptr;
    FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
}

void ReuseFences::destroy() noexcept {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  events_.clear();
}

void ReuseFences::fence_group(DeviceSync* const* group, std::size_t count, cudaStream_t stream) {
  cudaEvent_t fence = nullptr;
  for (std::size_t i = 0; i < count; ++i) {
    DeviceSync& s = *group[i];
    if (!s.takes_fence()) {
      release_after(s, stream);
      continue;
    }
    if (!fence) {
      fence = events_[next_++ % events_.size()];
      FLOWFEED_CUDA_CHECK(cudaEventRecord(fence, stream));
      ++stamp_;
    }
    *SyncAccess::fence(s) = FenceSlot{fence, stamp_};
  }
}

FenceSlot* fence_slot(const DeviceSync& sync) noexcept {
  return SyncAccess::fence(sync);
}

void leave_fence(const DeviceSync& sync, cudaEvent_t fence, std::uint64_t stamp) noexcept {
  *SyncAccess::fence(sync) = FenceSlot{fence, stamp};
}

void withdraw_fence(FenceSlot* slot, cudaEvent_t fence) noexcept {
  if (slot->event == fence) *slot = FenceSlot{};
}

void hand_on_in_place(DeviceSync& sync, cudaEvent_t ready, cudaStream_t stream) {
  FLOWFEED_CUDA_CHECK(cudaEventRecord(ready, stream));
  SyncAccess::hand_on_in_place(sync, ready, stream);
}

void BufferEvents::create(std::size_t buffers, bool fences) {
  for (std::size_t i = 0; i < buffers; ++i) {
    cudaEvent_t e = nullptr;
    FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    ready_.push_back(e);
    FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    reuse_.push_back(e);
  }
  if (fences) fences_.assign(buffers, FenceSlot{});
}

void BufferEvents::destroy() noexcept {
  for (cudaEvent_t e : ready_) cudaEventDestroy(e);
  for (cudaEvent_t e : reuse_) cudaEventDestroy(e);
  ready_.clear();
  reuse_.clear();
  fences_.clear();
}

bool BufferEvents::wait_reuse(std::size_t buffer, cudaStream_t stream, FenceSlot* newest) {
  if (fences_.empty() || !fences_[buffer].event) {
    FLOWFEED_CUDA_CHECK(cudaStreamWaitEvent(stream, reuse_[buffer], 0));
    return true;
  }
  FenceSlot& fence = fences_[buffer];
  bool waited = false;
  // A reader's fences are recorded on one stream with growing stamps, so the newest fence this
  // stream waited on covers every older one.
  if (!newest || fence.stamp > newest->stamp) {
    FLOWFEED_CUDA_CHECK(cudaStreamWaitEvent(stream, fence.event, 0));
    waited = true;
    if (newest) *newest = fence;
  }
  fence = FenceSlot{};
  return waited;
}

void BufferEvents::publish(DeviceSync& sync, std::size_t buffer, cudaStream_t stream,
                           std::uint64_t order, int stream_index) {
  FLOWFEED_CUDA_CHECK(cudaEventRecord(ready_[buffer], stream));
  SyncAccess::hand_on(sync, ready_[buffer], reuse_[buffer],
                      fences_.empty() ? nullptr : &fences_[buffer], stream, order, stream_index);
}

void BufferEvents::mark_complete(DeviceSync& sync) noexcept {
  SyncAccess::mark_complete(sync);
}

void BufferEvents::abandon(std::size_t buffer, cudaStream_t stream) noexcept {
  if (cudaEventRecord(reuse_[buffer], stream) != cudaSuccess) cudaGetLastError();
  if (!fences_.empty()) fences_[buffer] = FenceSlot{};
}

}  // namespace flowfeed::cuda
