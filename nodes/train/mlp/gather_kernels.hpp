#pragma once
/// \file
/// Launcher of the row-gather kernel behind the mlp node's resident mode (gather_kernels.cu).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace flowfeed {

/// dst row i = src row order[i] for i < rows; rows are row_bytes each. Enqueues on `stream` and
/// returns the launch's cudaGetLastError(); does not synchronise. src and dst must be 4-byte
/// aligned when row_bytes is a multiple of 4 (cudaMalloc pointers are).
cudaError_t launch_gather_rows(const void* src, const std::uint32_t* order, void* dst,
                               std::size_t row_bytes, std::size_t rows, cudaStream_t stream);

}  // namespace flowfeed
