#include "flowfeed/nodes/detail/image_augment.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "flowfeed/sampler.hpp"

namespace flowfeed {

SampleRng::SampleRng(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample,
                     std::uint64_t salt)
    : state_(splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ epoch) ^ sample) ^ salt)) {}

std::uint64_t SampleRng::next() noexcept {
  state_ += 0x9e3779b97f4a7c15ULL;
  return splitmix64(state_);
}

double SampleRng::uniform(double lo, double hi) noexcept {
  const double u = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);  // [0, 1)
  return lo + (hi - lo) * u;
}

std::uint64_t SampleRng::below(std::uint64_t n) noexcept {
  // Multiply-shift: unbiased enough for image coordinates, and the same on every machine.
  __extension__ using Wide = unsigned __int128;
  return static_cast<std::uint64_t>((static_cast<Wide>(next()) * n) >> 64);
}

CropBox random_resized_crop(int width, int height, double scale_min, double scale_max,
                            double ratio_min, double ratio_max, SampleRng& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(ratio_min);
  const double log_hi = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * rng.uniform(scale_min, scale_max);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const auto w = static_cast<long>(std::lround(std::sqrt(target * aspect)));
    const auto h = static_cast<long>(std::lround(std::sqrt(target / aspect)));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      const auto y = static_cast<double>(rng.below(static_cast<std::uint64_t>(height - h + 1)));
      const auto x = static_cast<double>(rng.below(static_cast<std::uint64_t>(width - w + 1)));
      return {x, y, static_cast<double>(w), static_cast<double>(h)};
    }
  }
  // Fallback: the central crop, its aspect ratio clamped to the range.
  const double in_ratio = static_cast<double>(width) / height;
  long w = width;
  long h = height;
  if (in_ratio < ratio_min) {
    h = std::lround(static_cast<double>(w) / ratio_min);
  } else if (in_ratio > ratio_max) {
    w = std::lround(static_cast<double>(h) * ratio_max);
  }
  w = std::clamp(w, 1L, static_cast<long>(width));
  h = std::clamp(h, 1L, static_cast<long>(height));
  return {static_cast<double>((width - w) / 2), static_cast<double>((height - h) / 2),
          static_cast<double>(w), static_cast<double>(h)};
}

CropBox center_crop(int width, int height, int resize, int out_width, int out_height) {
  // The shorter side becomes `resize`: one output pixel covers `s` source pixels.
  const double s = static_cast<double>(std::min(width, height)) / resize;
  const double w = std::min(out_width * s, static_cast<double>(width));
  const double h = std::min(out_height * s, static_cast<double>(height));
  return {(width - w) / 2, (height - h) / 2, w, h};
}

bool flip_choice(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample, double p) {
  if (p <= 0) return false;
  SampleRng rng(seed, epoch, sample, kFlipSalt);
  return rng.uniform(0, 1) < p;
}

void flip_in_place(std::uint8_t* image, int width, int height, int channels, bool chw) noexcept {
  const auto w = static_cast<std::size_t>(width);
  const auto h = static_cast<std::size_t>(height);
  const auto c = static_cast<std::size_t>(channels);
  if (chw) {
    for (std::size_t row = 0; row < c * h; ++row)
      std::reverse(image + row * w, image + row * w + w);
    return;
  }
  for (std::size_t y = 0; y < h; ++y) {
    std::uint8_t* line = image + y * w * c;
    for (std::size_t x = 0; x < w / 2; ++x) {
      std::swap_ranges(line + x * c, line + x * c + c, line + (w - 1 - x) * c);
    }
  }
}

}  // namespace flowfeed
