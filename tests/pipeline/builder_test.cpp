#include "flowfeed/builder.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <limits>

#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "tests/error_of.hpp"
#include "tests/pipeline/int32_loader.hpp"

namespace flowfeed {
namespace {

std::string at(int line) {
  return std::string(__FILE__) + ":" + std::to_string(line);
}

using test::problems_of;

TEST(PipelineBuilder, BuildsAndRunsWithoutYaml) {
  Registry registry = builtin_registry();
  // The host types themselves (with device: auto a GPU would swap them for their CUDA ones).
  Pipeline pipeline = PipelineBuilder()
                          .epochs(2)
                          .batch_size(64)
                          .prefetch_depth(8)
                          .device(DeviceChoice::host)
                          .load("synthetic", {{"samples", 1000}, {"sample_shape", {4, 4}}})
                          .stage("host_staging")
                          .upload("host_upload")
                          .train("checksum")
                          .build(registry);
  const PipelineConfig& c = pipeline.config();
  ASSERT_EQ(c.nodes.size(), 4u);
  EXPECT_EQ(c.nodes[0].name, "load");
  EXPECT_EQ(c.nodes[1].name, "stage");
  EXPECT_EQ(c.nodes[2].name, "upload");
  EXPECT_EQ(c.nodes[3].name, "train");
  EXPECT_EQ(c.nodes[0].params.get_int_list("sample_shape"), (std::vector<std::int64_t>{4, 4}));
  EXPECT_EQ(c.nodes[0].params.get_string("dtype"), "float32");  // the schema's default
  EXPECT_EQ(c.pipeline.epochs, 2);
  EXPECT_EQ(c.file, "<c++>");

  RunReport report = pipeline.run();
  // 1000 samples in batches of 64: 15 full and one of 40, twice.
  EXPECT_EQ(report.batches, 32u);
  EXPECT_EQ(report.samples, 2000u);
  // checksum verified every byte of x and y of every sample that arrived.
  EXPECT_EQ(report.extra.at("checksum_bytes_verified"), 2.0 * 1000 * (16 * 4 + 4));
  EXPECT_LE(report.max_in_flight, 8);
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(PipelineBuilder, TypedOptionsReachTheConfig) {
  Registry registry = builtin_registry();
  PipelineConfig c = PipelineBuilder()
                         .name("trainer")
                         .epochs(3)
                         .prefetch_depth(4)
                         .ordered(false)
                         .device(DeviceChoice::host)
                         .threads(2)
                         .stall_timeout(5)
                         .on_error(OnError::skip, 7)
                         .shuffle(42)
                         .drop_last()
                         .shard(1, 2)
                         .load("synthetic", {{"batches", 10}})
                         .named("reader")
                         .concurrency(3)
                         .train("discard")
                         .config(registry);
  EXPECT_EQ(c.file, "trainer");
  EXPECT_EQ(c.pipeline.epochs, 3);
  EXPECT_EQ(c.pipeline.prefetch_depth, 4);
  EXPECT_FALSE(c.pipeline.ordered);
  EXPECT_EQ(c.pipeline.device, DeviceChoice::host);
  EXPECT_EQ(c.backend, Backend::host);
  EXPECT_EQ(c.pipeline.threads, 2);
  EXPECT_EQ(c.pipeline.stall_timeout_s, 5.0);
  EXPECT_EQ(c.pipeline.on_error, OnError::skip);
  EXPECT_EQ(c.pipeline.max_skipped, 7);
  EXPECT_TRUE(c.sampler.shuffle);
  EXPECT_EQ(c.sampler.seed, 42u);
  EXPECT_TRUE(c.sampler.drop_last);
  EXPECT_EQ(c.sampler.rank, 1);
  EXPECT_EQ(c.sampler.world, 2);
  EXPECT_EQ(c.nodes[0].name, "reader");
  EXPECT_EQ(c.nodes[0].concurrency, 3);
  EXPECT_EQ(c.nodes[0].role, Role::load);
  EXPECT_EQ(c.nodes[1].role, Role::train);
}

TEST(PipelineBuilder, ReportsEveryProblemAtTheCallThatMadeIt) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  const int l_depth = __LINE__ + 1;
  b.prefetch_depth(0);
  const int l_shard = __LINE__ + 1;
  b.shard(2, 2);
  const int l_load = __LINE__ + 1;
  b.load("synthetic", {{"sampels", 1000}, {"dtype", "float64"}, {"delay_ms", "slow"}});
  const int l_stage = __LINE__ + 1;
  b.stage("host_staging").concurrency(0);
  const int l_train = __LINE__ + 1;
  b.train("chekcsum");
  std::vector<std::string> p = problems_of([&] { b.config(registry); });
  std::string known;
  for (const auto& name : registry.names()) known += (known.empty() ? "" : ", ") + name;
  std::vector<std::string> expected = {
      at(l_depth) + ": pipeline.prefetch_depth: 0 is out of range (must be between 1 and 4096)",
      at(l_stage) + ": nodes[1].concurrency: 0 is out of range (must be between 1 and 4096)",
      at(l_load) + ": nodes[0].params.delay_ms: expected a number, got 'slow'",
      at(l_load) +
          ": nodes[0].params.dtype: 'float64' is not one of float32, float16, uint8, int32, int64 "
          "(did you mean 'float32'?)",
      at(l_load) + ": nodes[0].params.sampels: unknown key (did you mean 'samples'?)",
      at(l_train) + ": nodes[2].type: unknown node type 'chekcsum' (did you mean 'checksum'? " +
          "known types: " + known + ")",
      at(l_shard) + ": sampler.rank: 2 is out of range (rank must be below world = 2)",
  };
  EXPECT_EQ(p, expected);
}

TEST(PipelineBuilder, ChecksNodeSettingsAndParamValues) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  const int l_load = __LINE__ + 1;
  b.load("synthetic", {{"batches", 0}, {"sample_shape", {28, -1}}}).concurrency(0);
  const int l_train = __LINE__ + 1;
  b.train("sleep", {{"ms", 1.5}}).concurrency(2);
  std::vector<std::string> p = problems_of([&] { b.config(registry); });
  std::vector<std::string> expected = {
      at(l_load) + ": nodes[0].concurrency: 0 is out of range (must be between 1 and 4096)",
      at(l_load) +
          ": nodes[0].params.batches: 0 is out of range (must be between 1 and "
          "1000000000000)",
      at(l_load) +
          ": nodes[0].params.sample_shape[1]: -1 is out of range (must be between 1 and "
          "1000000000)",
      at(l_train) +
          ": nodes[1].concurrency: a train node runs serially (concurrency must be 1, "
          "got 2)",
  };
  EXPECT_EQ(p, expected);
}

/// A train step that checks each row's first x element against the synthetic formula.
class FirstElementCheck final : public Node {
 public:
  void process(Batch& batch) override {
    const auto* x = reinterpret_cast<const float*>(batch.tensor(batch.newest_tier(), 0));
    const std::size_t elements = batch.layout->tensors()[0].sample_elements();
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      float expected[16];
      synthetic_fill(0, batch.samples[r], DType::float32, elements, expected);
      if (std::memcmp(&expected[0], &x[r * elements], sizeof(float)) != 0) {
        throw Error("row " + std::to_string(r) + " differs");
      }
    }
    rows_ += batch.rows();
  }
  std::size_t rows() const { return rows_; }

