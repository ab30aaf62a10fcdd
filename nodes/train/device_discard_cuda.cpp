// device_discard: waits on each batch's ready event and gives its device buffer back (the CUDA
// counterpart of discard: the pipeline and the copies measured alone).

#include <memory>

#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "flowfeed/registry.hpp"
#include "train/device_sink_cuda.hpp"

namespace flowfeed {

namespace {

class DeviceDiscard final : public DeviceSink<Node> {
 public:
  void process(Batch& batch) override {
    cuda::NvtxRange range(nvtx_, batch.seq);
    cuda::set_device(device_);
    wait_ready(batch);
    release(batch);
  }
};

}  // namespace

std::unique_ptr<Node> make_device_discard() {
  return std::make_unique<DeviceDiscard>();
}

void register_device_discard(Registry& registry) {
  registry.set(
      factory_type(
          "device_discard", Role::train, {}, [](const NodeSpec&) { return make_device_discard(); },
          "waits on each batch's ready event and frees its device buffer (measures the pipeline "
          "and the copies alone)")
          .runs_on(TypeBackend::cuda, "discard"));
}

}  // namespace flowfeed
