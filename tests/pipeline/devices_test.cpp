// `pipeline.devices`: the upload → train branch once per listed device, on the host backend (the
// entries are then only branch labels), so CI runs the same graph a multi-GPU machine does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "flowfeed/builder.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

/// What one branch's train node saw.
struct BranchLog {
  int replica = -1;
  int replicas = -1;
  int device = -1;
  std::vector<std::uint64_t> seqs;
  std::map<std::uint32_t, std::vector<std::uint32_t>> samples;  // epoch -> sample indices
};

/// Every train node's log, in the order the pipeline set them up.
struct Logs {
  std::mutex mutex;
  std::vector<std::shared_ptr<BranchLog>> branches;
};

class BranchRecorder final : public Node {
 public:
  explicit BranchRecorder(Logs* logs) : logs_(logs) {}
  void setup(BuildContext& context) override {
    log_ = std::make_shared<BranchLog>();
    log_->replica = context.replica();
    log_->replicas = context.replicas();
    log_->device = context.device_id();
    std::lock_guard<std::mutex> lock(logs_->mutex);
    logs_->branches.push_back(log_);
  }
  void process(Batch& batch) override {
    log_->seqs.push_back(batch.seq);
    auto& s = log_->samples[batch.epoch];
    s.insert(s.end(), batch.samples.begin(), batch.samples.end());
  }

 private:
  Logs* logs_;
  std::shared_ptr<BranchLog> log_;
};

Registry registry_with_recorder(Logs* logs) {
  Registry r;
  register_builtin_nodes(r);
  r.set_device_probe([] { return 0; });
  r.add(factory_type(
      "branch_record", Role::train, {},
      [logs](const NodeSpec&) { return std::make_unique<BranchRecorder>(logs); },
      "records what its branch sees"));
  return r;
}

std::string devices_text(const std::vector<int>& devices) {
  std::string s = "[";
  for (std::size_t i = 0; i < devices.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(devices[i]);
  }
  return s + "]";
}

/// 1000 samples in batches of 16: 63 batches per epoch (the last has 8 rows), two epochs.
std::string config_text(const std::string& devices, bool ordered, const std::string& sink) {
  return "pipeline:\n"
         "  epochs: 2\n"
         "  batch_size: 16\n"
         "  prefetch_depth: 6\n"
         "  ordered: " +
         std::string(ordered ? "true" : "false") +
         "\n"
         "  device: host\n"
         "  threads: 4\n"
         "  devices: " +
         devices +
         "\n"
         "sampler: { shuffle: true, seed: 9 }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, concurrency: 2, params: { samples: 1000, "
         "sample_shape: [3, 5], seed: 3 } }\n"
         "  - { name: stage, type: host_staging, concurrency: 2 }\n"
         "  - { name: upload, type: host_upload, concurrency: 2 }\n"
         "  - { name: train, type: " +
         sink + " }\n";
}

struct Case {
  std::vector<int> devices;
  bool ordered;
};

/// Names the case in test output.
void PrintTo(const Case& c, std::ostream* os) {
  *os << "devices " << devices_text(c.devices) << (c.ordered ? ", ordered" : ", unordered");
}

class Branches : public ::testing::TestWithParam<Case> {};

