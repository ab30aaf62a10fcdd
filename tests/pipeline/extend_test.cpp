// Custom node types: subclasses and callables registered by name, chosen from YAML, replacing
// built-ins; their schemas; transforms between staging and upload and after upload.
#include "flowfeed/extend.hpp"

#include <gtest/gtest.h>
#include <oneapi/tbb/info.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/error_of.hpp"
#include "tests/pipeline/int32_loader.hpp"

namespace flowfeed {
namespace {

/// Sample s: x = {s, 2s, 3s} as int32 (scaled by `scale`), y = s % 2.
class TripleLoader final : public Int32Loader {
 public:
  explicit TripleLoader(const Params& params)
      : Int32Loader(
            static_cast<std::size_t>(params.get_int("samples")),
            [scale = static_cast<std::int32_t>(params.get_int("scale"))](std::int32_t s, int j) {
              return scale * s * (j + 1);
            },
            [](std::int32_t s) { return s % 2; }) {}
  static Schema schema() {
    Schema s;
    s.add_int("samples", "data set size").range(1, 1e6).make_required();
    s.add_int("scale", "multiplies x", 1).range(1, 100);
    s.add_string("order", "row order", std::string("plain")).one_of({"plain", "reversed"});
    s.add_bool("verbose", "say more", false);
    return s;
  }
};

/// Records x[r][0] and y[r] of every row it sees, from the newest tier.
struct Seen {
  std::mutex mutex;
  std::vector<std::int64_t> values;
};

class Recorder final : public Node {
 public:
  explicit Recorder(Seen* seen) : seen_(seen) {}
  void process(Batch& batch) override {
    const Tier tier = batch.newest_tier();
    const auto* x = reinterpret_cast<const std::int32_t*>(batch.tensor(tier, 0));
    const auto* y = reinterpret_cast<const std::int32_t*>(batch.tensor(tier, 1));
    std::lock_guard<std::mutex> lock(seen_->mutex);
    for (std::size_t r = 0; r < batch.rows(); ++r) {
      seen_->values.push_back(x[r * 3] * 10 + y[r]);
    }
  }

 private:
  Seen* seen_;
};

Registry with_custom_types(Seen* seen) {
  Registry r;
  register_builtin_nodes(r);
  r.add(node_type<TripleLoader>("triple", Role::load, TripleLoader::schema(), "x = s, 2s, 3s"));
  NodeType recorder;
  recorder.name = "tally";
  recorder.role = Role::train;
  recorder.create = [seen](const NodeSpec&) { return std::make_unique<Recorder>(seen); };
  r.add(std::move(recorder));
  return r;
}

std::vector<std::string> problems_of(const std::string& yaml, const Registry& registry) {
  return test::problems_of([&] { load_config_string(yaml, registry, {}, "custom.yaml"); });
}

TEST(CustomTypes, AreChosenFromYaml) {
  Seen seen;
  Registry registry = with_custom_types(&seen);
  PipelineConfig config = load_config_string(R"(
pipeline: { batch_size: 4 }
nodes:
  - { name: load, type: triple, concurrency: 2, params: { samples: 10, scale: 3 } }
  - { name: stage, type: host_staging }
  - { name: upload, type: host_upload }
  - { name: train, type: tally }
)",
                                             registry, {}, "custom.yaml");
  EXPECT_EQ(config.nodes[0].params.get_string("order"), "plain");  // the custom default
  EXPECT_EQ(config.nodes[0].role, Role::load);
  Pipeline pipeline(std::move(config), registry);
  RunReport report = pipeline.run();
  EXPECT_EQ(report.batches, 3u);
  std::vector<std::int64_t> expected;
  for (int s = 0; s < 10; ++s) expected.push_back(3 * s * 10 + s % 2);
  EXPECT_EQ(seen.values, expected);
}

TEST(CustomTypes, ACustomSchemaReportsLikeABuiltIn) {
  Seen seen;
  Registry registry = with_custom_types(&seen);
  std::vector<std::string> p = problems_of(R"(nodes:
  - name: load
    type: triple
    params:
      scale: 500
      ordr: reversed
      verbose: maybe
  - { name: train, type: tally, params: { depth: 2 } }
)",
                                           registry);
  std::vector<std::string> expected = {
      "custom.yaml:5:14: nodes[0].params.scale: 500 is out of range (must be between 1 and 100)",
      "custom.yaml:6:7: nodes[0].params.ordr: unknown key (did you mean 'order'?)",
      "custom.yaml:7:16: nodes[0].params.verbose: expected true or false, got 'maybe'",
      "custom.yaml:5:7: nodes[0].params.samples: missing required key (data set size)",
      "custom.yaml:8:43: nodes[1].params.depth: unknown key (this takes no keys)",
  };
  EXPECT_EQ(p, expected);
  p = problems_of(R"(nodes:
  - { name: load, type: triple, params: { samples: 3, order: reversd } }
  - { name: train, type: tallly }
)",
                  registry);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0],
            "custom.yaml:2:62: nodes[0].params.order: 'reversd' is not one of plain, reversed "
            "(did you mean 'reversed'?)");
  std::string known;
  for (const auto& name : registry.names()) known += (known.empty() ? "" : ", ") + name;
  EXPECT_EQ(p[1],
            "custom.yaml:3:26: nodes[1].type: unknown node type 'tallly' (did you mean "
            "'tally'? known types: " +
                known + ")");
}

