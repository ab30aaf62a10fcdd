#pragma once
/// \file
/// The device_checksum kernel's interface, shared by device_checksum.cu (the kernel) and
/// device_sinks_cuda.cpp (the node, host compiler).

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

/// What one launch checks: rows × elements of x at `batch`, then rows labels at batch + y_offset.
struct ChecksumArgs {
  /// Rows whose sample indices travel inside the launch's parameters (1 KiB of the 4 KiB a kernel
  /// may take): no per-batch host buffer, event or wait for batches up to this size.
  static constexpr std::uint32_t kInlineSamples = 256;
  const unsigned char* batch = nullptr;
  const std::uint32_t* samples = nullptr;  ///< row → sample (device-readable); else inline/first
  std::uint32_t inline_count = 0;          ///< > 0: row → inline_samples[row]
  std::uint32_t inline_samples[kInlineSamples] = {};
  std::uint64_t first_sample = 0;
  std::uint64_t rows = 0;
  std::uint64_t elements = 0;  ///< per sample
  std::uint32_t element_size = 4;
  std::uint32_t type = 0;  ///< formula::ElementType
  std::uint64_t y_offset = 0;
  std::uint64_t seed = 0;
  std::int64_t classes = 10;
  std::uint64_t seq = 0;
  ChecksumRecord* record = nullptr;   ///< device memory
  unsigned int* host_flag = nullptr;  ///< mapped host memory, set to 1 on a mismatch
};

/// Launches the check on `stream`; returns the launch's error (cudaGetLastError).
cudaError_t launch_checksum(const ChecksumArgs& args, cudaStream_t stream);

}  // namespace flowfeed::cuda
