#pragma once
/// \file
/// Kernels that only tests use.

#include <cuda_runtime.h>

#include <cstddef>

namespace flowfeed::test {

/// Launches a kernel that writes through `bad_pointer` (e.g. a null pointer): an illegal address,
/// the sticky error a faulting train kernel causes.
cudaError_t launch_fault(int* bad_pointer, cudaStream_t stream);

/// Launches a kernel that first spins for about `spin_cycles` GPU clock cycles and then copies
/// `bytes` from `src` to `dst` (device memory): a slow reader of a device buffer.
cudaError_t launch_slow_copy(const void* src, void* dst, std::size_t bytes, long long spin_cycles,
                             cudaStream_t stream);

}  // namespace flowfeed::test
