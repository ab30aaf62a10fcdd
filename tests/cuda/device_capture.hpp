#pragma once
// A train node for GPU tests: copies every tensor of each batch back from the device once its
// upload is ready, with the batch's samples, so a test compares the bytes that reached the GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <vector>

#include "flowfeed/extend.hpp"
#include "flowfeed/registry.hpp"

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
      ASSERT_EQ(cudaEventSynchronize(static_cast<cudaEvent_t>(batch.ready_event)), cudaSuccess);
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

}  // namespace flowfeed::test
