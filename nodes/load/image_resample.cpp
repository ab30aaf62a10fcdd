#include "flowfeed/nodes/detail/image_resample.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FLOWFEED_RESAMPLE_AVX2 1  // compiled for AVX2 alone, chosen at run time
#endif

namespace flowfeed {

namespace {

// Pillow's Resample.c: weights are fixed point with 22 fraction bits (32 - 8 bits of a pixel - 2
// of headroom), sums start at one half for rounding.
constexpr int kPrecisionBits = 32 - 8 - 2;
constexpr std::int32_t kHalf = std::int32_t{1} << (kPrecisionBits - 1);

inline std::uint8_t clip8(std::int32_t v) {
  if (v >= (std::int32_t{1} << kPrecisionBits << 8)) return 255;
  if (v <= 0) return 0;
  return static_cast<std::uint8_t>(v >> kPrecisionBits);
}

/// Pillow's bilinear filter: a triangle of support 1.
inline double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

/// The horizontal pass over `rows` rows, output pixel x of a row to place x (or its mirror).
template <int C>
void horizontal(const std::uint8_t* src, std::size_t stride, int rows, int ksize, const int* first,
                const int* count, const std::int32_t* weights, int out_width, bool flip,
                std::uint8_t* dst) {
  const auto w = static_cast<std::size_t>(out_width);
  for (int y = 0; y < rows; ++y) {
    const std::uint8_t* in = src + static_cast<std::size_t>(y) * stride;
    std::uint8_t* row = dst + static_cast<std::size_t>(y) * w * C;
    for (std::size_t x = 0; x < w; ++x) {
      const std::int32_t* k = weights + x * static_cast<std::size_t>(ksize);
      const std::uint8_t* p = in + static_cast<std::size_t>(first[x]) * C;
      std::int32_t s[C];
      for (int c = 0; c < C; ++c) s[c] = kHalf;
      for (int i = 0; i < count[x]; ++i) {
        for (int c = 0; c < C; ++c) s[c] += p[i * C + c] * k[i];
      }
      std::uint8_t* q = row + (flip ? w - 1 - x : x) * C;
      for (int c = 0; c < C; ++c) q[c] = clip8(s[c]);
    }
  }
}

#if defined(__SSE2__)
/// The horizontal pass for 3 or 4 channels, two taps at a time with SSE2's pmaddwd. A 22-bit
/// weight does not fit its 16-bit operands, so each weight is split into its high and low 11 bits
/// (`split`: high, low pairs per tap) and the two sums recombined: sum(p * w) = (sum(p * high)
/// << 11) + sum(p * low), exactly, so the bytes are Pillow's.
template <int C>
void horizontal_sse2(const std::uint8_t* src, int width, std::size_t stride, int rows, int ksize,
                     const int* first, const int* count, const std::int16_t* split, int out_width,
                     bool flip, std::uint8_t* dst) {
  static_assert(C == 3 || C == 4);
  const auto w = static_cast<std::size_t>(out_width);
  const __m128i zero = _mm_setzero_si128();
  const __m128i half = _mm_set1_epi32(kHalf);
  // A pixel as the low lanes of a vector: one 4-byte load, except for the image's last column,
  // where a 4th byte might lie past the end of the buffer (assembled from single bytes instead).
  auto pixel = [](const std::uint8_t* p, bool last) {
    std::uint32_t v;
    if (C == 4 || !last) {
      std::memcpy(&v, p, 4);
    } else {
      v = p[0] | (std::uint32_t{p[1]} << 8) | (std::uint32_t{p[2]} << 16);
    }
    return _mm_cvtsi32_si128(static_cast<int>(v));
  };
  for (int y = 0; y < rows; ++y) {
    const std::uint8_t* in = src + static_cast<std::size_t>(y) * stride;
    std::uint8_t* row = dst + static_cast<std::size_t>(y) * w * C;
    // Output places in increasing order (a flip takes its pixels from the mirrored output), so
    // each pixel is stored with one 4-byte write whose 4th byte the next pixel overwrites (the
    // row buffer has room for the last one's).
    for (std::size_t j = 0; j < w; ++j) {
      const std::size_t x = flip ? w - 1 - j : j;
      // Per tap pair: high weights of both taps, then low weights (int16 each).
      const std::int16_t* k = split + x * static_cast<std::size_t>(ksize + 1) * 2;
      const std::uint8_t* p = in + static_cast<std::size_t>(first[x]) * C;
      __m128i hi = zero;
      __m128i lo = zero;
      const int n = count[x];
      // r0 r1 g0 g1 b0 b1 x0 x1 as int16, times w0 w1 w0 w1 ...: r0*w0 + r1*w1, ... as int32.
      auto add = [&](int i, __m128i a, __m128i b) {
        const __m128i ab = _mm_unpacklo_epi8(_mm_unpacklo_epi8(a, b), zero);
        std::int32_t wh;
        std::int32_t wl;
        std::memcpy(&wh, k + 2 * i, 4);
        std::memcpy(&wl, k + 2 * i + 2, 4);
        hi = _mm_add_epi32(hi, _mm_madd_epi16(ab, _mm_set1_epi32(wh)));
        lo = _mm_add_epi32(lo, _mm_madd_epi16(ab, _mm_set1_epi32(wl)));
      };
      if (first[x] + n + 2 <= width) {
        // Away from the right edge: 4-byte loads all, an odd count's extra tap weighs 0.
        for (int i = 0; i < n; i += 2)
          add(i, pixel(p + i * C, false), pixel(p + (i + 1) * C, false));
      } else {
        const int last = width - 1 - first[x];  // the tap at the image's last column
        for (int i = 0; i < n; i += 2) {
          add(i, pixel(p + i * C, i == last),
              i + 1 < n ? pixel(p + (i + 1) * C, i + 1 == last) : zero);
        }
      }
      __m128i sum = _mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(hi, 11), lo), half);
      sum = _mm_srai_epi32(sum, kPrecisionBits);
      // Saturating packs clamp to [0, 255], as clip8 does.
      sum = _mm_packus_epi16(_mm_packs_epi32(sum, zero), zero);
      const auto v = static_cast<std::uint32_t>(_mm_cvtsi128_si32(sum));
      std::memcpy(row + j * C, &v, 4);
    }
  }
}

