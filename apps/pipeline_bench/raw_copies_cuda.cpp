#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/nodes/detail/checksum_kernel.hpp"
#include "flowfeed/nodes/synthetic_formula.hpp"
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

NaiveLoop naive_loop(std::size_t batches, int epochs, std::size_t rows, std::size_t elements,
                     int device) {
  cuda::set_device(device);
  // One pageable buffer laid out batch by batch like the memory loader's: x, then the labels at
  // the next 256-byte boundary.
  const std::size_t x_bytes = rows * elements * sizeof(float);
  const std::size_t y_offset = (x_bytes + 255) / 256 * 256;
  const std::size_t batch_bytes = y_offset + rows * sizeof(std::int32_t);
  std::vector<unsigned char> data(batches * batch_bytes);
  for (std::size_t b = 0; b < batches; ++b) {
    unsigned char* batch = data.data() + b * batch_bytes;
    for (std::size_t r = 0; r < rows; ++r) {
      const std::uint64_t hash = formula::sample_hash(0, b * rows + r);
      for (std::size_t j = 0; j < elements; ++j) {
        const auto bits = static_cast<std::uint32_t>(
            formula::element_bits(formula::ElementType::float32, hash, j));
        std::memcpy(batch + (r * elements + j) * sizeof(float), &bits, sizeof bits);
      }
      const std::int32_t label = formula::label(hash, 10);
      std::memcpy(batch + y_offset + r * sizeof label, &label, sizeof label);
    }
  }
  cuda::ChecksumRecord* record = nullptr;
  unsigned int* flag = nullptr;
  NaiveLoop out;
  try {
    FLOWFEED_CUDA_CHECK(cudaMalloc(&record, sizeof *record));
    FLOWFEED_CUDA_CHECK(cudaMemset(record, 0, sizeof *record));
    FLOWFEED_CUDA_CHECK(cudaHostAlloc(&flag, sizeof *flag, cudaHostAllocMapped));
    *flag = 0;
    auto one_batch = [&](std::size_t b) {
      void* dev = nullptr;
      FLOWFEED_CUDA_CHECK(cudaMalloc(&dev, batch_bytes));
      FLOWFEED_CUDA_CHECK(
          cudaMemcpy(dev, data.data() + b * batch_bytes, batch_bytes, cudaMemcpyHostToDevice));
      cuda::ChecksumArgs a;
      a.count = 1;
      a.batches[0].data = static_cast<const unsigned char*>(dev);
      a.batches[0].first_sample = b * rows;
      a.batches[0].rows = static_cast<std::uint32_t>(rows);
      a.batches[0].y_offset = y_offset;
      a.batches[0].seq = b;
      a.max_rows = static_cast<std::uint32_t>(rows);
      a.elements = elements;
      a.element_size = sizeof(float);
      a.type = static_cast<std::uint32_t>(formula::ElementType::float32);
      a.seed = 0;
      a.classes = 10;
      a.record = record;
      a.host_flag = flag;
      FLOWFEED_CUDA_CHECK(cuda::launch_checksum(a, nullptr));
      FLOWFEED_CUDA_CHECK(cudaStreamSynchronize(nullptr));
      FLOWFEED_CUDA_CHECK(cudaFree(dev));
    };
    one_batch(0);  // warm-up: context, module load
    const auto start = std::chrono::steady_clock::now();
    for (int e = 0; e < epochs; ++e) {
      for (std::size_t b = 0; b < batches; ++b) one_batch(b);
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    out.batches = batches * static_cast<std::size_t>(epochs);
    out.batches_per_second = static_cast<double>(out.batches) / out.seconds;
    cuda::ChecksumRecord host_record{};
    FLOWFEED_CUDA_CHECK(
        cudaMemcpy(&host_record, record, sizeof host_record, cudaMemcpyDeviceToHost));
    out.mismatches = host_record.mismatches;
  } catch (...) {
    cudaFree(record);
    cudaFreeHost(flag);
    throw;
  }
  cudaFree(record);
  cudaFreeHost(flag);
  return out;
}

}  // namespace flowfeed::bench
