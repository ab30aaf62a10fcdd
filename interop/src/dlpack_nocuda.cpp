// The DLPack export in a build without CUDA: batches never live on a device.
#include <stdexcept>

#include "stream_sync.hpp"

namespace flowfeed::detail {

namespace {
[[noreturn]] void unavailable() {
  throw std::logic_error("flowfeed was built without CUDA (reconfigure with -DFLOWFEED_CUDA=ON)");
}
}  // namespace

bool cuda_interop_built() noexcept {
  return false;
}
int cuda_device_of(const void*) {
  unavailable();
}
void cuda_wait_ready(std::intptr_t, int, const DeviceSync&) {
  unavailable();
}
void cuda_release_after(std::intptr_t, int, const DeviceSync&) {
  unavailable();
}
cuda::FenceSlot* cuda_fence_slot(const DeviceSync&) noexcept {
  return nullptr;
}
void cuda_leave_fence(const DeviceSync&, InteropEvent*, std::uint64_t) noexcept {}
void cuda_withdraw_fence(cuda::FenceSlot*, InteropEvent*) noexcept {}
void cuda_stream_wait(std::intptr_t, int, InteropEvent*) {
  unavailable();
}
void cuda_record(std::intptr_t, int, InteropEvent*) {
  unavailable();
}
InteropEvent* cuda_event_create(int) {
  unavailable();
}
void cuda_event_destroy(InteropEvent*) noexcept {}
void cuda_event_synchronize(InteropEvent*) noexcept {}

}  // namespace flowfeed::detail
