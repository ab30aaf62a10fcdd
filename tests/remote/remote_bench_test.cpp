// pipeline_bench remote --quick: its three rows with their targets, every run delivering every
// sample (the scenario checks it and fails otherwise), and its servers and files gone at the end.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace flowfeed {
namespace {

TEST(RemoteBench, QuickRunGivesColdWarmAndFaultRows) {
  const std::string json =
      (std::filesystem::temp_directory_path() / "remote_bench_test.json").string();
  const std::string cmd =
      std::string(FLOWFEED_BENCH) + " remote --quick --runs 1 --json " + json + " 2>&1";
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
    targets[row.at("name")] = row.at("target").at("value").get<double>();
    EXPECT_GT(row.at("figure").get<double>(), 0) << row.dump();
  }
  EXPECT_EQ(targets, (std::map<std::string, double>{
                         {"remote_cold", 0.9}, {"remote_faults", 0.8}, {"remote_warm", 0.95}}));
  EXPECT_EQ(j.at("scenarios").at("remote").at("rounds").size(), 1u);
  EXPECT_NE(output.find("remote round 0: local "), std::string::npos) << output;
}

}  // namespace
}  // namespace flowfeed
