#include "flowfeed/nodes/detail/image_samples.hpp"

#include <fmt/format.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "flowfeed/config.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/detail/image_augment.hpp"
#include "flowfeed/schema.hpp"

namespace flowfeed {

std::string param_where(const NodeSpec& spec, const std::string& key) {
  SourceLoc loc = spec.params.loc(key);
  return (loc.file.empty() ? spec.loc : loc).str();
}

void add_image_params(Schema& s) {
  s.add_int("height", "output rows", 224).range(1, 16384);
  s.add_int("width", "output columns", 224).range(1, 16384);
  s.add_int("channels", "3: RGB, 1: gray", 3).range(1, 3);
  s.add_string("layout", "x as [H, W, C] (hwc) or [C, H, W] (chw)", std::string("hwc"))
      .one_of({"hwc", "chw"});
  s.add_string("crop", "random_resized (training) or center (Resize + CenterCrop)",
               std::string("random_resized"))
      .one_of({"random_resized", "center"});
  s.add_number("scale_min", "random_resized: smallest area fraction of the crop", 0.08)
      .range(1e-6, 1);
  s.add_number("scale_max", "random_resized: largest area fraction of the crop", 1.0)
      .range(1e-6, 1);
  s.add_number("ratio_min", "random_resized: smallest aspect ratio (width / height)", 3.0 / 4.0)
      .range(1e-3, 1e3);
  s.add_number("ratio_max", "random_resized: largest aspect ratio (width / height)", 4.0 / 3.0)
      .range(1e-3, 1e3);
  s.add_int("resize", "center: the shorter side before the crop (0: max(height, width) / 0.875)", 0)
      .range(0, 65536);
  s.add_number("flip", "probability of a left-right flip", 0.0).range(0, 1);
  s.add_int("seed", "seeds crops and flips together with (epoch, sample index)", 0).at_least(0);
  s.add_bool("dct_scaling", "decode a JPEG at 1/2, 1/4 or 1/8 size when its crop allows", true);
  s.add_int("num_classes", "when > 0, labels must be in [0, num_classes)", 0)
      .range(0, 2147483647.0);
  s.add_bool("parallel", "decode a batch's samples in parallel on the pipeline's threads", true);
  s.add_int("max_pixels",
            "an image whose header declares more pixels (width x height) is a bad sample, refused "
            "before it is decoded (Pillow's MAX_IMAGE_PIXELS)",
            89478485)
      .range(1, 4294967296.0);
}

void image_options_from(const NodeSpec& spec, ImageOptions& o, std::vector<std::string>& problems) {
  const Params& p = spec.params;
  o.height = static_cast<int>(p.get_int("height"));
  o.width = static_cast<int>(p.get_int("width"));
  o.channels = static_cast<int>(p.get_int("channels"));
  o.chw = p.get_string("layout") == "chw";
  o.crop = p.get_string("crop") == "center" ? ImageCrop::center : ImageCrop::random_resized;
  o.scale_min = p.get_number("scale_min");
  o.scale_max = p.get_number("scale_max");
  o.ratio_min = p.get_number("ratio_min");
  o.ratio_max = p.get_number("ratio_max");
  o.resize = static_cast<int>(p.get_int("resize"));
  if (o.resize == 0) o.resize = static_cast<int>(std::lround(std::max(o.height, o.width) / 0.875));
  o.flip = p.get_number("flip");
  o.seed = static_cast<std::uint64_t>(p.get_int("seed"));
  o.dct_scaling = p.get_bool("dct_scaling");
  o.num_classes = static_cast<int>(p.get_int("num_classes"));
  o.parallel = p.get_bool("parallel");
  o.max_pixels = static_cast<std::uint64_t>(p.get_int("max_pixels"));
  if (o.channels != 1 && o.channels != 3) {
    problems.push_back(
        fmt::format("{}: nodes.{}.params.channels: {} is not supported (1: gray, "
                    "3: RGB)",
                    param_where(spec, "channels"), spec.name, o.channels));
  }
  if (o.scale_min > o.scale_max) {
    problems.push_back(
        fmt::format("{}: nodes.{}.params.scale_min: {} is above scale_max {} (the "
                    "area fraction range must not be empty)",
                    param_where(spec, "scale_min"), spec.name, o.scale_min, o.scale_max));
  }
  if (o.ratio_min > o.ratio_max) {
    problems.push_back(
        fmt::format("{}: nodes.{}.params.ratio_min: {} is above ratio_max {} (the "
                    "aspect ratio range must not be empty)",
                    param_where(spec, "ratio_min"), spec.name, o.ratio_min, o.ratio_max));
  }
  if (o.crop == ImageCrop::center && o.resize < std::min(o.height, o.width)) {
    problems.push_back(
        fmt::format("{}: nodes.{}.params.resize: {} is smaller than the crop {}x{} "
                    "(the center crop must fit in the resized image)",
                    param_where(spec, "resize"), spec.name, o.resize, o.height, o.width));
  }
}

DecodeTarget decode_target(const ImageOptions& o) {
  DecodeTarget t;
  t.width = o.width;
  t.height = o.height;
  t.channels = o.channels;
  t.chw = o.chw;
  t.dct_scaling = o.dct_scaling;
  return t;
}

std::size_t image_bytes(const ImageOptions& o) {
  return static_cast<std::size_t>(o.width) * static_cast<std::size_t>(o.height) *
         static_cast<std::size_t>(o.channels);
}

std::vector<TensorSpec> image_tensors(const ImageOptions& o) {
  const std::int64_t h = o.height;
  const std::int64_t w = o.width;
  const std::int64_t c = o.channels;
  std::vector<std::int64_t> shape =
      o.chw ? std::vector<std::int64_t>{c, h, w} : std::vector<std::int64_t>{h, w, c};
  return {TensorSpec{"x", DType::uint8, std::move(shape)}, TensorSpec{"y", DType::int32, {}}};
}

void decode_image_sample(ImageDecoder& decoder, const std::uint8_t* data, std::size_t bytes,
                         ImageFormat format, const ImageOptions& o, const DecodeTarget& target,
                         std::uint32_t epoch, std::uint32_t sample, std::string_view where,
                         std::string_view node, std::uint8_t* x) {
  try {
    const ImageSize size = decoder.size(data, bytes, format);
    // From the header, before a byte is decoded: the decoder's buffers grow with the image.
    const std::uint64_t pixels =
        static_cast<std::uint64_t>(size.width) * static_cast<std::uint64_t>(size.height);
    if (pixels > o.max_pixels) {
      throw DataError(fmt::format(
          "{}: the image declares {}x{} = {} pixels, more than max_pixels = {} (a decompression "
          "bomb, or a larger image than expected: raise nodes.{}.params.max_pixels to accept it)",
          where, size.width, size.height, pixels, o.max_pixels, node));
    }
    CropBox box;
    if (o.crop == ImageCrop::random_resized) {
      SampleRng rng(o.seed, epoch, sample, kCropSalt);
      box = random_resized_crop(size.width, size.height, o.scale_min, o.scale_max, o.ratio_min,
                                o.ratio_max, rng);
    } else {
      box = center_crop(size.width, size.height, o.resize, o.width, o.height);
    }
    // The crop, resize, flip and layout happen in one pass that writes the batch's row.
    const bool flip = flip_choice(o.seed, epoch, sample, o.flip);
    decoder.decode(data, bytes, format, size, box, target, flip, x);
  } catch (const DecodeError& e) {
    throw DataError(fmt::format("{}: {}", where, e.what()));
  }
}

namespace {

struct Failure {
  std::size_t row;
  std::string message;
  bool data_error;
};

}  // namespace

void load_rows(Batch& batch, const RowPolicy& policy, DropLog& drops,
               const std::function<void(std::size_t row)>& load) {
  const std::size_t rows = batch.rows();
  std::mutex failures_mutex;
  std::vector<Failure> failures;  // allocates only when a sample fails
  auto one = [&](std::size_t row) {
    try {
      load(row);
    } catch (const DataError& e) {
      std::lock_guard<std::mutex> lock(failures_mutex);
      failures.push_back({row, e.what(), true});
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(failures_mutex);
      failures.push_back({row, e.what(), false});
    }
  };
  if (policy.parallel && rows > 1) {
    tbb::parallel_for(std::size_t{0}, rows, one);
  } else {
    for (std::size_t row = 0; row < rows; ++row) one(row);
  }
  if (failures.empty()) return;
  // The first failing row decides, whatever the threads' timing.
  std::sort(failures.begin(), failures.end(),
            [](const Failure& a, const Failure& b) { return a.row < b.row; });
  for (const Failure& f : failures) {
    if (!f.data_error) throw std::runtime_error(f.message);
  }
  if (!policy.skip) throw DataError(failures.front().message);
  std::vector<RowFailure> bad;
  bad.reserve(failures.size());
  for (Failure& f : failures) bad.push_back({f.row, std::move(f.message)});
  drops.drop_rows(batch, Tier::host, bad, policy.max_skipped);
}

}  // namespace flowfeed
