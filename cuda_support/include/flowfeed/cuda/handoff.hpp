#pragma once
/// \file
/// The device hand-off: how a batch's device buffer passes from the node that wrote it (its
/// producer: cuda_upload, a CUDA transform) to the nodes and callers that read it, and back. Part
/// of the CUDA support library (flowfeed::cuda_support); the one implementation of the contract
/// that Batch::sync (DeviceSync) carries. docs/CUDA.md "The device hand-off" explains it with a
/// picture; this header is the reference.
///
/// The contract, for every reader of a batch's device buffer:
/// 1. Before its first kernel that reads the buffer, its stream waits until the batch is ready:
///    wait_ready() (or wait_ready_all() for a group; ready_pending() first for a reader outside
///    the graph that may skip the wait). Nothing waits on the host.
/// 2. After its last kernel that reads the buffer, it releases the buffer on that stream:
///    release_after(), or, for a group of batches whose producer takes fences, fence_group() (one
///    event for the whole group). The producer's stream waits on that before it writes the buffer
///    again (BufferEvents::wait_reuse); the reader gives the batch back at once (no host wait).
/// 3. A transform that writes a new buffer is a reader of the old one and the producer of the new
///    one (BufferEvents::publish after release_after); one that writes in place hands the batch on
///    behind its own event (hand_on_in_place) and leaves the release to the batch's producer.
///
/// Thread-safety: the functions touch only the DeviceSync they are given; a DeviceSync belongs to
/// the node that holds its batch. A BufferEvents is used by one producer, under its own locks.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "flowfeed/batch.hpp"

namespace flowfeed::cuda {

/// Where a reader may leave one event of its own standing for a group of released batches (one
/// slot per device buffer of a producer that takes fences). Fences of one reader are recorded on
/// one stream with growing stamps, so a newer fence covers older ones.
struct FenceSlot {
  cudaEvent_t event = nullptr;  ///< null: the reader released the batch with release_after
  std::uint64_t stamp = 0;
};

/// Makes `stream` wait until the batch's device buffer is ready (cudaStreamWaitEvent on its ready
/// event; nothing when it has none). Throws CudaError.
void wait_ready(const DeviceSync& sync, cudaStream_t stream);
/// wait_ready() for a group, with as few waits as are needed: batches numbered on one producer
/// stream complete in order, so only the newest of each stream is waited on; a batch that is not
/// numbered is waited on alone (first, in the group's order). Throws CudaError.
void wait_ready_all(const DeviceSync* const* group, std::size_t count, cudaStream_t stream);
/// For a reader outside the graph: false when no wait is needed, because the batch has no ready
/// event, its producer saw it complete before handing it on, or it has completed since
/// (cudaEventQuery); true when the reader's stream must wait_ready(). Throws CudaError.
bool ready_pending(const DeviceSync& sync);
/// Waits on the host until the batch is ready (cudaEventSynchronize; nothing when it has no ready
/// event). For tests and tools; readers wait on their stream. Throws CudaError.
void synchronize_ready(const DeviceSync& sync);
/// Tells the producer that the reader's last use of the buffer is queued on `stream` (records the
/// producer's reuse event there; nothing when it wants none). Throws CudaError.
void release_after(const DeviceSync& sync, cudaStream_t stream);

/// A reader's fences for groups of batches: events used in turn, stamps growing.
class ReuseFences {
 public:
  ReuseFences() = default;
  ~ReuseFences() { destroy(); }
  ReuseFences(const ReuseFences&) = delete;
  ReuseFences& operator=(const ReuseFences&) = delete;
  /// Creates `events` events (current device). Use more than the batches in flight, so that a
  /// producer seldom finds a fence it waits for recorded again by a newer group (still correct,
  /// only later than needed).
  void create(std::size_t events);
  /// Destroys the events (errors ignored).
  void destroy() noexcept;
  /// After the group's last kernel on `stream`: one fence, recorded once, left for every batch
  /// whose producer takes fences; release_after() for the others, in the group's order. Throws
  /// CudaError.
  void fence_group(DeviceSync* const* group, std::size_t count, cudaStream_t stream);

