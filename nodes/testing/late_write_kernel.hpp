#pragma once
/// \file
/// The kernel of `late_write` (late_write_kernel.cu).

#include <cuda_runtime.h>

#include <cstddef>

namespace flowfeed::testing {

/// One block spins for about `spin_cycles` GPU clock cycles, then the grid fills `count` floats at
/// `data` with `value`.
cudaError_t launch_late_fill(float* data, std::size_t count, float value, long long spin_cycles,
                             cudaStream_t stream);

}  // namespace flowfeed::testing
