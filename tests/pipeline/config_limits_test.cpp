// Every config input is bounded, and each kind of bad input gets its own message: files that are
// not configs, sizes beyond any real config, long values, floods of problems, duplicate keys at
// every level, a second document, and keys that only a --set wrote.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/registry.hpp"
#include "pipeline/src/detail/config_file.hpp"
#include "tests/error_of.hpp"
#include "tests/temp_fifo.hpp"

namespace flowfeed {
namespace {

Registry builtins() {
  Registry r;
  register_builtin_nodes(r);
  return r;
}

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "flowfeed_limits_" + std::to_string(getpid()) + "_" + name;
}

std::string file_error(const std::string& path) {
  const Registry r = builtins();
  return test::error_of<ConfigError>([&] { (void)load_config_file(path, r); });
}

std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  const Registry r = builtins();
  return test::error_of<ConfigError>(
      [&] { (void)load_config_string(yaml, r, overrides, "f.yaml"); });
}

const std::string kChain =
    "nodes:\n"
    "  - { name: load, type: synthetic, params: { batches: 2 } }\n"
    "  - { name: train, type: checksum }\n";

TEST(ConfigLimits, DevicesDirectoriesAndEndlessFilesEachGetTheirOwnMessage) {
  EXPECT_EQ(file_error("/dev/zero"),
            "/dev/zero: is a character device, not a config file (a device such as /dev/zero "
            "gives bytes without end) give the path of a YAML config file");
  EXPECT_EQ(file_error("/dev/urandom"),
            "/dev/urandom: is a character device, not a config file (a device such as /dev/zero "
            "gives bytes without end) give the path of a YAML config file");
  EXPECT_EQ(file_error("/"),
            "/: is a directory, not a config file (give the path of a YAML "
            "config file)");
  EXPECT_EQ(file_error("/nonexistent-dir/x.yaml"),
            "/nonexistent-dir/x.yaml: cannot open config (No such file or directory)");
}

TEST(ConfigLimits, AFileLargerThanAnyConfigIsRefusedUnread) {
  // Sparse: 17 MiB of size, no disk used.
  const std::string path = temp_path("huge.yaml");
  std::ofstream(path) << "pipeline: {}\n";
  ASSERT_EQ(truncate(path.c_str(), 17 << 20), 0);
  EXPECT_EQ(file_error(path),
            path +
                ": the file holds 17.0 MiB, too large for a config (a config holds at most 1.0 "
                "MiB; the largest example config is 2 KiB) check that this is the config file");
  std::remove(path.c_str());
}

TEST(ConfigLimits, APipeIsReadNoFurtherThanTheLimit) {
  const test::TempFifo pipe(temp_path("endless.fifo"));
  ASSERT_TRUE(pipe.made());
  const std::string& fifo = pipe.path();
  // A writer that would never stop: it ends when the reader closes its end (EPIPE).
  std::thread writer([&] {
    signal(SIGPIPE, SIG_IGN);
    const int fd = open(fifo.c_str(), O_WRONLY);
    const std::string chunk(4096, 'a');
    while (fd >= 0 && write(fd, chunk.data(), chunk.size()) > 0) {
    }
    if (fd >= 0) close(fd);
  });
  EXPECT_EQ(test::error_of<ConfigError>([&] { (void)detail::read_config_file(fifo, 100000); }),
            fifo +
                ": the pipe gave more than 97.7 KiB, too large for a config (a config holds at "
                "most 97.7 KiB; the largest example config is 2 KiB) check that this is the "
                "config file");
  writer.join();
}

TEST(ConfigLimits, LongValuesAreCutToAReadableLength) {
  const std::string big(50000, 'x');
  EXPECT_EQ(config_error("pipeline: { device: " + big + " }\n" + kChain),
            "f.yaml:1:21: pipeline.device: '" + std::string(60, 'x') +
                "…' (50000 bytes) is not one of auto, cuda, host");
  // YAML caps an implicit key at 1024 characters; a 500-character key still floods a message.
  const std::string key(500, 'k');
  EXPECT_EQ(config_error("pipeline:\n  " + key + ": 1\n" + kChain),
            "f.yaml:2:3: pipeline." + std::string(60, 'k') +
                "… (500 bytes): unknown key (known keys: epochs, batch_size, prefetch_depth, "
                "ordered, device, device_id, devices, threads, memory_budget, thread_budget, "
                "stall_timeout_s, on_error, max_skipped, mode, resume_from)");
}

TEST(ConfigLimits, AtMostFiftyProblemsAreListedThenACount) {
  std::string yaml = "pipeline:\n";
  for (int i = 0; i < 3000; ++i) yaml += "  epochz" + std::to_string(i) + ": 1\n";
  const Registry r = builtins();
  const std::vector<std::string> problems =
      test::problems_of([&] { (void)load_config_string(yaml + kChain, r, {}, "f.yaml"); });
  ASSERT_EQ(problems.size(), 51u);
  EXPECT_EQ(problems[49],
            "f.yaml:51:3: pipeline.epochz49: unknown key (known keys: epochs, batch_size, "
            "prefetch_depth, ordered, device, device_id, devices, threads, memory_budget, "
            "thread_budget, stall_timeout_s, on_error, max_skipped, mode, resume_from)");
  EXPECT_EQ(problems[50], "and 2950 more problems (fix the ones above first)");
}