 private:
  std::vector<cudaEvent_t> events_;
  std::size_t next_ = 0;
  std::uint64_t stamp_ = 0;
};

/// The batch's fence slot, null when its producer takes no fences (for a reader that keeps its own
/// fence bookkeeping, e.g. interop's release_together).
FenceSlot* fence_slot(const DeviceSync& sync) noexcept;
/// Leaves `fence` (recorded by the reader after its last kernel reading the batch) with `stamp`
/// in the batch's fence slot instead of release_after(). The sync must take fences.
void leave_fence(const DeviceSync& sync, cudaEvent_t fence, std::uint64_t stamp) noexcept;
/// Empties `slot` if it still holds `fence` (before a reader destroys its fence event).
void withdraw_fence(FenceSlot* slot, cudaEvent_t fence) noexcept;

/// A transform that rewrote the buffer in place on `stream`: records `ready` there and hands the
/// batch on behind it. The release stays the batch's producer's (readers release as before); the
/// batch is no longer numbered (readers of a group wait on it alone). Throws CudaError.
void hand_on_in_place(DeviceSync& sync, cudaEvent_t ready, cudaStream_t stream);

/// A producer's hand-off events for its pool of device buffers: one ready and one reuse event per
/// buffer (a buffer belongs to one batch at a time, so its events do too), and one fence slot per
/// buffer when the producer takes fences. Used by one producer: calls for one stream are made
/// under the producer's lock for that stream.
class BufferEvents {
 public:
  BufferEvents() = default;
  ~BufferEvents() { destroy(); }
  BufferEvents(const BufferEvents&) = delete;
  BufferEvents& operator=(const BufferEvents&) = delete;
  /// Creates the events of `buffers` buffers on the current device (ready, then reuse, per
  /// buffer). `fences`: readers may leave fences in the buffers' slots.
  void create(std::size_t buffers, bool fences);
  /// Destroys the events (errors ignored); the destructor does it too.
  void destroy() noexcept;
  /// Buffer `buffer`'s ready event.
  cudaEvent_t ready(std::size_t buffer) const { return ready_[buffer]; }

  /// Makes `stream` wait until buffer `buffer`'s last reader is done, before the producer writes
  /// it again: on the fence a reader left in its slot (once per fence: when `newest` already
  /// holds a fence as new or newer, no wait; `newest` is the newest fence waited on by `stream`),
  /// else on its reuse event. Empties the slot. Returns true when it queued a wait. Throws
  /// CudaError.
  bool wait_reuse(std::size_t buffer, cudaStream_t stream, FenceSlot* newest = nullptr);
  /// Records buffer `buffer`'s ready event on `stream` after the producer's writes and hands the
  /// batch on with it: its reuse event, its fence slot (when fences are taken), `order` (the
  /// record's place on `stream`, 1, 2, ...; 0: not numbered) and `stream_index`. Throws CudaError.
  void publish(DeviceSync& sync, std::size_t buffer, cudaStream_t stream, std::uint64_t order,
               int stream_index);
  /// The batch's ready event completed before its producer handed it on: readers outside the graph
  /// need not wait (ready_pending).
  static void mark_complete(DeviceSync& sync) noexcept;
  /// A batch failed after writes to buffer `buffer` were queued on `stream`: whoever takes the
  /// buffer next waits for them (its reuse event is recorded after them; errors ignored), and its
  /// fence slot is emptied.
  void abandon(std::size_t buffer, cudaStream_t stream) noexcept;

 private:
  std::vector<cudaEvent_t> ready_;
  std::vector<cudaEvent_t> reuse_;
  // Per buffer: the fence its last reader left instead of recording reuse_ (written by the reader
  // before it gives the batch back, read and emptied by wait_reuse after the buffer is taken
  // again).
  std::vector<FenceSlot> fences_;
};

}  // namespace flowfeed::cuda
