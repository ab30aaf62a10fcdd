// The mlp train node wired into the graph on the host backend: it learns Fashion-MNIST, reports
// per-epoch figures, trains resident exactly as streamed, and fails with full messages.
#include "flowfeed/mlp/mlp_node.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/detail/idx_file.hpp"
#include "flowfeed/nodes/resident.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/mlp_registry.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

const std::string kFashion = "/usr/share/datasets/fashion-mnist/";

bool have_fashion() {
  struct stat st {};
  return stat((kFashion + "train-images-idx3-ubyte.gz").c_str(), &st) == 0;
}

/// Writes the first `count` samples of a Fashion-MNIST split as plain IDX files.
std::pair<std::string, std::string> fashion_subset(const TempDir& dir, const std::string& split,
                                                   std::size_t count) {
  IdxDataset d = load_idx_dataset(kFashion + split + "-images-idx3-ubyte.gz",
                                  kFashion + split + "-labels-idx1-ubyte.gz", 10);
  IdxPair p;
  p.count = count;
  p.rows = d.rows;
  p.cols = d.cols;
  p.images.assign(d.images.begin(), d.images.begin() + static_cast<std::ptrdiff_t>(count * 784));
  p.labels.assign(d.labels.begin(), d.labels.begin() + static_cast<std::ptrdiff_t>(count));
  return write_idx_pair(dir, p, split, false);
}

std::string train_chain(const std::string& images, const std::string& labels,
                        const std::string& train_params, int epochs,
                        const std::string& load_params = "") {
  return "pipeline: { epochs: " + std::to_string(epochs) +
         ", batch_size: 64, prefetch_depth: 4, device: host }\n"
         "sampler: { shuffle: true, seed: 42 }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: idx\n"
         "    concurrency: 2\n"
         "    params: { images: " +
         images + ", labels: " + labels + load_params +
         " }\n"
         "  - { name: stage, type: host_staging }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - name: train\n"
         "    type: mlp\n"
         "    params: { " +
         train_params + " }\n";
}

TEST(MlpNode, LearnsAFashionMnistSubset) {
  if (!have_fashion()) GTEST_SKIP() << "Fashion-MNIST not installed at " << kFashion;
  TempDir dir;
  const auto [images, labels] = fashion_subset(dir, "train", 12000);
  const auto [test_images, test_labels] = fashion_subset(dir, "t10k", 2000);
  Registry r;
  register_builtin_nodes(r);
  Pipeline p(load_config_string(train_chain(images, labels,
                                            "lr: 0.01, momentum: 0.9, eval_images: " + test_images +
                                                ", eval_labels: " + test_labels,
                                            3, ", dtype: uint8"),
                                r),
             r);
  const RunReport report = p.run();
  EXPECT_EQ(report.batches, 3u * 188u);
  ASSERT_EQ(report.train.epochs.size(), 3u);
  for (std::size_t e = 0; e < 3; ++e) {
    const auto& row = report.train.epochs[e];
    EXPECT_EQ(row.at("epoch"), static_cast<double>(e + 1));
    EXPECT_EQ(row.at("steps"), 188.0);
    EXPECT_GT(row.at("steps_per_second"), 0.0);
    EXPECT_GT(row.at("test_accuracy"), 0.70) << "epoch " << e + 1;
  }
  // Training loss falls, and the model classifies held-out images far above chance (0.1).
  EXPECT_LT(report.train.epochs[2].at("loss"), report.train.epochs[0].at("loss"));
  EXPECT_GT(report.train.accuracy, 0.78);
  EXPECT_EQ(report.train.accuracy, report.train.epochs[2].at("test_accuracy"));
  EXPECT_EQ(report.train.test_loss, report.train.epochs[2].at("test_loss"));
  EXPECT_EQ(report.train.loss, report.train.epochs[2].at("loss"));
  EXPECT_GT(report.train.steps_per_second, 0.0);
  EXPECT_GE(report.train.stall_fraction, 0.0);
  EXPECT_LT(report.train.stall_fraction, 1.0);
  EXPECT_EQ(report.allocations_after_build, 0u);

  const auto json = nlohmann::json::parse(report.to_json());
  EXPECT_EQ(json["train"]["accuracy"].get<double>(), report.train.accuracy);
  EXPECT_EQ(json["train"]["loss"].get<double>(), report.train.loss);
  EXPECT_EQ(json["train"]["test_loss"].get<double>(), report.train.test_loss);
  EXPECT_EQ(json["train"]["epochs"].size(), 3u);
  EXPECT_EQ(json["train"]["epochs"][1]["test_accuracy"].get<double>(),
            report.train.epochs[1].at("test_accuracy"));
}

