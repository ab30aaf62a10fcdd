// late_write: a test-only CUDA transform whose device work outlasts the batch's trip to the
// consumer (see late_write.hpp).
#include <cuda_runtime.h>

#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/node.hpp"
#include "flowfeed/testing/late_write.hpp"
#include "late_write_kernel.hpp"

namespace flowfeed {

namespace {

class LateWrite final : public Node {
 public:
  explicit LateWrite(double spin_ms) : spin_ms_(spin_ms) {}
  ~LateWrite() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void setup(BuildContext& context) override {
    device_ = context.device_id();
    cuda::set_device(device_);
    int clock_khz = 0;
    FLOWFEED_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device_));
    spin_cycles_ = static_cast<long long>(spin_ms_ * clock_khz);
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    events_.resize(static_cast<std::size_t>(context.prefetch_depth()));
    for (cudaEvent_t& e : events_) {
      FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }

  void process(Batch& batch) override {
    const TensorSpec& x = batch.layout->tensors().at(0);
    if (x.dtype != DType::float32 || !batch.device || !batch.sync.ready()) {
      throw std::logic_error("late_write needs a float32 x uploaded by a CUDA upload node");
    }
    cuda::set_device(device_);
    cudaEvent_t event = events_.at(batch.device.index());
    cuda::wait_ready(batch.sync, stream_);
    auto* data = reinterpret_cast<float*>(batch.tensor(Tier::device, 0));
    FLOWFEED_CUDA_CHECK(testing::launch_late_fill(data, batch.rows() * x.sample_elements(),
                                                  static_cast<float>(batch.seq + 1000),
                                                  spin_cycles_, stream_));
    // In place: the batch moves on behind this node's event; its upload still takes the release.
    cuda::hand_on_in_place(batch.sync, event, stream_);
  }

  void quiesce() noexcept override {
    if (stream_) cudaStreamSynchronize(stream_);
  }

 private:
  double spin_ms_;
  int device_ = 0;
  long long spin_cycles_ = 0;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;  // one per device buffer
};

}  // namespace

void register_late_write(Registry& registry) {
  Schema schema;
  schema.add_number("spin_ms", "GPU time spent before the fill, in milliseconds", 50.0)
      .range(0, 10000);
  registry.set(
      factory_type(
          "late_write", Role::transform, std::move(schema),
          [](const NodeSpec& spec) {
            return std::make_unique<LateWrite>(spec.params.get_number("spin_ms"));
          },
          "test only: fills x with seq + 1000 on the GPU after a spin, behind a new ready event")
          .runs_on(TypeBackend::cuda));
}

}  // namespace flowfeed
