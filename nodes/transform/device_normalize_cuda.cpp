// device_normalize: the CUDA implementation of `normalize`. It is a reader of cuda_upload's device
// buffer and the producer of a float one (flowfeed/cuda/handoff.hpp, rule 3): its own stream waits
// until the batch is ready, one kernel converts into a buffer of its own device pool, the upload's
// buffer is released after that kernel, and the batch leaves with the new buffer behind this
// node's events, which the train node (or a pull-mode caller) uses as it would the upload's.
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/cuda/nvtx.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "flowfeed/nodes/normalize.hpp"
#include "flowfeed/registry.hpp"
#include "transform/normalize_kernel.hpp"

namespace flowfeed {

namespace {

class DeviceNormalize final : public Node {
 public:
  explicit DeviceNormalize(NormalizeOptions options) : options_(std::move(options)) {}

  ~DeviceNormalize() override {
    events_.destroy();
    if (stream_) cudaStreamDestroy(stream_);
    cudaGetLastError();
  }

  void plan(PlanContext& plan) const override {
    plan_normalize(plan, options_, MemoryKind::device);
  }

  void setup(BuildContext& context) override {
    const NodeSpec& spec = context.spec();
    type_ = spec.type;
    device_ = context.device_id();
    nvtx_ = cuda::nvtx_name(spec.name);
    in_ = &context.layout();
    index_ = static_cast<std::size_t>(in_->find(options_.tensor));
    out_ = &context.change_layout(normalized_tensors(in_->tensors(), options_, spec));
    if (in_->tensors().size() > cuda::NormalizeArgs::kMaxCopies + 1) {
      throw ConfigError({spec.loc.str() + ": nodes." + spec.name + ".type: the batches have " +
                         std::to_string(in_->tensors().size()) + " tensors (device_normalize " +
                         "moves at most " + std::to_string(cuda::NormalizeArgs::kMaxCopies + 1) +
                         ")"});
    }
    const auto& shape = in_->tensors()[index_].shape;
    const bool chw = options_.layout == ChannelLayout::chw;
    args_.plane = static_cast<std::size_t>(chw ? shape[1] * shape[2] : shape[0] * shape[1]);
    args_.channels = static_cast<int>(options_.mean.size());
    args_.chw = chw;
    args_.dtype = options_.dtype == DType::float16    ? cuda::NormalizeArgs::Out::float16
                  : options_.dtype == DType::bfloat16 ? cuda::NormalizeArgs::Out::bfloat16
                                                      : cuda::NormalizeArgs::Out::float32;
    for (int c = 0; c < args_.channels; ++c) {
      args_.mean[c] = static_cast<float>(options_.mean[static_cast<std::size_t>(c)]);
      args_.stddev[c] = static_cast<float>(options_.stddev[static_cast<std::size_t>(c)]);
    }
    cuda::set_device(device_);
    pool_ = &context.make_batch_pool("device", MemoryKind::device, out_->capacity(),
                                     cuda::device_allocator(device_));
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    // A ready and a reuse event per output buffer, as cuda_upload has per device buffer.
    events_.create(pool_->count(), /*fences=*/false);
  }

  void begin_run() override { order_ = 0; }

  void process(Batch& batch) override {
    if (!batch.sync.ready() || !batch.device) {
      throw Error(type_ +
                  ": the batch has no device buffer and ready event (put device_normalize after "
                  "cuda_upload)");
    }
    cuda::NvtxRange range(nvtx_, batch.seq);
    // One stream: launches and the order numbers below follow one another.
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      cuda::set_device(device_);
      Lease out = pool_->acquire();
      const std::size_t buffer = out.index();
      const std::size_t rows = batch.rows();
      cuda::NormalizeArgs args = args_;
      args.in = reinterpret_cast<const std::uint8_t*>(batch.tensor(Tier::device, index_));
      args.out = out.data() + out_->offset(index_, rows);
      args.elements = rows * in_->tensors()[index_].sample_elements();
      for (std::size_t i = 0; i < in_->tensors().size(); ++i) {
        if (i == index_) continue;
        args.copies[args.copy_count++] = {
            reinterpret_cast<const unsigned char*>(batch.tensor(Tier::device, i)),
            reinterpret_cast<unsigned char*>(out.data() + out_->offset(i, rows)),
            rows * in_->tensors()[i].sample_bytes()};
      }
      cuda::wait_ready(batch.sync, stream_);
      // The output buffer's last reader (the train node) released it after its last kernel.
      events_.wait_reuse(buffer, stream_);
      cuda::launch_normalize(args, stream_);
      // The upload may overwrite its buffer once the kernel has read it.
      cuda::release_after(batch.sync, stream_);
      // The batch leaves with the new buffer behind this node's ready event, numbered on its one
      // stream, and takes no fences.
      events_.publish(batch.sync, buffer, stream_, order_ + 1, 0);
      ++order_;
      batch.device = std::move(out);  // the upload's buffer goes back to its pool
      batch.layout = out_;
    } catch (const CudaError& e) {
      if (e.sticky()) sticky_ = true;
      throw;
    }
  }

  void quiesce() noexcept override {
    if (stream_ && !sticky_) {
      if (cudaStreamSynchronize(stream_) != cudaSuccess) cudaGetLastError();
    }
  }

 private:
  NormalizeOptions options_;
  std::string type_;
  int device_ = 0;
  nvtxStringHandle_t nvtx_ = nullptr;
  const BatchLayout* in_ = nullptr;
  const BatchLayout* out_ = nullptr;
  std::size_t index_ = 0;
  cuda::NormalizeArgs args_;
  BufferPool* pool_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cuda::BufferEvents events_;
  std::mutex mutex_;
  std::uint64_t order_ = 0;
  bool sticky_ = false;
};

}  // namespace

std::unique_ptr<Node> make_device_normalize(NormalizeOptions options) {
  return std::make_unique<DeviceNormalize>(std::move(options));
}

void register_device_normalize(Registry& registry) {
  registry.set(normalize_type("device_normalize", make_device_normalize,
                              "uint8 images to float32/float16/bfloat16, (x - mean) / std per "
                              "channel, in one kernel on its own stream after cuda_upload",
                              TypeBackend::cuda, "normalize"));
}

}  // namespace flowfeed
