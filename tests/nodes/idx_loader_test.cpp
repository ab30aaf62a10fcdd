// The idx loader node through the whole graph: bytes and labels reach the sink, bad files fail the
// build with the node and the file named, and a batch never touches the files again.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/idx.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {
// Named apart from the helpers of the test files it shares a unity group with.
namespace idx_loader_test {

using namespace testing_files;

std::string idx_chain(const std::string& images, const std::string& labels,
                      const std::string& extra = "", int epochs = 2) {
  return "pipeline: { epochs: " + std::to_string(epochs) +
         ", batch_size: 16, prefetch_depth: 4, device: host, threads: 4 }\n"
         "sampler: { shuffle: true, seed: 5 }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: idx\n"
         "    concurrency: 3\n"
         "    params: { images: " +
         images + ", labels: " + labels + extra +
         " }\n"
         "  - { name: stage, type: host_staging, concurrency: 2 }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: capture }\n";
}

struct Case {
  bool gzip;
  bool u8;
};

class IdxThroughTheGraph : public ::testing::TestWithParam<Case> {};

TEST_P(IdxThroughTheGraph, EveryPixelAndLabelReachesTheSink) {
  const Case c = GetParam();
  TempDir dir;
  const IdxPair data = make_idx_pair(100, 4, 5, 10);
  const auto [images, labels] = write_idx_pair(dir, data, "train", c.gzip);
  Registry r;
  register_builtin_nodes(r);
  auto seen = std::make_shared<Captured>();
  register_capture(r, seen);
  Pipeline p(load_config_string(
                 idx_chain(images, labels, c.u8 ? ", dtype: uint8" : ", dtype: float32"), r),
             r);
  const RunReport report = p.run();

  // 100 samples / 16 = 7 batches per epoch (the last has 4 rows), two epochs.
  EXPECT_EQ(report.batches, 14u);
  EXPECT_EQ(report.samples, 200u);
  ASSERT_EQ(seen->tensors.size(), 2u);
  EXPECT_EQ(seen->tensors[0].name, "x");
  EXPECT_EQ(seen->tensors[0].dtype, c.u8 ? DType::uint8 : DType::float32);
  EXPECT_EQ(seen->tensors[0].shape, (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(seen->tensors[1].name, "y");
  EXPECT_EQ(seen->tensors[1].dtype, DType::int32);
  EXPECT_TRUE(seen->tensors[1].shape.empty());
  ASSERT_EQ(seen->samples.size(), 14u);
  std::set<std::uint32_t> epoch_samples[2];
  for (std::size_t b = 0; b < seen->samples.size(); ++b) {
    const auto& samples = seen->samples[b];
    EXPECT_EQ(samples.size(), b % 7 == 6 ? 4u : 16u) << "batch " << b;
    for (std::size_t row = 0; row < samples.size(); ++row) {
      const std::uint32_t s = samples[row];
      epoch_samples[b / 7].insert(s);
      EXPECT_EQ(seen->y[b][row], static_cast<std::int32_t>(s % 10)) << "batch " << b;
      const std::uint8_t* want = data.images.data() + s * 20;
      if (c.u8) {
        EXPECT_EQ(std::memcmp(seen->x[b].data() + row * 20, want, 20), 0)
            << "batch " << b << " row " << row << " (sample " << s << ")";
      } else {
        const auto* got = reinterpret_cast<const float*>(seen->x[b].data()) + row * 20;
        for (int k = 0; k < 20; ++k) {
          ASSERT_EQ(got[k], static_cast<float>(want[k]) / 255.0f)
              << "batch " << b << " row " << row << " pixel " << k;
        }
      }
    }
  }
  EXPECT_EQ(epoch_samples[0].size(), 100u);
  EXPECT_EQ(epoch_samples[1].size(), 100u);
  EXPECT_EQ(report.allocations_after_build, 0u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

INSTANTIATE_TEST_SUITE_P(Files, IdxThroughTheGraph,
                         ::testing::Values(Case{false, false}, Case{true, false}, Case{false, true},
                                           Case{true, true}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.gzip ? "gzip" : "plain") +
                                  (info.param.u8 ? "_uint8" : "_float32");
                         });

TEST(IdxLoader, BatchesComeFromMemoryNotTheFiles) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(40, 2, 3, 10), "t", true);
  Registry r;
  register_builtin_nodes(r);
  auto seen = std::make_shared<Captured>();
  register_capture(r, seen);
  Pipeline p(load_config_string(idx_chain(images, labels, "", 1), r), r);
  // Decompressed once at build: the run does not need the files any more.
  std::filesystem::remove(images);
  std::filesystem::remove(labels);
  EXPECT_EQ(p.run().samples, 40u);
  EXPECT_EQ(p.run().samples, 40u);
}

class IdxBadFiles : public ::testing::Test {
 protected:
  /// The DataError the pipeline's build throws for these files.
  std::string build_error(const std::string& images, const std::string& labels,
                          const std::string& extra = "") {
    Registry r;
    register_builtin_nodes(r);
    register_capture(r, std::make_shared<Captured>());
    const PipelineConfig config = load_config_string(idx_chain(images, labels, extra), r);
    return error_of<DataError>([&] { Pipeline p(config, r); });
  }
  /// The idx node's message for a problem with `file`.
  static std::string node_error(const std::string& file, const std::string& problem) {
    return "node 'load' (idx, <string>:4): " + file + ": " + problem;
  }
  /// Expects the build to fail with the idx node's message `problem` about `file` (one of the two).
  void expect_refused(const std::string& file, const std::string& images, const std::string& labels,
                      const std::string& problem) {
    EXPECT_EQ(build_error(images, labels), node_error(file, problem));
  }
  /// a-images and a-labels: 10 good 2 x 2 images and their labels, for a test to damage.
  std::pair<std::string, std::string> write_good_pair() {
    return write_idx_pair(dir_, make_idx_pair(10, 2, 2, 10), "a", false);
  }
  TempDir dir_;
};

TEST_F(IdxBadFiles, CountMismatchNamesTheNodeAndTheLabelFile) {
  IdxPair data = make_idx_pair(10, 2, 2, 10);
  const auto [images, labels] = write_idx_pair(dir_, data, "a", false);
  data.labels.pop_back();
  write_bytes(labels, idx_bytes(0x08, {9}, data.labels), false);
  EXPECT_EQ(build_error(images, labels),
            node_error(labels, "10 images but 9 labels (images: " + images +
                                   ") use the label file that belongs to these images"));
}

TEST_F(IdxBadFiles, LabelOutOfRange) {
  IdxPair data = make_idx_pair(10, 2, 2, 10);
  data.labels[7] = 11;
  const auto [images, labels] = write_idx_pair(dir_, data, "a", true);
  expect_refused(labels, images, labels, "label 11 out of range at index 7 (num_classes is 10)");
}

TEST_F(IdxBadFiles, TruncatedImageFile) {
  const auto [images, labels] = write_good_pair();
  std::filesystem::resize_file(images, 16 + 39);
  const std::string refetch = "re-download or re-extract the file";
  expect_refused(images, images, labels,
                 "truncated at byte 55 (header promises 56 bytes) " + refetch);
}

TEST_F(IdxBadFiles, NotGzipThoughNamedGz) {
  const auto [images, labels] = write_good_pair();
  const std::string gz = dir_.file("a-images.gz");
  std::filesystem::copy_file(images, gz);
  expect_refused(gz, gz, labels,
                 "not gzip (the name ends in .gz but the file starts with 00 00, not the "
                 "gzip magic 1f 8b) decompress it or remove the .gz suffix");
}

TEST_F(IdxBadFiles, ImagesWithNoPixelsAreBlamedOnTheFile) {
  const auto [images, labels] = write_good_pair();
  write_bytes(images, idx_bytes(0x08, {10, 5, 0}, {}), false);
  expect_refused(images, images, labels,
                 "each image holds no pixels (10 x 5 x 0: rows or columns are 0) use an "
                 "image file with images of at least 1 x 1");
}

TEST_F(IdxBadFiles, MissingFile) {
  const auto [images, labels] = write_good_pair();
  const std::string missing = dir_.file("nope");
  expect_refused(missing, missing, labels, "cannot open (No such file or directory)");
}

TEST(IdxConfig, ImagesAndLabelsAreRequired) {
  Registry r;
  register_builtin_nodes(r);
  const std::string yaml =
      "pipeline: { device: host }\n"
      "nodes:\n"
      "  - { name: load, type: idx, params: { dtype: uint8 } }\n"
      "  - { name: train, type: discard }\n";
  EXPECT_EQ(error_of<ConfigError>([&] { load_config_string(yaml, r); }),
            "<string>:3:38: nodes[0].params.images: missing required key (IDX image file (type "
            "0x08, count x rows x cols), plain or gzip)\n"
            "<string>:3:38: nodes[0].params.labels: missing required key (IDX label file (type "
            "0x08, count), plain or gzip)");
}

TEST(IdxLoader, CopyAllGivesTheWholeSetInTheSampleDtype) {
  TempDir dir;
  const IdxPair data = make_idx_pair(30, 3, 4, 7);
  const auto [images, labels] = write_idx_pair(dir, data, "r", false);
  for (DType dtype : {DType::uint8, DType::float32}) {
    IdxLoader loader({images, labels, dtype, 7, true});
    EXPECT_TRUE(loader.resident());
    EXPECT_EQ(loader.size(), 30u);
    std::vector<std::byte> x(30 * 12 * dtype_size(dtype));
    std::vector<std::int32_t> y(30);
    loader.copy_all(0, x.data());
    loader.copy_all(1, y.data());
    for (std::size_t i = 0; i < 30 * 12; ++i) {
      const float v = dtype == DType::uint8 ? static_cast<float>(static_cast<std::uint8_t>(x[i]))
                                            : reinterpret_cast<const float*>(x.data())[i] * 255.f;
      ASSERT_NEAR(v, data.images[i], 1e-3) << dtype_name(dtype) << " pixel " << i;
    }
    for (std::size_t i = 0; i < 30; ++i) EXPECT_EQ(y[i], static_cast<std::int32_t>(i % 7));
    EXPECT_THROW(loader.copy_all(2, x.data()), std::out_of_range);
  }
}

}  // namespace idx_loader_test
}  // namespace
}  // namespace flowfeed
