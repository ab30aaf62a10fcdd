#pragma once
/// \file
/// The one checking helper every CUDA runtime call of flowfeed goes through, and the small CUDA
/// utilities the CUDA node family shares (device probe, counted allocations, NVTX ranges).
/// Private to nodes/ and tests/cuda: it includes cuda_runtime.h.

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "flowfeed/error.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed::cuda {

/// True for errors that poison the CUDA context (kernel faults, ECC errors, device asserts): every
/// later call returns the same error, so the process must report and exit, never retry.
bool is_sticky(cudaError_t error) noexcept;

/// The CudaError for `error` returned by `call` (the call's text; only the name before '(' is
/// kept): "cudaMemcpyAsync: invalid argument (cudaErrorInvalidValue = 1, not sticky)". Clears the
/// thread's last error when the error is not sticky.
CudaError make_error(cudaError_t error, const char* call);
[[noreturn]] void throw_error(cudaError_t error, const char* call);
/// The CudaError for `call` of a CUDA library (cuBLAS, NCCL) that failed with status `code`,
/// described by `what`: "call: what". Sticky when the context holds a sticky error (a kernel
/// fault inside the library leaves one), by the same list as is_sticky().
CudaError library_error(const std::string& call, const std::string& what, int code);

/// Throws make_error(error, call) unless `error` is cudaSuccess.
inline void check(cudaError_t error, const char* call) {
  if (error != cudaSuccess) [[unlikely]] {
    throw_error(error, call);
  }
}

/// Visible CUDA devices; 0 when the runtime reports an error (35: no driver, 100: no device, ...).
int device_count() noexcept;
/// "cuda:N (<device name>)"; "cuda:N" when the name cannot be read.
std::string device_description(int device);
/// cudaSetDevice, checked.
void set_device(int device);

/// cudaMalloc on `device`, checked and counted (note_allocation) / cudaFree, errors ignored.
Allocator device_allocator(int device);
/// cudaHostAlloc(flags), checked and counted / cudaFreeHost, errors ignored.
Allocator pinned_allocator(unsigned flags = cudaHostAllocPortable);
/// One counted pinned allocation (for small per-node buffers outside pools).
void* pinned_alloc(std::size_t bytes, unsigned flags);
/// One counted device allocation on the current device.
void* device_alloc(std::size_t bytes);

/// The NVTX domain "flowfeed" all ranges go to.
nvtxDomainHandle_t nvtx_domain() noexcept;
/// A registered NVTX string for a node's name (register once in setup, use per batch).
nvtxStringHandle_t nvtx_name(const std::string& name) noexcept;
/// Attributes of a range called `name` whose payload is the batch's sequence number.
nvtxEventAttributes_t nvtx_attributes(nvtxStringHandle_t name, std::uint64_t seq) noexcept;

/// A push/pop NVTX range on this thread: one node's work on one batch.
class NvtxRange {
 public:
  NvtxRange(nvtxStringHandle_t name, std::uint64_t seq) noexcept {
    nvtxEventAttributes_t a = nvtx_attributes(name, seq);
    nvtxDomainRangePushEx(nvtx_domain(), &a);
  }
  ~NvtxRange() { nvtxDomainRangePop(nvtx_domain()); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace flowfeed::cuda

/// Checks a CUDA runtime call and names it in the error: FLOWFEED_CUDA_CHECK(cudaStreamCreate(&s)).
#define FLOWFEED_CUDA_CHECK(call) ::flowfeed::cuda::check((call), #call)
