#pragma once
/// \file
/// The shared state behind TensorSession, its BatchHandles and every exported tensor (private to
/// flowfeed_interop): which batches the caller holds, how many holds each has, and giving them
/// back on the owner thread.

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "flowfeed/dlpack.hpp"
#include "stream_sync.hpp"

namespace flowfeed::detail {

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
  bool fenced = false;                 // its reuse is covered by a group's fence (release_together)
};

/// What a TensorSession, its handles and its exported tensors share.
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
  InteropEvent* join_event = nullptr;
  int join_device = -1;
  std::map<const BufferPool*, int> pool_device;  // owner thread only

  // release_together's fence: one event, recorded on one stream (owner thread), and the upload's
  // fence slots it was left in (at most one per device buffer), cleared when the run ends.
  InteropEvent* fence_event = nullptr;
  int fence_device = -1;
  std::intptr_t fence_stream = 0;  // 0: none yet
  std::vector<cuda::FenceSlot*> fence_slots;

  ~ExportState();
  /// Drops one hold; the last gives the batch back (or queues it for the owner thread).
  void unref(HeldBatch* held) noexcept;
  /// On CUDA: releases the batch after every stream that reads it (cuda::release_after on the
  /// last, which first waits for the others), so that the upload overwrites the buffer only after
  /// them.
  void record_reuse(HeldBatch& held) noexcept;
  /// Records one fence on `stream` for the held batches of `group` it covers (see
  /// release_together) and marks them fenced. Owner thread; never throws (a failed record leaves
  /// every batch to its own reuse event).
  void fence(HeldBatch* const* group, std::size_t count, std::intptr_t stream) noexcept;
  /// After the run ended: waits for the fence's last record and empties the upload's fence slots
  /// that still hold it (the event is destroyed with this state). Never throws.
  void clear_fences() noexcept;
  /// Returns a batch to the session (owner thread). Never throws.
  void give_back(HeldBatch* held) noexcept;
  /// Gives back the batches queued by other threads (owner thread).
  void drain_returned();
  /// A slot for a new batch: one no batch and no tensor holds (owner thread).
  HeldBatch* free_slot();
  /// Where the batch's newest tier lives (cudaPointerGetAttributes once per device pool).
  DLDevice device_of(const Batch& b);
  /// The stall message naming every held batch and what holds it (call with `mutex` held).
  std::string held_message(double waited_s) const;
  /// Ends the run: held batches go back (reuse events recorded first), in-flight ones drain, the
  /// report is kept. Owner thread; never throws.
  void close() noexcept;
};

/// An exported tensor: the DLManagedTensor and what it points into.
struct ExportedTensor {
  DLManagedTensor managed{};
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;
  std::shared_ptr<ExportState> state;
  std::shared_ptr<const void> owner;
  HeldBatch* held = nullptr;  // null for a view

  static void deleter(DLManagedTensor* self) {
    auto* t = static_cast<ExportedTensor*>(self->manager_ctx);
    t->held->tensors.fetch_sub(1);
    t->state->unref(t->held);
    delete t;
  }
  /// A view (to_dlpack_view) holds no batch.
  static void view_deleter(DLManagedTensor* self) {
    delete static_cast<ExportedTensor*>(self->manager_ctx);
  }
};

}  // namespace flowfeed::detail
