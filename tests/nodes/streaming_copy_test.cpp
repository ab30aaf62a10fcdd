// streaming_copy (pinned_staging's copy into page-locked buffers): every byte, at every alignment
// of source and destination, and nothing outside the destination range.
#include "flowfeed/nodes/detail/streaming_copy.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace flowfeed {
namespace {

TEST(StreamingCopy, CopiesEveryByteAtEveryAlignmentAndNothingElse) {
  const std::size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 1000, 4099, 70000};
  std::vector<std::byte> src(70000 + 64);
  for (std::size_t i = 0; i < src.size(); ++i) {
    src[i] = static_cast<std::byte>((i * 131 + 7) % 251);
  }
  std::vector<std::byte> dst(70000 + 128);
  for (std::size_t bytes : sizes) {
    for (std::size_t s = 0; s < 17; ++s) {
      for (std::size_t d = 0; d < 17; ++d) {
        std::fill(dst.begin(), dst.end(), std::byte{0xee});
        streaming_copy(dst.data() + 32 + d, src.data() + s, bytes);
        for (std::size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 32 + d && i < 32 + d + bytes;
          const std::byte want = inside ? src[s + (i - 32 - d)] : std::byte{0xee};
          ASSERT_EQ(dst[i], want) << "bytes " << bytes << ", source offset " << s
                                  << ", destination offset " << d << ", byte " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace flowfeed