TEST(ConfigLimits, DuplicateKeysAreErrorsAtEveryLevel) {
  EXPECT_EQ(config_error("pipeline: { epochs: 1 }\n"
                         "sampler: { seed: 1, seed: 2 }\n" +
                         kChain +
                         "pipeline: { epochs: 2 }\n"
                         "nodes: []\n"),
            "f.yaml:6:1: pipeline: duplicate key (first at line 1; YAML would silently keep the "
            "first) remove one\n"
            "f.yaml:7:1: nodes: duplicate key (first at line 3; YAML would silently keep the "
            "first) remove one\n"
            "f.yaml:2:21: sampler.seed: duplicate key (first at line 2; YAML would silently keep "
            "the first) remove one");
}

TEST(ConfigLimits, ASecondDocumentIsAnError) {
  EXPECT_EQ(config_error("pipeline: { epochs: 1 }\n" + kChain + "---\npipeline: { epochs: 5 }\n"),
            "f.yaml:5:1: a second YAML document (a config is one document; '---' starts another, "
            "which would be ignored) remove it, or merge it into the first");
}

// yaml-cpp 0.7's LoadAll loops forever, allocating, on these (its parser reports a document
// without consuming the stray token); the loader stops at the first token after the document.
TEST(ConfigLimits, AStrayTokenAfterTheDocumentIsAnErrorNotAHang) {
  EXPECT_EQ(config_error("\n,\n"),
            "f.yaml:2:1: invalid YAML (unexpected ',': the document ended before it)");
  // The shape libFuzzer found: a comment, then an indented line that starts with a comma.
  EXPECT_EQ(config_error("# a comment\n"
                         "  ,params: { batches: 2 }\n"),
            "f.yaml:2:3: invalid YAML (unexpected ',': the document ended before it)");
}

TEST(ConfigLimits, AKeyOnlyASetWroteIsBlamedOnThatSet) {
  EXPECT_EQ(config_error("pipeline: { epochs: 1 }\n" + kChain, {"foo.bar=1"}),
            "--set foo.bar=1: foo: unknown key (the top level has pipeline, sampler, nodes)");
}

TEST(ConfigLimits, ANodeParamASetWroteKeepsTheSetAsItsPlace) {
  // A node's own checks at build blame params.loc(key): it was `f.yaml:1:1` for a --set value.
  const Registry r = builtins();
  const PipelineConfig c = load_config_string("pipeline: { epochs: 1 }\n" + kChain, r,
                                              {"nodes.load.params.batches=3"}, "f.yaml");
  EXPECT_EQ(c.nodes[0].params.loc("batches").str(), "--set nodes.load.params.batches=3");
  const PipelineConfig written =
      load_config_string("pipeline: { epochs: 1 }\n" + kChain, r, {}, "f.yaml");
  EXPECT_EQ(written.nodes[0].params.loc("batches").str(), "f.yaml:3:55");
}

TEST(ConfigLimits, ASetValueIsOneYamlValueAndItsProblemsSayHowToQuoteIt) {
  const std::string yaml = "pipeline: { epochs: 1 }\n" + kChain;
  EXPECT_EQ(config_error(yaml, {"nodes.load.params.name=*.bin"}),
            "--set nodes.load.params.name=*.bin: value is not valid YAML (the referenced anchor is "
            "not defined: '*' starts a YAML alias) quote a string value: --set "
            "'nodes.load.params.name=\"*.bin\"'");
  // A second document was dropped: epochs stayed 1.
  EXPECT_EQ(config_error(yaml, {"pipeline.epochs=1\n---\n2"}),
            "--set pipeline.epochs=1\\n---\\n2: the value holds a second YAML document ('---' "
            "starts another, which would be ignored) give one value, or quote a string value: "
            "--set 'pipeline.epochs=\"1\\n---\\n2\"'");
  // A stray token after the value: an error, not a hang (yaml-cpp's LoadAll loops on it).
  EXPECT_EQ(config_error(yaml, {"pipeline.epochs=[1],"}),
            "--set pipeline.epochs=[1],: value is not valid YAML (unexpected ',' after the value) "
            "quote a string value: --set 'pipeline.epochs=\"[1],\"'");
  EXPECT_EQ(config_error(yaml, {"pipeline.epochs={"}),
            "--set pipeline.epochs={: value is not valid YAML (end of map flow not found) quote a "
            "string value: --set 'pipeline.epochs=\"{\"'");
}

TEST(ConfigLimits, TheMemoryLoaderRejectsAShuffledOrShardedSamplerAtValidation) {
  EXPECT_EQ(config_error("sampler: { shuffle: true, seed: 3, world: 2, rank: 1 }\n"
                         "nodes:\n"
                         "  - { name: load, type: memory, params: { batches: 4, sample_shape: [4] "
                         "} }\n"
                         "  - { name: train, type: checksum }\n"),
            "f.yaml:1:21: sampler.shuffle: true does not fit (the memory loader 'load' serves "
            "batch k as the pre-batched slice of samples [k*batch_size, (k+1)*batch_size)) set "
            "sampler.shuffle: false, or use the synthetic loader\n"
            "f.yaml:1:43: sampler.world: 2 shards do not fit (the memory loader 'load' serves "
            "batch k as the pre-batched slice of samples [k*batch_size, (k+1)*batch_size)) run "
            "one process, or use the synthetic loader");
}

}  // namespace
}  // namespace flowfeed
