// Devices and memory: the device probe, DeviceScope and the counted allocators.
#include "flowfeed/cuda/device.hpp"

namespace flowfeed::cuda {

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::optional<std::uint64_t> device_free_memory(int device) noexcept {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess || cudaSetDevice(device) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  std::size_t free = 0, total = 0;
  const bool ok = cudaMemGetInfo(&free, &total) == cudaSuccess;
  if (!ok) cudaGetLastError();
  if (cudaSetDevice(previous) != cudaSuccess) cudaGetLastError();
  if (!ok) return std::nullopt;
  return free;
}

std::string device_description(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return "cuda:" + std::to_string(device);
  }
  return "cuda:" + std::to_string(device) + " (" + prop.name + ")";
}

void set_device(int device) {
  FLOWFEED_CUDA_CHECK(cudaSetDevice(device));
}

DeviceScope::DeviceScope(int device) {
  FLOWFEED_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) FLOWFEED_CUDA_CHECK(cudaSetDevice(device));
}

DeviceScope::~DeviceScope() {
  int now = previous_;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
}

void* device_alloc(std::size_t bytes) {
  void* p = nullptr;
  FLOWFEED_CUDA_CHECK(cudaMalloc(&p, bytes));
  note_allocation();
  return p;
}

void* pinned_alloc(std::size_t bytes, unsigned flags) {
  void* p = nullptr;
  FLOWFEED_CUDA_CHECK(cudaHostAlloc(&p, bytes, flags));
  note_allocation();
  return p;
}

Allocator device_allocator(int device) {
  // BufferPool counts its buffers itself (note_allocation per buffer), so these do not.
  return {[device](std::size_t bytes) -> void* {
            set_device(device);
            void* p = nullptr;
            FLOWFEED_CUDA_CHECK(cudaMalloc(&p, bytes));
            return p;
          },
          [device](void* p) {
            if (cudaSetDevice(device) != cudaSuccess || cudaFree(p) != cudaSuccess) {
              cudaGetLastError();
            }
          }};
}

Allocator pinned_allocator(unsigned flags) {
  return {[flags](std::size_t bytes) -> void* {
            void* p = nullptr;
            FLOWFEED_CUDA_CHECK(cudaHostAlloc(&p, bytes, flags));
            return p;
          },
          [](void* p) {
            if (cudaFreeHost(p) != cudaSuccess) cudaGetLastError();
          }};
}

Allocator pinned_allocator_on(int device) {
  Allocator pinned = pinned_allocator();
  pinned.allocate = [device, allocate = pinned.allocate](std::size_t bytes) {
    set_device(device);
    return allocate(bytes);
  };
  return pinned;
}

}  // namespace flowfeed::cuda
