// cuda_upload's bounce buffers (bounce_ring_cuda.hpp).
#include "upload/bounce_ring_cuda.hpp"

#include <cstring>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"

namespace flowfeed {

void BounceRing::create(BuildContext& context, std::size_t count, std::size_t bytes) {
  bytes_ = bytes;
  pool_ = &context.make_pool("bounce", MemoryKind::pinned, count, bytes_, cuda::pinned_allocator());
  for (std::size_t i = 0; i < count; ++i) {
    cudaEvent_t e = nullptr;
    FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    copied_.push_back(e);
    free_.push_back(i);
  }
}

void BounceRing::destroy_events() noexcept {
  for (cudaEvent_t e : copied_) cudaEventDestroy(e);
  copied_.clear();
}

void BounceRing::copy_chunk(std::byte* dst, const std::byte* src, std::size_t bytes,
                            cudaStream_t stream, int device) {
  std::size_t slot;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    returned_.wait(lock, [&] { return !free_.empty(); });
    slot = free_.front();
    free_.pop_front();
  }
  // Leased by index (the pool's counters then show the ring's use); returned, then put back in
  // the ring, on every path.
  struct Borrowed {
    BounceRing& ring;
    std::size_t slot;
    Lease lease;
    ~Borrowed() {
      lease.reset();
      {
        std::lock_guard<std::mutex> lock(ring.mutex_);
        ring.free_.push_back(slot);
      }
      ring.returned_.notify_one();
    }
  } borrowed{*this, slot, pool_->acquire_at(slot)};
  cuda::set_device(device);  // the TBB worker running this chunk may have another current
  cudaEvent_t copied = copied_[slot];
  // Its previous DMA has read the buffer (usually long done: the ring hands out the oldest).
  FLOWFEED_CUDA_CHECK(cudaEventSynchronize(copied));
  std::memcpy(borrowed.lease.data(), src, bytes);
  FLOWFEED_CUDA_CHECK(
      cudaMemcpyAsync(dst, borrowed.lease.data(), bytes, cudaMemcpyHostToDevice, stream));
  FLOWFEED_CUDA_CHECK(cudaEventRecord(copied, stream));
  chunks_.fetch_add(1, std::memory_order_relaxed);
  bytes_copied_.fetch_add(bytes, std::memory_order_relaxed);
}

}  // namespace flowfeed
