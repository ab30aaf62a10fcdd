#pragma once
// The copy of a batch whose loader left some of its bytes where they are (Batch::external): every
// piece to the device in one cudaMemcpyBatchAsync, since a cudaMemcpyAsync each would cost the
// stream a few microseconds apiece.
#include <cuda_runtime.h>

#include <cstddef>
#include <vector>

#include "flowfeed/batch.hpp"

namespace flowfeed {

/// The piece arrays one stream's copies are built in; use it from one thread at a time.
class PieceCopy {
 public:
  /// Room for a batch of `batch_size` rows: at most one piece per row, and one between each two
  /// and after the last. Nothing is allocated per batch after this.
  void reserve(std::size_t batch_size);
  /// Enqueues on `stream` the copy of `batch` into `dst`: its bytes from `src` (its buffer)
  /// between the external ranges, each range from where it is. Throws CudaError on failure.
  void enqueue(const Batch& batch, const std::byte* src, std::byte* dst, cudaStream_t stream);

 private:
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<std::size_t> sizes_;
};

}  // namespace flowfeed