/// One output row of the vertical pass, 16 bytes at a time: the same split weights as
/// horizontal_sse2, two rows of the horizontal pass per pmaddwd. The last n % 16 bytes go through
/// vertical_row.
void vertical_row_sse2(const std::uint8_t* rows, std::size_t n, int count,
                       const std::int16_t* split, std::uint8_t* out) {
  const __m128i zero = _mm_setzero_si128();
  const __m128i half = _mm_set1_epi32(kHalf);
  auto finish = [&](__m128i hi, __m128i lo) {
    return _mm_srai_epi32(_mm_add_epi32(_mm_add_epi32(_mm_slli_epi32(hi, 11), lo), half),
                          kPrecisionBits);
  };
  for (std::size_t j = 0; j + 16 <= n; j += 16) {
    __m128i hi[4] = {zero, zero, zero, zero};
    __m128i lo[4] = {zero, zero, zero, zero};
    for (int i = 0; i < count; i += 2) {
      const std::uint8_t* ra = rows + static_cast<std::size_t>(i) * n + j;
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ra));
      const __m128i b =
          i + 1 < count ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(ra + n)) : zero;
      std::int32_t wh;
      std::int32_t wl;
      std::memcpy(&wh, split + 2 * i, 4);
      std::memcpy(&wl, split + 2 * i + 2, 4);
      const __m128i vh = _mm_set1_epi32(wh);
      const __m128i vl = _mm_set1_epi32(wl);
      const __m128i ab_lo = _mm_unpacklo_epi8(a, b);  // a0 b0 a1 b1 ... a7 b7
      const __m128i ab_hi = _mm_unpackhi_epi8(a, b);
      const __m128i p[4] = {_mm_unpacklo_epi8(ab_lo, zero), _mm_unpackhi_epi8(ab_lo, zero),
                            _mm_unpacklo_epi8(ab_hi, zero), _mm_unpackhi_epi8(ab_hi, zero)};
      for (int q = 0; q < 4; ++q) {
        hi[q] = _mm_add_epi32(hi[q], _mm_madd_epi16(p[q], vh));
        lo[q] = _mm_add_epi32(lo[q], _mm_madd_epi16(p[q], vl));
      }
    }
    const __m128i w0 = _mm_packs_epi32(finish(hi[0], lo[0]), finish(hi[1], lo[1]));
    const __m128i w1 = _mm_packs_epi32(finish(hi[2], lo[2]), finish(hi[3], lo[3]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + j), _mm_packus_epi16(w0, w1));
  }
}
#endif

