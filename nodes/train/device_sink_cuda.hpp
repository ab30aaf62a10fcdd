#pragma once
// What the CUDA train-role sinks (device_checksum, device_discard) share: a device, a
// non-blocking stream of their own, and the CUDA contract (wait on the batch's ready event on that
// stream, record its reuse event after the last kernel that reads it).

#include <cuda_runtime.h>

#include <string>

#include "cuda/cuda_check.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

/// What both sinks share: a device, a non-blocking stream, and the ready/reuse protocol. `Base`
/// is Node (one batch per process()) or AsynchronousNode (batches completed in groups).
template <class Base>
class DeviceSink : public Base {
 public:
  ~DeviceSink() override {
    if (stream_) cudaStreamDestroy(stream_);
    cudaGetLastError();
  }

  void setup(BuildContext& context) override {
    device_ = context.device_id();
    name_ = context.spec().name;
    type_ = context.spec().type;
    nvtx_ = cuda::nvtx_name(name_);
    description_ = cuda::device_description(device_);
    cuda::set_device(device_);
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }

  void quiesce() noexcept override {
    if (stream_ && !sticky_) {
      if (cudaStreamSynchronize(stream_) != cudaSuccess) cudaGetLastError();
    }
  }

  void finish(RunReport& report) override { report.device = description_; }

 protected:
  /// Throws unless the batch carries a device buffer and a ready event.
  void require_device(const Batch& batch) const {
    if (!batch.ready_event || !batch.device) {
      throw Error(type_ +
                  ": the batch has no device buffer and ready event (the upload node must "
                  "be cuda_upload)");
    }
  }
  /// Makes this node's stream wait until the batch's bytes are on the device.
  void wait_ready(Batch& batch) {
    require_device(batch);
    wait_event(batch.ready_event);
  }
  void wait_event(void* event) {
    checked([&] {
      FLOWFEED_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event), 0));
    });
  }
  /// Tells the upload node that this node's last use of the buffer is enqueued.
  void record_reuse(Batch& batch) {
    if (!batch.reuse_event) return;
    checked([&] {
      FLOWFEED_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(batch.reuse_event), stream_));
    });
  }
  /// Runs f; remembers a sticky error so that quiesce() does not wait on a dead context.
  template <class F>
  void checked(F&& f) {
    try {
      f();
    } catch (const CudaError& e) {
      if (e.sticky()) sticky_ = true;
      throw;
    }
  }

  int device_ = 0;
  std::string name_;
  std::string type_;
  std::string description_;
  nvtxStringHandle_t nvtx_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool sticky_ = false;
};

}  // namespace flowfeed
