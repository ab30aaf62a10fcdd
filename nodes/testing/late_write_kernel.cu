#include "late_write_kernel.hpp"

namespace flowfeed::testing {

namespace {

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void fill(float* data, std::size_t count, float value) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    data[i] = value;
  }
}

}  // namespace

cudaError_t launch_late_fill(float* data, std::size_t count, float value, long long spin_cycles,
                             cudaStream_t stream) {
  spin<<<1, 1, 0, stream>>>(spin_cycles);
  fill<<<64, 256, 0, stream>>>(data, count, value);
  return cudaGetLastError();
}

}  // namespace flowfeed::testing
