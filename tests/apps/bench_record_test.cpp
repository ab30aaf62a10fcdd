// pipeline_bench --record FILE (apps/pipeline_bench/record.cpp): each RESULT row of the run becomes
// its scenario's record in a results file, the other records kept; a file that is not a records
// file is refused before anything runs, and left as it was. Nothing is timed.
#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "process_util.hpp"
#include "tests/temp_fifo.hpp"

namespace {

namespace fs = std::filesystem;
using flowfeed::test::run_shell;

fs::path fresh_file(const std::string& name, const std::string& text) {
  const fs::path path = fs::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[16];
  std::strftime(text, sizeof text, "%Y-%m-%d", &tm);
  return text;
}

TEST(PipelineBenchRecord, ReplacesTheScenariosRecordAndKeepsTheOthers) {
  const nlohmann::json other = {{"figure", 55.12},
                                {"unit", "GB/s"},
                                {"baseline", 55.15},
                                {"ratio", 0.999},
                                {"target", nullptr},
                                {"command", "pipeline_bench bandwidth"},
                                {"date", "2026-12-03"},
                                {"build", "0c69b8d"},
                                {"machine", "an H200"},
                                {"runs_over", "2 machine starts"},
                                {"runs", {{{"start", "A"}, {"figure", 55.0}}}}};
  const nlohmann::json old_seed = {{"figure", 9.0}, {"unit", "s"}, {"note", "older"}};
  const fs::path path = fresh_file(
      "bench_record_keep.json",
      nlohmann::json{{"records", {{"bandwidth_pinned_in_place", other}, {"seed", old_seed}}}}.dump(
          2));
  const fs::path json = fs::temp_directory_path() / "bench_record_keep_results.json";
  std::string output;
  const std::string args = "seed --record " + path.string() + " --json " + json.string();
  ASSERT_EQ(run_shell(std::string(FLOWFEED_BENCH) + " " + args + " 2>&1", &output), 0) << output;

  const nlohmann::json records = nlohmann::json::parse(read(path)).at("records");
  EXPECT_EQ(records.size(), 2u) << records.dump(2);
  EXPECT_EQ(records.at("bandwidth_pinned_in_place"), other);
  const nlohmann::json& seed = records.at("seed");
  const nlohmann::json row = nlohmann::json::parse(read(json)).at("results").at(0);
  ASSERT_EQ(row.at("name"), "seed");
  // The whole record is the new run's: nothing of the old one (its note) is left.
  EXPECT_EQ(seed.at("figure"), row.at("figure"));
  EXPECT_EQ(seed.at("baseline"), row.at("baseline"));
  EXPECT_EQ(seed.at("ratio"), row.at("ratio"));
  EXPECT_EQ(seed.at("unit"), "s");
  EXPECT_EQ(seed.at("target"), nullptr);
  EXPECT_EQ(seed.at("command"), "pipeline_bench " + args);
  EXPECT_EQ(seed.at("date"), today_utc());
  EXPECT_FALSE(seed.contains("note"));
  // Built from a git checkout: the commit; elsewhere null and said so.
  if (seed.at("build").is_null()) {
    EXPECT_EQ(seed.at("missing"), nlohmann::json::array({"build"}));
  } else {
    EXPECT_GE(seed.at("build").get<std::string>().size(), 7u);
    EXPECT_FALSE(seed.contains("missing"));
  }
  EXPECT_NE(seed.at("machine").get<std::string>().find(" host cores"), std::string::npos);
  fs::remove(path);
  fs::remove(json);
}

TEST(PipelineBenchRecord, BuildAndMachineCanBeNamed) {
  const fs::path path = fs::temp_directory_path() / "bench_record_named.json";
  fs::remove(path);  // a file that does not exist yet is created
  std::string output;
  ASSERT_EQ(run_shell(std::string(FLOWFEED_BENCH) + " seed --record " + path.string() +
                          " --build abc1234 --machine 'the H200, start Q' 2>&1",
                      &output),
            0)
      << output;
  const nlohmann::json seed = nlohmann::json::parse(read(path)).at("records").at("seed");
  EXPECT_EQ(seed.at("build"), "abc1234");
  EXPECT_EQ(seed.at("machine"), "the H200, start Q");
  EXPECT_EQ(seed.at("command"), "pipeline_bench seed --record " + path.string() +
                                    " --build abc1234 --machine 'the H200, start Q'");
  fs::remove(path);
}

TEST(PipelineBenchRecord, AQuickRunIsNotRecorded) {
  const fs::path path = fresh_file("bench_record_quick.json", "{\"records\": {}}\n");
  std::string output;
  EXPECT_EQ(
      run_shell(std::string(FLOWFEED_BENCH) + " seed --quick --record " + path.string() + " 2>&1",
                &output),
      2);
  EXPECT_EQ(output,
            "pipeline_bench: --record with --quick: a quick run is a smoke test, not a "
            "measurement (drop --quick to record)\n");
  EXPECT_EQ(read(path), "{\"records\": {}}\n");
  fs::remove(path);
}

TEST(PipelineBenchRecord, AFileThatIsNotARecordsFileIsRefusedBeforeAnyScenarioRuns) {
  for (const std::string text : {"{\"results\": []}\n", "{\"records\": [1, 2]}\n"}) {
    const fs::path path = fresh_file("bench_record_other.json", text);
    std::string output;
    EXPECT_EQ(run_shell(std::string(FLOWFEED_BENCH) + " seed --record " + path.string() + " 2>&1",
                        &output),
              1);
    EXPECT_EQ(output, "pipeline_bench: records file " + path.string() +
                          " is not a records file (no \"records\" object)\n");
    EXPECT_EQ(read(path), text);
  }
  const fs::path path = fresh_file("bench_record_broken.json", "{\"records\": {\n");
  std::string output;
  EXPECT_EQ(
      run_shell(std::string(FLOWFEED_BENCH) + " seed --record " + path.string() + " 2>&1", &output),
      1);
  EXPECT_EQ(output, "pipeline_bench: records file " + path.string() + " is not JSON (byte 15)\n");
  EXPECT_EQ(read(path), "{\"records\": {\n");
  // A FIFO is refused, not read: the read would wait for a writer for ever.
  const flowfeed::test::TempFifo fifo((fs::temp_directory_path() / "bench_record_fifo").string());
  ASSERT_TRUE(fifo.made());
  EXPECT_EQ(run_shell("timeout 60 " + std::string(FLOWFEED_BENCH) + " seed --record " +
                          fifo.path() + " 2>&1",
                      &output),
            1);
  EXPECT_EQ(output, "pipeline_bench: records file " + fifo.path() +
                        " is not a regular file (a records file is replaced whole)\n");
  EXPECT_EQ(run_shell(std::string(FLOWFEED_BENCH) + " seed --record /nonexistent-dir/r.json"
                                                    " 2>&1",
                      &output),
            1);
  EXPECT_EQ(output,
            "pipeline_bench: cannot write records /nonexistent-dir/r.json (directory "
            "/nonexistent-dir: No such file or directory)\n");
  fs::remove(path);
  fs::remove(fs::temp_directory_path() / "bench_record_other.json");
}

}  // namespace
