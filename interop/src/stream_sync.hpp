#pragma once
/// \file
/// The CUDA calls of the DLPack export (the device hand-off through flowfeed::cuda_support), behind
/// opaque handles (dlpack_cuda.cpp in CUDA builds,
/// dlpack_nocuda.cpp otherwise). Streams are array-API values (1 the legacy default stream, 2 the
/// per-thread default stream, larger values a cudaStream_t) or kLegacyStreamItself. Every call sets
/// `device` current for its duration and restores the thread's previous device.

#include <cstdint>

#include "flowfeed/batch.hpp"

namespace flowfeed::detail {

/// The legacy default stream itself (not an array-API value): what a reuse event is recorded on
/// when a tensor was read on a stream nobody named, since it orders after every blocking stream.
/// The array-API value 1 is served by the calling thread's per-thread default stream, which orders
/// after the legacy stream's earlier work and costs less per call.
inline constexpr std::intptr_t kLegacyStreamItself = -2;

/// An event of the export's own (a join or a fence event): opaque here, a cudaEvent_t inside
/// dlpack_cuda.cpp.
struct InteropEvent;

/// True in builds with CUDA.
bool cuda_interop_built() noexcept;
/// The device ordinal that `device_pointer` belongs to (cudaPointerGetAttributes).
int cuda_device_of(const void* device_pointer);
/// `stream`'s later work waits until the batch is ready (cuda::wait_ready); nothing when there is
/// nothing to wait for (cuda::ready_pending). No host wait.
void cuda_wait_ready(std::intptr_t stream, int device, const DeviceSync& sync);
/// Releases the batch after the work queued on `stream` (cuda::release_after).
void cuda_release_after(std::intptr_t stream, int device, const DeviceSync& sync);
/// The batch's fence slot (cuda::fence_slot); null when its producer takes no fences.
cuda::FenceSlot* cuda_fence_slot(const DeviceSync& sync) noexcept;
/// Leaves `fence` with `stamp` in the batch's fence slot (cuda::leave_fence).
void cuda_leave_fence(const DeviceSync& sync, InteropEvent* fence, std::uint64_t stamp) noexcept;
/// Empties `slot` if it still holds `fence` (cuda::withdraw_fence).
void cuda_withdraw_fence(cuda::FenceSlot* slot, InteropEvent* fence) noexcept;
/// cudaStreamWaitEvent(stream, event): `stream`'s later work waits for `event`; no host wait
/// (nothing to queue when the event already completed).
void cuda_stream_wait(std::intptr_t stream, int device, InteropEvent* event);
/// cudaEventRecord(event, stream).
void cuda_record(std::intptr_t stream, int device, InteropEvent* event);
/// A new event without timing on `device`.
InteropEvent* cuda_event_create(int device);
/// Destroys an event from cuda_event_create (null: nothing); errors ignored.
void cuda_event_destroy(InteropEvent* event) noexcept;
/// Waits on the host until `event`'s last record completed; errors ignored.
void cuda_event_synchronize(InteropEvent* event) noexcept;

}  // namespace flowfeed::detail
