#pragma once
/// \file
/// The CUDA calls of the DLPack export, behind opaque handles (dlpack_cuda.cpp in CUDA builds,
/// dlpack_nocuda.cpp otherwise). Streams are array-API values (1 the legacy default stream, 2 the
/// per-thread default stream, larger values a cudaStream_t) or kLegacyStreamItself. Every call sets
/// `device` current for its duration and restores the thread's previous device.

#include <cstdint>

namespace flowfeed::detail {

/// The legacy default stream itself (not an array-API value): what a reuse event is recorded on
/// when a tensor was read on a stream nobody named, since it orders after every blocking stream.
/// The array-API value 1 is served by the calling thread's per-thread default stream, which orders
/// after the legacy stream's earlier work and costs less per call.
inline constexpr std::intptr_t kLegacyStreamItself = -2;

/// True in builds with CUDA.
bool cuda_interop_built() noexcept;
/// The device ordinal that `device_pointer` belongs to (cudaPointerGetAttributes).
int cuda_device_of(const void* device_pointer);
/// cudaStreamWaitEvent(stream, event): `stream`'s later work waits for `event`; no host wait
/// (nothing to queue when the event already completed).
void cuda_stream_wait(std::intptr_t stream, int device, void* event);
/// cudaEventRecord(event, stream).
void cuda_record(std::intptr_t stream, int device, void* event);
/// A new event without timing on `device`.
void* cuda_event_create(int device);
/// Destroys an event from cuda_event_create; errors ignored.
void cuda_event_destroy(void* event) noexcept;
/// Waits on the host until `event`'s last record completed; errors ignored.
void cuda_event_synchronize(void* event) noexcept;

}  // namespace flowfeed::detail
