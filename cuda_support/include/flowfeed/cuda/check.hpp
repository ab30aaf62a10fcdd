#pragma once
/// \file
/// The one checking helper every CUDA runtime call of flowfeed goes through (part of the CUDA
/// support library, flowfeed::cuda_support). Includes cuda_runtime.h; C++17, so that kernels (*.cu)
/// may include it too.

#include <cuda_runtime.h>

#include <string>

#include "flowfeed/error.hpp"

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

}  // namespace flowfeed::cuda

/// Checks a CUDA runtime call and names it in the error: FLOWFEED_CUDA_CHECK(cudaStreamCreate(&s)).
#define FLOWFEED_CUDA_CHECK(call) ::flowfeed::cuda::check((call), #call)