TEST_P(Branches, EachBranchTakesADisjointShareThatCoversEveryEpoch) {
  const Case c = GetParam();
  const std::size_t n = c.devices.size();
  Logs logs;
  Registry r = registry_with_recorder(&logs);
  Pipeline p(load_config_string(config_text(devices_text(c.devices), c.ordered, "branch_record"), r,
                                {}, "x.yaml"),
             r);
  const RunReport report = p.run();
  EXPECT_EQ(report.batches, 126u);
  EXPECT_EQ(report.samples, 2000u);
  EXPECT_EQ(report.allocations_after_build, 0u);
  EXPECT_LE(report.max_in_flight, 6);
  ASSERT_EQ(logs.branches.size(), n);
  std::set<std::uint64_t> all_seqs;
  for (std::size_t b = 0; b < n; ++b) {
    const BranchLog& log = *logs.branches[b];
    EXPECT_EQ(log.replica, static_cast<int>(b));
    EXPECT_EQ(log.replicas, static_cast<int>(n));
    EXPECT_EQ(log.device, c.devices[b]);
    // Branch b takes seq b, b+N, ...: 126 / N each (126 is a multiple of 2 and 3).
    EXPECT_EQ(log.seqs.size(), 126 / n) << "branch " << b;
    for (std::uint64_t seq : log.seqs) {
      EXPECT_EQ(seq % n, b) << "branch " << b << " got batch " << seq;
      EXPECT_TRUE(all_seqs.insert(seq).second) << "batch " << seq << " reached two branches";
    }
    if (c.ordered) {
      EXPECT_TRUE(std::is_sorted(log.seqs.begin(), log.seqs.end())) << "branch " << b;
    }
  }
  EXPECT_EQ(all_seqs.size(), 126u);
  // Every epoch: the branches' samples are disjoint and together are the whole data set.
  for (std::uint32_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int> count(1000, 0);
    for (const auto& log : logs.branches) {
      for (std::uint32_t sample : log->samples[epoch]) ++count[sample];
    }
    for (std::size_t s = 0; s < count.size(); ++s) {
      ASSERT_EQ(count[s], 1) << "sample " << s << " in epoch " << epoch;
    }
  }
  // The same shares on a second run (deterministic).
  std::vector<std::vector<std::uint64_t>> first;
  for (const auto& log : logs.branches) {
    std::vector<std::uint64_t> seqs = log->seqs;
    std::sort(seqs.begin(), seqs.end());
    first.push_back(seqs);
    log->seqs.clear();
    log->samples.clear();
  }
  p.run();
  for (std::size_t b = 0; b < n; ++b) {
    std::vector<std::uint64_t> seqs = logs.branches[b]->seqs;
    std::sort(seqs.begin(), seqs.end());
    EXPECT_EQ(seqs, first[b]) << "branch " << b;
  }
}

