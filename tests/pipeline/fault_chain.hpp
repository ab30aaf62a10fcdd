#pragma once
// The chain the reliability tests break: load → [transform] → staging → upload → train on the
// host, two epochs of 90 samples, with the node of one family replaced by its test-only fault type
// (flowfeed/testing/fault_nodes.hpp); what its errors say (node, declaring line, batch, epoch);
// and runs that must fail with every pool buffer back.

#include <gtest/gtest.h>

#include <exception>
#include <ostream>
#include <string>
#include <vector>

#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/testing/fault_nodes.hpp"

namespace flowfeed::test::fault_chain {

inline constexpr const char* kFile = "reliability.yaml";
// 90 samples in batches of 16: 5 full batches and one of 10 per epoch, two epochs.
inline constexpr int kEpochs = 2;
inline constexpr int kPerEpoch = 6;
inline constexpr int kBatches = kEpochs * kPerEpoch;
inline constexpr int kSamples = 90;
inline constexpr int kBatchSize = 16;
inline constexpr int kSampleBytes = 8 * 4;  // sample_shape [8], float32

inline Registry make_registry() {
  Registry registry;
  register_builtin_nodes(registry);
  register_fault_nodes(registry);
  return registry;
}

inline const Registry& registry() {
  static const Registry r = make_registry();
  return r;
}

/// One line of the `nodes:` list.
struct NodeLine {
  std::string name;
  std::string type;
  std::string params;  // the inside of `params: { ... }`
  int concurrency = 1;
};

/// A config whose `pipeline:` options are on line 1 and whose node i is declared on line 3 + i.
inline std::string make_yaml(const std::string& pipeline_extra,
                             const std::vector<NodeLine>& nodes) {
  std::string y = "pipeline: { epochs: " + std::to_string(kEpochs) +
                  ", batch_size: " + std::to_string(kBatchSize) +
                  ", prefetch_depth: 4, threads: 4, device: host" +
                  (pipeline_extra.empty() ? "" : ", " + pipeline_extra) + " }\nnodes:\n";
  for (const auto& n : nodes) {
    y += "  - { name: " + n.name + ", type: " + n.type +
         ", concurrency: " + std::to_string(n.concurrency) + ", params: { " + n.params + " } }\n";
  }
  return y;
}

inline const std::string kData =
    "samples: " + std::to_string(kSamples) + ", sample_shape: [8], seed: 3";

/// The families a fault can sit in.
enum class Family { load, transform, staging, upload, train };

inline const char* family_name(Family f) {
  switch (f) {
    case Family::load: return "load";
    case Family::transform: return "transform";
    case Family::staging: return "staging";
    case Family::upload: return "upload";
    case Family::train: return "train";
  }
  return "?";
}

/// The chain load → [xform] → stage → upload → train with the node of `family` replaced by its
/// fault type carrying `fault` params. A transform exists only when it is the faulty node. The
/// loader runs 2 bodies at once unless `serial_load`.
inline std::vector<NodeLine> chain(Family family, const std::string& fault,
                                   bool serial_load = false) {
  std::vector<NodeLine> nodes;
  const int load_conc = serial_load ? 1 : 2;
  if (family == Family::load) {
    nodes.push_back({"load", "fault_load", kData + ", " + fault, load_conc});
  } else {
    nodes.push_back({"load", "synthetic", kData, load_conc});
  }
  if (family == Family::transform) nodes.push_back({"xform", "fault_transform", fault, 2});
  nodes.push_back(family == Family::staging ? NodeLine{"stage", "fault_staging", fault, 1}
                                            : NodeLine{"stage", "host_staging", "", 1});
  nodes.push_back(family == Family::upload ? NodeLine{"upload", "fault_upload", fault, 1}
                                           : NodeLine{"upload", "host_upload", "", 1});
  nodes.push_back(family == Family::train ? NodeLine{"train", "fault_train", fault, 1}
                                          : NodeLine{"train", "checksum", "", 1});
  return nodes;
}

/// Name, type and declaring line of the faulty node in chain(family).
struct Faulty {
  std::string name, type;
  int line;
};
inline Faulty faulty(Family family) {
  switch (family) {
    case Family::load: return {"load", "fault_load", 3};
    case Family::transform: return {"xform", "fault_transform", 4};
    case Family::staging: return {"stage", "fault_staging", 4};
    case Family::upload: return {"upload", "fault_upload", 5};
    case Family::train: return {"train", "fault_train", 6};
  }
  return {};
}

inline std::string label(const Faulty& f) {
  return "node '" + f.name + "' (" + f.type + ", " + kFile + ":" + std::to_string(f.line) + ")";
}
inline std::string at(int batch) {
  return " batch " + std::to_string(batch) + " (epoch " + std::to_string(batch / kPerEpoch) + ")";
}
/// The offset a data error names: the file position of the batch's first sample (no shuffle).
inline std::string data_error_text(const std::string& type, int batch) {
  const int offset = (batch % kPerEpoch) * kBatchSize * kSampleBytes;
  return "fault.bin: short read at offset " + std::to_string(offset) + " (injected by " + type +
         " at batch " + std::to_string(batch) + ")";
}
inline int rows_of(int batch) {
  return batch % kPerEpoch == kPerEpoch - 1 ? kSamples % kBatchSize : kBatchSize;
}

inline Pipeline build(const std::string& yaml) {
  return Pipeline(load_config_string(yaml, registry(), {}, kFile), registry());
}

/// Runs `p` expecting a NodeError; returns it (and checks that every buffer came back).
inline NodeError run_expecting_node_error(Pipeline& p) {
  try {
    p.run();
  } catch (const NodeError& e) {
    EXPECT_EQ(p.free_buffers(), p.total_buffers()) << "a buffer leaked after: " << e.what();
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a NodeError, got: " << e.what();
    return NodeError("", "", "", -2);
  }
  ADD_FAILURE() << "the run succeeded, expected it to fail";
  return NodeError("", "", "", -2);
}

inline std::string run_expecting_error(Pipeline& p) {
  try {
    p.run();
  } catch (const NodeError& e) {
    ADD_FAILURE() << "expected a plain Error, got NodeError: " << e.what();
    return e.what();
  } catch (const Error& e) {
    EXPECT_EQ(p.free_buffers(), p.total_buffers()) << "a buffer leaked after: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "the run succeeded, expected it to fail";
  return "";
}

inline const std::vector<Family> kFamilies = {Family::load, Family::transform, Family::staging,
                                              Family::upload, Family::train};
/// First batch, a middle one (in the second epoch), the last one.
inline const std::vector<int> kPositions = {0, 7, kBatches - 1};

inline void PrintTo(Family f, std::ostream* os) {
  *os << family_name(f);
}

}  // namespace flowfeed::test::fault_chain