 private:
  std::size_t rows_ = 0;
};

TEST(PipelineBuilder, TakesNodeObjectsWithoutARegistryEntry) {
  Registry registry = builtin_registry();
  std::atomic<std::size_t> transformed{0};
  auto check = std::make_unique<FirstElementCheck>();
  FirstElementCheck* check_ptr = check.get();
  // Host types: the check reads the batch's last buffer from the host.
  Pipeline pipeline = PipelineBuilder()
                          .batch_size(10)
                          .device(DeviceChoice::host)
                          .load("synthetic", {{"samples", 95}, {"sample_shape", {16}}})
                          .transform(make_node([&](Batch& b) { transformed += b.rows(); }))
                          .concurrency(2)
                          .stage("host_staging")
                          .upload("host_upload")
                          .train(std::move(check))
                          .build(registry);
  // The registry passed in is not changed: the objects live in the pipeline only.
  EXPECT_EQ(registry.names().size(), builtin_registry().names().size());
  const PipelineConfig& c = pipeline.config();
  EXPECT_EQ(c.nodes[1].name, "transform");
  EXPECT_EQ(c.nodes[1].type, "flowfeed::CallableNode");
  EXPECT_EQ(c.nodes[1].role, Role::transform);
  EXPECT_EQ(c.nodes[4].type, "flowfeed::(anonymous namespace)::FirstElementCheck");
  RunReport report = pipeline.run();
  EXPECT_EQ(report.batches, 10u);
  EXPECT_EQ(transformed.load(), 95u);
  EXPECT_EQ(check_ptr->rows(), 95u);
  EXPECT_EQ(report.nodes[4].type, "flowfeed::(anonymous namespace)::FirstElementCheck");
  // A pipeline may run again; its objects stay with it.
  report = pipeline.run();
  EXPECT_EQ(check_ptr->rows(), 190u);
}

TEST(PipelineBuilder, TwoObjectsOfOneClassGetDistinctTypeNames) {
  Registry registry = builtin_registry();
  PipelineConfig c;
  Pipeline pipeline = PipelineBuilder()
                          .load("synthetic", {{"batches", 2}})
                          .transform(make_node([](Batch&) {}))
                          .transform(make_node([](Batch&) {}))
                          .train("discard")
                          .build(registry);
  EXPECT_EQ(pipeline.config().nodes[1].name, "transform");
  EXPECT_EQ(pipeline.config().nodes[2].name, "transform_2");
  EXPECT_EQ(pipeline.config().nodes[1].type, "flowfeed::CallableNode");
  EXPECT_EQ(pipeline.config().nodes[2].type, "flowfeed::CallableNode #2");
  EXPECT_EQ(pipeline.run().batches, 2u);
}

