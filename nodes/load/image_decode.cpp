#include "flowfeed/nodes/detail/image_decode.hpp"

#include <fmt/format.h>
#include <png.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// libjpeg's own API (libjpeg-turbo's jpeglib.h needs FILE declared first): TurboJPEG 2.1 cannot
// decode part of an image; jpeg_crop_scanline and jpeg_skip_scanlines can.
#include <jerror.h>
#include <jpeglib.h>

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

// ---- libjpeg, through its setjmp error handling as libpng above.

}  // namespace

/// libjpeg's error manager with the jump target of its errors (outside the anonymous namespace:
/// JpegState, declared in image_decode.hpp, holds one).
struct JpegErrors {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool data_lost;  // a warning said part of the image data is missing (then `message` says which)
  char message[JMSG_LENGTH_MAX];
};

namespace {

/// Warnings after which libjpeg fills the rest of the scan with grey (zero coefficients): the data
/// ended early, a marker cut a scan short, or a restart interval was lost.
bool loses_data(int code) {
  return code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_MUST_RESYNC;
}

void jpeg_fail(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}

/// Warnings (level -1) are noted, not printed; trace messages are dropped. The first warning that
/// loses image data is kept (others, e.g. extraneous bytes before a marker, leave a whole image,
/// as PIL accepts them too).
void jpeg_note(j_common_ptr c, int level) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  if (level < 0 && !e->data_lost && loses_data(c->err->msg_code)) {
    e->data_lost = true;
    (*c->err->format_message)(c, e->message);
  }
}

}  // namespace

struct JpegState {
  jpeg_decompress_struct info;
  JpegErrors errors;
};

namespace {

/// What read_jpeg_region decodes: the JPEG at 1/`denom` size as `space`, rows [y0, y1) and at
/// least columns [x0, x1) of it, into `out` (rows packed; `capacity` bytes). libjpeg widens the
/// columns to its iMCU boundary on the left: `x` and `width` are the columns it produced.
struct JpegRegion {
  int denom;
  J_COLOR_SPACE space;
  int x0, x1, y0, y1;
  std::uint8_t* out;
  std::size_t capacity;
  int x;
  int width;
};

/// Decodes a region (JpegRegion). The rows above it are entropy-decoded only (no IDCT, upsampling
/// or colour conversion), the rows below it not at all, and the columns outside it skip all but
/// entropy decoding. Returns false with errors.message set.
bool read_jpeg_region(JpegState& j, const std::uint8_t* data, std::size_t bytes, JpegRegion& r) {
  jpeg_decompress_struct& c = j.info;
  j.errors.data_lost = false;
  if (setjmp(j.errors.jump)) {
    jpeg_abort_decompress(&c);
    return false;
  }
  jpeg_mem_src(&c, data, static_cast<unsigned long>(bytes));
  jpeg_read_header(&c, TRUE);
  c.scale_num = 1;
  c.scale_denom = static_cast<unsigned>(r.denom);
  c.out_color_space = r.space;
  jpeg_start_decompress(&c);
  auto x = static_cast<JDIMENSION>(r.x0);
  auto width = static_cast<JDIMENSION>(r.x1 - r.x0);
  if (width < c.output_width) jpeg_crop_scanline(&c, &x, &width);
  const std::size_t row =
      static_cast<std::size_t>(width) * static_cast<std::size_t>(c.output_components);
  if (row * static_cast<std::size_t>(r.y1 - r.y0) > r.capacity ||
      static_cast<JDIMENSION>(r.y1) > c.output_height) {
    std::strcpy(j.errors.message, "the region to decode does not fit its buffer");
    jpeg_abort_decompress(&c);
    return false;
  }
  if (r.y0 > 0) jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(r.y0));
  JSAMPROW rows[16];
  while (c.output_scanline < static_cast<JDIMENSION>(r.y1)) {
    const JDIMENSION n =
        std::min<JDIMENSION>(16, static_cast<JDIMENSION>(r.y1) - c.output_scanline);
    for (JDIMENSION i = 0; i < n; ++i) {
      rows[i] =
          r.out +
          static_cast<std::size_t>(c.output_scanline + i - static_cast<JDIMENSION>(r.y0)) * row;
    }
    jpeg_read_scanlines(&c, rows, n);
  }
  // The rows below are never decoded: abort, not finish, which would read them.
  jpeg_abort_decompress(&c);
  r.x = static_cast<int>(x);
  r.width = static_cast<int>(width);
  return true;
}

}  // namespace

ImageDecoder::ImageDecoder() : jpeg_(tjInitDecompress()), region_(std::make_unique<JpegState>()) {
  if (!jpeg_)
    throw std::runtime_error("tjInitDecompress failed: " + std::string(tjGetErrorStr2(nullptr)));
  JpegState& j = *region_;
  j.info.err = jpeg_std_error(&j.errors.pub);
  j.errors.pub.error_exit = jpeg_fail;
  j.errors.pub.emit_message = jpeg_note;
  jpeg_create_decompress(&j.info);
}

ImageDecoder::~ImageDecoder() {
  jpeg_destroy_decompress(&region_->info);
  tjDestroy(jpeg_);
}

