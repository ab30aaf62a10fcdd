#include "flowfeed/config.hpp"

#include <gtest/gtest.h>

#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/registry.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

/// "a, b, c": every registered type, as an unknown-type error lists them.
std::string known_types() {
  std::string out;
  for (const auto& n : builtin_registry().names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

/// The whole message of the ConfigError that loading `yaml` throws.
std::string error_of(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  Registry r = builtin_registry();
  return test::error_of<ConfigError>([&] { load_config_string(yaml, r, overrides, "t.yaml"); });
}

const char* kGood = R"(pipeline:
  epochs: 2
  prefetch_depth: 4
  device: host
nodes:
  - name: load
    type: synthetic
    concurrency: 3
    params: { batches: 5, sample_shape: [4] }
  - name: train
    type: checksum
)";

TEST(Config, ParsesValuesAndFillsDefaults) {
  Registry r = builtin_registry();
  PipelineConfig c = load_config_string(kGood, r, {}, "t.yaml");
  EXPECT_EQ(c.pipeline.epochs, 2);
  EXPECT_EQ(c.pipeline.prefetch_depth, 4);
  EXPECT_TRUE(c.pipeline.ordered);
  EXPECT_EQ(c.backend, Backend::host);
  ASSERT_EQ(c.nodes.size(), 2u);
  EXPECT_EQ(c.nodes[0].concurrency, 3);
  EXPECT_EQ(c.nodes[0].role, Role::load);
  EXPECT_EQ(c.nodes[0].loc.str(), "t.yaml:6:5");
  EXPECT_EQ(c.nodes[0].params.get_int("batches"), 5);
  EXPECT_EQ(c.nodes[0].params.get_string("dtype"), "float32");  // default
  EXPECT_EQ(c.nodes[0].params.loc("batches").str(), "t.yaml:9:24");
}

TEST(Config, OverridesAddressNodesByName) {
  Registry r = builtin_registry();
  PipelineConfig c = load_config_string(
      kGood, r,
      {"nodes.load.concurrency=8", "pipeline.prefetch_depth=3", "nodes.load.params.delay_ms=2.5"},
      "t.yaml");
  EXPECT_EQ(c.nodes[0].concurrency, 8);
  EXPECT_EQ(c.pipeline.prefetch_depth, 3);
  EXPECT_DOUBLE_EQ(c.nodes[0].params.get_number("delay_ms"), 2.5);
}

TEST(Config, BadOverridesNameTheOverride) {
  EXPECT_EQ(error_of(kGood, {"nodes.lod.concurrency=8"}),
            "--set nodes.lod.concurrency=8: no node named 'lod' (did you mean 'load'?)");
  EXPECT_EQ(error_of(kGood, {"pipeline.epochs"}), "--set pipeline.epochs: expected key.path=value");
  EXPECT_EQ(error_of(kGood, {"nodes.load.concurrency=many"}),
            "--set nodes.load.concurrency=many: nodes[0].concurrency: expected an int or auto, got "
            "'many'");
}

TEST(Config, AnIntWithALeadingZeroIsCalledOctalOnlyWhenItIs) {
  // The message for --set pipeline.epochs=`value`, after its "--set ...: pipeline.epochs: ".
  const auto epochs = [](const std::string& value) {
    const std::string prefix = "--set pipeline.epochs=" + value + ": pipeline.epochs: ";
    const std::string message = error_of(kGood, {"pipeline.epochs=" + value});
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << message;
    return message.substr(std::min(prefix.size(), message.size()));
  };
  EXPECT_EQ(epochs("010"),
            "expected an int, got '010' (a leading zero would make YAML read it as octal) write it "
            "without the zero");
  // Before, each of these was said to be octal too.
  EXPECT_EQ(epochs("0x10"),
            "expected an int, got '0x10' (hexadecimal, octal and binary forms are not read) write "
            "it in decimal");
  EXPECT_EQ(epochs("0.5"), "expected an int, got '0.5'");
  EXPECT_EQ(epochs("9223372036854775807"),
            "9223372036854775807 is out of range (must be between 1 and 1000000)");
}

TEST(Config, UnknownKeysSuggestTheClosest) {
  EXPECT_EQ(error_of("pipeline: { prefetch_dept: 3 }\nnodes:\n  - { name: l, type: synthetic, "
                     "params: { bach_size: 4 } }\n  - { name: t, type: discard }\n"),
            "t.yaml:1:13: pipeline.prefetch_dept: unknown key (did you mean 'prefetch_depth'?)\n"
            "t.yaml:3:43: nodes[0].params.bach_size: unknown key (did you mean 'batch_size'?)");
}

TEST(Config, ReportsEveryProblemAtOnce) {
  const std::string yaml = R"(pipeline:
  epochs: three
  prefetch_depth: 0
  device: gpu
  ordered: maybe
sampler: { world: 2, rank: 2 }
nodes:
  - name: load
    type: synthetic
    concurrency: 010
    params: { sample_shape: [4, -1], dtype: float64 }
  - name: load
    type: pinned_stagin
  - { type: sleep, params: { ms: fast } }
  - name: train
    type: sleep
    concurrency: 2
)";
  EXPECT_EQ(
      error_of(yaml),
      std::string(
          "t.yaml:2:11: pipeline.epochs: expected an int, got 'three'\n"
          "t.yaml:3:19: pipeline.prefetch_depth: 0 is out of range (must be between 1 and "
          "4096)\n"
          "t.yaml:4:11: pipeline.device: 'gpu' is not one of auto, cuda, host\n"
          "t.yaml:5:12: pipeline.ordered: expected true or false, got 'maybe'\n"
          "t.yaml:10:18: nodes[0].concurrency: expected an int or auto, got '010' (a leading "
          "zero would make YAML read it as octal) write it without the zero\n"
          "t.yaml:11:33: nodes[0].params.sample_shape[1]: -1 is out of range (must be between "
          "1 and 1000000000)\n"
          "t.yaml:11:45: nodes[0].params.dtype: 'float64' is not one of float32, float16, "
          "uint8, int32, int64 (did you mean 'float32'?)\n"
          "t.yaml:14:5: nodes[2].name: missing required key (unique node name)\n"
          "t.yaml:14:34: nodes[2].params.ms: expected a number, got 'fast'\n"
          "t.yaml:12:5: nodes[1].name: duplicate node name 'load' (first declared at "
          "t.yaml:8:5) names must be unique\n"
          "t.yaml:13:11: nodes[1].type: unknown node type 'pinned_stagin' (did you mean "
          "'pinned_staging'? known types: ") +
          known_types() +
          ")\n"
          "t.yaml:14:13: nodes[2].type: only the last node may be a train node (the chain is "
          "load → transform* → staging → upload → transform* → train)\n"
          "t.yaml:15:5: nodes[3].concurrency: a train node runs serially (concurrency must be "
          "1, got 2)\n"
          "t.yaml:6:28: sampler.rank: 2 is out of range (rank must be below world = 2)");
}

