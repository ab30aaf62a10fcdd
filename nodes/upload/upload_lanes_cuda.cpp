// The completion thread of cuda_upload's lanes (upload_lanes_cuda.hpp).
#include "upload/upload_lanes_cuda.hpp"

#include <chrono>
#include <stdexcept>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"

namespace flowfeed {

void UploadLanes::create(int streams, std::size_t depth, std::size_t batch_size) {
  for (int s = 0; s < streams; ++s) {
    auto lane = std::make_unique<UploadLane>();
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking));
    // At most `depth` copies are outstanding: each holds a device buffer.
    lane->ring.resize(depth);
    lane->pieces.reserve(batch_size);
    lanes_.push_back(std::move(lane));
  }
  taken_.reserve(depth);
}

void UploadLanes::start(int device) {
  device_ = device;
  poller_ = std::thread([this] { poll(); });
}

void UploadLanes::stop() noexcept {
  if (!poller_.joinable()) return;
  stop_.store(true);
  outstanding_.fetch_add(1);
  outstanding_.notify_one();
  poller_.join();
}

void UploadLanes::destroy_streams() noexcept {
  for (auto& lane : lanes_) {
    if (lane->stream) cudaStreamDestroy(lane->stream);
    lane->stream = nullptr;
  }
}

void UploadLanes::add(UploadLane& lane, PendingCopy pending) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(lane.mutex);
    if (lane.count == lane.ring.size()) {
      throw std::logic_error("cuda_upload: more copies outstanding than device buffers");
    }
    lane.ring[(lane.head + lane.count) % lane.ring.size()] = std::move(pending);
    ++lane.count;
    wake = outstanding_.fetch_add(1, std::memory_order_release) == 0;
  }
  if (wake) outstanding_.notify_one();
}

/// Moves the oldest `n` entries of a lane into taken_.
void UploadLanes::take(UploadLane& lane, std::size_t n) {
  std::lock_guard<std::mutex> lock(lane.mutex);
  for (std::size_t i = 0; i < n; ++i) {
    taken_.push_back(lane.ring[lane.head]);
    lane.ring[lane.head] = PendingCopy{};
    lane.head = (lane.head + 1) % lane.ring.size();
  }
  lane.count -= n;
}

/// Completes what take() collected: returns the staging buffers (their copy is done) and hands
/// each batch on, or fails it with `error`.
void UploadLanes::complete_taken(UploadLane& lane, const std::exception_ptr& error) {
  for (PendingCopy& p : taken_) {
    nvtxDomainRangeEnd(cuda::nvtx_domain(), p.range);
    if (!error) {
      cuda::BufferEvents::mark_complete(p.batch->sync);  // readers need not wait on it
      p.batch->staging.reset();
      p.batch->host.reset();
      lane.copies.fetch_add(1, std::memory_order_relaxed);
    }
    p.done(error);
  }
  outstanding_.fetch_sub(static_cast<int>(taken_.size()), std::memory_order_acq_rel);
  taken_.clear();
}

/// Fails every outstanding copy of every lane (nothing may wait forever after an error).
void UploadLanes::fail_all(cudaError_t code) {
  CudaError error = cuda::make_error(code, "cudaEventQuery");
  std::exception_ptr e = std::make_exception_ptr(error);
  if (error.sticky() && !sticky_.load()) {
    sticky_error_ = e;
    sticky_.store(true, std::memory_order_release);
  }
  for (auto& lane : lanes_) {
    std::size_t n;
    {
      std::lock_guard<std::mutex> lock(lane->mutex);
      n = lane->count;
    }
    take(*lane, n);
    complete_taken(*lane, e);
  }
}

/// The ready event of the lane's entry `i` (0 = oldest).
cudaEvent_t UploadLanes::event_at(UploadLane& lane, std::size_t i) {
  std::lock_guard<std::mutex> lock(lane.mutex);
  return lane.ring[(lane.head + i) % lane.ring.size()].ready;
}

/// Completes the lane's finished copies, oldest first; returns true when it completed one.
/// Steady state costs one cudaEventQuery (the oldest copy is still running); when the oldest is
/// done and so is the newest, every copy of the lane completes as one group.
bool UploadLanes::poll_lane(UploadLane& lane) {
  std::size_t n;
  {
    std::lock_guard<std::mutex> lock(lane.mutex);
    n = lane.count;
  }
  if (n == 0) return false;
  // Only this thread removes entries, so the oldest n stay put while we query without the lock.
  cudaError_t e = cudaEventQuery(event_at(lane, 0));
  if (e == cudaErrorNotReady) return false;
  std::size_t done = 1;
  if (e == cudaSuccess && n > 1) {
    e = cudaEventQuery(event_at(lane, n - 1));
    if (e == cudaSuccess) {
      done = n;
    } else if (e == cudaErrorNotReady) {
      for (e = cudaSuccess; done + 1 < n; ++done) {
        e = cudaEventQuery(event_at(lane, done));
        if (e != cudaSuccess) break;
      }
    }
  }
  if (e != cudaSuccess && e != cudaErrorNotReady) {
    fail_all(e);
    return true;
  }
  take(lane, done);
  complete_taken(lane, nullptr);
  return true;
}

void UploadLanes::poll() {
  using Clock = std::chrono::steady_clock;
  // The CUDA runtime binds a device per thread.
  if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();
  int idle = 0;
  while (true) {
    outstanding_.wait(0, std::memory_order_acquire);
    if (stop_.load()) return;
    bool progress = false;
    for (auto& lane : lanes_) progress |= poll_lane(*lane);
    if (progress) {
      idle = 0;
    } else if (++idle < 50) {
      // Between queries, spin about 2 µs without CUDA calls: a query takes the driver's locks
      // that the submitting and consuming threads need too. A 200 KB copy takes about 6 µs.
      const auto until = Clock::now() + std::chrono::microseconds(2);
      while (Clock::now() < until) {
      }
    } else {
      // Nothing finished for ~100 µs (large copies): stop spinning a core on them.
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
}

}  // namespace flowfeed
