// Inputs the config fuzzer (tests/fuzz/config_fuzz.cpp) found: each once escaped
// load_config_string as a yaml-cpp exception instead of a ConfigError (exit code 1, not 2).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/registry.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

std::string config_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  Registry r = builtin_registry();
  return test::error_of<ConfigError>(
      [&] { (void)load_config_string(yaml, r, overrides, "f.yaml"); });
}

TEST(ConfigRobustness, ScalarPipelineAndListSamplerAreConfigErrors) {
  EXPECT_EQ(config_error("pipeline: fast\nsampler: [1, 2]\nnodes:\n"
                         "  - { name: load, type: synthetic }\n"
                         "  - { name: train, type: checksum }\n"),
            "f.yaml:1:11: pipeline: expected a map, got 'fast'\n"
            "f.yaml:2:10: sampler: expected a map, got a list");
}

TEST(ConfigRobustness, NodeOverrideWithAScalarInTheNodeList) {
  EXPECT_EQ(config_error("nodes:\n  - 3\n  - { name: load, type: synthetic }\n"
                         "  - { name: train, type: checksum }\n",
                         {"nodes.load.concurrency=2"}),
            "f.yaml:2:5: nodes[0]: expected a map with name and type, got '3'");
}

// Every seed of the fuzzer's corpus loads or is rejected with a ConfigError, nothing else.
TEST(ConfigRobustness, FuzzSeedCorpusLoads) {
  Registry r = builtin_registry();
  int valid = 0;
  int rejected = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(FLOWFEED_SOURCE_DIR) +
                                                               "/tests/fuzz/corpus")) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string input = ss.str();
    const auto nul = input.find('\0');
    std::vector<std::string> overrides;
    if (nul != std::string::npos) {
      std::istringstream rest(input.substr(nul + 1));
      for (std::string line; std::getline(rest, line);) overrides.push_back(line);
    }
    try {
      (void)load_config_string(input.substr(0, nul), r, overrides, "seed.yaml");
      ++valid;
    } catch (const ConfigError&) {
      ++rejected;  // the bad inputs among the seeds
    } catch (const std::exception& e) {
      ADD_FAILURE() << entry.path() << ": not a ConfigError: " << e.what();
    }
  }
  EXPECT_GE(valid, 2);
  EXPECT_GE(rejected, 7);
}

}  // namespace
}  // namespace flowfeed
