// The `mix` loader's config: errors that name the key and where it was written (in its sources
// too, and for a config built in C++), sources that do not fit together, a source's own build
// error, and the epoch tables claimed from the memory budget.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/error.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/python_types.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/session.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

TEST(Mix, ConfigErrorsNameTheKeyAndWhereItWasWritten) {
  const Registry r = builtin_registry();
  const auto problems = [&](const std::string& yaml) {
    return test::problems_of([&] { (void)load_config_string(yaml, r, {}, "mix.yaml"); });
  };
  EXPECT_EQ(problems(R"(pipeline: { mode: pull }
nodes:
  - name: load
    type: mix
    params: { epoch: samples }
    sources:
      - { type: npz, params: { path: a.npy } }
      - { type: synthetic, weight: 0, params: { sampels: 3 } }
      - { type: checksum }
      - { typ: synthetic }
  - { name: upload, type: host_upload }
)"),
            (std::vector<std::string>{
                "mix.yaml:8:49: nodes[0].sources[1].params.sampels: unknown key (did you mean "
                "'samples'?)",
                "mix.yaml:10:11: nodes[0].sources[3].typ: unknown key (did you mean 'type'?)",
                "mix.yaml:10:9: nodes[0].sources[3].type: missing required key (a source names "
                "its loader type)",
                "mix.yaml:7:17: nodes[0].sources[0].type: unknown node type 'npz' (did you mean "
                "'npy'? known types: checksum, cuda_upload, delay, device_checksum, "
                "device_discard, device_normalize, discard, host_staging, host_upload, idx, "
                "image_folder, memory, mix, mlp, normalize, npy, pinned_staging, random_flip, "
                "record, sleep, synthetic, tokens, webdataset)",
                "mix.yaml:9:17: nodes[0].sources[2].type: 'checksum' is a train type (a source of "
                "'mix' is a loader) pick a load type",
                "mix.yaml:5:22: nodes[0].params.epoch: samples needs the count (an epoch of how "
                "many positions?) set params.samples",
                "mix.yaml:8:36: nodes[0].sources[1].weight: 0 gives the source no share (a weight "
                "must be above 0) raise it, or remove the source"}));
  EXPECT_EQ(problems(R"(pipeline: { mode: pull }
nodes:
  - { name: load, type: mix }
  - { name: upload, type: host_upload, sources: [{ type: synthetic }] }
)"),
            (std::vector<std::string>{
                "mix.yaml:3:5: nodes[0].sources: missing required key ('mix' combines the "
                "loaders listed under sources) add sources: [{ type: ..., params: {...} }, ...]",
                "mix.yaml:4:5: nodes[1].sources: 'host_upload' takes no sources (only a type that "
                "combines loaders does, e.g. mix) remove them"}));
}

TEST(Mix, AParamThatFailedItsOwnCheckIsReportedOnceAndNotReadByTheTypesChecks) {
  // epoch fails its choices: the mix's cross-key checks (which read epoch) do not run on it.
  const Registry r = builtin_registry();
  EXPECT_EQ(test::problems_of([&] {
              (void)load_config_string(R"(pipeline: { mode: pull }
nodes:
  - name: load
    type: mix
    params: { epoch: firstexhausted }
    sources:
      - { type: synthetic, params: { samples: 3 } }
  - { name: upload, type: host_upload }
)",
                                       r, {}, "mix.yaml");
            }),
            (std::vector<std::string>{"mix.yaml:5:22: nodes[0].params.epoch: 'firstexhausted' is "
                                      "not one of first_exhausted, samples (did you mean "
                                      "'first_exhausted'?)"}));
}

TEST(Mix, APythonIterableSourceNeedsAnUnshuffledMix) {
  Registry r = builtin_registry();
  register_python_placeholders(r);
  EXPECT_EQ(test::problems_of([&] {
              (void)load_config_string(R"(pipeline: { mode: pull }
sampler: { shuffle: true }
nodes:
  - name: load
    type: mix
    sources:
      - { type: synthetic }
      - { type: python_iterable, params: { callable: "m:f", samples: 10 } }
  - { name: upload, type: host_upload }
)",
                                       r, {}, "mix.yaml");
            }),
            (std::vector<std::string>{
                "mix.yaml:2:21: sampler.shuffle: true does not fit source 1 (python_iterable) of "
                "the mix 'load' (an iterable gives its samples in its own order) set "
                "sampler.shuffle: false, or use a map-style python source"}));
}

/// How a memory budget error goes on after "... is available ", when `claimed` of the host
/// budget was claimed before, up to the keys to lower.
std::string host_budget_claimed(const std::string& claimed) {
  return "(pipeline.memory_budget.host, " + claimed +
         " of it already claimed by the pools and data sets before it; the process would be "
         "killed for want of memory mid-run) lower ";
}

/// The error of type E that building the pipeline of `yaml` (read as m.yaml) throws.
template <class E>
std::string build_error(const std::string& yaml) {
  const Registry r = builtin_registry();
  return test::error_of<E>([&] { Pipeline(load_config_string(yaml, r, {}, "m.yaml"), r); });
}

