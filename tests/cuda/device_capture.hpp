#pragma once
// A train node for GPU tests: copies every tensor of each batch back from the device once its
// upload is ready, with the batch's samples, so a test compares the bytes that reached the GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/registry.hpp"
#include "flowfeed/stats.hpp"
#include "tests/cuda/gpu_test.hpp"

namespace flowfeed::test {

/// What `device_capture` saw: per batch, its epoch, samples and each tensor's rows × sample
/// bytes.
struct DeviceCapture {
  std::mutex mutex;
  std::vector<std::uint32_t> epochs;
  std::vector<std::vector<std::uint32_t>> samples;
  std::vector<std::vector<std::vector<std::uint8_t>>> tensors;  // [batch][tensor] bytes
};

/// Registers `device_capture` (train role), filling `out`.
inline void register_device_capture(Registry& registry, std::shared_ptr<DeviceCapture> out) {
  class Capture final : public Node {
   public:
    explicit Capture(std::shared_ptr<DeviceCapture> out) : out_(std::move(out)) {}
    void process(Batch& batch) override {
      ASSERT_NO_THROW(cuda::synchronize_ready(batch.sync));
      std::vector<std::vector<std::uint8_t>> tensors;
      for (std::size_t i = 0; i < batch.layout->tensors().size(); ++i) {
        std::vector<std::uint8_t> bytes(batch.rows() * batch.layout->tensors()[i].sample_bytes());
        ASSERT_EQ(cudaMemcpy(bytes.data(), batch.tensor(Tier::device, i), bytes.size(),
                             cudaMemcpyDeviceToHost),
                  cudaSuccess);
        tensors.push_back(std::move(bytes));
      }
      std::lock_guard<std::mutex> lock(out_->mutex);
      out_->epochs.push_back(batch.epoch);
      out_->samples.push_back(batch.samples);
      out_->tensors.push_back(std::move(tensors));
    }

   private:
    std::shared_ptr<DeviceCapture> out_;
  };
  registry.set(factory_type(
      "device_capture", Role::train, {},
      [out](const NodeSpec&) { return std::make_unique<Capture>(out); },
      "test sink: copies every tensor back from the device"));
}

/// A run to `device_capture`: its report and what reached the device.
struct CapturedRun {
  RunReport report;
  std::shared_ptr<DeviceCapture> seen;
};

/// Runs two epochs of batches of 16 (shuffled, unless `sampler` says otherwise) on the device
/// through `load` (the loader's YAML node line), a pinned_staging node when `staging`,
/// cuda_upload and device_capture; fails, naming `what`, if the run hangs.
inline CapturedRun run_to_device_capture(const std::string& load, bool staging,
                                         const std::string& what,
                                         const std::string& sampler = "shuffle: true, seed: 3") {
  auto seen = std::make_shared<DeviceCapture>();
  Registry r = builtin_registry();
  register_device_capture(r, seen);
  const std::string yaml =
      "pipeline: { epochs: 2, batch_size: 16, prefetch_depth: 4, device: cuda }\n"
      "sampler: { " +
      sampler +
      " }\n"
      "nodes:\n" +
      load + (staging ? "  - { name: stage, type: pinned_staging }\n" : "") +
      "  - { name: upload, type: cuda_upload }\n"
      "  - { name: train, type: device_capture }\n";
  Pipeline p(load_config_string(yaml, r), r);
  return {within(60, what, [&] { return p.run(); }), seen};
}

/// Checks the report of a run whose loader reads into page-locked memory itself: nothing
/// allocated after build; the loader's buffers are the only host batch buffers (no staging pool,
/// no bounce buffers); a pinned_staging node (when `staging`) passed all `batches` through.
inline void expect_only_the_loaders_pinned_buffers(const RunReport& report, bool staging,
                                                   double batches) {
  EXPECT_EQ(report.allocations_after_build, 0u);
  std::vector<std::string> pools;
  for (const auto& pool : report.pools) pools.push_back(pool.name + " " + pool.kind);
  EXPECT_EQ(pools, (std::vector<std::string>{"load.staging pinned", "upload.device device"}));
  if (staging) {
    EXPECT_EQ(report.extra.at("stage.copied_bytes"), 0.0);
    EXPECT_EQ(report.extra.at("stage.passed_through_batches"), batches);
  }
  EXPECT_EQ(report.extra.count("upload.bounced_bytes"), 0u);
}

}  // namespace flowfeed::test
