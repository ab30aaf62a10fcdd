// The npy loader node through the whole graph: rows read with pread reach the sink with their
// labels converted to int32; bad headers, shapes and short files fail with the file named.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/detail/npy_file.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

std::string npy_chain(const std::string& features, const std::string& labels,
                      const std::string& extra = "", bool shuffle = true) {
  return std::string(
             "pipeline: { epochs: 2, batch_size: 8, prefetch_depth: 3, device: host, "
             "threads: 4 }\n"
             "sampler: { shuffle: ") +
         (shuffle ? "true" : "false") +
         ", seed: 11 }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: npy\n"
         "    concurrency: 3\n"
         "    params: { features: " +
         features + ", labels: " + labels + extra +
         " }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: capture }\n";
}

class NpyLoaderTest : public ::testing::Test {
 protected:
  /// 50 samples of float32 [3, 2]: element k of sample s is s * 10 + k / 8.
  std::string write_features(std::size_t count = 50) {
    features_.resize(count * 6);
    for (std::size_t i = 0; i < features_.size(); ++i) {
      features_[i] = static_cast<float>(i / 6) * 10.0f + static_cast<float>(i % 6) / 8.0f;
    }
    const std::string path = dir_.file("x.npy");
    write_npy(path, NpyDtype::float32, {static_cast<std::int64_t>(count), 3, 2}, features_.data());
    return path;
  }
  /// Labels (s * 3) % 10 in the given dtype.
  std::string write_labels(NpyDtype dtype, std::size_t count = 50) {
    std::vector<std::byte> raw(count * npy_dtype_size(dtype));
    for (std::size_t s = 0; s < count; ++s) {
      const std::int64_t v = static_cast<std::int64_t>((s * 3) % 10);
      if (dtype == NpyDtype::uint8) raw[s] = static_cast<std::byte>(v);
      if (dtype == NpyDtype::int32) {
        const auto w = static_cast<std::int32_t>(v);
        std::memcpy(raw.data() + s * 4, &w, 4);
      }
      if (dtype == NpyDtype::int64) std::memcpy(raw.data() + s * 8, &v, 8);
    }
    const std::string path = dir_.file("y.npy");
    write_npy(path, dtype, {static_cast<std::int64_t>(count)}, raw.data());
    return path;
  }
  Registry registry() {
    Registry r;
    register_builtin_nodes(r);
    register_capture(r, seen_);
    return r;
  }
  std::string build_error(const std::string& yaml) {
    Registry r = registry();
    const PipelineConfig config = load_config_string(yaml, r);
    return error_of<DataError>([&] { Pipeline p(config, r); });
  }

  TempDir dir_;
  std::vector<float> features_;
  std::shared_ptr<Captured> seen_ = std::make_shared<Captured>();
};

TEST_F(NpyLoaderTest, RowsAndLabelsOfEveryDtypeReachTheSink) {
  for (NpyDtype ldtype : {NpyDtype::uint8, NpyDtype::int32, NpyDtype::int64}) {
    SCOPED_TRACE(std::string(npy_dtype_descr(ldtype)));
    seen_ = std::make_shared<Captured>();
    const std::string x = write_features();
    const std::string y = write_labels(ldtype);
    Registry r = registry();
    Pipeline p(load_config_string(npy_chain(x, y, ", num_classes: 10"), r), r);
    const RunReport report = p.run();
    // 50 / 8 = 7 batches per epoch (the last has 2 rows), two epochs.
    EXPECT_EQ(report.batches, 14u);
    ASSERT_EQ(seen_->tensors.size(), 2u);
    EXPECT_EQ(seen_->tensors[0].dtype, DType::float32);
    EXPECT_EQ(seen_->tensors[0].shape, (std::vector<std::int64_t>{3, 2}));
    EXPECT_EQ(seen_->tensors[1].dtype, DType::int32);
    std::set<std::uint32_t> seen_samples;
    for (std::size_t b = 0; b < seen_->samples.size(); ++b) {
      for (std::size_t row = 0; row < seen_->samples[b].size(); ++row) {
        const std::uint32_t s = seen_->samples[b][row];
        seen_samples.insert(s);
        EXPECT_EQ(seen_->y[b][row], static_cast<std::int32_t>((s * 3) % 10));
        EXPECT_EQ(std::memcmp(seen_->x[b].data() + row * 24, features_.data() + s * 6, 24), 0)
            << "batch " << b << " row " << row << " sample " << s;
      }
    }
    EXPECT_EQ(seen_samples.size(), 50u);
    // Host memory is the pool, sized from the bound, not the file.
    for (const auto& pool : report.pools) {
      if (pool.name == "load.host") {
        EXPECT_EQ(pool.buffers, 3u);
      }
    }
    EXPECT_EQ(report.allocations_after_build, 0u);
  }
}

