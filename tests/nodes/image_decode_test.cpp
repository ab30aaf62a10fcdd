// ImageDecoder: one decoder per thread decodes every image that thread loads, the bad ones too.

#include "flowfeed/nodes/detail/image_decode.hpp"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cstdint>
#include <string>
#include <vector>

namespace flowfeed {
namespace {

/// A 32×24 RGB JPEG of a gradient, made with TurboJPEG.
std::vector<std::uint8_t> gradient_jpeg() {
  const int width = 32;
  const int height = 24;
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(width * height * 3));
  for (std::size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<std::uint8_t>(i * 7);
  tjhandle h = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long bytes = 0;
  const int rc =
      tjCompress2(h, rgb.data(), width, 0, height, TJPF_RGB, &out, &bytes, TJSAMP_420, 90, 0);
  std::vector<std::uint8_t> jpeg;
  if (rc == 0) jpeg.assign(out, out + bytes);
  tjFree(out);
  tjDestroy(h);
  return jpeg;
}

std::string header_error(ImageDecoder& decoder, const std::vector<std::uint8_t>& jpeg) {
  try {
    decoder.size(jpeg.data(), jpeg.size(), ImageFormat::jpeg);
  } catch (const DecodeError& e) {
    return e.what();
  }
  return "";
}

TEST(ImageDecoder, AHeaderThatFailsLeavesTheDecoderFitForTheNextImage) {
  const std::vector<std::uint8_t> good = gradient_jpeg();
  ASSERT_GT(good.size(), 20u);
  std::vector<std::uint8_t> bad = good;
  bad[2] = 0xFF;  // the marker after SOI becomes FF BF, which no JPEG has
  bad[3] = 0xBF;
  ImageDecoder decoder;
  EXPECT_EQ(header_error(decoder, bad), "not a decodable JPEG (Unsupported marker type 0xbf)");
  // Before, the handle went on from the failed header and refused every image after it with the
  // same message, so one bad file made good ones bad samples on that thread.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(header_error(decoder, good), "") << "image " << i << " after the bad one";
    const ImageSize s = decoder.size(good.data(), good.size(), ImageFormat::jpeg);
    EXPECT_EQ(s.width, 32);
    EXPECT_EQ(s.height, 24);
  }
}

}  // namespace
}  // namespace flowfeed
