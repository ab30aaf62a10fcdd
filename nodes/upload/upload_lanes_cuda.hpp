#pragma once
// cuda_upload's copy lanes (one non-blocking stream each) and the one thread that completes their
// copies by polling ready events.
//
// Why a polling thread: a host callback per batch on the copy stream (cudaStreamAddCallback or
// cudaLaunchHostFunc) blocks later work in that stream and caps small batches at ~20,000/s, and
// cudaLaunchHostFunc never runs after a sticky error. Polling cudaEventQuery costs ~0.7 µs, sees
// every error, and lets completions of one stream be taken in groups (events of one stream
// complete in order, so when the newest is done all are).
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/cuda/nvtx.hpp"
#include "flowfeed/node.hpp"
#include "upload/piece_copy_cuda.hpp"

namespace flowfeed {

/// A copy on a lane whose ready event has been recorded, until the poller completes it.
struct PendingCopy {
  Batch* batch = nullptr;
  Completion done;
  cudaEvent_t ready = nullptr;
  nvtxRangeId_t range = 0;
};

/// One stream and the copies outstanding on it, oldest first.
struct UploadLane {
  cudaStream_t stream = nullptr;
  std::mutex submit_mutex;  // held by a submitter across its CUDA calls
  std::mutex mutex;         // guards the ring
  std::vector<PendingCopy> ring;
  std::size_t head = 0;
  std::size_t count = 0;
  std::uint64_t recorded = 0;     // copies enqueued on the stream (under submit_mutex)
  cuda::FenceSlot waited;         // the newest reader's fence the stream waits on (submit_mutex)
  std::uint64_t reuse_waits = 0;  // cudaStreamWaitEvent calls before copies (submit_mutex)
  std::atomic<std::uint64_t> copies{0};
  PieceCopy pieces;  // the copies of batches with external ranges (submit_mutex)
};

/// The lanes of one cuda_upload node and their completion thread. A submitter enqueues its copy
/// and records the ready event under the lane's submit_mutex, then add()s it; the thread hands each
/// batch on once its copy is done (or fails every outstanding batch after an error).
class UploadLanes {
 public:
  UploadLanes() = default;
  UploadLanes(const UploadLanes&) = delete;
  UploadLanes& operator=(const UploadLanes&) = delete;
  ~UploadLanes() { stop(); }

  /// Creates `streams` non-blocking streams (current device), each with room for `depth`
  /// outstanding copies (each holds a device buffer) and piece arrays for `batch_size` rows.
  void create(int streams, std::size_t depth, std::size_t batch_size);
  /// Starts the completion thread on `device`.
  void start(int device);
  /// Stops and joins the completion thread (outstanding copies stay as they are).
  void stop() noexcept;
  /// Destroys the streams (errors ignored).
  void destroy_streams() noexcept;

  std::size_t size() const noexcept { return lanes_.size(); }
  UploadLane& operator[](std::size_t i) noexcept { return *lanes_[i]; }
  auto begin() noexcept { return lanes_.begin(); }
  auto end() noexcept { return lanes_.end(); }

  /// Hands a copy whose ready event was just recorded on `lane`'s stream to the completion thread.
  /// Under the lane's submit_mutex, so that its ring keeps its copies in the order their events
  /// were recorded.
  void add(UploadLane& lane, PendingCopy pending);

  /// True once a sticky error was seen: every later copy would fail too.
  bool sticky() const noexcept { return sticky_.load(std::memory_order_acquire); }
  /// The sticky error (valid once sticky()).
  const std::exception_ptr& sticky_error() const noexcept { return sticky_error_; }

 private:
  void poll();
  bool poll_lane(UploadLane& lane);
  cudaEvent_t event_at(UploadLane& lane, std::size_t i);
  void take(UploadLane& lane, std::size_t n);
  void complete_taken(UploadLane& lane, const std::exception_ptr& error);
  void fail_all(cudaError_t code);

  std::vector<std::unique_ptr<UploadLane>> lanes_;
  int device_ = 0;
  std::vector<PendingCopy> taken_;  // the poller's scratch, reserved in create()
  std::thread poller_;
  std::atomic<int> outstanding_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> sticky_{false};
  std::exception_ptr sticky_error_;  // written once, before sticky_ becomes true
};

}  // namespace flowfeed
