#pragma once
/// \file
/// Kernels that only tests use.

#include <cuda_runtime.h>

namespace flowfeed::test {

/// Launches a kernel that writes through `bad_pointer` (e.g. a null pointer): an illegal address,
/// the sticky error a faulting train kernel causes.
cudaError_t launch_fault(int* bad_pointer, cudaStream_t stream);

}  // namespace flowfeed::test