TEST_P(Branches, ChecksumVerifiesEveryByteAndTheReportHasARowPerBranchNode) {
  const Case c = GetParam();
  const std::size_t n = c.devices.size();
  Logs logs;
  Registry r = registry_with_recorder(&logs);
  // The same config with one branch (built first: allocations are counted process-wide): the
  // bytes that must arrive.
  std::string one = config_text("[0]", c.ordered, "checksum");
  const RunReport single = Pipeline(load_config_string(one, r, {}, "x.yaml"), r).run();
  EXPECT_EQ(single.extra.at("checksum_bytes_verified"), static_cast<double>(single.bytes_uploaded));
  Pipeline p(load_config_string(config_text(devices_text(c.devices), c.ordered, "checksum"), r, {},
                                "x.yaml"),
             r);
  for (int run = 0; run < 2; ++run) {
    const RunReport report = p.run();
    EXPECT_EQ(report.batches, 126u);
    EXPECT_EQ(report.bytes_uploaded, single.bytes_uploaded);
    // Each branch's checksum verified its share; the report adds them up.
    EXPECT_EQ(report.extra.at("checksum_bytes_verified"),
              static_cast<double>(report.bytes_uploaded));
    EXPECT_EQ(report.allocations_after_build, 0u);
    EXPECT_EQ(p.free_buffers(), p.total_buffers());
    std::vector<std::string> names;
    for (const auto& node : report.nodes) names.push_back(node.name);
    std::vector<std::string> expected = {"load", "stage"};
    for (int d : c.devices) {
      expected.push_back("upload@" + std::to_string(d));
      expected.push_back("train@" + std::to_string(d));
    }
    EXPECT_EQ(names, expected);
    for (const auto& node : report.nodes) {
      const std::uint64_t want = node.name == "load" || node.name == "stage" ? 126 : 126 / n;
      EXPECT_EQ(node.items, want) << node.name;
    }
    ASSERT_EQ(report.branches.size(), n);
    std::uint64_t bytes = 0;
    for (std::size_t b = 0; b < n; ++b) {
      EXPECT_EQ(report.branches[b].branch, static_cast<int>(b));
      EXPECT_EQ(report.branches[b].device, c.devices[b]);
      EXPECT_EQ(report.branches[b].batches, 126 / n);
      bytes += report.branches[b].bytes_uploaded;
    }
    EXPECT_EQ(bytes, report.bytes_uploaded);
    EXPECT_NE(report.to_json().find("\"branches\""), std::string::npos);
    EXPECT_NE(report.to_table().find("branch 1 on device " + std::to_string(c.devices[1]) + ": " +
                                     std::to_string(126 / n) + " batches"),
              std::string::npos)
        << report.to_table();
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, Branches,
                         ::testing::Values(Case{{0, 1}, true}, Case{{0, 1}, false},
                                           Case{{0, 1, 2}, true}, Case{{0, 1, 2}, false},
                                           Case{{4, 2}, true}));

TEST(Branches, ARepeatedDeviceGetsASecondBranch) {
  Logs logs;
  Registry r = registry_with_recorder(&logs);
  Pipeline p(load_config_string(config_text("[0, 0]", true, "checksum"), r, {}, "x.yaml"), r);
  const RunReport report = p.run();
  std::vector<std::string> names;
  for (const auto& node : report.nodes) names.push_back(node.name);
  EXPECT_EQ(names, (std::vector<std::string>{"load", "stage", "upload@0", "train@0", "upload@0.1",
                                             "train@0.1"}));
  EXPECT_EQ(report.extra.at("checksum_bytes_verified"), static_cast<double>(report.bytes_uploaded));
}

TEST(Branches, OneListedDeviceIsTheSingleBranchPipeline) {
  Logs logs;
  Registry r = registry_with_recorder(&logs);
  Pipeline p(load_config_string(config_text("[3]", true, "branch_record"), r, {}, "x.yaml"), r);
  EXPECT_EQ(p.config().pipeline.device_id, 3);
  const RunReport report = p.run();
  EXPECT_EQ(report.nodes.back().name, "train");
  EXPECT_TRUE(report.branches.empty());
  ASSERT_EQ(logs.branches.size(), 1u);
  EXPECT_EQ(logs.branches[0]->device, 3);
  EXPECT_EQ(logs.branches[0]->seqs.size(), 126u);
}

TEST(Branches, RecordWritesOneFilePerBranch) {
  Logs logs;
  Registry r = registry_with_recorder(&logs);
  const std::string path = ::testing::TempDir() + "flowfeed_devices_record.txt";
  Pipeline p(
      load_config_string(config_text("[0, 1]", true, "record, params: { path: " + path + " }"), r,
                         {}, "x.yaml"),
      r);
  p.run();
  std::set<std::uint64_t> seqs;
  for (int b = 0; b < 2; ++b) {
    std::ifstream in(path + "." + std::to_string(b));
    ASSERT_TRUE(in) << path << "." << b;
    int lines = 0;
    for (std::string line; std::getline(in, line); ++lines) {
      std::istringstream ls(line);
      std::uint32_t epoch;
      std::uint64_t seq;
      ls >> epoch >> seq;
      EXPECT_EQ(seq % 2, static_cast<std::uint64_t>(b)) << line;
      seqs.insert(seq);
    }
    EXPECT_EQ(lines, 63);
    std::remove((path + "." + std::to_string(b)).c_str());
  }
  EXPECT_EQ(seqs.size(), 126u);
}

class FailAtSeven final : public Node {
 public:
  void process(Batch& batch) override {
    if (batch.seq == 7) throw Error("batch seven is bad");
  }
};

TEST(Branches, AFailureInABranchEndsTheRunNamingTheBranchNode) {
  Logs logs;
  Registry r = registry_with_recorder(&logs);
  r.add(node_type<FailAtSeven>("fail_at_seven", Role::train));
  Pipeline p(load_config_string(config_text("[0, 1, 2]", true, "fail_at_seven"), r, {}, "x.yaml"),
             r);
  for (int run = 0; run < 2; ++run) {
    try {
      p.run();
      ADD_FAILURE() << "the run did not fail";
    } catch (const NodeError& e) {
      // Batch 7 goes to branch 7 % 3 = 1.
      EXPECT_EQ(std::string(e.what()),
                "node 'train@1' (fail_at_seven, x.yaml:14) batch 7 (epoch 0): batch seven is bad");
      EXPECT_EQ(e.node(), "train@1");
    }
    EXPECT_EQ(p.free_buffers(), p.total_buffers());
  }
}

std::string config_error(const std::string& yaml, const Registry& registry) {
  return testing_files::error_of<ConfigError>(
      [&] { load_config_string(yaml, registry, {}, "x.yaml"); });
}

std::string small(const std::string& pipeline_keys, const std::string& last = "checksum") {
  return "pipeline:\n" + pipeline_keys +
         "nodes:\n"
         "  - { name: load, type: synthetic, params: { batches: 4, sample_shape: [5] } }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: " +
         last + " }\n";
}

Registry with_gpus(int count) {
  Registry r;
  register_builtin_nodes(r);
  r.set_device_probe([count] { return count; });
  return r;
}

/// Why device: auto chose the host with no GPU visible: the build may have no CUDA at all.
std::string host_reason(const Registry& r) {
  return r.cuda_built() ? "no CUDA device is visible"
                        : "this build has no CUDA (FLOWFEED_CUDA=OFF)";
}

TEST(BranchesConfig, AllNeedsCudaDevices) {
  EXPECT_EQ(config_error(small("  device: host\n  devices: all\n"), with_gpus(2)),
            "x.yaml:3:12: pipeline.devices: 'all' means every visible CUDA device, and the "
            "pipeline runs on the host (device: host) list the branches explicitly, e.g. [0, 1], "
            "or leave devices out");
  EXPECT_EQ(config_error(small("  devices: all\n"), with_gpus(0)),
            "x.yaml:2:12: pipeline.devices: 'all' means every visible CUDA device, and the "
            "pipeline runs on the host (device: auto, and " +
                host_reason(with_gpus(0)) +
                ": host types) list the branches explicitly, e.g. [0, 1], or leave devices out");
}

TEST(BranchesConfig, BadValuesNameTheirPlace) {
  const Registry r = with_gpus(0);
  EXPECT_EQ(config_error(small("  devices: []\n"), r),
            "x.yaml:2:12: pipeline.devices: an empty list (a pipeline needs at least one device) "
            "list one or more device ordinals, or leave devices out to use device_id");
  EXPECT_EQ(config_error(small("  devices: [0, x, -1]\n"), r),
            "x.yaml:2:16: pipeline.devices[1]: expected an int, got 'x'\n"
            "x.yaml:2:19: pipeline.devices[2]: -1 is out of range (must be between 0 and 1024)");
  EXPECT_EQ(config_error(small("  devices: 1\n"), r),
            "x.yaml:2:12: pipeline.devices: expected a list of CUDA device ordinals or 'all', got "
            "'1'");
  EXPECT_EQ(config_error(small("  device_id: 1\n  devices: [0, 1]\n"), r),
            "x.yaml:2:14: pipeline.device_id: set together with pipeline.devices (devices names "
            "every device the pipeline uses; the shared stages run on its first entry) remove one "
            "of them");
  EXPECT_EQ(config_error(small("  devices: [0, 1]\n  devicesx: [0]\n"), r),
            "x.yaml:3:3: pipeline.devicesx: unknown key (did you mean 'devices'?)");
}

TEST(BranchesConfig, SeveralDevicesNeedRunModeAndAnUploadNode) {
  const Registry r = with_gpus(0);
  EXPECT_EQ(
      config_error(
          "pipeline:\n  mode: pull\n  devices: [0, 1]\nnodes:\n"
          "  - { name: load, type: synthetic, params: { batches: 4, sample_shape: [5] } }\n"
          "  - { name: upload, type: host_upload }\n",
          r),
      "x.yaml:3:12: pipeline.devices: 2 devices need mode: run (a branch per device ends in its "
      "own train node; pull mode hands every batch to one caller loop) list one device, or set "
      "pipeline.mode: run");
  EXPECT_EQ(
      config_error(
          "pipeline:\n  devices: [0, 1]\nnodes:\n"
          "  - { name: load, type: synthetic, params: { batches: 4, sample_shape: [5] } }\n"
          "  - { name: train, type: checksum }\n",
          r),
      "x.yaml:2:12: pipeline.devices: 2 devices replicate the chain from its upload node on, and "
      "this chain has none add an upload node (cuda_upload or host_upload) before the train node");
}

TEST(BranchesConfig, CudaChecksEveryListedDevice) {
  Registry r = with_gpus(2);
  if (!r.cuda_built()) GTEST_SKIP() << "built without CUDA (FLOWFEED_CUDA=OFF)";
  const std::string cuda_chain =
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 4, sample_shape: [5] } }\n"
      "  - { name: stage, type: pinned_staging }\n"
      "  - { name: upload, type: cuda_upload }\n"
      "  - { name: train, type: device_checksum }\n";
  EXPECT_EQ(config_error("pipeline:\n  device: cuda\n  devices: [1, 2, 0, 5]\n" + cuda_chain, r),
            "x.yaml:3:12: pipeline.devices[1]: 2 is out of range (2 CUDA devices visible)\n"
            "x.yaml:3:12: pipeline.devices[3]: 5 is out of range (2 CUDA devices visible)");
  const PipelineConfig all =
      load_config_string("pipeline:\n  devices: all\n" + cuda_chain, r, {}, "x.yaml");
  EXPECT_EQ(all.backend, Backend::cuda);
  EXPECT_EQ(all.pipeline.devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(all.pipeline.device_id, 0);
  // device: auto takes CUDA only when every listed device is visible.
  const PipelineConfig past =
      load_config_string("pipeline:\n  devices: [0, 2]\n" + cuda_chain, r, {}, "x.yaml");
  EXPECT_EQ(past.backend, Backend::host);
  EXPECT_EQ(past.device_reason,
            "device: auto, devices up to 2 but 2 CUDA devices visible: host types");
}

