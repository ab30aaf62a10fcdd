#pragma once
// Shared by the webdataset tests: shards written by tests/nodes/make_image_shards.py (PIL and
// Python's tarfile) once per test program, a chain around the loader, and a run that collects
// every sample's bytes and label.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed::webdataset_testing {

using namespace testing_files;
using Json = nlohmann::json;

using namespace testing_files;
using Json = nlohmann::json;

/// A directory of shards written by the helper script for one case, once per test program.
class Shards {
 public:
  explicit Shards(const std::string& args) {
    const std::string cmd = fmt::format("{} {}/tests/nodes/make_image_shards.py {} {}",
                                        FLOWFEED_PYTHON, FLOWFEED_SOURCE_DIR, dir_.file(""), args);
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
    std::ifstream in(dir_.file("manifest.json"));
    manifest_ = Json::parse(in);
  }
  std::string file(const std::string& name) const { return dir_.file(name); }
  const Json& manifest() const { return manifest_; }

 private:
  TempDir dir_;
  Json manifest_;
};

inline const Shards& formats() {
  static const Shards s("formats");
  return s;
}
inline const Shards& photos() {
  static const Shards s("photos 40 3");
  return s;
}
inline const Shards& corrupt() {
  static const Shards s("corrupt");
  return s;
}

inline std::vector<std::uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline std::string chain(const std::string& shards, const std::string& params,
                         const std::string& pipeline = "",
                         const std::string& sampler = "shuffle: false",
                         const std::string& transform = "") {
  return fmt::format(
      "pipeline: {{ device: host{} }}\n"
      "sampler: {{ {} }}\n"
      "nodes:\n"
      "  - name: load\n"
      "    type: webdataset\n"
      "    params: {{ shards: '{}'{} }}\n"
      "{}"
      "  - {{ name: train, type: capture }}\n",
      pipeline, sampler, shards, params, transform);
}

struct Outcome {
  std::shared_ptr<Captured> seen = std::make_shared<Captured>();
  RunReport report;
  /// (epoch, sample) → the sample's x bytes, and sample → label.
  std::map<std::pair<int, std::uint32_t>, std::vector<std::uint8_t>> x;
  std::map<std::uint32_t, std::int32_t> y;
};

inline Outcome run(const std::string& yaml, int epochs_seen_per_batch = 1) {
  Outcome r;
  Registry registry;
  register_builtin_nodes(registry);
  register_capture(registry, r.seen);
  Pipeline p(load_config_string(yaml, registry), registry);
  r.report = p.run();
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  const std::size_t per = r.seen->tensors.at(0).sample_bytes();
  // Batches arrive in order (ordered: true), so the epoch is the batch count's quotient.
  const std::size_t batches = r.seen->samples.size();
  for (std::size_t b = 0; b < batches; ++b) {
    const auto& samples = r.seen->samples[b];
    const int epoch = static_cast<int>(b * static_cast<std::size_t>(epochs_seen_per_batch) /
                                       std::max<std::size_t>(batches, 1));
    for (std::size_t i = 0; i < samples.size(); ++i) {
      const auto* px = reinterpret_cast<const std::uint8_t*>(r.seen->x[b].data()) + i * per;
      r.x[{epoch, samples[i]}] = std::vector<std::uint8_t>(px, px + per);
      r.y[samples[i]] = r.seen->y[b][i];
    }
  }
  return r;
}

inline std::string build_error(const std::string& yaml) {
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, std::make_shared<Captured>());
  const PipelineConfig config = load_config_string(yaml, r);
  return error_of<DataError>([&] { Pipeline p(config, r); });
}

inline std::string run_error(const std::string& yaml) {
  Registry r;
  register_builtin_nodes(r);
  register_capture(r, std::make_shared<Captured>());
  Pipeline p(load_config_string(yaml, r), r);
  return error_of<NodeError>([&] { p.run(); });
}

inline const std::string kLoad = "node 'load' (webdataset, <string>:4)";

/// The corrupt case's shard `<name>.tar`.
inline std::string corrupt_tar(const std::string& name) {
  return corrupt().file(name + ".tar");
}

/// Where the header of sample `sample`'s `field` member sits in corrupt_tar(name).
inline std::uint64_t header_of(const std::string& name, int sample, const char* field = "jpg") {
  return corrupt().manifest()[name][sample]["members"][field]["header"];
}

}  // namespace flowfeed::webdataset_testing
