#pragma once
/// \file
/// Decoding a JPEG (TurboJPEG) or PNG (libpng) straight into an output crop of fixed size: the
/// crop region is chosen before the pixels are decoded, so a JPEG whose region is much larger than
/// the output is decoded at a reduced size by the IDCT itself (1/2, 1/4, 1/8, ...), then resized
/// with Pillow's bilinear arithmetic (image_resample.hpp). One ImageDecoder per thread; none of it
/// is thread-safe.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "flowfeed/nodes/detail/image_augment.hpp"
#include "flowfeed/nodes/detail/image_resample.hpp"

namespace flowfeed {

struct JpegState;  // libjpeg's decompressor and error manager (image_decode.cpp)

/// The encodings the image loader decodes.
enum class ImageFormat : std::uint8_t { jpeg, png };

/// Why an image could not be decoded; the message is the reason alone (the caller names the
/// shard and member).
class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Width and height of an encoded image.
struct ImageSize {
  int width = 0;
  int height = 0;
};

/// What the decoder produces: `width` × `height` × `channels` (1: gray, 3: RGB) uint8, HWC or
/// CHW.
struct DecodeTarget {
  int width = 224;
  int height = 224;
  int channels = 3;
  bool chw = false;         ///< planes instead of interleaved pixels
  bool dct_scaling = true;  ///< let a JPEG's IDCT shrink the image when the crop allows
};

/// A per-thread decoder: TurboJPEG handle, libpng state and scratch buffers that grow to the
/// largest image it has seen (so a steady state allocates nothing).
class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  /// Reads the image's size from its header. Throws DecodeError.
  ImageSize size(const std::uint8_t* data, std::size_t bytes, ImageFormat format);

  /// Decodes the image (whose size() is `size`), takes the region `box` of it and resizes that to
  /// `target` (Pillow's bilinear resize, as torchvision's antialiased one), mirrored left to
  /// right when `flip`, writing `out` (target.width × target.height × target.channels bytes).
  /// Throws DecodeError.
  void decode(const std::uint8_t* data, std::size_t bytes, ImageFormat format, ImageSize size,
              const CropBox& box, const DecodeTarget& target, bool flip, std::uint8_t* out);

  /// The JPEG scale (numerator/denominator) the last decode used: 8/8 when full size.
  int last_scale_eighths() const noexcept { return last_scale_eighths_; }

 private:
  /// Decodes the part of the JPEG that the crop's resize reads, at the smallest IDCT scale that
  /// keeps the crop at least as large as the target, and resizes it into `out`.
  void decode_jpeg(const std::uint8_t* data, std::size_t bytes, ImageSize size, const CropBox& box,
                   const DecodeTarget& target, bool flip, std::uint8_t* out);
  ImageSize decode_png(const std::uint8_t* data, std::size_t bytes, int channels);

  /// Throws the header's DecodeError and replaces the handle it failed on.
  [[noreturn]] void fail_header();

  void* jpeg_ = nullptr;               // tjhandle: headers
  std::unique_ptr<JpegState> region_;  // libjpeg: the decode of a region
  std::vector<std::uint8_t> pixels_;   // the decoded region (possibly reduced) or PNG, HWC
  std::vector<std::uint8_t> cmyk_;     // a CMYK JPEG's region before conversion
  Resampler resampler_;
  int last_scale_eighths_ = 8;
};

}  // namespace flowfeed