#if defined(FLOWFEED_RESAMPLE_AVX2)
/// vertical_row_sse2 32 bytes at a time (AVX2's unpacks and packs work within 128-bit lanes;
/// unpacking then packing puts every byte back in its place).
__attribute__((target("avx2"))) inline __m256i finish_avx2(__m256i hi, __m256i lo) {
  return _mm256_srai_epi32(
      _mm256_add_epi32(_mm256_add_epi32(_mm256_slli_epi32(hi, 11), lo), _mm256_set1_epi32(kHalf)),
      kPrecisionBits);
}

__attribute__((target("avx2"))) void vertical_row_avx2(const std::uint8_t* rows, std::size_t n,
                                                       int count, const std::int16_t* split,
                                                       std::uint8_t* out) {
  const __m256i zero = _mm256_setzero_si256();
  for (std::size_t j = 0; j + 32 <= n; j += 32) {
    __m256i hi[4] = {zero, zero, zero, zero};
    __m256i lo[4] = {zero, zero, zero, zero};
    for (int i = 0; i < count; i += 2) {
      const std::uint8_t* ra = rows + static_cast<std::size_t>(i) * n + j;
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra));
      const __m256i b =
          i + 1 < count ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ra + n)) : zero;
      std::int32_t wh;
      std::int32_t wl;
      std::memcpy(&wh, split + 2 * i, 4);
      std::memcpy(&wl, split + 2 * i + 2, 4);
      const __m256i vh = _mm256_set1_epi32(wh);
      const __m256i vl = _mm256_set1_epi32(wl);
      const __m256i ab_lo = _mm256_unpacklo_epi8(a, b);
      const __m256i ab_hi = _mm256_unpackhi_epi8(a, b);
      const __m256i p[4] = {_mm256_unpacklo_epi8(ab_lo, zero), _mm256_unpackhi_epi8(ab_lo, zero),
                            _mm256_unpacklo_epi8(ab_hi, zero), _mm256_unpackhi_epi8(ab_hi, zero)};
      for (int q = 0; q < 4; ++q) {
        hi[q] = _mm256_add_epi32(hi[q], _mm256_madd_epi16(p[q], vh));
        lo[q] = _mm256_add_epi32(lo[q], _mm256_madd_epi16(p[q], vl));
      }
    }
    const __m256i w0 = _mm256_packs_epi32(finish_avx2(hi[0], lo[0]), finish_avx2(hi[1], lo[1]));
    const __m256i w1 = _mm256_packs_epi32(finish_avx2(hi[2], lo[2]), finish_avx2(hi[3], lo[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), _mm256_packus_epi16(w0, w1));
  }
}
#endif

/// The horizontal pass for 3 or 4 channels: SSE2 when allowed and compiled, else plain C++.
template <int C>
void horizontal_best(bool simd, const std::uint8_t* src, int width, std::size_t stride, int rows,
                     int ksize, const int* first, const int* count, const std::int32_t* weights,
                     const std::int16_t* split, const ResampleOutput& out, std::uint8_t* dst) {
#if defined(__SSE2__)
  if (simd) {
    horizontal_sse2<C>(src, width, stride, rows, ksize, first, count, split, out.width, out.flip,
                       dst);
    return;
  }
#endif
  (void)simd;
  (void)width;
  (void)split;
  horizontal<C>(src, stride, rows, ksize, first, count, weights, out.width, out.flip, dst);
}

}  // namespace

