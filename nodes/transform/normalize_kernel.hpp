#pragma once
/// \file
/// The device_normalize kernel: uint8 → float32/float16/bfloat16, (v - mean[c]) / std[c], and a
/// byte copy of the batch's other tensors, in one launch. Private to nodes/.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace flowfeed::cuda {

/// What one launch converts and copies.
struct NormalizeArgs {
  static constexpr int kMaxChannels = 4;
  static constexpr int kMaxCopies = 6;
  enum class Out : int { float32, float16, bfloat16 };
  /// A tensor that is only moved to the output buffer.
  struct Copy {
    const unsigned char* src = nullptr;
    unsigned char* dst = nullptr;
    std::size_t bytes = 0;
  };
  const std::uint8_t* in = nullptr;  ///< 4-byte aligned
  void* out = nullptr;               ///< 16-byte aligned
  std::size_t elements = 0;          ///< values to convert (whole samples)
  std::size_t plane = 0;             ///< values per channel plane (chw)
  int channels = 0;
  bool chw = false;
  Out dtype = Out::float32;
  float mean[kMaxChannels] = {};
  float stddev[kMaxChannels] = {};
  Copy copies[kMaxCopies] = {};
  int copy_count = 0;
};

/// Enqueues the kernel on `stream`; throws CudaError when the launch fails.
void launch_normalize(const NormalizeArgs& args, cudaStream_t stream);

}  // namespace flowfeed::cuda
