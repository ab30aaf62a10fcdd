// Kernels that only tests use.
#include "test_kernels.hpp"

namespace flowfeed::test {

namespace {
__global__ void write_through(int* p) {
  p[threadIdx.x] = 1;
}

__global__ void slow_copy(const unsigned char* src, unsigned char* dst, std::size_t bytes,
                          long long spin_cycles) {
  const long long start = clock64();
  while (clock64() - start < spin_cycles) {
  }
  const std::size_t step = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += step) {
    dst[i] = src[i];
  }
}
}  // namespace

cudaError_t launch_slow_copy(const void* src, void* dst, std::size_t bytes, long long spin_cycles,
                             cudaStream_t stream) {
  slow_copy<<<64, 256, 0, stream>>>(static_cast<const unsigned char*>(src),
                                    static_cast<unsigned char*>(dst), bytes, spin_cycles);
  return cudaGetLastError();
}

cudaError_t launch_fault(int* bad_pointer, cudaStream_t stream) {
  write_through<<<1, 32, 0, stream>>>(bad_pointer);
  return cudaGetLastError();
}

}  // namespace flowfeed::test