void Resampler::taps(int in_size, double in0, double in1, int out_size, Taps& t) {
  // Pillow's precompute_coeffs, step for step (its box coordinates are C floats).
  const auto f0 = static_cast<float>(in0);
  const auto f1 = static_cast<float>(in1);
  const double scale = static_cast<double>(f1 - f0) / out_size;
  const double filterscale = std::max(scale, 1.0);
  const double support = filterscale;  // the triangle's support, 1, times the scale
  t.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  const auto n = static_cast<std::size_t>(out_size);
  const auto ksize = static_cast<std::size_t>(t.ksize);
  t.first.resize(n);
  t.count.resize(n);
  if (t.weights.size() < n * ksize) t.weights.resize(n * ksize);
  if (t.exact.size() < ksize) t.exact.resize(ksize);
  const double ss = 1.0 / filterscale;
  for (std::size_t i = 0; i < n; ++i) {
    const double center = f0 + (static_cast<double>(i) + 0.5) * scale;
    const int lo = std::max(static_cast<int>(center - support + 0.5), 0);
    const int hi = std::min(static_cast<int>(center + support + 0.5), in_size);
    const int count = std::max(hi - lo, 0);
    double sum = 0;
    for (int x = 0; x < count; ++x) {
      const double w = triangle((x + lo - center + 0.5) * ss);
      t.exact[static_cast<std::size_t>(x)] = w;
      sum += w;
    }
    std::int32_t* k = t.weights.data() + i * ksize;
    for (int x = 0; x < count; ++x) {
      double w = t.exact[static_cast<std::size_t>(x)];
      if (sum != 0.0) w /= sum;
      k[x] = static_cast<std::int32_t>(w < 0 ? -0.5 + w * (1 << kPrecisionBits)
                                             : 0.5 + w * (1 << kPrecisionBits));
    }
    t.first[i] = lo;
    t.count[i] = count;
  }
  // The same weights split for horizontal_sse2: per tap pair, the high 11 bits of both, then the
  // low 11 bits of both; a missing second tap weighs 0.
  const std::size_t pairs = (ksize + 1) / 2;
  if (t.split.size() < n * pairs * 4) t.split.resize(n * pairs * 4);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int32_t* k = t.weights.data() + i * ksize;
    std::int16_t* out = t.split.data() + i * pairs * 4;
    for (std::size_t j = 0; j < pairs; ++j) {
      for (std::size_t m = 0; m < 2; ++m) {
        const std::size_t tap = 2 * j + m;
        const std::int32_t w = static_cast<int>(tap) < t.count[i] ? k[tap] : 0;
        out[4 * j + m] = static_cast<std::int16_t>(w >> 11);
        out[4 * j + 2 + m] = static_cast<std::int16_t>(w & 0x7ff);
      }
    }
  }
}

ResampleSimd best_resample_simd() noexcept {
#if defined(FLOWFEED_RESAMPLE_AVX2)
  if (__builtin_cpu_supports("avx2")) return ResampleSimd::avx2;
#endif
#if defined(__SSE2__)
  return ResampleSimd::sse2;
#else
  return ResampleSimd::none;
#endif
}

Resampler::Resampler(ResampleSimd simd) : simd_(std::min(simd, best_resample_simd())) {}

PixelRect Resampler::plan(int width, int height, const ResampleBox& box, int out_width,
                          int out_height) {
  taps(width, box.x0, box.x1, out_width, horizontal_);
  taps(height, box.y0, box.y1, out_height, vertical_);
  // The taps move right (down) with the output pixel: the first output's first tap and the last
  // output's last one bound every pixel read.
  PixelRect r;
  r.x = horizontal_.first.front();
  r.y = vertical_.first.front();
  r.width = std::max(horizontal_.first.back() + horizontal_.count.back() - r.x, 0);
  r.height = std::max(vertical_.first.back() + vertical_.count.back() - r.y, 0);
  for (int& f : horizontal_.first) f -= r.x;
  for (int& f : vertical_.first) f -= r.y;
  planned_ = r;
  out_width_ = out_width;
  out_height_ = out_height;
  return r;
}

