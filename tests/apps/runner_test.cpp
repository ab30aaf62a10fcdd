// pipeline_runner as a user runs it: exit codes, messages, and the JSON report.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/python_types.hpp"

namespace {

struct Result {
  int code;
  std::string output;  // stdout and stderr together
};

Result run(const std::string& args) {
  std::string cmd = std::string(FLOWFEED_RUNNER) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  while (std::size_t n = fread(buf.data(), 1, buf.size(), pipe)) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

std::string write_temp(const std::string& name, const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

std::string known_types() {
  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  // The runner has the Python types too (real or placeholders: the same names).
  flowfeed::register_python_placeholders(registry);
  std::string out;
  for (const auto& n : registry.names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

const std::string kConfigs = std::string(FLOWFEED_SOURCE_DIR) + "/configs/";

/// What the runner prints when it exits 2 (a config or data set it refuses); fails the test
/// when it exits otherwise.
std::string exit_2_output(const std::string& args) {
  const Result r = run(args);
  EXPECT_EQ(r.code, 2);
  return r.output;
}

TEST(Runner, ConfigErrorExitsTwoWithEveryProblem) {
  std::string path = write_temp("runner_bad.yaml",
                                "pipeline: { epochs: 0, prefetch_depht: 2 }\n"
                                "nodes:\n  - { name: l, type: synthetic }\n"
                                "  - { name: t, type: slep }\n");
  EXPECT_EQ(
      exit_2_output(path),
      path + ":1:21: pipeline.epochs: 0 is out of range (must be between 1 and 1000000)\n" + path +
          ":1:24: pipeline.prefetch_depht: unknown key (did you mean 'prefetch_depth'?)\n" + path +
          ":4:22: nodes[1].type: unknown node type 'slep' (did you mean 'sleep'? known "
          "types: " +
          known_types() + ")\n");
}

TEST(Runner, DataSetWithoutABatchExitsTwo) {
  std::string path = write_temp("runner_nobatch.yaml",
                                "pipeline: { batch_size: 8 }\nsampler: { drop_last: true }\n"
                                "nodes:\n  - { name: l, type: synthetic, params: { samples: 3 } }\n"
                                "  - { name: t, type: discard }\n");
  EXPECT_EQ(exit_2_output(path),
            path +
                ": pipeline.batch_size: the data set gives no batch (3 samples in "
                "this shard, batch 8, drop_last) use a smaller batch or keep the "
                "last partial batch\n");
}

TEST(Runner, UnknownParamOfATypeWithoutParams) {
  EXPECT_EQ(exit_2_output(kConfigs + "seed_prefetch.yaml --set nodes.train.type=checksum"),
            kConfigs +
                "seed_prefetch.yaml:24:15: nodes[3].params.ms: unknown key (this "
                "takes no keys)\n");
}

TEST(Runner, ReportHasTheDocumentedFields) {
  auto report = std::filesystem::temp_directory_path() / "runner_report.json";
  Result r = run(kConfigs +
                 "seed_prefetch.yaml -q --set nodes.load.params.delay_ms=0 "
                 "--set nodes.train.params.ms=0 --report " +
                 report.string());
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output, "");  // --quiet prints nothing
  nlohmann::json j = nlohmann::json::parse(std::ifstream(report));
  for (const char* key : {"config", "device", "epochs", "batches", "samples", "bytes_uploaded",
                          "seconds", "batches_per_second", "prefetch_depth", "max_in_flight",
                          "allocations_after_build", "nodes", "pools", "train"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["batches"], 50);
  EXPECT_EQ(j["device"], "host");
  EXPECT_EQ(j["allocations_after_build"], 0);
  EXPECT_LE(j["max_in_flight"].get<int>(), j["prefetch_depth"].get<int>());
  ASSERT_EQ(j["nodes"].size(), 4u);
  EXPECT_EQ(j["nodes"][0]["name"], "load");
  EXPECT_EQ(j["nodes"][0]["items"], 50);
  EXPECT_EQ(j["pools"][0]["kind"], "pageable");
  EXPECT_TRUE(j["train"].contains("stall_fraction"));
}

TEST(Runner, MissingConfigFileExitsTwo) {
  EXPECT_EQ(exit_2_output("/nonexistent.yaml"),
            "/nonexistent.yaml: cannot open config (No such file or directory)\n");
}

}  // namespace
