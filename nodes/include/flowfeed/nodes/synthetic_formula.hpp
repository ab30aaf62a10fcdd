#pragma once
/// \file
/// The synthetic data formula as inline functions usable from host and device code, so that the
/// `synthetic` and `memory` loaders, the host `checksum` and the GPU `device_checksum` share one
/// definition of every byte. Includes no CUDA header: under nvcc the functions are
/// `__host__ __device__`, elsewhere plain inline functions.

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FLOWFEED_HOST_DEVICE __host__ __device__
#else
#define FLOWFEED_HOST_DEVICE
#endif

namespace flowfeed::formula {

/// splitmix64, bit for bit the same as flowfeed::splitmix64 (sampler.hpp); inline here so that
/// device code can call it.
FLOWFEED_HOST_DEVICE inline std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Per-sample hash of (seed, sample).
FLOWFEED_HOST_DEVICE inline std::uint64_t sample_hash(std::uint64_t seed,
                                                      std::uint64_t sample) noexcept {
  return mix(mix(seed) ^ (sample * 0x9E3779B97F4A7C15ull));
}

/// The 32-bit word behind element `element` of the sample whose hash is `hash`.
FLOWFEED_HOST_DEVICE inline std::uint32_t word(std::uint64_t hash, std::uint64_t element) noexcept {
  return static_cast<std::uint32_t>(hash) + static_cast<std::uint32_t>(element) * 2654435761u;
}

/// Element types, numbered as flowfeed::DType (batch.hpp).
enum class ElementType : std::uint8_t { float32 = 0, float16 = 1, uint8 = 2, int32 = 3, int64 = 4 };

/// The bit pattern of element `element` (little-endian, in the low bytes of the result):
/// float32 = ((word >> 8) & 0xFFFF) / 65536 (exact in float), float16 = (word >> 16) & 0x3BFF (a
/// finite half), uint8 = word >> 24, int32 = word, int64 = word zero-extended.
FLOWFEED_HOST_DEVICE inline std::uint64_t element_bits(ElementType type, std::uint64_t hash,
                                                       std::uint64_t element) noexcept {
  const std::uint32_t w = word(hash, element);
  switch (type) {
    case ElementType::float32: {
      const float f = static_cast<float>((w >> 8) & 0xFFFFu) * (1.0f / 65536.0f);
#if defined(__CUDA_ARCH__)
      return __float_as_uint(f);
#else
      std::uint32_t bits = 0;
      std::memcpy(&bits, &f, sizeof bits);
      return bits;
#endif
    }
    case ElementType::float16: return (w >> 16) & 0x3BFFu;
    case ElementType::uint8: return w >> 24;
    case ElementType::int32: return w;
    case ElementType::int64: return w;
  }
  return 0;
}

/// The label of a sample: (hash >> 40) % classes.
FLOWFEED_HOST_DEVICE inline std::int32_t label(std::uint64_t hash, std::int64_t classes) noexcept {
  return static_cast<std::int32_t>((hash >> 40) % static_cast<std::uint64_t>(classes));
}

}  // namespace flowfeed::formula
