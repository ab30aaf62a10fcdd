// register_cuda_nodes for builds with CUDA: the real CUDA family and the device probe.
#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "flowfeed/nodes/memory.hpp"
#include "flowfeed/nodes/npy.hpp"

namespace flowfeed {

void register_pinned_staging(Registry& registry);
void register_cuda_upload(Registry& registry);
void register_device_checksum(Registry& registry);
void register_device_discard(Registry& registry);
void register_device_normalize(Registry& registry);

int cuda_device_count() noexcept {
  return cuda::device_count();
}
std::string cuda_device_description(int device) {
  return cuda::device_description(device);
}

namespace {

/// Page-locks a loader's data set (memory) or files' mappings (npy) in place, once, while the
/// pipeline is built.
HostPinning cuda_host_pinning() {
  return {
      [](void* data, std::size_t bytes) {
        FLOWFEED_CUDA_CHECK(cudaHostRegister(data, bytes, cudaHostRegisterPortable));
      },
      [](const void* data, std::size_t bytes) {
        // A PROT_READ mapping can be registered only read-only: the device reads it, never
        // writes it.
        FLOWFEED_CUDA_CHECK(cudaHostRegister(const_cast<void*>(data), bytes,
                                             cudaHostRegisterPortable | cudaHostRegisterReadOnly));
      },
      [](const void* data) {
        if (cudaHostUnregister(const_cast<void*>(data)) != cudaSuccess) cudaGetLastError();
      }};
}

}  // namespace

void register_cuda_nodes(Registry& registry) {
  register_pinned_staging(registry);
  register_cuda_upload(registry);
  register_device_normalize(registry);
  register_device_checksum(registry);
  register_device_discard(registry);
  registry.set(memory_node_type(cuda_host_pinning()));
  registry.set(npy_node_type(cuda_host_pinning()));
  registry.set_device_probe([] { return cuda::device_count(); });
  registry.set_device_memory_probe([](int device) { return cuda::device_free_memory(device); });
  registry.set_cuda_built(true);
}

}  // namespace flowfeed
