// The holds on the batches a TensorSession handed out: the last one releases the batch after the
// consumer's streams and gives it back (at once on the owner thread, else queued for it).
#include "export_state.hpp"

#include <algorithm>
#include <sstream>

#include "stream_sync.hpp"

namespace flowfeed::detail {

namespace {
/// Fence stamps grow across sessions: an upload node skips a fence whose stamp is not above the
/// newest it waited on, and its fence slots outlive a session.
std::atomic<std::uint64_t> g_fence_stamp{0};
}  // namespace

ExportState::~ExportState() {
  cuda_event_destroy(join_event);
  cuda_event_destroy(fence_event);
}

void ExportState::unref(HeldBatch* held) noexcept {
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

void ExportState::record_reuse(HeldBatch& held) noexcept {
  if (held.device.device_type != kDLCUDA || held.fenced) return;
  DeviceSync sync;
  {
    // close() may give the batch back from the owner thread while a deleter runs here.
    std::lock_guard<std::mutex> lock(mutex);
    if (held.batch) sync = held.batch->sync;
  }
  if (!sync.wants_release()) return;
  std::vector<std::intptr_t> targets;
  {
    std::lock_guard<std::mutex> lock(held.mutex);
    targets = held.streams;
    if (held.unknown_reader) targets.push_back(kLegacyStreamItself);  // after blocking streams
  }
  if (targets.empty()) return;
  const int device = held.device.device_id;
  try {
    std::lock_guard<std::mutex> lock(join_mutex);
    if (targets.size() > 1 && (!join_event || join_device != device)) {
      cuda_event_destroy(join_event);
      join_event = nullptr;
      join_event = cuda_event_create(device);
      join_device = device;
    }
    // The last stream waits for the others, then releases the batch for all of them.
    for (std::size_t i = 0; i + 1 < targets.size(); ++i) {
      cuda_record(targets[i], device, join_event);
      cuda_stream_wait(targets.back(), device, join_event);
    }
    cuda_release_after(targets.back(), device, sync);
  } catch (...) {
    // A failed record (a destroyed stream, a lost context) cannot be reported from a deleter;
    // the upload's own CUDA calls report a broken context.
  }
}

void ExportState::fence(HeldBatch* const* group, std::size_t count, std::intptr_t stream) noexcept {
  if (stream <= 0 || (fence_stream != 0 && fence_stream != stream)) return;
  // A batch the fence covers: on CUDA, its upload takes fences, `stream` is its only reader, and
  // the handle being released is its only hold (no exported tensor may read it later).
  const auto covered = [&](HeldBatch& h) {
    if (!h.batch || h.device.device_type != kDLCUDA || !h.batch->sync.takes_fence()) return false;
    if (h.refs.load() != 1 || h.handles.load() != 1) return false;
    if (fence_device >= 0 && h.device.device_id != fence_device) return false;
    std::lock_guard<std::mutex> lock(h.mutex);
    return !h.unknown_reader && h.streams.size() == 1 && h.streams.front() == stream;
  };
  int device = fence_device;
  for (std::size_t i = 0; i < count && device < 0; ++i) {
    if (covered(*group[i])) device = group[i]->device.device_id;
  }
  if (device < 0) return;
  try {
    if (!fence_event) {
      fence_event = cuda_event_create(device);
      fence_device = device;
    }
    std::uint64_t stamp = 0;
    for (std::size_t i = 0; i < count; ++i) {
      HeldBatch& h = *group[i];
      if (!covered(h)) continue;
      if (stamp == 0) {
        cuda_record(stream, device, fence_event);
        fence_stream = stream;
        stamp = g_fence_stamp.fetch_add(1) + 1;
      }
      cuda::FenceSlot* slot = cuda_fence_slot(h.batch->sync);
      if (std::find(fence_slots.begin(), fence_slots.end(), slot) == fence_slots.end()) {
        fence_slots.push_back(slot);  // once per device buffer
      }
      cuda_leave_fence(h.batch->sync, fence_event, stamp);
      h.fenced = true;
    }
  } catch (...) {
    // Nothing marked fenced after a failed record: each batch records its own reuse event.
  }
}

void ExportState::clear_fences() noexcept {
  if (!fence_event) return;
  // The fence event dies with this state while the upload's slots outlive it: once the readers it
  // covers are done, the slots that still hold it are emptied (the upload then waits on each
  // buffer's reuse event, whose last record is older, which orders nothing more).
  cuda_event_synchronize(fence_event);
  for (cuda::FenceSlot* slot : fence_slots) cuda_withdraw_fence(slot, fence_event);
  fence_slots.clear();
}

void ExportState::give_back(HeldBatch* held) noexcept {
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

void ExportState::drain_returned() {
  std::vector<HeldBatch*> batches;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batches.swap(returned);
  }
  for (HeldBatch* h : batches) give_back(h);
}

HeldBatch* ExportState::free_slot() {
  for (auto& s : slots) {
    if (!s->batch && s->refs.load() == 0) return s.get();
  }
  slots.push_back(std::make_unique<HeldBatch>());
  return slots.back().get();
}

DLDevice ExportState::device_of(const Batch& b) {
  const Tier tier = b.newest_tier();
  const BufferPool* pool = b.lease(tier).pool();
  if (!pool || pool->kind() != MemoryKind::device || !cuda_interop_built()) {
    return {kDLCPU, 0};
  }
  auto it = pool_device.find(pool);
  if (it == pool_device.end()) {
    it = pool_device.emplace(pool, cuda_device_of(b.data(tier))).first;
  }
  return {kDLCUDA, it->second};
}

std::string ExportState::held_message(double waited_s) const {
  std::ostringstream out;
  const auto depth = pipeline->plan().prefetch_depth;
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

void ExportState::close() noexcept {
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
    clear_fences();  // the run is over, whether it ended or failed
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

}  // namespace flowfeed::detail
