// The webdataset loader through the whole graph, on shards that PIL and Python's tarfile wrote
// (tests/nodes/make_image_shards.py): decoded pixels against references, every PNG/JPEG kind,
// labels, determinism across threads and runs, rank sharding, every corruption class with its
// message, and on_error: skip dropping exactly the bad samples.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;
using Json = nlohmann::json;

/// A directory of shards written by the helper script for one case, once per test program.
class Shards {
 public:
  explicit Shards(const std::string& args) {
    const std::string cmd = fmt::format("{} {}/tests/nodes/make_image_shards.py {} {}",
                                        FLOWFEED_PYTHON, FLOWFEED_SOURCE_DIR, dir_.file(""), args);
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
    std::ifstream in(dir_.file("manifest.json"));
    manifest_ = Json::parse(in);
  }
  std::string file(const std::string& name) const { return dir_.file(name); }
  const Json& manifest() const { return manifest_; }

 private:
  TempDir dir_;
  Json manifest_;
};

const Shards& formats() {
  static const Shards s("formats");
  return s;
}
const Shards& photos() {
  static const Shards s("photos 40 3");
  return s;
}
const Shards& corrupt() {
  static const Shards s("corrupt");
  return s;
}

std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string chain(const std::string& shards, const std::string& params,
                  const std::string& pipeline = "", const std::string& sampler = "shuffle: false",
                  const std::string& transform = "") {
  return fmt::format(
      "pipeline: {{ device: host{} }}\n"
      "sampler: {{ {} }}\n"
      "nodes:\n"
      "  - name: load\n"
      "    type: webdataset\n"
      "    params: {{ shards: '{}'{} }}\n"
      "{}"
      "  - {{ name: train, type: capture }}\n",
      pipeline, sampler, shards, params, transform);
}

struct Outcome {
  std::shared_ptr<Captured> seen = std::make_shared<Captured>();
  RunReport report;
  /// (epoch, sample) → the sample's x bytes, and sample → label.
  std::map<std::pair<int, std::uint32_t>, std::vector<std::uint8_t>> x;
  std::map<std::uint32_t, std::int32_t> y;
};

Outcome run(const std::string& yaml, int epochs_seen_per_batch = 1) {
  Outcome r;
  Registry registry;
  register_builtin_nodes(registry);
  register_capture(registry, r.seen);
  Pipeline p(load_config_string(yaml, registry), registry);
  r.report = p.run();
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  const std::size_t per = r.seen->tensors.at(0).sample_bytes();
  // Batches arrive in order (ordered: true), so the epoch is the batch count's quotient.
  const std::size_t batches = r.seen->samples.size();
  for (std::size_t b = 0; b < batches; ++b) {
    const auto& samples = r.seen->samples[b];
    const int epoch = static_cast<int>(b * static_cast<std::size_t>(epochs_seen_per_batch) /
                                       std::max<std::size_t>(batches, 1));
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const auto* px = reinterpret_cast<const std::uint8_t*>(r.seen->x[b].data()) + i * per;
      r.x[{epoch, samples[i]}] = std::vector<std::uint8_t>(px, px + per);
      r.y[samples[i]] = r.seen->y[b][i];
    }
  }
  return r;
}

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
    // Both are triangle filters over the same box; they round and clamp edges differently.
    EXPECT_LE(worst, 2);
  }
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

std::string build_error(const std::string& yaml) {
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, std::make_shared<Captured>());
  const PipelineConfig config = load_config_string(yaml, r);
  return error_of<DataError>([&] { Pipeline p(config, r); });
}

std::string run_error(const std::string& yaml) {
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, std::make_shared<Captured>());
  Pipeline p(load_config_string(yaml, r), r);
  return error_of<NodeError>([&] { p.run(); });
}

const std::string kLoad = "node 'load' (webdataset, <string>:4)";

std::uint64_t header_of(const std::string& name, int sample, const char* field = "jpg") {
  return corrupt().manifest()[name][sample]["members"][field]["header"];
}

TEST(WebDataset, TruncatedTarFailsTheBuildWithItsOffset) {
  const Shards& s = corrupt();
  const std::string tar = s.file("truncated.tar");
  EXPECT_EQ(build_error(chain(tar, "")),
            fmt::format("{}: {}: truncated tar: the file ends 100 bytes into the header block at "
                        "offset {} (a header is 512 bytes; was the shard cut short while it was "
                        "written or copied?)",
                        kLoad, tar, header_of("whole", 3)));
}

TEST(WebDataset, MemberCutShortFailsTheBuildUnlessSkipped) {
  const Shards& s = corrupt();
  const std::string tar = s.file("cut_short.tar");
  EXPECT_EQ(build_error(chain(tar, "")),
            fmt::format("{}: {}: sample 's003' (member 's003.jpg' at offset {}): the member is cut "
                        "short (the shard ends before the size its header declares) (set "
                        "pipeline.on_error: skip to drop such samples)",
                        kLoad, tar, header_of("whole", 3)));
  Outcome r = run(chain(tar, "", ", on_error: skip, max_skipped: 1"));
  EXPECT_EQ(r.report.samples, 3u);
  EXPECT_EQ(r.report.skipped_samples, 1u);
}

