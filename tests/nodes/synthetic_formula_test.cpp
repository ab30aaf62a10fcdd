#include "flowfeed/nodes/synthetic_formula.hpp"

#include <gtest/gtest.h>

#include <cstring>

#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/sampler.hpp"

namespace flowfeed {
namespace {

TEST(SyntheticFormula, MixIsTheSamplersSplitmix64) {
  for (std::uint64_t x : {0ull, 1ull, 42ull, 0x9E3779B97F4A7C15ull, ~0ull}) {
    EXPECT_EQ(formula::mix(x), splitmix64(x)) << x;
  }
}

TEST(SyntheticFormula, FillWritesTheFormulasBitsForEveryType) {
  const std::uint64_t h = synthetic_sample_hash(7, 123);
  for (DType d : {DType::float32, DType::float16, DType::uint8, DType::int32, DType::int64}) {
    unsigned char buf[8 * 5] = {};
    synthetic_fill(7, 123, d, 5, buf);
    for (std::size_t j = 0; j < 5; ++j) {
      std::uint64_t got = 0;
      std::memcpy(&got, buf + j * dtype_size(d), dtype_size(d));
      EXPECT_EQ(got, formula::element_bits(static_cast<formula::ElementType>(d), h, j))
          << dtype_name(d) << " element " << j;
    }
  }
}

TEST(SyntheticFormula, Float32ValuesAreSixteenBitFractions) {
  float f[4];
  synthetic_fill(1, 2, DType::float32, 4, f);
  const std::uint64_t h = synthetic_sample_hash(1, 2);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(f[j], static_cast<float>((synthetic_word(h, j) >> 8) & 0xFFFFu) / 65536.0f);
    EXPECT_GE(f[j], 0.0f);
    EXPECT_LT(f[j], 1.0f);
  }
}

}  // namespace
}  // namespace flowfeed
