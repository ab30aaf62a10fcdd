// pipeline_bench remote --quick: its rows with their targets and the random-access rows of npy
// samples and token windows (no target), every run delivering every
// sample (the scenario checks it and fails otherwise), and its servers and files gone at the end;
// with nginx, and with Python's threaded server (--server python: what a machine without nginx
// uses), each named in the output.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace flowfeed {
namespace {

class RemoteBench : public ::testing::TestWithParam<const char*> {};

TEST_P(RemoteBench, QuickRunGivesColdWarmAndFaultRows) {
  const std::string server = GetParam();
  const std::string json =
      (std::filesystem::temp_directory_path() / ("remote_bench_test_" + server + ".json")).string();
  const std::string cmd = std::string(FLOWFEED_BENCH) + " remote --quick --runs 1 --server " +
                          server + " --json " + json + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), pipe)) output += buf.data();
  ASSERT_EQ(::pclose(pipe), 0) << output;
  std::ifstream in(json);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::filesystem::remove(json);
  std::map<std::string, double> targets;
  for (const auto& row : j.at("results")) {
    const nlohmann::json& target = row.at("target");
    targets[row.at("name")] = target.is_null() ? -1.0 : target.at("value").get<double>();
    EXPECT_GT(row.at("figure").get<double>(), 0) << row.dump();
  }
  EXPECT_EQ(targets, (std::map<std::string, double>{{"remote_cold", 0.9},
                                                    {"remote_cold_vs_memory", -1.0},
                                                    {"remote_faults", 0.8},
                                                    {"remote_warm", 0.95},
                                                    {"remote_warm_memory", 0.95},
                                                    {"remote_warm_after_fetch", -1.0},
                                                    {"remote_range", -1.0},
                                                    {"remote_token_range", -1.0}}));
  EXPECT_EQ(j.at("scenarios").at("remote").at("rounds").size(), 1u);
  EXPECT_NE(output.find("remote round 0, from disk: local "), std::string::npos) << output;
  EXPECT_NE(output.find("remote round 0, from memory: local "), std::string::npos) << output;
  EXPECT_NE(output.find("; right after the fetch: local "), std::string::npos) << output;
  EXPECT_NE(output.find("remote round 0, random order: local "), std::string::npos) << output;
  EXPECT_NE(output.find("remote round 0, token windows at random: local "), std::string::npos)
      << output;
  const std::string named =
      server == "nginx" ? "remote: shards served by nginx on 127.0.0.1:"
                        : "remote: shards served by python ThreadingHTTPServer (range_server.py)";
  EXPECT_NE(output.find(named), std::string::npos) << output;
  EXPECT_EQ(j.at("scenarios").at("remote").at("server").get<std::string>().substr(0, 5),
            server.substr(0, 5));
}

INSTANTIATE_TEST_SUITE_P(Servers, RemoteBench, ::testing::Values("nginx", "python"));

}  // namespace
}  // namespace flowfeed