TEST(Config, DuplicateKeysAreErrors) {
  EXPECT_EQ(error_of("pipeline:\n  epochs: 1\n  epochs: 2\nnodes:\n  - { name: l, type: synthetic "
                     "}\n  - { name: t, type: discard }\n"),
            "t.yaml:3:3: pipeline.epochs: duplicate key (first at line 2; YAML would silently "
            "keep the first) remove one");
}

TEST(Config, EmptyPipelineAndMissingRoles) {
  EXPECT_EQ(error_of("pipeline: { epochs: 1 }\n"),
            "t.yaml: nodes: the pipeline has no nodes (a pipeline needs at least a load and "
            "a train node) add a `nodes:` list");
  EXPECT_EQ(error_of("nodes:\n  - { name: l, type: synthetic }\n  - { name: s, type: "
                     "host_staging }\n"),
            "t.yaml:3:22: nodes[1].type: the last node must be a train node, 's' is a staging "
            "node (add a train-role node such as checksum, sleep or mlp)");
  EXPECT_EQ(error_of("nodes:\n  - { name: l, type: synthetic }\n  - { name: u, type: host_upload "
                     "}\n  - { name: s, type: host_staging }\n  - { name: t, type: discard }\n"),
            "t.yaml:4:22: nodes[2].type: 's' (staging) cannot come after 'u' (upload) (the chain "
            "is load → transform* → staging → upload → transform* → train)");
}

