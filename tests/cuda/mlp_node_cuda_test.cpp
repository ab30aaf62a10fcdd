// The mlp node on the cuda backend, against the CPU reference through the same graph: same seed,
// same batches, the same training to float tolerance; resident and streamed runs agree.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "flowfeed/config.hpp"
#include "flowfeed/mlp/mlp_node.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/resident.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/cuda/gpu_test.hpp"
#include "tests/nodes/mlp_registry.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

std::string chain(const std::string& device, const std::string& images, const std::string& labels,
                  const std::string& dtype) {
  return "pipeline: { epochs: 2, batch_size: 64, prefetch_depth: 4, device: " + device +
         " }\n"
         "sampler: { shuffle: true, seed: 42 }\n"
         "nodes:\n"
         "  - { name: load, type: idx, concurrency: 2, params: { images: " +
         images + ", labels: " + labels + ", dtype: " + dtype +
         " } }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - name: train\n"
         "    type: mlp\n"
         "    params: { hidden: [32], lr: 0.01, momentum: 0.9, seed: 3, eval_images: " +
         images + ", eval_labels: " + labels + " }\n";
}

/// ||a - b|| / ||a|| over every parameter.
double relative_difference(const MlpParams& a, const MlpParams& b) {
  double diff = 0, norm = 0;
  for (std::size_t l = 0; l < a.weights.size(); ++l) {
    for (std::size_t k = 0; k < a.weights[l].size(); ++k) {
      diff += std::pow(double(a.weights[l][k]) - b.weights[l][k], 2);
      norm += std::pow(double(a.weights[l][k]), 2);
    }
    for (std::size_t k = 0; k < a.biases[l].size(); ++k) {
      diff += std::pow(double(a.biases[l][k]) - b.biases[l][k], 2);
      norm += std::pow(double(a.biases[l][k]), 2);
    }
  }
  return std::sqrt(diff / norm);
}

/// 1,232 images of 6x6 in 10 classes (20 batches of 64, the last of 16) and their labels, as the
/// IDX files a-images and a-labels in `dir`, gzipped when asked.
std::pair<std::string, std::string> six_by_six_images(const TempDir& dir, bool gzip) {
  return write_idx_pair(dir, make_idx_pair(1232, 6, 6, 10), "a", gzip);
}

class MlpNodeCuda : public ::testing::TestWithParam<const char*> {};

TEST_P(MlpNodeCuda, ResidentOnTheGpuTrainsAsTheCpuReference) {
  FLOWFEED_REQUIRE_GPU();
  TempDir dir;
  // 20 batches of 64 (the last has 16 rows) of 6x6 images, two epochs.
  const auto [images, labels] = six_by_six_images(dir, false);
  std::vector<MlpNode*> nodes;
  Registry r = registry_keeping(&nodes);
  const PipelineConfig host =
      resident_config(load_config_string(chain("host", images, labels, GetParam()), r), r);
  const PipelineConfig cuda =
      resident_config(load_config_string(chain("cuda", images, labels, GetParam()), r), r);
  ASSERT_EQ(cuda.backend, Backend::cuda);
  Pipeline ph(host, r);
  Pipeline pc(cuda, r);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_STREQ(nodes[1]->backend_name(), "cuda");
  EXPECT_TRUE(nodes[1]->resident());
  // Same seed, same initial weights.
  EXPECT_EQ(relative_difference(nodes[0]->params(), nodes[1]->params()), 0.0);
  const RunReport a = ph.run();
  const RunReport b = pc.run();
  ASSERT_EQ(b.train.epochs.size(), 2u);
  for (std::size_t e = 0; e < 2; ++e) {
    EXPECT_NEAR(a.train.epochs[e].at("loss"), b.train.epochs[e].at("loss"),
                1e-4 * a.train.epochs[e].at("loss"))
        << "epoch " << e + 1;
    EXPECT_NEAR(a.train.epochs[e].at("test_loss"), b.train.epochs[e].at("test_loss"),
                1e-4 * a.train.epochs[e].at("test_loss"));
  }
  EXPECT_LT(relative_difference(nodes[0]->params(), nodes[1]->params()), 1e-4);
  EXPECT_EQ(b.allocations_after_build, 0u);
  EXPECT_GE(b.extra.at("train_device_wait_seconds"), 0.0);
  // A second run continues training from where the first ended, as on the host.
  ph.run();
  pc.run();
  EXPECT_LT(relative_difference(nodes[0]->params(), nodes[1]->params()), 1e-4);
}

