#include "gather_kernels.hpp"

namespace flowfeed {

namespace {

/// Thread i (grid-strided) copies word i % words of row i / words.
template <typename Word>
__global__ void gather_rows_kernel(const Word* __restrict__ src,
                                   const std::uint32_t* __restrict__ order, Word* __restrict__ dst,
                                   std::size_t words, std::size_t total) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::size_t r = i / words;
    const std::size_t w = i - r * words;
    dst[i] = src[static_cast<std::size_t>(order[r]) * words + w];
  }
}

template <typename Word>
cudaError_t launch(const void* src, const std::uint32_t* order, void* dst, std::size_t words,
                   std::size_t rows, cudaStream_t stream) {
  const std::size_t total = words * rows;
  constexpr unsigned kThreads = 256;
  const std::size_t wanted = (total + kThreads - 1) / kThreads;
  const unsigned blocks = static_cast<unsigned>(wanted < 65535 ? wanted : 65535);
  gather_rows_kernel<Word><<<blocks, kThreads, 0, stream>>>(static_cast<const Word*>(src), order,
                                                            static_cast<Word*>(dst), words, total);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_gather_rows(const void* src, const std::uint32_t* order, void* dst,
                               std::size_t row_bytes, std::size_t rows, cudaStream_t stream) {
  if (rows == 0 || row_bytes == 0) return cudaSuccess;
  if (row_bytes % 4 == 0) {
    return launch<std::uint32_t>(src, order, dst, row_bytes / 4, rows, stream);
  }
  return launch<std::uint8_t>(src, order, dst, row_bytes, rows, stream);
}

}  // namespace flowfeed