TEST(CustomTypes, ReplaceABuiltInByName) {
  Registry registry;
  register_builtin_nodes(registry);
  std::atomic<std::uint64_t> rows{0};
  // Every config that says `type: checksum` now gets this train step.
  registry.set(callable_type(
      "checksum", Role::train, [&rows](Batch& b) { rows += b.rows(); }, "counts rows"));
  EXPECT_EQ(registry.find("checksum")->doc, "counts rows");
  PipelineConfig config = load_config_string(R"(
pipeline: { batch_size: 8, device: host }
nodes:
  - { name: load, type: synthetic, params: { samples: 100 } }
  - { name: train, type: checksum }
)",
                                             registry);
  Pipeline pipeline(std::move(config), registry);
  EXPECT_EQ(pipeline.run().batches, 13u);
  EXPECT_EQ(rows.load(), 100u);
  // add() refuses to replace silently.
  EXPECT_EQ(test::error_of<std::invalid_argument>(
                [&] { registry.add(callable_type("checksum", Role::train, [](Batch&) {})); }),
            "node type 'checksum' is already registered (use Registry::set to replace it)");
}

TEST(CustomTypes, CallableWithParamsIsMadeOncePerPipeline) {
  Registry registry;
  register_builtin_nodes(registry);
  std::atomic<int> made{0};
  std::atomic<std::int64_t> total{0};
  Schema schema;
  schema.add_int("weight", "added per row", 1).range(0, 1000);
  registry.add(callable_type("weigh", Role::train, schema, [&](const Params& params) -> ProcessFn {
    ++made;
    const std::int64_t w = params.get_int("weight");
    return [&total, w](Batch& b) { total += w * static_cast<std::int64_t>(b.rows()); };
  }));
  PipelineConfig config = load_config_string(R"(
pipeline: { batch_size: 10 }
nodes:
  - { name: load, type: synthetic, params: { samples: 25, sample_shape: [2] } }
  - { name: train, type: weigh, params: { weight: 7 } }
)",
                                             registry);
  Pipeline pipeline(std::move(config), registry);
  EXPECT_EQ(made.load(), 1);
  pipeline.run();
  pipeline.run();
  EXPECT_EQ(made.load(), 1);
  EXPECT_EQ(total.load(), 2 * 7 * 25);
}

class Noop final : public Node {
 public:
  void process(Batch&) override {}
};

TEST(CustomTypes, LoadTypesMustBeLoaders) {
  EXPECT_EQ(test::error_of<std::invalid_argument>([&] { node_type<Noop>("rec", Role::load); }),
            "node type 'rec': a load type must derive from flowfeed::LoaderNode");
  EXPECT_THROW(callable_type("fn", Role::load, [](Batch&) {}), std::invalid_argument);
  EXPECT_THROW(CallableNode(ProcessFn{}), std::invalid_argument);
}

