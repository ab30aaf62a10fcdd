#include "upload/piece_copy_cuda.hpp"

#include "flowfeed/cuda/check.hpp"

namespace flowfeed {

void PieceCopy::reserve(std::size_t batch_size) {
  const std::size_t pieces = 2 * batch_size + 1;
  dsts_.reserve(pieces);
  srcs_.reserve(pieces);
  sizes_.reserve(pieces);
}

void PieceCopy::enqueue(const Batch& batch, const std::byte* src, std::byte* dst,
                        cudaStream_t stream) {
  dsts_.clear();
  srcs_.clear();
  sizes_.clear();
  batch.for_each_piece(src, [&](std::size_t at, const std::byte* from, std::size_t n) {
    dsts_.push_back(dst + at);
    srcs_.push_back(from);
    sizes_.push_back(n);
  });
  cudaMemcpyAttributes attributes{};
  attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  std::size_t first = 0;  // the one set of attributes applies from the first piece on
  FLOWFEED_CUDA_CHECK(cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), dsts_.size(),
                                           &attributes, &first, 1, stream));
}

}  // namespace flowfeed
