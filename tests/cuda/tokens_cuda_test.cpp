// The tokens loader on CUDA: windows read from a token file straight into page-locked memory
// (pinned_staging passes them through, or cuda_upload copies from them without bounce buffers)
// arrive on the device at the file's width, byte-exact, with pread, io_uring and mmap.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/stats.hpp"
#include "gpu_test.hpp"
#include "tests/cuda/device_capture.hpp"
#include "tests/nodes/test_files.hpp"
#include "tests/nodes/token_corpus.hpp"

namespace flowfeed {
namespace {

using namespace token_corpus;

TEST(TokensCuda, WindowsReadIntoPinnedMemoryArriveOnTheDeviceAtTheFilesWidth) {
  FLOWFEED_REQUIRE_GPU();
  testing_files::TempDir dir;
  const Corpus& c = licenses();
  const std::string path = dir.file("train.bin");
  write_raw(path, c.tokens, 2);
  const std::vector<std::uint64_t> starts = all_starts({0, c.tokens.size()}, 512, true);
  for (const char* io : {"pread", "io_uring", "mmap"}) {
    for (const bool staging : {true, false}) {
      SCOPED_TRACE(std::string(io) + (staging ? " pinned_staging" : " no staging node"));
      const auto [report, seen] = test::run_to_device_capture(
          "  - { name: load, type: tokens, concurrency: 2, params: { files: " + path +
              ", context: 512, positions: random, seed: 7, windows: 200, io: " + io + " } }\n",
          staging, "the tokens run");
      ASSERT_EQ(seen->samples.size(), 26u);  // 13 batches (12 of 16, one of 8) an epoch
      // x and y are uint16 on the device: 2 bytes a token, the window and the window shifted by
      // one.
      for (std::size_t b = 0; b < seen->samples.size(); ++b) {
        const std::uint32_t epoch = seen->epochs[b];
        for (std::size_t row = 0; row < seen->samples[b].size(); ++row) {
          const std::uint64_t start = random_start(starts, 7, epoch, seen->samples[b][row]);
          for (std::size_t t = 0; t < 2; ++t) {
            std::vector<std::uint16_t> want(512);
            for (std::size_t k = 0; k < 512; ++k) {
              want[k] = static_cast<std::uint16_t>(c.tokens[start + t + k]);
            }
            ASSERT_EQ(std::memcmp(seen->tensors[b][t].data() + row * 1024, want.data(), 1024), 0)
                << "batch " << b << " row " << row << (t == 0 ? " x" : " y");
          }
        }
      }
      test::expect_only_the_loaders_pinned_buffers(report, staging, 26.0);
    }
  }
}

}  // namespace
}  // namespace flowfeed
