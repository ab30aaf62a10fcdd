// The CUDA calls of the DLPack export: consumer streams wait on ready events, reuse events are
// recorded on consumer streams. Runtime API only (host compiler).
#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"
#include "stream_sync.hpp"

namespace flowfeed::detail {

namespace {

/// Makes `device` current for a scope and restores the thread's previous device (a deleter may
/// run on any thread of the consumer's).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    FLOWFEED_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) FLOWFEED_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

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

void cuda_stream_wait(std::intptr_t stream, int device, void* event) {
  // An event that already completed orders nothing: a prefetched batch's upload usually has, and
  // the query costs less than queueing a wait on the consumer's stream.
  const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (state == cudaSuccess) return;
  if (state != cudaErrorNotReady) FLOWFEED_CUDA_CHECK(state);
  DeviceScope scope(device);
  FLOWFEED_CUDA_CHECK(cudaStreamWaitEvent(to_stream(stream), static_cast<cudaEvent_t>(event), 0));
}

void cuda_record(std::intptr_t stream, int device, void* event) {
  DeviceScope scope(device);
  FLOWFEED_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), to_stream(stream)));
}

void* cuda_event_create(int device) {
  DeviceScope scope(device);
  cudaEvent_t event = nullptr;
  FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void cuda_event_destroy(void* event) noexcept {
  if (event) cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void cuda_event_synchronize(void* event) noexcept {
  if (event && cudaEventSynchronize(static_cast<cudaEvent_t>(event)) != cudaSuccess) {
    cudaGetLastError();
  }
}

}  // namespace flowfeed::detail