TEST_F(NpyLoaderTest, KeepsTheFeatureDtype) {
  std::vector<std::uint16_t> halves(20 * 4);
  for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<std::uint16_t>(i * 977);
  const std::string x = dir_.file("h.npy");
  write_npy(x, NpyDtype::float16, {20, 4}, halves.data());
  Registry r = registry();
  Pipeline p(load_config_string(npy_chain(x, write_labels(NpyDtype::int64, 20), "", false), r), r);
  p.run();
  ASSERT_EQ(seen_->tensors[0].dtype, DType::float16);
  EXPECT_EQ(seen_->tensors[0].shape, (std::vector<std::int64_t>{4}));
  // Sequential order: the first batch holds samples 0..7.
  EXPECT_EQ(std::memcmp(seen_->x[0].data(), halves.data(), 8 * 4 * 2), 0);
}

TEST_F(NpyLoaderTest, RowCountMismatch) {
  const std::string x = write_features(50);
  const std::string y = write_labels(NpyDtype::int64, 49);
  EXPECT_EQ(build_error(npy_chain(x, y)),
            "node 'load' (npy, <string>:4): " + y + ": 49 labels but " + x +
                " holds 50 samples (both files need the same first dimension)");
}

TEST_F(NpyLoaderTest, FloatLabels) {
  const std::string x = write_features();
  const std::string y = dir_.file("yf.npy");
  std::vector<float> labels(50, 1.0f);
  write_npy(y, NpyDtype::float32, {50}, labels.data());
  EXPECT_EQ(build_error(npy_chain(x, y)),
            "node 'load' (npy, <string>:4): " + y +
                ": labels must be integers (uint8, int32 or int64), but the dtype is <f4");
}

TEST_F(NpyLoaderTest, TwoDimensionalLabels) {
  const std::string x = write_features();
  const std::string y = dir_.file("y2.npy");
  std::vector<std::int32_t> labels(50, 1);
  write_npy(y, NpyDtype::int32, {50, 1}, labels.data());
  EXPECT_EQ(build_error(npy_chain(x, y)),
            "node 'load' (npy, <string>:4): " + y +
                ": labels must be one-dimensional, but the shape is (50, 1) (save an [N] array)");
}

TEST_F(NpyLoaderTest, FeaturesWithoutAFeatureDimension) {
  const std::string x = dir_.file("x1.npy");
  std::vector<float> flat(50, 0.5f);
  write_npy(x, NpyDtype::float32, {50}, flat.data());
  EXPECT_EQ(build_error(npy_chain(x, write_labels(NpyDtype::int64))),
            "node 'load' (npy, <string>:4): " + x +
                ": features must have a sample dimension and at least one feature dimension, "
                "but the shape is (50,) (save an [N, ...] array)");
}

TEST_F(NpyLoaderTest, SamplesWithNoValuesAreBlamedOnTheFile) {
  const std::string x = dir_.file("x0.npy");
  write_npy(x, NpyDtype::float32, {50, 0}, nullptr);
  EXPECT_EQ(build_error(npy_chain(x, write_labels(NpyDtype::int64))),
            "node 'load' (npy, <string>:4): " + x +
                ": each sample holds no values (shape (50, 0): a feature dimension is 0) save "
                "features with at least one value a sample");
}

TEST_F(NpyLoaderTest, ShortFileAtBuild) {
  const std::string x = write_features();
  std::filesystem::resize_file(x, std::filesystem::file_size(x) - 5);
  const std::string message = build_error(npy_chain(x, write_labels(NpyDtype::int64)));
  EXPECT_EQ(
      message.rfind("node 'load' (npy, <string>:4): " + x + ": truncated: header promises ", 0), 0u)
      << message;
}

TEST_F(NpyLoaderTest, BadMagic) {
  const std::string x = dir_.file("bad.npy");
  write_bytes(x, Bytes(200, 0x41), false);
  EXPECT_EQ(
      build_error(npy_chain(x, write_labels(NpyDtype::int64))),
      "node 'load' (npy, <string>:4): " + x + ": not a .npy file (magic bytes are not \\x93NUMPY)");
}

TEST_F(NpyLoaderTest, LabelOutOfRangeFailsItsBatch) {
  const std::string x = write_features();
  std::vector<std::int64_t> labels(50, 1);
  labels[21] = 12;
  const std::string y = dir_.file("y.npy");
  write_npy(y, NpyDtype::int64, {50}, labels.data());
  Registry r = registry();
  Pipeline p(load_config_string(npy_chain(x, y, ", num_classes: 10", false), r), r);
  // Sequential order, batch 8: sample 21 is in batch 2.
  EXPECT_EQ(error_of<NodeError>([&] { p.run(); }),
            "node 'load' (npy, <string>:4) batch 2 (epoch 0): " + y +
                ": label 12 at index 21 is out of range [0, 10)");
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST_F(NpyLoaderTest, BatchesAreReadFromTheFileAtRunTime) {
  const std::string x = write_features();
  Registry r = registry();
  Pipeline p(load_config_string(npy_chain(x, write_labels(NpyDtype::int64), "", false), r), r);
  // Cut the file after the build, inside the last batch (samples 48 and 49, from byte 1280).
  std::filesystem::resize_file(x, 128 + 48 * 24 + 10);
  EXPECT_EQ(error_of<NodeError>([&] { p.run(); }),
            "node 'load' (npy, <string>:4) batch 6 (epoch 0): " + x +
                ": short read at offset 1290 (end of file, 38 more bytes wanted) the file was "
                "truncated while open");
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

}  // namespace
}  // namespace flowfeed
