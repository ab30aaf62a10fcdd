#pragma once
/// \file
/// The device_checksum kernel's interface, shared by device_checksum.cu (the kernel) and
/// device_checksum_cuda.cpp (the node, host compiler).

#include <cuda_runtime.h>

#include <cstdint>

namespace flowfeed::cuda {

/// The first mismatch of a run, written once by the thread that claims it (claimed 0 → 1). Batches
/// of one stream run in order, so it is a mismatching byte of the first bad batch.
struct ChecksumRecord {
  unsigned int claimed;
  unsigned int tensor;            ///< 0: x, 1: y
  unsigned long long mismatches;  ///< mismatching elements in all
  unsigned long long seq;
  unsigned long long row;
  unsigned long long sample;
  unsigned long long byte;      ///< first differing byte within the sample's tensor
  unsigned long long expected;  ///< the element's bits
  unsigned long long actual;
};

/// One batch of a launch: rows × elements of x at `data`, then rows labels at data + y_offset.
struct ChecksumBatch {
  static constexpr std::uint32_t kNoInline = 0xffffffffu;
  const unsigned char* data = nullptr;
  const std::uint32_t* samples = nullptr;  ///< row → sample (device-readable), or null
  std::uint64_t first_sample = 0;          ///< row → first_sample + row (no samples, no inline)
  std::uint64_t y_offset = 0;
  std::uint64_t seq = 0;
  std::uint32_t rows = 0;
  std::uint32_t inline_at = kNoInline;  ///< row → ChecksumArgs::inline_samples[inline_at + row]
};

/// What one launch checks: up to kMaxBatches batches of the same layout, one grid slice each.
struct ChecksumArgs {
  static constexpr std::uint32_t kMaxBatches = 16;
  /// Sample indices that travel inside the launch's parameters (1 KiB; a launch may take 32 KiB
  /// on sm_70 and newer): shuffled batches need no host buffer, event or wait while they fit.
  static constexpr std::uint32_t kInlineSamples = 256;
  ChecksumBatch batches[kMaxBatches];
  std::uint32_t count = 0;
  std::uint32_t max_rows = 0;
  std::uint32_t inline_samples[kInlineSamples] = {};
  std::uint64_t elements = 0;  ///< per sample
  std::uint32_t element_size = 4;
  std::uint32_t type = 0;  ///< formula::ElementType
  std::uint64_t seed = 0;
  std::int64_t classes = 10;
  ChecksumRecord* record = nullptr;   ///< device memory
  unsigned int* host_flag = nullptr;  ///< mapped host memory, set to 1 on a mismatch
};

/// Launches the check on `stream`; returns the launch's error (cudaGetLastError).
cudaError_t launch_checksum(const ChecksumArgs& args, cudaStream_t stream);

}  // namespace flowfeed::cuda
