// The webdataset loader through the whole graph, on shards that PIL and Python's tarfile wrote
// (tests/nodes/make_image_shards.py): decoded pixels against references, every PNG/JPEG kind,
// labels, the crop geometry, determinism across threads and runs, and rank sharding.
#include <turbojpeg.h>

#include <cmath>
#include <set>
#include <sstream>
#include <tuple>

#include "flowfeed/nodes/detail/image_augment.hpp"
#include "flowfeed/nodes/detail/image_resample.hpp"
#include "tests/nodes/webdataset_fixture.hpp"

namespace flowfeed {
namespace {

using namespace webdataset_testing;

/// The exact 40x30 decode of the formats shard (center crop of the whole image, no resize).
const std::string kWhole = ", height: 30, width: 40, crop: center, resize: 30";

TEST(WebDataset, PngKindsDecodeExactlyAndJpegKindsMatchPil) {
  const Shards& s = formats();
  Outcome r = run(chain(s.file("formats.tar"), kWhole, ", batch_size: 16"));
  ASSERT_EQ(r.report.samples, s.manifest().size());
  for (std::size_t i = 0; i < s.manifest().size(); ++i) {
    const Json& m = s.manifest()[i];
    const std::string kind = m["kind"];
    SCOPED_TRACE(kind);
    EXPECT_EQ(r.y.at(static_cast<std::uint32_t>(i)), m["label"].get<int>());
    const std::vector<std::uint8_t> ref = read_file(s.file("ref/" + kind + ".rgb"));
    const std::vector<std::uint8_t>& got = r.x.at({0, static_cast<std::uint32_t>(i)});
    ASSERT_EQ(got.size(), ref.size());
    int worst = 0;
    for (std::size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, std::abs(got[k] - ref[k]));
    if (kind.rfind("png", 0) == 0) {
      EXPECT_EQ(worst, 0) << "a PNG decodes exactly";
    } else {
      // PIL decodes with libjpeg too, but may upsample chroma differently.
      EXPECT_LE(worst, 3) << "JPEG decode differs from PIL's by more than its rounding";
    }
  }
}

TEST(WebDataset, JpegAtFullSizeIsTurboJpegsOwnDecode) {
  const Shards& s = formats();
  Outcome r = run(chain(s.file("formats.tar"), kWhole, ", batch_size: 16"));
  const Json& m = s.manifest()[6];
  ASSERT_EQ(m["kind"], "jpeg_rgb");
  const auto tar = read_file(s.file("formats.tar"));
  const std::size_t at = m["members"]["jpg"]["data"];
  const std::size_t size = m["members"]["jpg"]["size"];
  std::vector<std::uint8_t> ref(40 * 30 * 3);
  tjhandle h = tjInitDecompress();
  ASSERT_EQ(tjDecompress2(h, tar.data() + at, size, ref.data(), 40, 0, 30, TJPF_RGB, 0), 0);
  tjDestroy(h);
  EXPECT_EQ(r.x.at({0, 6}), ref);
}

TEST(WebDataset, DctScalingStaysWithinItsErrorOfAFullDecode) {
  // 48-96 px photos to 24x24 center crops: DCT scaling decodes at 1/2 (or 1/4), then resizes.
  const Shards& s = photos();
  const std::string shards = s.file("photos-{000..002}.tar");
  const std::string params = ", height: 24, width: 24, crop: center, resize: 24";
  Outcome scaled = run(chain(shards, params + ", dct_scaling: true", ", batch_size: 40"));
  Outcome full = run(chain(shards, params + ", dct_scaling: false", ", batch_size: 40"));
  ASSERT_EQ(scaled.x.size(), 40u);
  double squares = 0;
  int worst = 0;
  std::size_t n = 0;
  for (const auto& [key, a] : scaled.x) {
    const auto& b = full.x.at(key);
    for (std::size_t k = 0; k < a.size(); ++k) {
      const int d = std::abs(a[k] - b[k]);
      squares += d * d;
      worst = std::max(worst, d);
      ++n;
    }
  }
  // A reduced IDCT averages blocks where the resize's triangle filter weighs pixels: they differ
  // by a few levels on these textured pictures, far from a misplaced or wrong image (< 15 dB).
  const double psnr = 10 * std::log10(255.0 * 255.0 / (squares / static_cast<double>(n)));
  EXPECT_GT(worst, 0) << "the scaled decode should take another path than the full one";
  EXPECT_GE(psnr, 30.0) << "worst " << worst;
  EXPECT_LE(worst, 64);
}

TEST(WebDataset, CenterCropGeometryMatchesPilsResizeOfTheSameBox) {
  const Shards& s = formats();
  for (const auto& [name, size, resize] : {std::tuple{"down", 20, 22}, std::tuple{"up", 40, 200}}) {
    SCOPED_TRACE(name);
    Outcome r = run(
        chain(s.file("resize.tar"),
              fmt::format(", height: {0}, width: {0}, crop: center, resize: {1}", size, resize)));
    const std::vector<std::uint8_t> ref = read_file(s.file(fmt::format("ref/{}.rgb", name)));
    const std::vector<std::uint8_t>& got = r.x.at({0, 0});
    ASSERT_EQ(got.size(), ref.size());
    int worst = 0;
    for (std::size_t k = 0; k < ref.size(); ++k) worst = std::max(worst, std::abs(got[k] - ref[k]));
    // The same weights, passes and rounding as Pillow's resample: the same bytes.
    EXPECT_EQ(worst, 0);
  }
}

TEST(WebDataset, RandomCropDecodesOnlyItsRegionWithTheBytesOfAWholeDecode) {
  // The loader decodes only the rows and columns its resize reads (libjpeg's skip and crop), and
  // resizes from there: the bytes must be those of TurboJPEG's whole decode of the photo resized
  // over the same box (Resampler, Pillow's bytes: CenterCropGeometryMatchesPilsResizeOfTheSameBox).
  const Shards& s = photos();
  Outcome r = run(chain(s.file("photos-*.tar"),
                        ", height: 24, width: 24, flip: 0.5, seed: 5, dct_scaling: false",
                        ", batch_size: 40"));
  ASSERT_EQ(r.x.size(), 40u);
  tjhandle h = tjInitDecompress();
  Resampler resampler;
  int flipped = 0;
  for (std::uint32_t i = 0; i < 40; ++i) {
    SCOPED_TRACE(i);
    const Json& m = s.manifest()[i];
    const auto tar = read_file(s.file(fmt::format("photos-{:03}.tar", i / 14)));
    const int w = m["width"];
    const int hgt = m["height"];
    std::vector<std::uint8_t> whole(static_cast<std::size_t>(w * hgt * 3));
    ASSERT_EQ(tjDecompress2(h, tar.data() + m["members"]["jpg"]["data"].get<std::size_t>(),
                            m["members"]["jpg"]["size"], whole.data(), w, 0, hgt, TJPF_RGB, 0),
              0);
    SampleRng rng(5, 0, i, kCropSalt);
    const CropBox b = random_resized_crop(w, hgt, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng);
    const bool flip = flip_choice(5, 0, i, 0.5);
    flipped += flip;
    std::vector<std::uint8_t> want(24 * 24 * 3);
    resampler.resize(whole.data(), w, hgt, static_cast<std::size_t>(w) * 3, 3,
                     {b.x, b.y, b.x + b.width, b.y + b.height}, {24, 24, flip, false}, want.data());
    EXPECT_EQ(r.x.at({0, i}), want);
  }
  tjDestroy(h);
  EXPECT_GT(flipped, 5);
  EXPECT_LT(flipped, 35);
}

TEST(WebDataset, EveryJpegKindDecodesARegionAsItsWholeImage) {
  // An 8x8 crop from the middle of each 40x30 image: libjpeg skips the rows above it and crops
  // the columns (baseline 4:2:0, 4:2:2 and 4:4:4, gray, CMYK, progressive); the bytes must be
  // those of the whole image's decode resized over the same box.
  const Shards& s = formats();
  Outcome whole = run(chain(s.file("formats.tar"), kWhole, ", batch_size: 16"));
  Outcome part = run(chain(s.file("formats.tar"), ", height: 8, width: 8, crop: center, resize: 30",
                           ", batch_size: 16"));
  const CropBox b = center_crop(40, 30, 30, 8, 8);
  Resampler resampler;
  int kinds = 0;
  for (std::size_t i = 0; i < s.manifest().size(); ++i) {
    const std::string kind = s.manifest()[i]["kind"];
    if (kind.rfind("jpeg", 0) != 0) continue;
    SCOPED_TRACE(kind);
    ++kinds;
    std::vector<std::uint8_t> want(8 * 8 * 3);
    resampler.resize(whole.x.at({0, static_cast<std::uint32_t>(i)}).data(), 40, 30, 40 * 3, 3,
                     {b.x, b.y, b.x + b.width, b.y + b.height}, {8, 8, false, false}, want.data());
    EXPECT_EQ(part.x.at({0, static_cast<std::uint32_t>(i)}), want);
  }
  EXPECT_EQ(kinds, 6);
}

TEST(WebDataset, GrayOutputAndChwLayout) {
  const Shards& s = formats();
  Outcome hwc = run(chain(s.file("formats.tar"), kWhole, ", batch_size: 16"));
  Outcome chw = run(chain(s.file("formats.tar"), kWhole + ", layout: chw", ", batch_size: 16"));
  Outcome gray = run(chain(s.file("formats.tar"), kWhole + ", channels: 1", ", batch_size: 16"));
  EXPECT_EQ(chw.seen->tensors[0].shape, (std::vector<std::int64_t>{3, 30, 40}));
  EXPECT_EQ(gray.seen->tensors[0].shape, (std::vector<std::int64_t>{30, 40, 1}));
  for (std::uint32_t i = 0; i < 10; ++i) {
    const auto& a = hwc.x.at({0, i});
    const auto& b = chw.x.at({0, i});
    for (std::size_t p = 0; p < 40 * 30; ++p) {
      for (std::size_t c = 0; c < 3; ++c) ASSERT_EQ(a[p * 3 + c], b[c * 40 * 30 + p]) << i;
    }
  }
  // A gray PNG (and the high byte of a 16-bit one) arrives as its own values.
  for (std::uint32_t i : {3u, 5u}) {
    const auto& a = hwc.x.at({0, i});
    const auto& g = gray.x.at({0, i});
    for (std::size_t p = 0; p < 40 * 30; ++p) ASSERT_EQ(g[p], a[p * 3]) << i;
  }
}

TEST(WebDataset, GnuLongNamesIndexLikePax) {
  const Shards& s = formats();
  Outcome pax = run(chain(s.file("formats.tar"), kWhole, ", batch_size: 16"));
  Outcome gnu = run(chain(s.file("gnu.tar"), kWhole, ", batch_size: 16"));
  ASSERT_EQ(gnu.report.samples, 3u);
  for (std::uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(gnu.x.at({0, i}), pax.x.at({0, i}));
    EXPECT_EQ(gnu.y.at(i), pax.y.at(i));
  }
}

const std::string kAugment = ", height: 32, width: 32, flip: 0.5, seed: 5";

TEST(WebDataset, AugmentationIsTheSameAtAnyThreadCountAndInEveryRun) {
  const Shards& s = photos();
  const std::string shards = s.file("photos-*.tar");
  const std::string sampler = ", seed: 3";
  Outcome serial = run(chain(shards, kAugment + ", parallel: false",
                             ", epochs: 2, batch_size: 8, threads: 1", "shuffle: true" + sampler),
                       2);
  Outcome wide =
      run(chain(shards, kAugment, ", epochs: 2, batch_size: 8, threads: 4, prefetch_depth: 6",
                "shuffle: true" + sampler),
          2);
  Outcome again =
      run(chain(shards, kAugment, ", epochs: 2, batch_size: 8, threads: 4, prefetch_depth: 6",
                "shuffle: true" + sampler),
          2);
  ASSERT_EQ(serial.x.size(), 80u);
  EXPECT_EQ(serial.x, wide.x);
  EXPECT_EQ(wide.x, again.x);
  for (std::uint32_t i = 0; i < 40; ++i) EXPECT_EQ(serial.y.at(i), static_cast<int>(i % 10));
  // A new epoch draws new crops.
  int same = 0;
  for (std::uint32_t i = 0; i < 40; ++i) same += serial.x.at({0, i}) == serial.x.at({1, i});
  EXPECT_LT(same, 4);
}

TEST(WebDataset, RandomFlipTransformMakesTheLoadersChoices) {
  const Shards& s = photos();
  const std::string shards = s.file("photos-*.tar");
  for (const std::string layout : {"hwc", "chw"}) {
    SCOPED_TRACE(layout);
    const std::string params = ", height: 32, width: 32, seed: 9, layout: " + layout;
    Outcome plain = run(chain(shards, params));
    Outcome fused = run(chain(shards, params + ", flip: 0.5"));
    Outcome apart = run(chain(shards, params, "", "shuffle: false",
                              "  - { name: flip, type: random_flip, concurrency: 2, params: { p: "
                              "0.5, seed: 9, layout: " +
                                  layout + " } }\n"));
    EXPECT_EQ(fused.x, apart.x);
    int flipped = 0;
    for (const auto& [key, bytes] : plain.x) flipped += bytes != fused.x.at(key);
    EXPECT_GT(flipped, 10);
    EXPECT_LT(flipped, 30);
  }
}

TEST(WebDataset, ShippedConfigRunsOnGeneratedShards) {
  Registry r;
  register_builtin_nodes(r);
  const std::string shards = photos().file("photos-{000..002}.tar");
  Pipeline p(
      load_config_file(
          std::string(FLOWFEED_SOURCE_DIR) + "/configs/images_webdataset.yaml", r,
          {"nodes.load.params.shards=" + shards, "pipeline.device=host", "pipeline.batch_size=16"}),
      r);
  const RunReport report = p.run();
  EXPECT_EQ(report.samples, 40u);
  EXPECT_EQ(report.batches, 3u);
  EXPECT_EQ(report.allocations_after_build, 0u);
}

TEST(WebDataset, RankShardsAreDisjointAndCoverTheSet) {
  const Shards& s = photos();
  const std::string shards = s.file("photos-{000..002}.tar");
  Outcome whole = run(chain(shards, kAugment, ", batch_size: 8", "shuffle: true, seed: 4"));
  std::set<std::uint32_t> seen;
  std::size_t total = 0;
  for (int rank = 0; rank < 3; ++rank) {
    Outcome part = run(chain(shards, kAugment, ", batch_size: 8",
                             fmt::format("shuffle: true, seed: 4, rank: {}, world: 3", rank)));
    for (const auto& [key, bytes] : part.x) {
      seen.insert(key.second);
      ++total;
      EXPECT_EQ(bytes, whole.x.at(key)) << "a sample decodes the same on every rank";
    }
  }
  EXPECT_EQ(total, 40u);
  EXPECT_EQ(seen.size(), 40u);
}

}  // namespace
}  // namespace flowfeed
