#pragma once
/// \file
/// Devices and memory for CUDA code (part of the CUDA support library, flowfeed::cuda_support):
/// the device probe, a scope that makes a device current, and counted allocators for buffer pools.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed::cuda {

/// Visible CUDA devices; 0 when the runtime reports an error (35: no driver, 100: no device, ...).
int device_count() noexcept;
/// Free memory on `device` (cudaMemGetInfo), or nullopt when it cannot be read.
std::optional<std::uint64_t> device_free_memory(int device) noexcept;
/// "cuda:N (<device name>)"; "cuda:N" when the name cannot be read.
std::string device_description(int device);
/// cudaSetDevice, checked.
void set_device(int device);

/// Makes `device` current for a scope and restores the thread's previous device on exit (for code
/// that runs on threads it does not own, e.g. a deleter on any consumer thread).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

/// cudaMalloc on `device`, checked and counted (note_allocation) / cudaFree, errors ignored.
Allocator device_allocator(int device);
/// cudaHostAlloc(flags), checked and counted / cudaFreeHost, errors ignored.
Allocator pinned_allocator(unsigned flags = cudaHostAllocPortable);
/// Portable page-locked memory allocated with `device` current (for pools a node makes for
/// another, e.g. the loader's fill pool: BuildContext::make_fill_pool).
Allocator pinned_allocator_on(int device);
/// One counted pinned allocation (for small per-node buffers outside pools).
void* pinned_alloc(std::size_t bytes, unsigned flags);
/// One counted device allocation on the current device.
void* device_alloc(std::size_t bytes);

}  // namespace flowfeed::cuda
