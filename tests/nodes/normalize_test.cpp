// `normalize` on the host backend: the exact values that leave it (float32, float16, bfloat16,
// hwc and chw) against a reference computed here from the synthetic loader's bytes, the layout the
// nodes after it see, the bytes the report counts as uploaded, and its config errors.
#include "flowfeed/nodes/normalize.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/stats.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

constexpr std::uint64_t kSeed = 5;
const std::vector<float> kMean{123.675f, 116.28f, 103.53f};
const std::vector<float> kStd{58.395f, 57.12f, 57.375f};

/// What the train node saw of one batch: the x dtype and bytes, and the labels.
struct Seen {
  DType dtype = DType::uint8;
  std::vector<std::uint32_t> samples;
  std::vector<std::byte> x;
  std::vector<std::int32_t> y;
};

/// A registry with the built-ins and a `capture` train node that copies every batch it gets.
Registry capture_registry(std::shared_ptr<std::vector<Seen>> seen) {
  Registry r;
  register_builtin_nodes(r);
  r.set(callable_type("capture", Role::train, [seen](Batch& b) {
    Seen s;
    const auto& x = b.layout->tensors()[0];
    s.dtype = x.dtype;
    s.samples = b.samples;
    const std::size_t x_bytes = b.rows() * x.sample_bytes();
    s.x.assign(b.tensor(Tier::device, 0), b.tensor(Tier::device, 0) + x_bytes);
    s.y.resize(b.rows());
    std::memcpy(s.y.data(), b.tensor(Tier::device, 1), b.rows() * sizeof(std::int32_t));
    seen->push_back(std::move(s));
  }));
  return r;
}

std::string config(const std::string& shape, const std::string& params) {
  return "pipeline: { batch_size: 4, prefetch_depth: 3, device: auto }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, params: { samples: 10, dtype: uint8, seed: 5, "
         "sample_shape: " +
         shape +
         " } }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: norm, type: device_normalize, params: { " +
         params +
         " } }\n"
         "  - { name: train, type: capture }\n";
}

/// The test's own reference of one value, in float32: (v - mean) / std.
float reference(std::uint8_t v, std::size_t c) {
  const float diff = static_cast<float>(v) - kMean[c];
  return diff / kStd[c];
}

/// Nearest bfloat16 (ties to even), found by comparing the two candidates in double.
std::uint16_t reference_bfloat16(float f) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t down = bits & 0xffff0000u;
  const std::uint32_t up = down + 0x10000u;
  const double d = static_cast<double>(f);
  const double lo = std::abs(d - static_cast<double>(std::bit_cast<float>(down)));
  const double hi = std::abs(static_cast<double>(std::bit_cast<float>(up)) - d);
  if (lo < hi || (lo == hi && ((down >> 16) & 1u) == 0))
    return static_cast<std::uint16_t>(down >> 16);
  return static_cast<std::uint16_t>(up >> 16);
}

std::uint16_t reference_float16(float f) {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
}

