#pragma once
/// \file
/// Raw CUDA baselines, measured in the same process as the pipeline they are compared with. In a
/// build without CUDA every function throws NeedsCuda (raw_copies_off.cpp).

#include <cstddef>

namespace flowfeed::bench {

/// Result of a raw copy loop.
struct RawCopies {
  double gbps = 0;  ///< bytes / seconds / 1e9
  double copies_per_second = 0;
  std::size_t copies = 0;
  double seconds = 0;
};

/// Back-to-back cudaMemcpyAsync host → device of `bytes` each from page-locked buffers
/// (cudaHostAlloc), on one non-blocking stream, for about `seconds`, timed with CUDA events after a
/// warm-up. Throws flowfeed::CudaError.
RawCopies raw_pinned_copies(std::size_t bytes, double seconds, int device);

/// Result of the naive loop.
struct NaiveLoop {
  std::size_t batches = 0;
  double seconds = 0;
  double batches_per_second = 0;
  unsigned long long mismatches = 0;  ///< elements the checksum kernel found wrong (0)
};

/// The founding report's loop, for `batches` × `epochs` batches of `rows` samples of `elements`
/// float32 plus `rows` int32 labels, generated with the synthetic formula (seed 0, 10 classes) into
/// one pageable host buffer: per batch a fresh cudaMalloc, a synchronous pageable cudaMemcpy, the
/// device_checksum kernel on the legacy default stream, a synchronize and cudaFree. Timed on the
/// host over the whole loop (after one warm-up batch). Throws flowfeed::CudaError.
NaiveLoop naive_loop(std::size_t batches, int epochs, std::size_t rows, std::size_t elements,
                     int device);

}  // namespace flowfeed::bench
