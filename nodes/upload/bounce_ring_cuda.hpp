#pragma once
// cuda_upload's bounce buffers: a ring of page-locked buffers that batches arriving in pageable
// memory are copied through, in chunks, each chunk's DMA started as soon as its host copy is done.
#include <cuda_runtime.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "flowfeed/node.hpp"
#include "flowfeed/pool.hpp"

namespace flowfeed {

/// The ring, handed out oldest first (the buffer whose DMA was enqueued longest ago is the
/// likeliest to be done). Empty until create(). Chunks may be copied from any thread.
class BounceRing {
 public:
  BounceRing() = default;
  BounceRing(const BounceRing&) = delete;
  BounceRing& operator=(const BounceRing&) = delete;
  ~BounceRing() { destroy_events(); }

  /// Makes the node's pool "bounce" of `count` page-locked buffers of `bytes` each, and an event
  /// per buffer (current device).
  void create(BuildContext& context, std::size_t count, std::size_t bytes);
  /// Destroys the events (errors ignored).
  void destroy_events() noexcept;
  /// True once created.
  bool active() const noexcept { return pool_ != nullptr; }
  /// Bytes per buffer: the chunk size.
  std::size_t bytes() const noexcept { return bytes_; }

  /// Copies `bytes` (at most bytes()) from pageable `src` into the oldest free buffer (waiting for
  /// one, and for that buffer's previous DMA) and enqueues its DMA to `dst` on `stream`, with
  /// `device` current. Throws CudaError.
  void copy_chunk(std::byte* dst, const std::byte* src, std::size_t bytes, cudaStream_t stream,
                  int device);

  /// Chunks copied since the last call.
  std::uint64_t take_chunks() noexcept { return chunks_.exchange(0); }
  /// Bytes copied since the last call.
  std::uint64_t take_bytes() noexcept { return bytes_copied_.exchange(0); }

 private:
  std::size_t bytes_ = 0;
  BufferPool* pool_ = nullptr;       // its buffers are leased by index, in the order of `free_`
  std::vector<cudaEvent_t> copied_;  // recorded after each buffer's last DMA
  std::mutex mutex_;
  std::condition_variable returned_;
  std::deque<std::size_t> free_;
  std::atomic<std::uint64_t> chunks_{0};
  std::atomic<std::uint64_t> bytes_copied_{0};
};

}  // namespace flowfeed