/// Transforms on either side of the upload, as a user writes them: normalization of the staged
/// host bytes before the copy, and a second step on the uploaded bytes after it.
TEST(CustomTypes, TransformsRunBetweenStagingAndUploadAndAfterUpload) {
  Registry registry;
  register_builtin_nodes(registry);
  std::atomic<int> before_tier_ok{0}, after_tier_ok{0};
  Schema affine;
  affine.add_number("shift", "subtracted first", 0.0);
  affine.add_number("scale", "then multiplied", 1.0);
  registry.add(
      callable_type("affine", Role::transform, affine, [&](const Params& params) -> ProcessFn {
        const auto shift = static_cast<float>(params.get_number("shift"));
        const auto scale = static_cast<float>(params.get_number("scale"));
        return [&, shift, scale](Batch& b) {
          // Between staging and upload the batch sits in its staging buffer, nothing newer.
          if (b.staging && !b.device && !b.host) ++before_tier_ok;
          auto* x = reinterpret_cast<float*>(b.tensor(Tier::staging, 0));
          const std::size_t n = b.rows() * b.layout->tensors()[0].sample_elements();
          for (std::size_t i = 0; i < n; ++i) x[i] = (x[i] - shift) * scale;
        };
      }));
  registry.add(callable_type("negate", Role::transform, [&](Batch& b) {
    if (b.device && !b.staging && !b.host) ++after_tier_ok;
    auto* x = reinterpret_cast<float*>(b.tensor(Tier::device, 0));
    const std::size_t n = b.rows() * b.layout->tensors()[0].sample_elements();
    for (std::size_t i = 0; i < n; ++i) x[i] = -x[i];
  }));
  std::vector<float> got;
  std::mutex mutex;
  registry.add(callable_type("collect", Role::train, [&](Batch& b) {
    const auto* x = reinterpret_cast<const float*>(b.tensor(Tier::device, 0));
    std::lock_guard<std::mutex> lock(mutex);
    got.insert(got.end(), x, x + b.rows() * 5);
  }));
  PipelineConfig config = load_config_string(R"(
pipeline: { batch_size: 16, prefetch_depth: 4, device: host }
nodes:
  - { name: load, type: synthetic, params: { samples: 40, sample_shape: [5], seed: 9 } }
  - { name: stage, type: host_staging }
  - { name: normalize, type: affine, concurrency: 2, params: { shift: 0.5, scale: 4 } }
  - { name: upload, type: host_upload }
  - { name: flip, type: negate }
  - { name: train, type: collect }
)",
                                             registry);
  for (const int transform : {2, 4}) EXPECT_EQ(config.nodes[transform].role, Role::transform);
  Pipeline pipeline(std::move(config), registry);
  RunReport report = pipeline.run();
  EXPECT_EQ(report.batches, 3u);
  EXPECT_EQ(before_tier_ok.load(), 3);
  EXPECT_EQ(after_tier_ok.load(), 3);
  ASSERT_EQ(got.size(), 40u * 5);
  for (std::uint32_t s = 0; s < 40; ++s) {
    float raw[5];
    synthetic_fill(9, s, DType::float32, 5, raw);
    for (int j = 0; j < 5; ++j) {
      ASSERT_EQ(got[s * 5 + j], -((raw[j] - 0.5f) * 4.0f)) << "sample " << s << " element " << j;
    }
  }
}

/// Keeps what its BuildContext said about where batches arrive and the threads.
class ContextProbe final : public Node {
 public:
  ContextProbe(std::vector<std::pair<Tier, int>>* seen) : seen_(seen) {}
  void setup(BuildContext& context) override {
    seen_->emplace_back(context.input().tier, context.threads());
  }
  void process(Batch&) override {}

 private:
  std::vector<std::pair<Tier, int>>* seen_;
};

TEST(CustomTypes, TheBuildContextSaysWhereBatchesArriveAndHowManyThreadsRun) {
  Registry registry;
  register_builtin_nodes(registry);
  std::vector<std::pair<Tier, int>> seen;
  for (Role role : {Role::transform, Role::upload}) {
    registry.set(
        factory_type(role == Role::upload ? "probe_upload" : "probe", role, {},
                     [&seen](const NodeSpec&) { return std::make_unique<ContextProbe>(&seen); }));
  }
  const std::string head =
      "pipeline: { batch_size: 8, prefetch_depth: 2, device: host, threads: 3 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { samples: 16, sample_shape: [4] } }\n"
      "  - { name: early, type: probe }\n";
  Pipeline(load_config_string(head + "  - { name: stage, type: host_staging }\n"
                                     "  - { name: late, type: probe }\n"
                                     "  - { name: upload, type: probe_upload }\n"
                                     "  - { name: train, type: discard }\n",
                              registry),
           registry);
  EXPECT_EQ(seen, (std::vector<std::pair<Tier, int>>{
                      {Tier::host, 3}, {Tier::staging, 3}, {Tier::staging, 3}}));
  seen.clear();
  Pipeline(load_config_string(head + "  - { name: upload, type: probe_upload }\n"
                                     "  - { name: train, type: discard }\n",
                              registry, {"pipeline.threads=0"}),
           registry);
  EXPECT_EQ(seen,
            (std::vector<std::pair<Tier, int>>{{Tier::host, tbb::info::default_concurrency()},
                                               {Tier::host, tbb::info::default_concurrency()}}));
}

TEST(CustomTypes, ATransformCannotGoBeforeTheLoader) {
  Registry registry;
  register_builtin_nodes(registry);
  registry.add(callable_type("noop", Role::transform, [](Batch&) {}));
  const std::vector<std::string> problems = test::problems_of([&] {
    load_config_string(R"(nodes:
  - { name: t, type: noop }
  - { name: load, type: synthetic }
  - { name: train, type: sleep }
)",
                       registry, {}, "order.yaml");
  });
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0],
            "order.yaml:2:22: nodes[0].type: the first node must be a load node, 't' is a "
            "transform node (the chain is load → transform* → staging → upload → transform* → "
            "train)");
}

}  // namespace
}  // namespace flowfeed
