#include "image_decode.hpp"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstring>

namespace flowfeed {

namespace {

std::string jpeg_error(tjhandle h) {
  return tjGetErrorStr2(h);
}

/// PIL's MULDIV255, so CMYK converts exactly as PIL's CMYK → RGB does.
inline int muldiv255(int a, int b) {
  const int t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

/// Adobe-style (inverted) CMYK as TurboJPEG returns it → RGB, or → gray with BT.601 weights.
void cmyk_to(const std::uint8_t* cmyk, std::size_t pixels, int channels, std::uint8_t* out) {
  for (std::size_t i = 0; i < pixels; ++i) {
    const std::uint8_t* p = cmyk + 4 * i;
    const int nk = p[3];
    int rgb[3];
    for (int c = 0; c < 3; ++c) rgb[c] = nk - muldiv255(255 - p[c], nk);
    if (channels == 3) {
      for (int c = 0; c < 3; ++c)
        out[3 * i + static_cast<std::size_t>(c)] = static_cast<std::uint8_t>(rgb[c]);
    } else {
      out[i] = static_cast<std::uint8_t>(
          (rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
    }
  }
}

// ---- libpng, through its setjmp error handling: no C++ object lives in the frame that
// setjmp returns to twice, and libpng's errors come back as text.

struct PngSource {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t pos;
  char message[192];
};

void png_read_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (src->size - src->pos < n) png_error(png, "the image data ends early (cut short)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

void png_fail(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  const auto end = fmt::format_to_n(src->message, sizeof src->message - 1, "{}", message);
  *end.out = '\0';
  std::longjmp(png_jmpbuf(png), 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

/// Reads the PNG into `out` (grown as needed) converted to `channels` (0: header only). Returns
/// false with src.message set on failure.
bool png_read(PngSource& src, int channels, std::vector<std::uint8_t>& out, ImageSize& size) {
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &src, png_fail, png_ignore_warning);
  if (!png) {
    std::strcpy(src.message, "libpng could not start");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (!info || setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, info ? &info : nullptr, nullptr);
    return false;
  }
  png_set_read_fn(png, &src, png_read_memory);
  png_read_info(png, info);
  size.width = static_cast<int>(png_get_image_width(png, info));
  size.height = static_cast<int>(png_get_image_height(png, info));
  if (channels > 0) {
    const int color = png_get_color_type(png, info);
    const int depth = png_get_bit_depth(png, info);
    if (color == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);  // the high byte, as PIL's 16-bit RGB reader
    png_set_strip_alpha(png);                // alpha dropped, not composited (PIL's convert)
    const bool gray = (color & PNG_COLOR_MASK_COLOR) == 0;
    if (gray && channels == 3) png_set_gray_to_rgb(png);
    if (!gray && channels == 1) png_set_rgb_to_gray_fixed(png, 1, 29900, 58700);  // BT.601
    const int passes = png_set_interlace_handling(png);
    png_read_update_info(png, info);
    const std::size_t row = png_get_rowbytes(png, info);
    if (row != static_cast<std::size_t>(size.width) * static_cast<std::size_t>(channels)) {
      png_error(png, "unexpected row size after conversion");
    }
    const std::size_t need = row * static_cast<std::size_t>(size.height);
    if (out.size() < need) out.resize(need);
    for (int pass = 0; pass < passes; ++pass) {
      for (int y = 0; y < size.height; ++y) {
        png_read_row(png, out.data() + static_cast<std::size_t>(y) * row, nullptr);
      }
    }
    png_read_end(png, nullptr);
  }
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

}  // namespace

ImageDecoder::ImageDecoder() : jpeg_(tjInitDecompress()) {
  if (!jpeg_)
    throw std::runtime_error("tjInitDecompress failed: " + std::string(tjGetErrorStr2(nullptr)));
}

ImageDecoder::~ImageDecoder() {
  tjDestroy(jpeg_);
}

ImageSize ImageDecoder::size(const std::uint8_t* data, std::size_t bytes, ImageFormat format) {
  if (bytes == 0) throw DecodeError("empty image (0 bytes)");
  ImageSize s;
  if (format == ImageFormat::jpeg) {
    int subsamp = 0;
    int colorspace = 0;
    if (tjDecompressHeader3(jpeg_, data, bytes, &s.width, &s.height, &subsamp, &colorspace) != 0) {
      throw DecodeError("not a decodable JPEG (" + jpeg_error(jpeg_) + ")");
    }
  } else {
    PngSource src{data, bytes, 0, {}};
    if (!png_read(src, 0, pixels_, s)) {
      throw DecodeError(fmt::format("not a decodable PNG ({})", src.message));
    }
  }
  if (s.width <= 0 || s.height <= 0) throw DecodeError("the image has no pixels");
  return s;
}

ImageSize ImageDecoder::decode_jpeg(const std::uint8_t* data, std::size_t bytes, ImageSize size,
                                    const CropBox& box, const DecodeTarget& target) {
  int subsamp = 0;
  int colorspace = 0;
  int w = 0;
  int h = 0;
  if (tjDecompressHeader3(jpeg_, data, bytes, &w, &h, &subsamp, &colorspace) != 0) {
    throw DecodeError("not a decodable JPEG (" + jpeg_error(jpeg_) + ")");
  }
  // The smallest IDCT scale at which the crop still covers the target in both directions: then
  // the resize only shrinks, and a 500 px photo cropped to 224 decodes at 1/2 (4x fewer pixels).
  tjscalingfactor scale{1, 1};
  if (target.dct_scaling) {
    int count = 0;
    const tjscalingfactor* factors = tjGetScalingFactors(&count);
    for (int i = 0; i < count; ++i) {
      const tjscalingfactor f = factors[i];
      // Only 1/2, 1/4 and 1/8 have fast (SIMD) reduced IDCTs in libjpeg-turbo: 7/8, 3/4 and 5/8
      // decode slower than full size (measured: docs/IMAGES.md).
      if (f.num != 1 || (f.denom != 2 && f.denom != 4 && f.denom != 8)) continue;
      const double r = static_cast<double>(f.num) / f.denom;
      if (box.width * r >= target.width && box.height * r >= target.height &&
          f.num * scale.denom < scale.num * f.denom) {
        scale = f;
      }
    }
  }
  last_scale_eighths_ = scale.num * 8 / scale.denom;
  const ImageSize scaled{TJSCALED(size.width, scale), TJSCALED(size.height, scale)};
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const int format = cmyk ? TJPF_CMYK : (target.channels == 3 ? TJPF_RGB : TJPF_GRAY);
  const std::size_t pixel_count =
      static_cast<std::size_t>(scaled.width) * static_cast<std::size_t>(scaled.height);
  std::vector<std::uint8_t>& dst = cmyk ? cmyk_ : pixels_;
  const std::size_t need = pixel_count * static_cast<std::size_t>(tjPixelSize[format]);
  if (dst.size() < need) dst.resize(need);
  if (tjDecompress2(jpeg_, data, bytes, dst.data(), scaled.width, 0, scaled.height, format, 0) !=
      0) {
    const std::string why = jpeg_error(jpeg_);
    // A warning still leaves a whole image (e.g. extraneous bytes before a marker, which PIL
    // accepts too), except when the data ended early: then part of the image is missing.
    if (tjGetErrorCode(jpeg_) != TJERR_WARNING || why.find("Premature end") != std::string::npos) {
      throw DecodeError("corrupt JPEG data (" + why + ")");
    }
  }
  if (cmyk) {
    const std::size_t out = pixel_count * static_cast<std::size_t>(target.channels);
    if (pixels_.size() < out) pixels_.resize(out);
    cmyk_to(cmyk_.data(), pixel_count, target.channels, pixels_.data());
  }
  return scaled;
}

ImageSize ImageDecoder::decode_png(const std::uint8_t* data, std::size_t bytes, int channels) {
  PngSource src{data, bytes, 0, {}};
  ImageSize s;
  if (!png_read(src, channels, pixels_, s)) {
    throw DecodeError(fmt::format("not a decodable PNG ({})", src.message));
  }
  last_scale_eighths_ = 8;
  return s;
}

void ImageDecoder::decode(const std::uint8_t* data, std::size_t bytes, ImageFormat format,
                          ImageSize size, const CropBox& box, const DecodeTarget& target, bool flip,
                          std::uint8_t* out) {
  if (bytes == 0) throw DecodeError("empty image (0 bytes)");
  const ImageSize decoded = format == ImageFormat::jpeg
                                ? decode_jpeg(data, bytes, size, box, target)
                                : decode_png(data, bytes, target.channels);
  resize(decoded, box, target, flip, out);
}

void ImageDecoder::resize(ImageSize decoded, const CropBox& box, const DecodeTarget& target,
                          bool flip, std::uint8_t* out) {
  // Pixel i of an image the IDCT scaled by f covers source pixels [i / f, (i + 1) / f) (its last
  // one may be partial: the scaled size is rounded up), so the box scales by f, not by the ratio
  // of the sizes.
  const double f = static_cast<double>(last_scale_eighths_) / 8.0;
  const ResampleBox region{box.x * f, box.y * f, (box.x + box.width) * f, (box.y + box.height) * f};
  const std::size_t stride =
      static_cast<std::size_t>(decoded.width) * static_cast<std::size_t>(target.channels);
  resampler_.resize(pixels_.data(), decoded.width, decoded.height, stride, target.channels, region,
                    {target.width, target.height, flip, target.chw}, out);
}

}  // namespace flowfeed
