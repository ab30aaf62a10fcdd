// The resample the image loader crops with (flowfeed/nodes/detail/image_resample.hpp). Its bytes
// against Pillow's are checked through the loader
// (WebDataset.CenterCropGeometryMatchesPilsResizeOfTheSameBox); here: every instruction set gives
// the same bytes, flip and CHW are the mirror and the planes of the plain output, and a plan's
// rectangle holds every pixel the resize reads.
#include "flowfeed/nodes/detail/image_resample.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace flowfeed {
namespace {

/// A textured test image: every byte differs from its neighbours.
std::vector<std::uint8_t> texture(int width, int height, int channels) {
  std::vector<std::uint8_t> img(static_cast<std::size_t>(width * height * channels));
  std::uint32_t s = 12345;
  for (auto& v : img) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<std::uint8_t>(s >> 24);
  }
  return img;
}

struct Case {
  ResampleBox box;
  int out_width;
  int out_height;
};

/// Shrinking and enlarging, whole and fractional boxes, boxes at every edge, odd sizes.
const std::vector<Case> kCases = {
    {{0, 0, 97, 61}, 24, 24},   {{10, 5, 90.5, 60}, 37, 29}, {{0.25, 0.75, 20.5, 17.25}, 40, 33},
    {{80, 40, 97, 61}, 24, 24}, {{0, 0, 12, 9}, 50, 31},     {{3, 2, 96, 59}, 1, 7},
    {{50, 30, 51, 31}, 8, 8},   {{0, 20, 97, 21}, 64, 2},
};

std::vector<std::uint8_t> resize(ResampleSimd simd, const std::vector<std::uint8_t>& img,
                                 int channels, const Case& c, bool flip, bool chw) {
  Resampler r(simd);
  std::vector<std::uint8_t> out(static_cast<std::size_t>(c.out_width * c.out_height * channels));
  r.resize(img.data(), 97, 61, static_cast<std::size_t>(97 * channels), channels, c.box,
           {c.out_width, c.out_height, flip, chw}, out.data());
  return out;
}

TEST(Resample, EveryInstructionSetGivesTheSameBytes) {
  for (int channels = 1; channels <= 4; ++channels) {
    const auto img = texture(97, 61, channels);
    for (std::size_t i = 0; i < kCases.size(); ++i) {
      for (const bool flip : {false, true}) {
        SCOPED_TRACE(testing::Message() << channels << " channels, case " << i << " flip " << flip);
        const auto plain = resize(ResampleSimd::none, img, channels, kCases[i], flip, false);
        EXPECT_EQ(resize(ResampleSimd::sse2, img, channels, kCases[i], flip, false), plain);
        EXPECT_EQ(resize(ResampleSimd::avx2, img, channels, kCases[i], flip, false), plain);
      }
    }
  }
}

TEST(Resample, FlipMirrorsAndChwSplitsThePlanes) {
  const int channels = 3;
  const auto img = texture(97, 61, channels);
  for (const Case& c : kCases) {
    const auto hwc = resize(ResampleSimd::avx2, img, channels, c, false, false);
    const auto flipped = resize(ResampleSimd::avx2, img, channels, c, true, false);
    const auto chw = resize(ResampleSimd::avx2, img, channels, c, true, true);
    const auto w = static_cast<std::size_t>(c.out_width);
    const auto h = static_cast<std::size_t>(c.out_height);
    for (std::size_t y = 0; y < h; ++y) {
      for (std::size_t x = 0; x < w; ++x) {
        for (std::size_t ch = 0; ch < 3; ++ch) {
          const std::uint8_t want = hwc[(y * w + (w - 1 - x)) * 3 + ch];
          ASSERT_EQ(flipped[(y * w + x) * 3 + ch], want);
          ASSERT_EQ(chw[ch * w * h + y * w + x], want);
        }
      }
    }
  }
}

TEST(Resample, ThePlannedRectangleHoldsEveryPixelRead) {
  // A decoder that produces only the plan's rectangle (what the JPEG path does) must get the
  // bytes of a resize over the whole image: run() on a copy of just that rectangle.
  const int channels = 3;
  const auto img = texture(97, 61, channels);
  for (const Case& c : kCases) {
    const auto whole = resize(ResampleSimd::avx2, img, channels, c, false, false);
    Resampler r;
    const PixelRect rect = r.plan(97, 61, c.box, c.out_width, c.out_height);
    ASSERT_GE(rect.x, 0);
    ASSERT_GE(rect.y, 0);
    ASSERT_LE(rect.x + rect.width, 97);
    ASSERT_LE(rect.y + rect.height, 61);
    std::vector<std::uint8_t> part(static_cast<std::size_t>(rect.width * rect.height * channels));
    const auto row = static_cast<std::size_t>(rect.width * channels);
    for (int y = 0; y < rect.height; ++y) {
      const std::uint8_t* from =
          img.data() +
          (static_cast<std::size_t>(rect.y + y) * 97 + static_cast<std::size_t>(rect.x)) * 3;
      std::copy(from, from + row, part.data() + static_cast<std::size_t>(y) * row);
    }
    std::vector<std::uint8_t> out(whole.size());
    r.run(part.data(), row, channels, {c.out_width, c.out_height, false, false}, out.data());
    EXPECT_EQ(out, whole);
  }
}

}  // namespace
}  // namespace flowfeed
