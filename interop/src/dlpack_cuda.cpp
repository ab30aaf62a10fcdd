// The CUDA calls of the DLPack export: consumer streams wait until batches are ready, batches are
// released after consumer streams (the device hand-off, flowfeed/cuda/handoff.hpp). Runtime API
// only (host compiler).
#include <cuda_runtime.h>

#include <memory>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "stream_sync.hpp"

namespace flowfeed::detail {

struct InteropEvent {
  cudaEvent_t event = nullptr;
};

namespace {

using cuda::DeviceScope;

/// The stream a wait or a record goes to. The legacy default stream (1) is served by the calling
/// thread's per-thread default stream: a blocking stream, so what is queued on it is ordered after
/// the legacy stream's earlier work and before its later work, which is all a consumer on the
/// legacy stream needs. On the H200, with a pipeline's upload thread queuing copies, 200 KB batches
/// went through Pipeline.views at about 65,000/s when the waits and records went to the legacy
/// stream itself and at about 110,000/s through the per-thread stream. kLegacyStreamItself is for a
/// reader on a stream nobody named: the legacy stream waits on every blocking stream.
cudaStream_t to_stream(std::intptr_t value) {
  if (value == kLegacyStreamItself) return cudaStreamLegacy;
  if (value == 1 || value == 2) return cudaStreamPerThread;
  return reinterpret_cast<cudaStream_t>(value);
}

}  // namespace

bool cuda_interop_built() noexcept {
  return true;
}

int cuda_device_of(const void* device_pointer) {
  cudaPointerAttributes attributes{};
  FLOWFEED_CUDA_CHECK(cudaPointerGetAttributes(&attributes, device_pointer));
  return attributes.device;
}

void cuda_wait_ready(std::intptr_t stream, int device, const DeviceSync& sync) {
  if (!cuda::ready_pending(sync)) return;
  DeviceScope scope(device);
  cuda::wait_ready(sync, to_stream(stream));
}

void cuda_release_after(std::intptr_t stream, int device, const DeviceSync& sync) {
  DeviceScope scope(device);
  cuda::release_after(sync, to_stream(stream));
}

cuda::FenceSlot* cuda_fence_slot(const DeviceSync& sync) noexcept {
  return cuda::fence_slot(sync);
}

void cuda_leave_fence(const DeviceSync& sync, InteropEvent* fence, std::uint64_t stamp) noexcept {
  cuda::leave_fence(sync, fence->event, stamp);
}

void cuda_withdraw_fence(cuda::FenceSlot* slot, InteropEvent* fence) noexcept {
  cuda::withdraw_fence(slot, fence->event);
}

void cuda_stream_wait(std::intptr_t stream, int device, InteropEvent* event) {
  // An event that already completed orders nothing.
  const cudaError_t state = cudaEventQuery(event->event);
  if (state == cudaSuccess) return;
  if (state != cudaErrorNotReady) cuda::check(state, "cudaEventQuery");
  DeviceScope scope(device);
  FLOWFEED_CUDA_CHECK(cudaStreamWaitEvent(to_stream(stream), event->event, 0));
}

void cuda_record(std::intptr_t stream, int device, InteropEvent* event) {
  DeviceScope scope(device);
  FLOWFEED_CUDA_CHECK(cudaEventRecord(event->event, to_stream(stream)));
}

InteropEvent* cuda_event_create(int device) {
  DeviceScope scope(device);
  auto event = std::make_unique<InteropEvent>();
  FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&event->event, cudaEventDisableTiming));
  return event.release();
}

void cuda_event_destroy(InteropEvent* event) noexcept {
  if (!event) return;
  cudaEventDestroy(event->event);
  delete event;
}

void cuda_event_synchronize(InteropEvent* event) noexcept {
  if (event && cudaEventSynchronize(event->event) != cudaSuccess) cudaGetLastError();
}

}  // namespace flowfeed::detail
