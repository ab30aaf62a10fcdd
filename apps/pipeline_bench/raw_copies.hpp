#pragma once
/// \file
/// Raw CUDA copy baselines, measured in the same process as the pipeline they are compared with.

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

}  // namespace flowfeed::bench