TEST(MlpNode, EvaluatesEveryNthEpochAndAfterTheLast) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(256, 4, 4, 10), "a", false);
  Registry r;
  register_builtin_nodes(r);
  Pipeline p(load_config_string(train_chain(images, labels,
                                            "hidden: [8], eval_every: 2, eval_images: " + images +
                                                ", eval_labels: " + labels,
                                            5),
                                r),
             r);
  const RunReport report = p.run();
  ASSERT_EQ(report.train.epochs.size(), 5u);
  for (std::size_t e = 0; e < 5; ++e) {
    EXPECT_EQ(report.train.epochs[e].count("test_accuracy"), e == 1 || e == 3 || e == 4 ? 1u : 0u)
        << "epoch " << e + 1;
  }
  // A second run on the same pipeline reports only its own epochs.
  EXPECT_EQ(p.run().train.epochs.size(), 5u);
}

TEST(MlpNode, ResidentTrainsExactlyAsStreamed) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(300, 6, 6, 10), "a", true);
  std::vector<MlpNode*> nodes;
  Registry r = registry_keeping(&nodes);
  const PipelineConfig streamed = load_config_string(
      train_chain(images, labels, "hidden: [16, 12], lr: 0.02, momentum: 0.5", 3), r);
  const PipelineConfig resident = resident_config(streamed, r);
  ASSERT_EQ(resident.nodes.size(), 2u);
  EXPECT_EQ(resident.nodes[0].name, "load");
  EXPECT_TRUE(resident.nodes[0].params.get_bool("resident"));
  EXPECT_EQ(resident.nodes[1].name, "train");

  Pipeline ps(streamed, r);
  Pipeline pr(resident, r);
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_FALSE(nodes[0]->resident());
  EXPECT_TRUE(nodes[1]->resident());
  const RunReport a = ps.run();
  const RunReport b = pr.run();
  ASSERT_EQ(a.train.epochs.size(), 3u);
  ASSERT_EQ(b.train.epochs.size(), 3u);
  for (std::size_t e = 0; e < 3; ++e) {
    EXPECT_EQ(a.train.epochs[e].at("loss"), b.train.epochs[e].at("loss")) << "epoch " << e + 1;
    EXPECT_EQ(a.train.epochs[e].at("accuracy"), b.train.epochs[e].at("accuracy"));
  }
  const MlpParams pa = nodes[0]->params();
  const MlpParams pb = nodes[1]->params();
  EXPECT_EQ(pa.weights, pb.weights);
  EXPECT_EQ(pa.biases, pb.biases);
  // Nothing was uploaded in resident mode: batches carried sample indices only.
  EXPECT_GT(a.bytes_uploaded, 0u);
  EXPECT_EQ(b.bytes_uploaded, 0u);
  EXPECT_EQ(b.samples, a.samples);
}

TEST(MlpNode, SameSeedSameInitialWeights) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(64, 4, 4, 10), "a", false);
  std::vector<MlpNode*> nodes;
  Registry r = registry_keeping(&nodes);
  Pipeline p(load_config_string(train_chain(images, labels, "hidden: [8], seed: 7", 1), r), r);
  MlpOptions o;
  o.inputs = 16;
  o.hidden = {8};
  o.seed = 7;
  const MlpParams init = init_mlp_params(o);
  EXPECT_EQ(nodes.at(0)->params().weights, init.weights);
  EXPECT_STREQ(nodes.at(0)->backend_name(), "host");
}

std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  Registry r;
  register_builtin_nodes(r);
  return error_of<ConfigError>([&] { Pipeline p(load_config_string(yaml, r, overrides), r); });
}

TEST(MlpNode, EvalImagesWithoutLabels) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(64, 4, 4, 10), "a", false);
  EXPECT_EQ(config_error(train_chain(images, labels, "eval_images: " + images, 1)),
            "<string>:12:28: nodes.train.params.eval_labels: missing (eval_images is set, and "
            "evaluation needs both files) set eval_labels too, or neither");
}

TEST(MlpNode, RejectsFloat16Inputs) {
  const std::string yaml =
      "pipeline: { device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 2, dtype: float16 } }\n"
      "  - { name: train, type: mlp }\n";
  EXPECT_EQ(config_error(yaml),
            "<string>:4:5: nodes.train.type: mlp takes x as float32 or uint8, the loader gives "
            "float16 (convert the data, or set the loader's dtype)");
}

TEST(MlpNode, ResidentNeedsOrderedBatches) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(64, 4, 4, 10), "a", false);
  const std::string yaml =
      "pipeline: { device: host, ordered: false }\n"
      "nodes:\n" +
      idx_load_line(images, labels, ", resident: true") + "  - { name: train, type: mlp }\n";
  EXPECT_EQ(config_error(yaml),
            "<string>:4:5: nodes.train.type: resident training takes batches in the sampler's "
            "order (pipeline.ordered is false) set pipeline.ordered: true");
}

