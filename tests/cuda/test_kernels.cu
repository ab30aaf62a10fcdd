// Kernels that only tests use.
#include "test_kernels.hpp"

namespace flowfeed::test {

namespace {
__global__ void write_through(int* p) {
  p[threadIdx.x] = 1;
}
}  // namespace

cudaError_t launch_fault(int* bad_pointer, cudaStream_t stream) {
  write_through<<<1, 32, 0, stream>>>(bad_pointer);
  return cudaGetLastError();
}

}  // namespace flowfeed::test
