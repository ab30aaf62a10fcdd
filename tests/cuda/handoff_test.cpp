// The device hand-off (flowfeed/cuda/handoff.hpp) between a producer and a reader on two streams
// of their own, without a pipeline: what the reader reads and what the producer overwrites.
#include "flowfeed/cuda/handoff.hpp"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "gpu_test.hpp"
#include "test_kernels.hpp"

namespace flowfeed {
namespace {

constexpr std::size_t kBytes = 1 << 20;

/// Two non-blocking streams, device buffers and a spin long enough that a missing wait shows.
class HandOff : public ::testing::Test {
 protected:
  void SetUp() override {
    FLOWFEED_REQUIRE_GPU();
    FLOWFEED_CUDA_CHECK(cudaSetDevice(0));
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&producer_, cudaStreamNonBlocking));
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&reader_, cudaStreamNonBlocking));
    int clock_khz = 0;
    FLOWFEED_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
    spin_ = 100LL * clock_khz;  // about 100 ms
  }
  void TearDown() override {
    cudaDeviceSynchronize();
    for (void* p : buffers_) cudaFree(p);
    if (producer_) cudaStreamDestroy(producer_);
    if (reader_) cudaStreamDestroy(reader_);
  }
  /// A device buffer of kBytes, every byte `value`.
  std::byte* buffer(int value) {
    void* p = nullptr;
    FLOWFEED_CUDA_CHECK(cudaMalloc(&p, kBytes));
    FLOWFEED_CUDA_CHECK(cudaMemset(p, value, kBytes));
    FLOWFEED_CUDA_CHECK(cudaDeviceSynchronize());
    buffers_.push_back(p);
    return static_cast<std::byte*>(p);
  }
  /// The bytes of a device buffer, read after every queued work.
  std::vector<std::uint8_t> bytes_of(const std::byte* p) {
    FLOWFEED_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::uint8_t> out(kBytes);
    FLOWFEED_CUDA_CHECK(cudaMemcpy(out.data(), p, kBytes, cudaMemcpyDeviceToHost));
    return out;
  }
  static bool all(const std::vector<std::uint8_t>& v, std::uint8_t value) {
    for (std::uint8_t b : v) {
      if (b != value) return false;
    }
    return true;
  }

  cudaStream_t producer_ = nullptr;
  cudaStream_t reader_ = nullptr;
  long long spin_ = 0;
  std::vector<void*> buffers_;
};

TEST_F(HandOff, TheReaderSeesEveryByteTheProducerWroteBeforeItHandedTheBatchOn) {
  std::byte* source = buffer(0xAB);
  std::byte* device = buffer(0);
  std::byte* copy = buffer(0);
  cuda::BufferEvents events;
  events.create(1, /*fences=*/false);
  DeviceSync sync;
  FLOWFEED_CUDA_CHECK(test::launch_slow_copy(source, device, kBytes, spin_, producer_));
  events.publish(sync, 0, producer_, 1, 0);
  EXPECT_TRUE(sync.ready());
  EXPECT_TRUE(cuda::ready_pending(sync));  // the producer's kernel still spins
  cuda::wait_ready(sync, reader_);
  FLOWFEED_CUDA_CHECK(cudaMemcpyAsync(copy, device, kBytes, cudaMemcpyDeviceToDevice, reader_));
  EXPECT_TRUE(all(bytes_of(copy), 0xAB));
  EXPECT_FALSE(cuda::ready_pending(sync));  // completed since
}

TEST_F(HandOff, TheProducerOverwritesABufferOnlyAfterItsReaderReleasedIt) {
  std::byte* device = buffer(0x11);
  std::byte* mirror = buffer(0);
  cuda::BufferEvents events;
  events.create(1, /*fences=*/false);
  DeviceSync sync;
  events.publish(sync, 0, producer_, 1, 0);
  cuda::wait_ready(sync, reader_);
  FLOWFEED_CUDA_CHECK(test::launch_slow_copy(device, mirror, kBytes, spin_, reader_));
  cuda::release_after(sync, reader_);
  EXPECT_TRUE(events.wait_reuse(0, producer_));
  FLOWFEED_CUDA_CHECK(cudaMemsetAsync(device, 0x22, kBytes, producer_));
  EXPECT_TRUE(all(bytes_of(mirror), 0x11));
  EXPECT_TRUE(all(bytes_of(device), 0x22));
}