TEST(Config, InvalidYamlNamesLineAndColumn) {
  EXPECT_EQ(error_of("pipeline: { epochs: 1\nnodes: []\n"),
            "t.yaml:2:6: invalid YAML (end of map flow not found)");
}

TEST(Config, MissingFileSaysSo) {
  Registry r = builtin_registry();
  EXPECT_EQ(test::error_of<ConfigError>([&] { load_config_file("/nonexistent/x.yaml", r); }),
            "/nonexistent/x.yaml: cannot open config (No such file or directory)");
}

TEST(Config, DeviceChoiceWithoutCudaOrWithoutDevice) {
  Registry r = builtin_registry();
  if (r.cuda_built()) {
    r.set_device_probe([] { return 0; });
    EXPECT_EQ(test::error_of<ConfigError>([&] {
                load_config_string(
                    "pipeline: { device: cuda }\nnodes:\n  - { name: l, type: synthetic }\n"
                    "  - { name: t, type: discard }\n",
                    r, {}, "t.yaml");
              }),
              "t.yaml:1:21: pipeline.device: cuda was asked for but no CUDA device is "
              "visible (cudaGetDeviceCount found none) use device: auto or device: host");
  } else {
    EXPECT_EQ(error_of("pipeline: { device: cuda }\nnodes:\n  - { name: l, type: synthetic }\n"
                       "  - { name: t, type: discard }\n"),
              "t.yaml:1:21: pipeline.device: cuda is unavailable in this build (flowfeed was "
              "built without CUDA) reconfigure with -DFLOWFEED_CUDA=ON, or use device: auto");
  }
  // With device: auto and no GPU, CUDA types resolve to their host counterparts.
  r.set_device_probe([] { return 0; });
  PipelineConfig c = load_config_string(
      "nodes:\n  - { name: l, type: synthetic }\n  - { name: s, type: pinned_staging }\n"
      "  - { name: u, type: cuda_upload }\n  - { name: t, type: device_checksum }\n",
      r, {}, "t.yaml");
  EXPECT_EQ(c.backend, Backend::host);
  EXPECT_EQ(c.nodes[1].type, "host_staging");
  EXPECT_EQ(c.nodes[1].declared_type, "pinned_staging");
  EXPECT_EQ(c.nodes[2].type, "host_upload");
  EXPECT_EQ(c.nodes[3].type, "checksum");
}

TEST(Config, CppBuiltConfigsGetTheSameChecks) {
  Registry r = builtin_registry();
  PipelineConfig c;
  c.file = "app.cpp";
  NodeSpec load;
  load.name = "load";
  load.type = "synthetic";
  load.params.set("batches", std::int64_t{0});
  load.params.set("colour", std::string("red"));
  NodeSpec train;
  train.name = "train";
  train.type = "sleep";
  c.nodes = {load, train};
  EXPECT_EQ(test::error_of<ConfigError>([&] { validate_config(c, r); }),
            "app.cpp: nodes[0].params.batches: 0 is out of range (must be between 1 and "
            "1000000000000)\n"
            "app.cpp: nodes[0].params.colour: unknown key (known keys: batches, samples, "
            "batch_size, sample_shape, dtype, delay_ms, seed, classes)");
}

}  // namespace
}  // namespace flowfeed
