#pragma once
/// \file
/// Resizing a sub-pixel region of a uint8 image with Pillow's arithmetic: `Image.resize(size,
/// BILINEAR, box)` is a separable triangle filter, antialiased when shrinking (its support grows
/// with the scale), with 22-bit fixed-point weights, a horizontal pass then a vertical one, each
/// rounded to uint8 — what torchvision's `RandomResizedCrop(antialias=True)` does to PIL images.
/// The same steps here give the same bytes. The flip and the output layout are folded into the
/// passes, so the result lands in the batch without another copy.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace flowfeed {

/// A region of an image in pixel-edge coordinates: [x0, x1) × [y0, y1), fractions allowed.
struct ResampleBox {
  double x0 = 0;
  double y0 = 0;
  double x1 = 0;
  double y1 = 0;
};

/// Whole pixels of an image: columns [x, x + width), rows [y, y + height).
struct PixelRect {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
};

/// Where and how the resized region is written.
struct ResampleOutput {
  int width = 0;
  int height = 0;
  bool flip = false;  ///< mirror left to right
  bool chw = false;   ///< planes instead of interleaved pixels
};

/// The instructions the resample may use; each gives the same bytes.
enum class ResampleSimd : std::uint8_t { none, sse2, avx2 };

/// The best this CPU runs (AVX2 is chosen at run time; SSE2 is x86-64's baseline).
ResampleSimd best_resample_simd() noexcept;

/// Pillow's bilinear resample. Keeps its weights and intermediate rows between calls: one per
/// thread; after the largest image has been met it allocates nothing.
class Resampler {
 public:
  /// At most `simd` (tests compare the paths); never more than the CPU has.
  explicit Resampler(ResampleSimd simd = ResampleSimd::avx2);

  /// Resizes `box` of `src` (`width` × `height` pixels of `channels` (1 to 4) bytes, rows
  /// `stride` bytes apart) to `out.width` × `out.height`, writing `dst` (HWC, or CHW when
  /// `out.chw`). Pixels outside the image are never read: the filter is cut at its edges and its
  /// weights renormalised, as Pillow does. plan() then run().
  void resize(const std::uint8_t* src, int width, int height, std::size_t stride, int channels,
              const ResampleBox& box, const ResampleOutput& out, std::uint8_t* dst);

  /// Computes the weights for resizing `box` of a `width` × `height` image to `out_width` ×
  /// `out_height`, and returns the pixels they read: a decoder need produce no others.
  PixelRect plan(int width, int height, const ResampleBox& box, int out_width, int out_height);

  /// Resizes with the last plan. `src` points at the plan's first pixel (its rect's x, y); the
  /// rect's pixels are there, rows `stride` bytes apart. `out` has the plan's size.
  void run(const std::uint8_t* src, std::size_t stride, int channels, const ResampleOutput& out,
           std::uint8_t* dst);

 private:
  /// One direction's weights: for output pixel i, taps [first[i], first[i] + count[i]) with
  /// weights weights[i * ksize + k].
  struct Taps {
    int ksize = 0;
    std::vector<int> first;
    std::vector<int> count;
    std::vector<std::int32_t> weights;
    std::vector<std::int16_t> split;  // weights as 11-bit halves, for the SIMD pass
    std::vector<double> exact;
  };
  static void taps(int in_size, double in0, double in1, int out_size, Taps& t);

  Taps horizontal_;  // first[] relative to planned_.x
  Taps vertical_;    // first[] relative to planned_.y
  ResampleSimd simd_;
  PixelRect planned_;
  int out_width_ = 0;
  int out_height_ = 0;
  std::vector<std::uint8_t> rows_;    // the horizontal pass: out.width × rows used × channels
  std::vector<std::uint8_t> packed_;  // one output row before it is split into planes (CHW)
};

}  // namespace flowfeed
