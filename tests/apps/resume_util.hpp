#pragma once
/// \file
/// What the resume tests share: their scratch files, pipeline_runner run to its end, and the config
/// of the world-size and checkpoint-error tests.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/apps/process_util.hpp"

namespace flowfeed::test::resume {

namespace fs = std::filesystem;

/// `name` in the temp dir, unique to this process.
inline fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("flowfeed_resume_" + std::to_string(getpid()) + "_" + name);
}

/// Writes `yaml` to temp_path(name) and returns that path.
inline fs::path write_temp_config(const std::string& name, const std::string& yaml) {
  const fs::path path = temp_path(name);
  std::ofstream(path) << yaml;
  return path;
}

/// The whole file ("" when it cannot be read).
inline std::string slurp(const fs::path& path) {
  return read_file(path.string());
}

/// Runs the runner once to its end; returns its exit code, `output` its stdout and stderr.
inline int run(const std::string& env, const std::vector<std::string>& args, std::string* output) {
  std::string command = env + " " + FLOWFEED_RUNNER;
  for (const auto& a : args) command += " '" + a + "'";
  return run_shell(command + " 2>&1", output);
}

/// The config of the world-size tests and the checkpoint errors: 1001 samples in batches of 7 over
/// two epochs, shuffled, into a `record` sink.
inline fs::path world_config() {
  return write_temp_config(
      "world.yaml",
      "pipeline: { epochs: 2, batch_size: 7, prefetch_depth: 4, device: host }\n"
      "sampler: { shuffle: true, seed: 11 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 2, params: { samples: "
      "1001, sample_shape: [2] } }\n"
      "  - { name: train, type: record, params: { path: unset } }\n");
}

}  // namespace flowfeed::test::resume
