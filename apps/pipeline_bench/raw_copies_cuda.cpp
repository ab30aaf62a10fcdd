#include <cuda_runtime.h>

#include <vector>

#include "cuda/cuda_check.hpp"
#include "raw_copies.hpp"

namespace flowfeed::bench {

RawCopies raw_pinned_copies(std::size_t bytes, double seconds, int device) {
  cuda::set_device(device);
  // A few buffers on each side so the loop does not copy one hot buffer over and over.
  constexpr int kBuffers = 4;
  std::vector<void*> host(kBuffers, nullptr), dev(kBuffers, nullptr);
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  RawCopies r;
  try {
    for (int i = 0; i < kBuffers; ++i) {
      FLOWFEED_CUDA_CHECK(cudaHostAlloc(&host[i], bytes, cudaHostAllocPortable));
      FLOWFEED_CUDA_CHECK(cudaMalloc(&dev[i], bytes));
    }
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    FLOWFEED_CUDA_CHECK(cudaEventCreate(&start));
    FLOWFEED_CUDA_CHECK(cudaEventCreate(&stop));
    auto run = [&](std::size_t n) {
      FLOWFEED_CUDA_CHECK(cudaEventRecord(start, stream));
      for (std::size_t i = 0; i < n; ++i) {
        FLOWFEED_CUDA_CHECK(cudaMemcpyAsync(dev[i % kBuffers], host[i % kBuffers], bytes,
                                            cudaMemcpyHostToDevice, stream));
      }
      FLOWFEED_CUDA_CHECK(cudaEventRecord(stop, stream));
      FLOWFEED_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      FLOWFEED_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      return static_cast<double>(ms) * 1e-3;
    };
    // Warm up, then size the timed loop from the warm-up's rate.
    const std::size_t warm = 64;
    const double t = run(warm);
    const std::size_t n = static_cast<std::size_t>(seconds / (t / warm)) + 1;
    r.copies = n;
    r.seconds = run(n);
    r.gbps = static_cast<double>(bytes) * static_cast<double>(n) / r.seconds * 1e-9;
    r.copies_per_second = static_cast<double>(n) / r.seconds;
  } catch (...) {
    for (void* p : host) cudaFreeHost(p);
    for (void* p : dev) cudaFree(p);
    throw;
  }
  for (void* p : host) cudaFreeHost(p);
  for (void* p : dev) cudaFree(p);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return r;
}

}  // namespace flowfeed::bench