TEST(WebDataset, SampleWithoutLabelFailsTheBuild) {
  const Shards& s = corrupt();
  const std::string tar = s.file("no_label.tar");
  EXPECT_EQ(build_error(chain(tar, "")),
            fmt::format("{}: {}: sample 's002' (member 's002.jpg' at offset {}): no label member "
                        "(.cls) (set pipeline.on_error: skip to drop such samples)",
                        kLoad, tar, header_of("no_label", 2)));
}

TEST(WebDataset, UndecodableImagesFailTheirBatchNamingShardMemberAndOffset) {
  const Shards& s = corrupt();
  const std::string text = s.file("not_image.tar");
  EXPECT_EQ(run_error(chain(text, "")),
            fmt::format("{} batch 0 (epoch 0): {}: sample 's002' (member 's002.jpg' at offset "
                        "{}): not a decodable JPEG (Not a JPEG file: starts with 0x68 0x65)",
                        kLoad, text, header_of("not_image", 2)));
  const std::string empty = s.file("zero_byte.tar");
  EXPECT_EQ(run_error(chain(empty, "")),
            fmt::format("{} batch 0 (epoch 0): {}: sample 's002' (member 's002.jpg' at offset "
                        "{}): empty image (0 bytes)",
                        kLoad, empty, header_of("zero_byte", 2)));
  const std::string label = s.file("bad_label.tar");
  EXPECT_EQ(run_error(chain(label, "")),
            fmt::format("{} batch 0 (epoch 0): {}: sample 's002' (member 's002.jpg' at offset "
                        "{}): label 'two' in its .cls member is not an integer",
                        kLoad, label, header_of("bad_label", 2)));
  EXPECT_EQ(run_error(chain(s.file("whole.tar"), ", num_classes: 3")),
            fmt::format("{} batch 0 (epoch 0): {}: sample 's003' (member 's003.jpg' at offset "
                        "{}): label 3 is out of range [0, 3)",
                        kLoad, s.file("whole.tar"), header_of("whole", 3)));
}

TEST(WebDataset, SkipDropsExactlyTheBadSamplesAndNamesThem) {
  const Shards& s = corrupt();
  const std::string tar = s.file("mixed.tar");
  Outcome r = run(chain(tar, "", ", epochs: 2, batch_size: 5, on_error: skip, max_skipped: 6"), 2);
  EXPECT_EQ(r.report.samples, 20u);
  EXPECT_EQ(r.report.skipped_samples, 6u);
  EXPECT_EQ(r.report.skipped_batches, 0u);
  // Every good sample arrives with its own label; the bad ones (3, 7, 11) never do.
  const Json& m = s.manifest()["mixed"];
  for (const auto& [key, bytes] : r.x) {
    EXPECT_NE(key.second, 3u);
    EXPECT_NE(key.second, 7u);
    EXPECT_NE(key.second, 11u);
    EXPECT_EQ(r.y.at(key.second), m[key.second]["label"].get<int>());
  }
  // Batch 0 holds samples 0-4 less sample 3; the labels moved down with their images.
  EXPECT_EQ(r.seen->samples[0], (std::vector<std::uint32_t>{0, 1, 2, 4}));
  EXPECT_EQ(r.seen->y[0], (std::vector<std::int32_t>{0, 1, 2, 3}));
  ASSERT_EQ(r.report.warnings.size(), 6u);
  EXPECT_EQ(r.report.warnings[0],
            fmt::format("skipped: dropped sample 3 from batch 0 (epoch 0): {}: sample 'bad_text' "
                        "(member 'bad_text.jpg' at offset {}): not a decodable JPEG (Not a JPEG "
                        "file: starts with 0x68 0x65)",
                        tar, m[3]["members"]["jpg"]["header"].get<std::uint64_t>()));

  // One more than max_skipped ends the run.
  EXPECT_EQ(
      run_error(chain(tar, "", ", batch_size: 13, on_error: skip, max_skipped: 2")),
      fmt::format("{} batch 0 (epoch 0): {}: sample 'bad_text' (member 'bad_text.jpg' at offset "
                  "{}): not a decodable JPEG (Not a JPEG file: starts with 0x68 0x65) (3 samples "
                  "dropped, more than pipeline.max_skipped = 2)",
                  kLoad, tar, m[3]["members"]["jpg"]["header"].get<std::uint64_t>()));
}

TEST(WebDataset, ContradictoryParamsAreConfigErrors) {
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, std::make_shared<Captured>());
  const std::string yaml = chain(formats().file("formats.tar"),
                                 ", scale_min: 0.9, scale_max: 0.5, crop: center, resize: 10");
  const std::string message =
      error_of<ConfigError>([&] { Pipeline p(load_config_string(yaml, r), r); });
  // Line 6 holds the params; the shard path's length varies with the temp directory.
  std::istringstream lines(yaml);
  std::string line;
  for (int i = 0; i < 6; ++i) std::getline(lines, line);
  EXPECT_EQ(message,
            fmt::format("<string>:6:{}: nodes.load.params.scale_min: 0.9 is above scale_max 0.5 "
                        "(the area fraction range must not be empty)\n"
                        "<string>:6:{}: nodes.load.params.resize: 10 is smaller than the crop "
                        "224x224 (the center crop must fit in the resized image)",
                        line.find("scale_min: ") + 12, line.find("resize: ") + 9));
}

}  // namespace
}  // namespace flowfeed