TEST_F(HandOff, AGroupWaitCoversEveryBatchOfAStreamAndAnInPlaceTransform) {
  std::byte* source = buffer(0x5C);
  std::byte* devices[3] = {buffer(0), buffer(0), buffer(0)};
  cuda::BufferEvents events;
  events.create(3, /*fences=*/false);
  DeviceSync syncs[3];
  for (std::uint64_t i = 0; i < 3; ++i) {
    FLOWFEED_CUDA_CHECK(test::launch_slow_copy(source, devices[i], kBytes, spin_, producer_));
    events.publish(syncs[i], i, producer_, i + 1, 0);
  }
  // The last batch is rewritten in place on a third stream, behind an event of its own.
  cudaStream_t transform = nullptr;
  cudaEvent_t rewritten = nullptr;
  FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&transform, cudaStreamNonBlocking));
  FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&rewritten, cudaEventDisableTiming));
  std::byte* other = buffer(0x77);
  cuda::wait_ready(syncs[2], transform);
  FLOWFEED_CUDA_CHECK(test::launch_slow_copy(other, devices[2], kBytes, spin_, transform));
  cuda::hand_on_in_place(syncs[2], rewritten, transform);
  EXPECT_TRUE(syncs[2].wants_release());  // the release stays the producer's
  const DeviceSync* group[3] = {&syncs[0], &syncs[1], &syncs[2]};
  cuda::wait_ready_all(group, 3, reader_);
  std::byte* copies[3] = {buffer(0), buffer(0), buffer(0)};
  for (int i = 0; i < 3; ++i) {
    FLOWFEED_CUDA_CHECK(
        cudaMemcpyAsync(copies[i], devices[i], kBytes, cudaMemcpyDeviceToDevice, reader_));
  }
  FLOWFEED_CUDA_CHECK(cudaStreamSynchronize(reader_));
  // Read on the host only now: the reader's copies were ordered by the waits alone.
  std::vector<std::uint8_t> seen[3];
  for (int i = 0; i < 3; ++i) {
    seen[i].resize(kBytes);
    FLOWFEED_CUDA_CHECK(cudaMemcpy(seen[i].data(), copies[i], kBytes, cudaMemcpyDeviceToHost));
  }
  EXPECT_TRUE(all(seen[0], 0x5C));
  EXPECT_TRUE(all(seen[1], 0x5C));
  EXPECT_TRUE(all(seen[2], 0x77));
  cudaDeviceSynchronize();
  cudaEventDestroy(rewritten);
  cudaStreamDestroy(transform);
}

TEST_F(HandOff, OneFenceReleasesAGroupAndTheProducerWaitsOnItOnce) {
  std::byte* devices[2] = {buffer(0x33), buffer(0x33)};
  std::byte* mirrors[2] = {buffer(0), buffer(0)};
  cuda::BufferEvents events;
  events.create(2, /*fences=*/true);
  DeviceSync syncs[2];
  for (std::size_t i = 0; i < 2; ++i) events.publish(syncs[i], i, producer_, i + 1, 0);
  EXPECT_TRUE(syncs[0].takes_fence());
  const DeviceSync* ready[2] = {&syncs[0], &syncs[1]};
  cuda::wait_ready_all(ready, 2, reader_);
  for (int i = 0; i < 2; ++i) {
    FLOWFEED_CUDA_CHECK(test::launch_slow_copy(devices[i], mirrors[i], kBytes, spin_, reader_));
  }
  cuda::ReuseFences fences;
  fences.create(2);
  DeviceSync* group[2] = {&syncs[0], &syncs[1]};
  fences.fence_group(group, 2, reader_);
  cuda::FenceSlot newest;
  EXPECT_TRUE(events.wait_reuse(0, producer_, &newest));
  EXPECT_FALSE(events.wait_reuse(1, producer_, &newest));  // the same fence: already waited on
  for (int i = 0; i < 2; ++i) {
    FLOWFEED_CUDA_CHECK(cudaMemsetAsync(devices[i], 0x44, kBytes, producer_));
  }
  EXPECT_TRUE(all(bytes_of(mirrors[0]), 0x33));
  EXPECT_TRUE(all(bytes_of(mirrors[1]), 0x33));
}

}  // namespace
}  // namespace flowfeed