void Resampler::resize(const std::uint8_t* src, int width, int height, std::size_t stride,
                       int channels, const ResampleBox& box, const ResampleOutput& out,
                       std::uint8_t* dst) {
  const PixelRect r = plan(width, height, box, out.width, out.height);
  run(src + static_cast<std::size_t>(r.y) * stride +
          static_cast<std::size_t>(r.x) * static_cast<std::size_t>(channels),
      stride, channels, out, dst);
}

void Resampler::run(const std::uint8_t* src, std::size_t stride, int channels,
                    const ResampleOutput& out, std::uint8_t* dst) {
  if (channels < 1 || channels > 4) throw std::invalid_argument("resample: 1 to 4 channels");
  if (out.width != out_width_ || out.height != out_height_) {
    throw std::logic_error("resample: run's output size differs from the plan's");
  }
  const int rows = planned_.height;
  const int width = planned_.width;
  const auto c = static_cast<std::size_t>(channels);
  const std::size_t n = static_cast<std::size_t>(out.width) * c;  // bytes of one output row
  // One byte more: horizontal_sse2 writes 4 bytes for the last 3-byte pixel.
  if (rows_.size() < n * static_cast<std::size_t>(rows) + 1)
    rows_.resize(n * static_cast<std::size_t>(rows) + 1);
  const Taps& h = horizontal_;
  const bool simd = simd_ != ResampleSimd::none;
  switch (channels) {
    case 1:
      horizontal<1>(src, stride, rows, h.ksize, h.first.data(), h.count.data(), h.weights.data(),
                    out.width, out.flip, rows_.data());
      break;
    case 2:
      horizontal<2>(src, stride, rows, h.ksize, h.first.data(), h.count.data(), h.weights.data(),
                    out.width, out.flip, rows_.data());
      break;
    case 3:
      horizontal_best<3>(simd, src, width, stride, rows, h.ksize, h.first.data(), h.count.data(),
                         h.weights.data(), h.split.data(), out, rows_.data());
      break;
    default:
      horizontal_best<4>(simd, src, width, stride, rows, h.ksize, h.first.data(), h.count.data(),
                         h.weights.data(), h.split.data(), out, rows_.data());
      break;
  }
  // The vertical pass, a whole output row at a time: each tap adds a row of the horizontal pass
  // times its weight. CHW output is split into planes from a packed row.
  const auto plane = static_cast<std::size_t>(out.width) * static_cast<std::size_t>(out.height);
  if (out.chw && packed_.size() < n) packed_.resize(n);
  const auto ksize = static_cast<std::size_t>(vertical_.ksize);
  for (std::size_t y = 0; y < static_cast<std::size_t>(out.height); ++y) {
    const std::uint8_t* first = rows_.data() + static_cast<std::size_t>(vertical_.first[y]) * n;
    const std::int32_t* k = vertical_.weights.data() + y * ksize;
    const int count = vertical_.count[y];
    std::uint8_t* o = out.chw ? packed_.data() : dst + y * n;
    std::size_t done = 0;
    const std::int16_t* split = vertical_.split.data() + y * (ksize + 1) * 2;
#if defined(FLOWFEED_RESAMPLE_AVX2)
    if (simd_ == ResampleSimd::avx2) {
      vertical_row_avx2(first, n, count, split, o);
      done = n - n % 32;
    }
#endif
#if defined(__SSE2__)
    if (simd_ != ResampleSimd::none && done == 0) {
      vertical_row_sse2(first, n, count, split, o);
      done = n - n % 16;
    }
#endif
    for (std::size_t j = done; j < n; ++j) {
      std::int32_t sum = kHalf;
      for (int i = 0; i < count; ++i) sum += first[static_cast<std::size_t>(i) * n + j] * k[i];
      o[j] = clip8(sum);
    }
    if (!out.chw) continue;
    for (std::size_t ch = 0; ch < c; ++ch) {
      std::uint8_t* p = dst + ch * plane + y * static_cast<std::size_t>(out.width);
      for (std::size_t x = 0; x < static_cast<std::size_t>(out.width); ++x) p[x] = o[x * c + ch];
    }
  }
}

}  // namespace flowfeed