TEST(Mix, SourcesOfDifferentSamplesAreAConfigErrorNamingBothAndTheTensor) {
  const std::string yaml = R"(pipeline: { mode: pull, device: host }
nodes:
  - name: load
    type: mix
    sources:
      - { type: synthetic, params: { sample_shape: [4], dtype: uint8 } }
      - { type: synthetic, params: { sample_shape: [4], dtype: float32 } }
  - { name: upload, type: host_upload }
)";
  EXPECT_EQ(build_error<ConfigError>(yaml),
            "m.yaml:3:5: node 'load': sources 0 (synthetic) and 1 (synthetic) give different "
            "samples: tensor 'x' is uint8 [4] in source 0 and float32 [4] in source 1 (a mix's "
            "batches have one layout) make every source give the same tensors");
}

TEST(Mix, ASourcesOwnBuildErrorNamesTheSource) {
  const std::string yaml = R"(pipeline: { mode: pull, device: host, batch_size: 4 }
nodes:
  - name: load
    type: mix
    sources:
      - { type: synthetic, params: { samples: 8, sample_shape: [4] } }
      - { type: npy, params: { features: /nonexistent/x.npy, labels: /nonexistent/y.npy } }
  - { name: upload, type: host_upload }
)";
  EXPECT_EQ(build_error<Error>(yaml),
            "node 'load' (mix, m.yaml:3): source 1 (npy): /nonexistent/x.npy: cannot open (No "
            "such file or directory)");
  // A config error a source finds while it is built: at the source's place in the config.
  const std::string budget =
      R"(pipeline: { mode: pull, device: host, batch_size: 4, memory_budget: { host: 1000000 } }
nodes:
  - name: load
    type: mix
    sources:
      - { type: synthetic, params: { samples: 8, sample_shape: [1000] } }
      - { type: memory, params: { samples: 1000, sample_shape: [1000] } }
  - { name: upload, type: host_upload }
)";
  EXPECT_EQ(
      build_error<ConfigError>(budget),
      "m.yaml:7:17: node 'load' source 1 (memory): nodes[0].params.samples, "
      "nodes[0].params.sample_shape: the data set (1000 samples) of source 1 (memory) of node "
      "'load' needs 3.9 MiB of host memory, and 976.6 KiB is available " +
          host_budget_claimed("126.1 KiB") +
          "nodes[0].params.samples, nodes[0].params.sample_shape");
}

TEST(Mix, TheEpochTablesAreClaimedFromTheMemoryBudget) {
  // 100,000,000 positions: two tables of 500 MB, against a budget of 100 MB.
  const std::string yaml =
      R"(pipeline: { mode: pull, device: host, batch_size: 4, memory_budget: { host: 100000000 } }
nodes:
  - name: load
    type: mix
    params: { epoch: samples, samples: 100000000 }
    sources:
      - { type: synthetic, params: { samples: 8, sample_shape: [4] } }
      - { type: synthetic, params: { samples: 8, sample_shape: [4] } }
  - { name: upload, type: host_upload }
)";
  const std::string tables = build_error<ConfigError>(yaml);
  EXPECT_EQ(
      tables,
      "m.yaml:3:5: nodes.load.params.samples: the epoch tables (2 epochs of 100000000 positions, "
      "5 bytes each) of node 'load' needs 953.7 MiB of host memory, and 95.4 MiB is available " +
          host_budget_claimed("4.2 KiB") + "nodes.load.params.samples");
}

TEST(Mix, AConfigBuiltInCppHasItsSourcesCheckedAndDefaulted) {
  const Registry r = builtin_registry();
  PipelineConfig config;
  config.pipeline.mode = RunMode::pull;
  config.pipeline.device = DeviceChoice::host;
  config.pipeline.batch_size = 5;
  NodeSpec load;
  load.name = "load";
  load.type = "mix";
  for (const std::int64_t samples : {10, 30}) {
    SourceSpec source;
    source.type = "synthetic";
    source.params.set("samples", samples);
    load.sources.push_back(std::move(source));
  }
  NodeSpec upload;
  upload.name = "upload";
  upload.type = "host_upload";
  config.nodes = {load, upload};
  PipelineConfig bad = config;
  bad.nodes[0].sources[1].params.set("sampels", std::int64_t{3});
  bad.nodes[0].sources[0].keys.set("weight", 0.0);
  EXPECT_EQ(test::problems_of([&] { validate_config(bad, r); }),
            (std::vector<std::string>{
                "<c++>: nodes[0].sources[1].params.sampels: unknown key (did you mean "
                "'samples'?)",
                "<c++>: nodes[0].sources[0].weight: 0 gives the source no share (a weight must be "
                "above 0) raise it, or remove the source"}));
  validate_config(config, r);
  // Weights default to 1: the 10-sample source runs out after 20 positions.
  Pipeline p(config, r);
  Session s = p.start();
  std::size_t rows = 0;
  while (Batch* b = s.next()) {
    rows += b->rows();
    s.release(b);
  }
  EXPECT_EQ(rows, 20u);
  EXPECT_EQ(s.report().extra.at("load.source1.samples"), 10);
}

}  // namespace
}  // namespace flowfeed
