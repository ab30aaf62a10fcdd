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
void cuda_stream_wait(std::intptr_t, int, void*) {
  unavailable();
}
void cuda_record(std::intptr_t, int, void*) {
  unavailable();
}
void* cuda_event_create(int) {
  unavailable();
}
void cuda_event_destroy(void*) noexcept {}
void cuda_event_synchronize(void*) noexcept {}

}  // namespace flowfeed::detail