TEST(MlpNode, ResidentNeedsAnInMemoryLoaderAndTheMlp) {
  Registry r;
  register_builtin_nodes(r);
  const std::string yaml =
      "pipeline: { device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 2 } }\n"
      "  - { name: train, type: discard }\n";
  const PipelineConfig config = load_config_string(yaml, r);
  EXPECT_EQ(error_of<ConfigError>([&] { resident_config(config, r); }),
            "<string>:3:5: nodes.load.type: resident mode needs a loader that holds the data set "
            "in memory ('synthetic' does not) use the idx loader\n"
            "<string>:4:5: nodes.train.type: resident mode trains with mlp ('discard' cannot take "
            "a resident data set)");
}

TEST(MlpNode, LabelOutsideTheClassesFailsItsBatch) {
  // Synthetic labels in [0, 12) against a 10-class model: the first label >= 10 fails its batch.
  const std::string yaml =
      "pipeline: { batch_size: 16, prefetch_depth: 2, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 4, sample_shape: [5], seed: 3, "
      "classes: 12 } }\n"
      "  - { name: train, type: mlp, params: { hidden: [4] } }\n";
  std::size_t first_bad = 0;
  while (synthetic_label(3, first_bad, 12) < 10) ++first_bad;
  ASSERT_LT(first_bad, 64u);
  Registry r;
  register_builtin_nodes(r);
  Pipeline p(load_config_string(yaml, r), r);
  EXPECT_EQ(error_of<NodeError>([&] { p.run(); }),
            "node 'train' (mlp, <string>:4) batch " + std::to_string(first_bad / 16) +
                " (epoch 0): MlpCpu: label " + std::to_string(synthetic_label(3, first_bad, 12)) +
                " at row " + std::to_string(first_bad % 16) + " is out of range [0, 10)");
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
}

TEST(MlpNode, BadEvalFileNamesTheNodeAndTheFile) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(64, 4, 4, 10), "a", false);
  const std::string missing = dir.file("t10k-labels");
  Registry r;
  register_builtin_nodes(r);
  const PipelineConfig config = load_config_string(
      train_chain(images, labels, "eval_images: " + images + ", eval_labels: " + missing, 1), r);
  EXPECT_EQ(
      error_of<DataError>([&] { Pipeline p(config, r); }),
      "node 'train' (mlp, <string>:10): " + missing + ": cannot open (No such file or directory)");
}

TEST(MlpNode, EvalImagesOfAnotherShape) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(64, 4, 4, 10), "a", false);
  const auto [other, other_labels] = write_idx_pair(dir, make_idx_pair(10, 5, 5, 10), "b", false);
  Registry r;
  register_builtin_nodes(r);
  const PipelineConfig config = load_config_string(
      train_chain(images, labels, "eval_images: " + other + ", eval_labels: " + other_labels, 1),
      r);
  EXPECT_EQ(error_of<DataError>([&] { Pipeline p(config, r); }),
            "node 'train' (mlp, <string>:10): " + other +
                ": test images have 25 pixels each but the training samples 16 (evaluate on "
                "images of the training shape)");
}

struct RunnerResult {
  int code;
  std::string output;
};

RunnerResult run_runner(const std::string& args) {
  const std::string cmd = std::string(FLOWFEED_RUNNER) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

TEST(MlpNode, RunnerPrintsEpochsAndTheResidentRatio) {
  TempDir dir;
  const auto [images, labels] = write_idx_pair(dir, make_idx_pair(200, 4, 4, 10), "a", false);
  const std::string path = dir.file("train.yaml");
  write_bytes(
      path,
      [&] {
        const std::string yaml = train_chain(
            images, labels, "hidden: [8], eval_images: " + images + ", eval_labels: " + labels, 2);
        return Bytes(yaml.begin(), yaml.end());
      }(),
      false);
  const std::string report = dir.file("report.json");
  const RunnerResult r = run_runner(path + " --compare-resident --report " + report);
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* line : {"streamed: epoch 1: train loss ", "streamed: epoch 2: train loss ",
                           "resident: epoch 1: train loss ", "resident: epoch 2: train loss ",
                           "streamed / resident training throughput: "}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
  EXPECT_NE(r.output.find(" | test loss "), std::string::npos) << r.output;
  std::ifstream in(report);
  const auto json = nlohmann::json::parse(in);
  EXPECT_GT(json["extra"]["streamed_over_resident"].get<double>(), 0.0);
  EXPECT_EQ(json["train"]["epochs"].size(), 2u);
}

}  // namespace
}  // namespace flowfeed
