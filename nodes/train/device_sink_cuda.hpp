#pragma once
// What the CUDA train-role sinks (device_checksum, device_discard) share: a device, a
// non-blocking stream of their own, and the device hand-off on it (flowfeed/cuda/handoff.hpp).

#include <cuda_runtime.h>

#include <string>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/cuda/nvtx.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/stats.hpp"

namespace flowfeed {

/// What both sinks share: a device, a non-blocking stream, and the device hand-off. `Base`
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
    if (!batch.sync.ready() || !batch.device) {
      throw Error(type_ +
                  ": the batch has no device buffer and ready event (the upload node must "
                  "be cuda_upload)");
    }
  }
  /// Makes this node's stream wait until the batch's bytes are on the device.
  void wait_ready(Batch& batch) {
    require_device(batch);
    checked([&] { cuda::wait_ready(batch.sync, stream_); });
  }
  /// Tells the batch's producer that this node's last use of the buffer is enqueued.
  void release(Batch& batch) {
    checked([&] { cuda::release_after(batch.sync, stream_); });
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
