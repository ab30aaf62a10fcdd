// The device_checksum kernel: every byte of x and y against the synthetic formula.
#include "flowfeed/nodes/detail/checksum_kernel.hpp"
#include "flowfeed/nodes/synthetic_formula.hpp"

namespace flowfeed::cuda {

namespace {

__device__ std::uint64_t load_element(const unsigned char* p, std::uint32_t size) {
  switch (size) {
    case 1: return *p;
    case 2: return *reinterpret_cast<const std::uint16_t*>(p);
    case 4: return *reinterpret_cast<const std::uint32_t*>(p);
    default: return *reinterpret_cast<const std::uint64_t*>(p);
  }
}

__device__ void report(const ChecksumArgs& a, std::uint64_t seq, unsigned int tensor,
                       std::uint64_t row, std::uint64_t sample, std::uint64_t byte,
                       std::uint64_t expected, std::uint64_t actual) {
  atomicAdd(&a.record->mismatches, 1ull);
  if (atomicCAS(&a.record->claimed, 0u, 1u) == 0u) {
    a.record->tensor = tensor;
    a.record->seq = seq;
    a.record->row = row;
    a.record->sample = sample;
    a.record->byte = byte;
    a.record->expected = expected;
    a.record->actual = actual;
    __threadfence_system();
    *reinterpret_cast<volatile unsigned int*>(a.host_flag) = 1u;
  }
}

/// First differing byte of two little-endian elements.
__device__ std::uint64_t first_byte(std::uint64_t a, std::uint64_t b) {
  return static_cast<std::uint64_t>(__ffsll(static_cast<long long>(a ^ b)) - 1) / 8;
}

__global__ void checksum_kernel(ChecksumArgs a) {
  const ChecksumBatch& b = a.batches[blockIdx.z];
  const auto type = static_cast<formula::ElementType>(a.type);
  const std::uint64_t sample_bytes = a.elements * a.element_size;
  for (std::uint64_t row = blockIdx.y; row < b.rows; row += gridDim.y) {
    const std::uint64_t sample = b.samples ? b.samples[row]
                                 : b.inline_at != ChecksumBatch::kNoInline
                                     ? a.inline_samples[b.inline_at + row]
                                     : b.first_sample + row;
    const std::uint64_t hash = formula::sample_hash(a.seed, sample);
    const unsigned char* xs = b.data + row * sample_bytes;
    for (std::uint64_t j = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x;
         j < a.elements; j += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
      const std::uint64_t expected = formula::element_bits(type, hash, j);
      const std::uint64_t actual = load_element(xs + j * a.element_size, a.element_size);
      if (actual != expected) {
        report(a, b.seq, 0, row, sample, j * a.element_size + first_byte(expected, actual),
               expected, actual);
      }
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      const auto expected = static_cast<std::uint32_t>(formula::label(hash, a.classes));
      const std::uint32_t actual =
          *reinterpret_cast<const std::uint32_t*>(b.data + b.y_offset + row * 4);
      if (actual != expected)
        report(a, b.seq, 1, row, sample, first_byte(expected, actual), expected, actual);
    }
  }
}

}  // namespace

cudaError_t launch_checksum(const ChecksumArgs& args, cudaStream_t stream) {
  if (args.count == 0 || args.max_rows == 0) return cudaSuccess;
  constexpr unsigned threads = 256;
  const unsigned rows = args.max_rows < 65535 ? args.max_rows : 65535;
  std::uint64_t per_row = (args.elements + threads - 1) / threads;
  const std::uint64_t cap = rows >= 4096 ? 1 : 4096 / rows;
  if (per_row > cap) per_row = cap;
  if (per_row == 0) per_row = 1;
  checksum_kernel<<<dim3(static_cast<unsigned>(per_row), rows, args.count), threads, 0, stream>>>(
      args);
  return cudaGetLastError();
}

}  // namespace flowfeed::cuda