TEST(BranchesConfig, MlpAsksForOneProcessPerGpu) {
  Registry r = with_gpus(0);
  const std::string yaml =
      "pipeline:\n  batch_size: 8\n  devices: [0, 1]\nnodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 4, sample_shape: [5] } }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: mlp, params: { hidden: [4] } }\n";
  try {
    Pipeline p(load_config_string(yaml, r, {}, "x.yaml"), r);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "x.yaml:7:5: nodes.train.type: mlp does not train on several pipeline.devices in one "
              "process (its 2 branches would each update their own weights; averaging gradients "
              "across branches is not implemented) run one process per GPU with mpirun or "
              "torchrun and all_reduce: nccl, each with one device_id");
  }
}

TEST(BranchesBuilder, DevicesFromCpp) {
  Registry r = with_gpus(0);
  Pipeline p = PipelineBuilder()
                   .batch_size(10)
                   .device(DeviceChoice::host)
                   .devices({0, 1, 2})
                   .load("synthetic", {{"samples", 300}, {"sample_shape", {4}}})
                   .upload("host_upload")
                   .train("checksum")
                   .build(r);
  const RunReport report = p.run();
  EXPECT_EQ(report.batches, 30u);
  ASSERT_EQ(report.branches.size(), 3u);
  for (const auto& b : report.branches) EXPECT_EQ(b.batches, 10u);
  EXPECT_EQ(report.extra.at("checksum_bytes_verified"), static_cast<double>(report.bytes_uploaded));

  const int line = __LINE__ + 3;
  try {
    PipelineBuilder()
        .all_devices()
        .load("synthetic", {{"samples", 300}, {"sample_shape", {4}}})
        .upload("host_upload")
        .train("checksum")
        .build(r);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              std::string(__FILE__) + ":" + std::to_string(line) +
                  ": pipeline.devices: 'all' means every visible CUDA device, and the pipeline "
                  "runs on the host (device: auto, and " +
                  host_reason(r) +
                  ": host types) list the branches explicitly, e.g. [0, 1], or leave devices out");
  }
}

}  // namespace
}  // namespace flowfeed
