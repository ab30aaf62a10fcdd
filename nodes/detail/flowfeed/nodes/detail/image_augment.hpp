#pragma once
/// \file
/// The geometric part of image augmentation: which region of the source image becomes the output
/// (torchvision's RandomResizedCrop and Resize + CenterCrop), whether it is flipped, and storing
/// the result in HWC or CHW order. Every random choice comes from a SampleRng seeded by (seed,
/// epoch, sample index), so a sample's augmentation does not depend on which thread decodes it.

#include <cstddef>
#include <cstdint>

namespace flowfeed {

/// A counter-based generator for one sample: its stream depends only on (seed, epoch, sample)
/// and the order of the draws, never on a thread or on other samples.
class SampleRng {
 public:
  /// The stream of `sample` in `epoch` for `seed`; `salt` separates independent uses (the crop
  /// and the flip draw from different streams, so a flip transform agrees with the loader's).
  SampleRng(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample, std::uint64_t salt);
  /// The next 64 random bits.
  std::uint64_t next() noexcept;
  /// Uniform in [lo, hi).
  double uniform(double lo, double hi) noexcept;
  /// Uniform integer in [0, n) (n > 0).
  std::uint64_t below(std::uint64_t n) noexcept;

 private:
  std::uint64_t state_;
};

/// Salts of the streams the image nodes draw from.
inline constexpr std::uint64_t kCropSalt = 0x63726f70;  // "crop"
inline constexpr std::uint64_t kFlipSalt = 0x666c6970;  // "flip"

/// A region of the source image in pixels (fractional for a center crop after a resize).
struct CropBox {
  double x = 0, y = 0, width = 0, height = 0;
};

/// torchvision.transforms.RandomResizedCrop.get_params: up to 10 tries of an area fraction in
/// [scale_min, scale_max] and a log-uniform aspect ratio in [ratio_min, ratio_max] that fits,
/// else the central crop clamped to the ratio range. Integer box.
CropBox random_resized_crop(int width, int height, double scale_min, double scale_max,
                            double ratio_min, double ratio_max, SampleRng& rng);

/// Resize (shorter side to `resize`) then CenterCrop(out_height, out_width), as one box in source
/// pixels. A crop larger than the resized image is clamped to it.
CropBox center_crop(int width, int height, int resize, int out_width, int out_height);

/// True with probability `p` (one draw from a kFlipSalt stream of the sample).
bool flip_choice(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample, double p);

/// Mirrors an image left-right in place (HWC or CHW).
void flip_in_place(std::uint8_t* image, int width, int height, int channels, bool chw) noexcept;

}  // namespace flowfeed