/// A loader object: sample i has x = {i, i+1, i+2} as int32 and y = i % 3.
class CountingLoader final : public Int32Loader {
 public:
  CountingLoader()
      : Int32Loader(
            12, [](std::int32_t s, int j) { return s + j; }, [](std::int32_t s) { return s % 3; }) {
  }
};

TEST(PipelineBuilder, TakesALoaderObject) {
  Registry registry = builtin_registry();
  std::vector<std::int32_t> seen;
  Pipeline pipeline =
      PipelineBuilder()
          .batch_size(5)
          .load(std::make_unique<CountingLoader>())
          .train(make_node([&](Batch& b) {
            const auto* x = reinterpret_cast<const std::int32_t*>(b.tensor(Tier::host, 0));
            const auto* y = reinterpret_cast<const std::int32_t*>(b.tensor(Tier::host, 1));
            for (std::size_t r = 0; r < b.rows(); ++r) {
              seen.push_back(x[r * 3 + 2] * 10 + y[r]);
            }
          }))
          .build(registry);
  EXPECT_EQ(pipeline.run().batches, 3u);
  std::vector<std::int32_t> expected;
  for (int s = 0; s < 12; ++s) expected.push_back((s + 2) * 10 + s % 3);
  EXPECT_EQ(seen, expected);
}

TEST(PipelineBuilder, ObjectNodeFailuresNameTheBuilderLine) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  b.load("synthetic", {{"batches", 5}});
  const int l_train = __LINE__ + 1;
  b.train(make_node([](Batch& batch) {
    if (batch.seq == 3) throw Error("loss is NaN");
  }));
  Pipeline pipeline = b.build(registry);
  try {
    pipeline.run();
    FAIL() << "run() did not throw";
  } catch (const NodeError& e) {
    EXPECT_EQ(std::string(e.what()), "node 'train' (flowfeed::CallableNode, " + at(l_train) +
                                         ") batch 3 (epoch 0): loss is NaN");
    EXPECT_EQ(e.batch(), 3);
  }
  EXPECT_EQ(pipeline.free_buffers(), pipeline.total_buffers());
}

TEST(PipelineBuilder, ABuilderWithObjectsBuildsOnePipeline) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  b.load("synthetic", {{"batches", 1}}).train(make_node([](Batch&) {}));
  EXPECT_EQ(test::error_of<std::logic_error>([&] { b.config(registry); }),
            "PipelineBuilder::config: node 'train' is a C++ object, not a registered type, "
            "so the config cannot be built with this registry alone (use "
            "PipelineBuilder::build)");
  Pipeline first = b.build(registry);
  EXPECT_EQ(test::error_of<std::logic_error>([&] { b.build(registry); }),
            "PipelineBuilder::build: this builder's Node objects already belong to a pipeline "
            "(a builder that holds Node objects builds one pipeline)");
  EXPECT_EQ(first.run().batches, 1u);
}

TEST(PipelineBuilder, ABuilderOfRegisteredTypesBuildsAgain) {
  Registry registry = builtin_registry();
  PipelineBuilder b;
  b.load("synthetic", {{"batches", 3}}).train("discard");
  Pipeline one = b.build(registry);
  Pipeline two = b.build(registry);
  EXPECT_EQ(one.run().batches, 3u);
  EXPECT_EQ(two.run().batches, 3u);
}

TEST(PipelineBuilder, ParamArgConvertsLikeYaml) {
  EXPECT_EQ(std::get<std::int64_t>(ParamArg(7).value()), 7);
  EXPECT_EQ(std::get<std::int64_t>(ParamArg(std::size_t{9}).value()), 9);
  EXPECT_EQ(std::get<double>(ParamArg(0.5f).value()), 0.5);
  EXPECT_EQ(std::get<bool>(ParamArg(true).value()), true);
  EXPECT_EQ(std::get<std::string>(ParamArg("uint8").value()), "uint8");
  EXPECT_EQ(std::get<std::vector<std::int64_t>>(ParamArg({1, 2}).value()),
            (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(test::error_of<std::out_of_range>(
                [&] { ParamArg big(std::numeric_limits<unsigned long long>::max()); }),
            "parameter value 18446744073709551615 does not fit an int parameter (at most "
            "2^63-1)");
}

TEST(PipelineBuilder, PipelinesMove) {
  Registry registry = builtin_registry();
  Pipeline a =
      PipelineBuilder().load("synthetic", {{"batches", 4}}).train("discard").build(registry);
  Pipeline b = std::move(a);
  EXPECT_EQ(b.run().batches, 4u);
  Pipeline c =
      PipelineBuilder().load("synthetic", {{"batches", 2}}).train("discard").build(registry);
  c = std::move(b);
  EXPECT_EQ(c.run().batches, 4u);
}

}  // namespace
}  // namespace flowfeed