/// Runs `yaml` and checks every value of every batch against the reference, bit for bit.
void check_run(const std::string& yaml, DType dtype, bool chw) {
  auto seen = std::make_shared<std::vector<Seen>>();
  const Registry r = capture_registry(seen);
  const PipelineConfig c = load_config_string(yaml, r);
  ASSERT_EQ(c.nodes[3].type, "normalize");  // device: auto on a machine without a GPU
  Pipeline p(c, r);
  const RunReport report = p.run();
  EXPECT_EQ(report.allocations_after_build, 0u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  ASSERT_EQ(seen->size(), 3u);  // 4 + 4 + 2 samples
  const std::size_t elements = 4 * 5 * 3;
  std::size_t checked = 0;
  for (const Seen& s : *seen) {
    EXPECT_EQ(s.dtype, dtype);
    ASSERT_EQ(s.x.size(), s.samples.size() * elements * dtype_size(dtype));
    for (std::size_t row = 0; row < s.samples.size(); ++row) {
      std::vector<std::uint8_t> raw(elements);
      synthetic_fill(kSeed, s.samples[row], DType::uint8, elements, raw.data());
      EXPECT_EQ(s.y[row], synthetic_label(kSeed, s.samples[row], 10));
      for (std::size_t e = 0; e < elements; ++e) {
        const std::size_t c = chw ? e / 20 : e % 3;
        const float want = reference(raw[e], c);
        const std::size_t at = row * elements + e;
        if (dtype == DType::float32) {
          float got;
          std::memcpy(&got, s.x.data() + at * 4, 4);
          ASSERT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want))
              << "sample " << s.samples[row] << " element " << e;
        } else {
          std::uint16_t got;
          std::memcpy(&got, s.x.data() + at * 2, 2);
          const std::uint16_t expect =
              dtype == DType::float16 ? reference_float16(want) : reference_bfloat16(want);
          ASSERT_EQ(got, expect) << "sample " << s.samples[row] << " element " << e;
        }
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 10 * elements);
  // The upload carried uint8 images and int32 labels: the float tensor is made after it.
  const BatchLayout uploaded({{"x", DType::uint8, {4, 5, 3}}, {"y", DType::int32, {}}}, 4);
  EXPECT_EQ(report.bytes_uploaded, 2 * uploaded.bytes(4) + uploaded.bytes(2));
}

TEST(Normalize, Float32HwcIsExactlyTheReference) {
  check_run(config("[4, 5, 3]", "dtype: float32"), DType::float32, false);
}

TEST(Normalize, Float32ChwIsExactlyTheReference) {
  check_run(config("[3, 4, 5]", "layout: chw"), DType::float32, true);
}

TEST(Normalize, Float16RoundsToNearestEven) {
  check_run(config("[4, 5, 3]", "dtype: float16"), DType::float16, false);
}

TEST(Normalize, Bfloat16RoundsToNearestEven) {
  check_run(config("[3, 4, 5]", "dtype: bfloat16, layout: chw"), DType::bfloat16, true);
}

TEST(Normalize, MeanAndStdComeFromParams) {
  auto seen = std::make_shared<std::vector<Seen>>();
  const Registry r = capture_registry(seen);
  Pipeline p(load_config_string(config("[2, 2, 1]", "mean: [100], std: [4]"), r), r);
  p.run();
  ASSERT_FALSE(seen->empty());
  const Seen& s = seen->front();
  std::vector<std::uint8_t> raw(4);
  synthetic_fill(kSeed, s.samples[0], DType::uint8, 4, raw.data());
  for (std::size_t e = 0; e < 4; ++e) {
    float got;
    std::memcpy(&got, s.x.data() + e * 4, 4);
    EXPECT_EQ(got, (static_cast<float>(raw[e]) - 100.0f) / 4.0f);
  }
}

TEST(Normalize, HalfConversionsMatchTheReferenceOverTheFloatRange) {
  // Every exponent, many mantissas, both signs; plus the edges of float16's range and ties.
  std::vector<float> values{0.0f,
                            -0.0f,
                            65504.0f,
                            65519.996f,
                            65520.0f,
                            1e9f,
                            5.96e-8f,
                            2.98e-8f,
                            2.9802322e-8f,
                            6.1035156e-5f,
                            6.1035153e-5f,
                            1.0009766f,
                            1.0004883f,
                            1.0014648f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min()};
  for (std::uint64_t bits = 0; bits <= 0xffffffffu; bits += 65521) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(bits));
    if (!std::isnan(f)) values.push_back(f);
  }
  for (float f : values) {
    ASSERT_EQ(float_to_float16_bits(f), reference_float16(f)) << f;
    if (std::isfinite(f) && std::abs(f) < 3.3e38f) {
      ASSERT_EQ(float_to_bfloat16_bits(f), reference_bfloat16(f)) << f;
    }
  }
  EXPECT_TRUE(std::isnan(
      static_cast<float>(std::bit_cast<_Float16>(float_to_float16_bits(std::nanf(""))))));
}

/// The whole error text of loading and building `yaml`.
std::string build_error(const std::string& yaml) {
  auto seen = std::make_shared<std::vector<Seen>>();
  const Registry r = capture_registry(seen);
  return test::error_of<ConfigError>(
      [&] { Pipeline p(load_config_string(yaml, r, {}, "images.yaml"), r); });
}

TEST(Normalize, RejectsTensorsItCannotConvert) {
  const std::string at = "images.yaml:6:5: nodes.norm.params.";
  EXPECT_EQ(build_error(config("[4, 5, 3]", "tensor: image")),
            at + "tensor: the batches have no tensor 'image' (they have x, y) name one of those");
  EXPECT_EQ(build_error(config("[4, 5]", "")),
            at + "tensor: 'x' is uint8 [4, 5] (normalize takes uint8 images of rank 3, [H, W, C] "
                 "or [C, H, W]) have the loader emit uint8 images");
  const std::string channels = " channels in layout hwc (give one per channel, or set layout: chw)";
  EXPECT_EQ(build_error(config("[3, 4, 5]", "")),
            at + "mean: 3 means and 3 stds for 'x' uint8 [3, 4, 5] with 5" + channels);
  EXPECT_EQ(build_error(config("[4, 5, 3]", "mean: [1, 2], std: [1, 2, 3]")),
            at + "mean: 2 means and 3 stds for 'x' uint8 [4, 5, 3] with 3" + channels);
}

TEST(Normalize, ValidatesItsParams) {
  EXPECT_EQ(build_error(config("[4, 5, 3]", "std: [1, 0, 1], dtype: float64")),
            "images.yaml:6:62: nodes[3].params.std[1]: 0 is out of range (must be between 1e-06 "
            "and 1000000)\n"
            "images.yaml:6:76: nodes[3].params.dtype: 'float64' is not one of float32, float16, "
            "bfloat16 (did you mean 'float32'?)");
}

}  // namespace
}  // namespace flowfeed
