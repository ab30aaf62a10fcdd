// What pipeline_runner and pipeline_bench refuse on their command lines before any work: outputs
// that would replace one another, the config or a checkpoint's files; empty paths; numbers out of
// range, said in words; and --set values that are not one YAML value, blamed on the --set.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/apps/runner_process.hpp"

namespace flowfeed::test {
namespace {

const std::string kSmallRun =
    "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
    "nodes:\n"
    "  - { name: load, type: synthetic, params: { batches: 3, sample_shape: [2] } }\n"
    "  - { name: train, type: checksum }\n";

/// Runs the runner to its end; returns its exit code, with what it printed in `out` and `err`.
int run_runner(const std::vector<std::string>& args, std::string* err, std::string* out = nullptr) {
  Runner r(args);
  const int code = r.wait(kExitBound);
  *err = r.err();
  if (out) *out = r.out();
  return code;
}

constexpr const char* kHelpLine = "Run with --help for more information.\n";

TEST(RunnerPaths, AReportInsideTheCheckpointDirectoryIsRefusedAndTheManifestKept) {
  const std::string config = write_config("paths_ck", kSmallRun);
  const std::string ck = runner_temp_path("paths_ck");
  std::filesystem::remove_all(ck);
  std::string err;
  ASSERT_EQ(run_runner({config, "--quiet", "--checkpoint", ck}, &err), 0) << err;
  const std::string manifest = read_file(ck + "/pipeline.json");
  ASSERT_NE(manifest.find("\"format\": \"flowfeed checkpoint\""), std::string::npos) << manifest;

  // Before, the report replaced the checkpoint's manifest and the next --resume failed.
  std::string out;
  EXPECT_EQ(run_runner({config, "--checkpoint", ck, "--report", ck + "/pipeline.json"}, &err, &out),
            2);
  EXPECT_EQ(err, "--report " + ck + "/pipeline.json: inside the --checkpoint directory " + ck +
                     " (the files there are the checkpoint's) choose another path\n");
  EXPECT_EQ(out, "");
  EXPECT_EQ(read_file(ck + "/pipeline.json"), manifest);

  // Through `..`, and also beside --resume alone (the directory a later run continues from).
  EXPECT_EQ(run_runner({config, "--quiet", "--resume", ck, "--trace",
                        ck + "/../" + std::filesystem::path(ck).filename().string() + "/t.json"},
                       &err),
            2);
  EXPECT_EQ(err, "--trace " + ck + "/../" + std::filesystem::path(ck).filename().string() +
                     "/t.json: inside the --resume directory " + ck +
                     " (the files there are the checkpoint's) choose another path\n");
  std::filesystem::remove_all(ck);
}

TEST(RunnerPaths, TwoOutputsOrAnOutputAndTheConfigNamingOneFileAreRefused) {
  const std::string config = write_config("paths_same", kSmallRun);
  const std::string report = runner_temp_path("same.json");
  std::remove(report.c_str());
  const std::string dir = std::filesystem::path(report).parent_path().string();
  const std::string name = std::filesystem::path(report).filename().string();
  std::string err, out;
  EXPECT_EQ(
      run_runner({config, "--report", report, "--trace", dir + "/./" + name, "--timeline", config},
                 &err, &out),
      2);
  EXPECT_EQ(err, "--trace " + dir + "/./" + name + ": the same file as --report " + report +
                     " (one would replace the other) choose another path\n"
                     "--timeline " +
                     config + ": the same file as config " + config +
                     " (writing it would replace what was read) choose another path\n");
  EXPECT_EQ(out, "");
  EXPECT_FALSE(std::filesystem::exists(report));
  EXPECT_EQ(read_file(config), kSmallRun);
}

TEST(RunnerPaths, EveryEmptyPathIsAnErrorNamingItsOption) {
  const std::string config = write_config("paths_empty", kSmallRun);
  for (const std::string option :
       {"--report", "--trace", "--timeline", "--resume", "--checkpoint"}) {
    std::string err, out;
    EXPECT_EQ(run_runner({config, option, ""}, &err, &out), 2) << option;
    EXPECT_EQ(err, option + ": the path is empty (give a file name)\n" + kHelpLine);
    EXPECT_EQ(out, "");
  }
  std::string err;
  EXPECT_EQ(run_runner({""}, &err), 2);
  EXPECT_EQ(err, std::string("config: the path is empty (give a file name)\n") + kHelpLine);
}

TEST(RunnerPaths, EveryEmptyPathOfTheBenchIsAnErrorNamingItsOption) {
  const std::vector<std::vector<std::string>> cases = {
      {"seed", "--config"},     {"bandwidth", "--config"}, {"bandwidth", "--pageable-config"},
      {"autotune", "--config"}, {"autotune", "--dir"},     {"storage", "--dir"},
      {"images", "--config"},   {"images", "--shards"},    {"overhead", "--json"},
      {"scaling", "--svg"},     {"seed", "--data-dir"},
  };
  for (const auto& c : cases) {
    const std::string command = std::string(FLOWFEED_BENCH) + " " + c[0] + " " + c[1] + " ''";
    std::string output;
    EXPECT_EQ(run_shell_bounded(command, &output), 2) << command;
    EXPECT_EQ(output, c[1] + ": the path is empty (give a file name)\n" + kHelpLine) << command;
  }
}

TEST(RunnerArguments, CountsSayAPositiveIntegerNotA309DigitRange) {
  const std::string config = write_config("counts", kSmallRun);
  std::string err;
  EXPECT_EQ(run_runner({config, "--stop-after", "abc"}, &err), 2);
  EXPECT_EQ(err, std::string("--stop-after: 'abc' is not a whole number\n") + kHelpLine);
  EXPECT_EQ(run_runner({config, "--stop-after", "-3"}, &err), 2);
  EXPECT_EQ(err, std::string("--stop-after: '-3' is out of range (must be a positive integer)\n") +
                     kHelpLine);
  EXPECT_EQ(
      run_runner({config, "--checkpoint", runner_temp_path("counts_ck"), "--checkpoint-every", "0"},
                 &err),
      2);
  EXPECT_EQ(err,
            std::string("--checkpoint-every: '0' is out of range (must be a positive integer)\n") +
                kHelpLine);
  EXPECT_EQ(run_runner({config, "--stop-after", "99999999999999999999"}, &err), 2);
  EXPECT_EQ(err, std::string("--stop-after: '99999999999999999999' is too large (at most "
                             "18446744073709551615)\n") +
                     kHelpLine);

  std::string output;
  const std::string bench = std::string(FLOWFEED_BENCH);
  EXPECT_EQ(run_shell_bounded(bench + " overhead --batches 0", &output), 2);
  EXPECT_EQ(output, std::string("--batches: '0' is out of range (must be a positive integer)\n") +
                        kHelpLine);
  EXPECT_EQ(run_shell_bounded(bench + " tokens --windows x", &output), 2);
  EXPECT_EQ(output, std::string("--windows: 'x' is not a whole number\n") + kHelpLine);
  EXPECT_EQ(run_shell_bounded(bench + " overhead --raw-seconds -1", &output), 2);
  EXPECT_EQ(output,
            std::string("--raw-seconds: '-1' is out of range (must be above 0)\n") + kHelpLine);
  EXPECT_EQ(run_shell_bounded(bench + " naive --depth 0", &output), 2);
  EXPECT_EQ(output,
            std::string("--depth: '0' is out of range (must be between 1 and 1024)\n") + kHelpLine);
}

#if FLOWFEED_TEST_IMAGES  // the image family
TEST(RunnerArguments, ANodeCheckOfAValueASetWroteNamesTheSet) {
  // The webdataset loader checks its params when the pipeline is built; a value given by --set
  // was blamed on `file:1:1`.
  const std::string config = write_config(
      "set_node_check",
      "pipeline: { epochs: 1, batch_size: 4, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: webdataset, params: { shards: nothing-*.tar, height: 8, width: 8 "
      "} }\n"
      "  - { name: train, type: discard }\n");
  std::string err;
  EXPECT_EQ(run_runner({config, "--quiet", "--set", "nodes.load.params.ratio_min=2", "--set",
                        "nodes.load.params.ratio_max=1.5"},
                       &err),
            2);
  EXPECT_EQ(err,
            "--set nodes.load.params.ratio_min=2: nodes.load.params.ratio_min: 2 is above "
            "ratio_max 1.5 (the aspect ratio range must not be empty)\n");
}
#endif

TEST(RunnerArguments, ASetValueThatIsNotOneYamlValueNamesTheSetAndHowToQuote) {
  const std::string config = write_config("set_yaml", kSmallRun);
  std::string err;
  EXPECT_EQ(run_runner({config, "--quiet", "--set", "nodes.load.params.files=*.bin"}, &err), 2);
  EXPECT_EQ(err,
            "--set nodes.load.params.files=*.bin: value is not valid YAML (the referenced anchor "
            "is not defined: '*' starts a YAML alias) quote a string value: --set "
            "'nodes.load.params.files=\"*.bin\"'\n");
  // Before, the second document was silently dropped and the run went on with epochs: 1.
  EXPECT_EQ(run_runner({config, "--quiet", "--set", "pipeline.epochs=1\n---\n2"}, &err), 2);
  EXPECT_EQ(err,
            "--set pipeline.epochs=1\\n---\\n2: the value holds a second YAML document ('---' "
            "starts another, which would be ignored) give one value, or quote a string value: "
            "--set 'pipeline.epochs=\"1\\n---\\n2\"'\n");
}

}  // namespace
}  // namespace flowfeed::test