void ImageDecoder::fail_header() {
  const std::string message = "not a decodable JPEG (" + jpeg_error(jpeg_) + ")";
  // TurboJPEG 2.1 leaves a handle whose header read failed part-way through the header: the next
  // image's header read on it continues from there and fails with this image's error. A new handle
  // starts clean (only failed images pay for it).
  if (tjhandle fresh = tjInitDecompress()) {
    tjDestroy(jpeg_);
    jpeg_ = fresh;
  }
  throw DecodeError(message);
}

ImageSize ImageDecoder::size(const std::uint8_t* data, std::size_t bytes, ImageFormat format) {
  if (bytes == 0) throw DecodeError("empty image (0 bytes)");
  ImageSize s;
  if (format == ImageFormat::jpeg) {
    int subsamp = 0;
    int colorspace = 0;
    if (tjDecompressHeader3(jpeg_, data, bytes, &s.width, &s.height, &subsamp, &colorspace) != 0) {
      fail_header();
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

void ImageDecoder::decode_jpeg(const std::uint8_t* data, std::size_t bytes, ImageSize size,
                               const CropBox& box, const DecodeTarget& target, bool flip,
                               std::uint8_t* out) {
  int subsamp = 0;
  int colorspace = 0;
  int w = 0;
  int h = 0;
  if (tjDecompressHeader3(jpeg_, data, bytes, &w, &h, &subsamp, &colorspace) != 0) {
    fail_header();
  }
  // The smallest IDCT scale at which the crop still covers the target in both directions: then
  // the resize only shrinks, and a 1000 px photo cropped to 224 decodes at 1/2 (4x fewer pixels).
  // Only 1/2, 1/4 and 1/8 have fast (SIMD) reduced IDCTs in libjpeg-turbo: 7/8, 3/4 and 5/8
  // decode slower than full size (measured: docs/IMAGES.md).
  int denom = 1;
  if (target.dct_scaling) {
    for (int d : {2, 4, 8}) {
      if (box.width / d >= target.width && box.height / d >= target.height) denom = d;
    }
  }
  last_scale_eighths_ = 8 / denom;
  const ImageSize scaled{(size.width + denom - 1) / denom, (size.height + denom - 1) / denom};
  // Pixel i of an image the IDCT scaled by 1/d covers source pixels [i d, (i + 1) d) (its last
  // one may be partial: the scaled size is rounded up), so the box scales by 1/d, not by the
  // ratio of the sizes.
  const double f = 1.0 / denom;
  const PixelRect need =
      resampler_.plan(scaled.width, scaled.height,
                      {box.x * f, box.y * f, (box.x + box.width) * f, (box.y + box.height) * f},
                      target.width, target.height);
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const int components = cmyk ? 4 : target.channels;
  // Two more columns each side than the filter reads: libjpeg's chroma upsampling treats the
  // region's edge as the image's, so its outermost column may differ from a whole decode.
  JpegRegion r{};
  r.denom = denom;
  r.space = cmyk ? JCS_CMYK : (target.channels == 3 ? JCS_RGB : JCS_GRAYSCALE);
  r.x0 = std::max(need.x - 2, 0);
  r.x1 = std::min(need.x + need.width + 2, scaled.width);
  r.y0 = need.y;
  r.y1 = need.y + need.height;
  std::vector<std::uint8_t>& dst = cmyk ? cmyk_ : pixels_;
  // libjpeg may widen the region on the left by up to an iMCU: budget the whole scaled width.
  const std::size_t capacity = static_cast<std::size_t>(scaled.width) *
                               static_cast<std::size_t>(r.y1 - r.y0) *
                               static_cast<std::size_t>(components);
  if (dst.size() < capacity) dst.resize(capacity);
  r.out = dst.data();
  r.capacity = dst.size();
  if (!read_jpeg_region(*region_, data, bytes, r)) {
    throw DecodeError(fmt::format("corrupt JPEG data ({})", region_->errors.message));
  }
  // The data ended early, or a scan was cut short: part of the region is grey, not the image.
  if (region_->errors.data_lost) {
    throw DecodeError(fmt::format("corrupt JPEG data ({})", region_->errors.message));
  }
  const auto c = static_cast<std::size_t>(target.channels);
  const std::size_t pixel_count =
      static_cast<std::size_t>(r.width) * static_cast<std::size_t>(r.y1 - r.y0);
  if (cmyk) {
    if (pixels_.size() < pixel_count * c) pixels_.resize(pixel_count * c);
    cmyk_to(cmyk_.data(), pixel_count, target.channels, pixels_.data());
  }
  const std::size_t stride = static_cast<std::size_t>(r.width) * c;
  resampler_.run(pixels_.data() + static_cast<std::size_t>(need.x - r.x) * c, stride,
                 target.channels, {target.width, target.height, flip, target.chw}, out);
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
  if (format == ImageFormat::jpeg) {
    decode_jpeg(data, bytes, size, box, target, flip, out);
    return;
  }
  const ImageSize decoded = decode_png(data, bytes, target.channels);
  resampler_.resize(
      pixels_.data(), decoded.width, decoded.height,
      static_cast<std::size_t>(decoded.width) * static_cast<std::size_t>(target.channels),
      target.channels, {box.x, box.y, box.x + box.width, box.y + box.height},
      {target.width, target.height, flip, target.chw}, out);
}

}  // namespace flowfeed