TEST_P(MlpNodeCuda, StreamedThroughCudaUploadEqualsResident) {
  FLOWFEED_REQUIRE_GPU();
  std::vector<MlpNode*> nodes;
  Registry r = registry_keeping(&nodes);
  TempDir dir;
  const auto [images, labels] = six_by_six_images(dir, true);
  // device: cuda swaps host_staging/host_upload for pinned_staging/cuda_upload.
  const PipelineConfig streamed = load_config_string(chain("cuda", images, labels, GetParam()), r);
  ASSERT_EQ(streamed.nodes[2].type, "cuda_upload");
  const PipelineConfig host = load_config_string(chain("host", images, labels, GetParam()), r);
  // Each pipeline is built right before its run: the allocation counter is per process.
  Pipeline ps(streamed, r);
  const RunReport a = ps.run();
  Pipeline pr(resident_config(streamed, r), r);
  const RunReport b = pr.run();
  Pipeline ph(host, r);
  const RunReport c = ph.run();
  ASSERT_EQ(nodes.size(), 3u);
  EXPECT_GT(a.bytes_uploaded, 0u);
  EXPECT_EQ(b.bytes_uploaded, 0u);
  for (std::size_t e = 0; e < 2; ++e) {
    // The same kernels on the same batches in the same order: the same numbers.
    EXPECT_EQ(a.train.epochs[e].at("loss"), b.train.epochs[e].at("loss")) << "epoch " << e + 1;
    EXPECT_NEAR(a.train.epochs[e].at("loss"), c.train.epochs[e].at("loss"),
                1e-4 * c.train.epochs[e].at("loss"));
  }
  EXPECT_EQ(relative_difference(nodes[0]->params(), nodes[1]->params()), 0.0);
  EXPECT_LT(relative_difference(nodes[2]->params(), nodes[0]->params()), 1e-4);
  EXPECT_EQ(a.allocations_after_build, 0u);
  EXPECT_EQ(ps.free_buffers(), ps.total_buffers());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MlpNodeCuda, ::testing::Values("float32", "uint8"));

TEST(MlpCudaResume, StoppedMidEpochAndResumedEndsWithTheUninterruptedWeights) {
  FLOWFEED_REQUIRE_GPU();
  TempDir dir;
  const auto [images, labels] = six_by_six_images(dir, true);
  std::vector<MlpNode*> nodes;
  Registry r = registry_keeping(&nodes);
  const PipelineConfig config = load_config_string(chain("cuda", images, labels, "uint8"), r);
  const std::string ckpt = dir.file("ckpt");
  {
    Pipeline whole(config, r);
    whole.run();
  }
  {
    Pipeline first(config, r);
    RunOptions options;
    options.stop_after = 27;  // 20 batches per epoch: mid-epoch 1
    first.run(options);
    first.save_checkpoint(ckpt);
  }
  PipelineConfig resumed = config;
  resumed.pipeline.resume_from = ckpt;
  Pipeline rest(resumed, r);
  rest.run();
  ASSERT_EQ(nodes.size(), 3u);
  const double difference = relative_difference(nodes[0]->params(), nodes[2]->params());
  RecordProperty("relative_difference", std::to_string(difference));
  std::cout << "resumed on the GPU: relative difference to the uninterrupted weights " << difference
            << "\n";
  // Weights and momentum are copied bit for bit and the step is deterministic on one GPU.
  EXPECT_EQ(difference, 0.0);
}

TEST(MlpNodeCudaErrors, StreamedBatchNotOnTheDevice) {
  FLOWFEED_REQUIRE_GPU();
  std::vector<MlpNode*> nodes;
  Registry r = registry_keeping(&nodes);
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(128, 4, 4, 10), "a", false);
  // No upload node: on cuda the batch is still in host memory.
  const std::string yaml =
      "pipeline: { device: cuda }\n"
      "nodes:\n" +
      idx_load_line(images, labels) + "  - { name: train, type: mlp, params: { hidden: [8] } }\n";
  Pipeline p(load_config_string(yaml, r), r);
  EXPECT_EQ(error_of<NodeError>([&] { p.run(); }),
            "node 'train' (mlp, <string>:4) batch 0 (epoch 0): mlp (cuda): the batch is not on "
            "the device (no ready event) put a cuda_upload node before the train node");
}

TEST(MlpNodeCudaConfigs, MnistLikeTrainsFashionMnistOnTheGpu) {
  FLOWFEED_REQUIRE_GPU();
  // The GPU machine has no Debian packages: FLOWFEED_FASHION_MNIST_DIR points at carried copies.
  const char* env = std::getenv("FLOWFEED_FASHION_MNIST_DIR");
  const std::string data = env ? std::string(env) + "/" : "/usr/share/datasets/fashion-mnist/";
  if (!std::ifstream(data + "train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "Fashion-MNIST not installed at " << data
                 << " (set FLOWFEED_FASHION_MNIST_DIR to a folder with its four .gz files)";
  }
  Registry r;
  register_builtin_nodes(r);
  const PipelineConfig config =
      load_config_file(std::string(FLOWFEED_SOURCE_DIR) + "/configs/mnist_like.yaml", r,
                       {"nodes.load.params.images=" + data + "train-images-idx3-ubyte.gz",
                        "nodes.load.params.labels=" + data + "train-labels-idx1-ubyte.gz",
                        "nodes.train.params.eval_images=" + data + "t10k-images-idx3-ubyte.gz",
                        "nodes.train.params.eval_labels=" + data + "t10k-labels-idx1-ubyte.gz"});
  ASSERT_EQ(config.backend, Backend::cuda);
  Pipeline p(config, r);
  const RunReport report = p.run();
  EXPECT_EQ(report.nodes.back().type, "mlp");
  EXPECT_EQ(report.nodes[2].type, "cuda_upload");
  EXPECT_GE(report.train.accuracy, 0.85);
  EXPECT_EQ(report.train.epochs.size(), 10u);
  EXPECT_EQ(report.allocations_after_build, 0u);
  // Streamed: the device holds the upload pool's prefetch_depth batches, not the data set.
  // 8 buffers of x (64 x 784 float32 = 200,704 bytes) and y (64 int32, padded to 256).
  EXPECT_EQ(report.device_pool_bytes, 8u * 200960u);
}

}  // namespace
}  // namespace flowfeed
