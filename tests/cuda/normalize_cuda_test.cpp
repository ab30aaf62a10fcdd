// device_normalize on the GPU: the bytes it writes (float32, float16, bfloat16; hwc and chw; a
// partial last batch; labels moved along) equal the host `normalize` bit for bit, over several
// epochs so that both its output pool and the upload's buffers are reused; and it waits on the
// batch's ready event: a slow kernel that rewrites the images before that event is recorded must
// be what it converts.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/normalize.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/stats.hpp"
#include "gpu_test.hpp"
#include "test_kernels.hpp"

namespace flowfeed {
namespace {

constexpr std::uint64_t kSeed = 9;
constexpr int kSamples = 21;  // batches of 4: the last one has 1
constexpr std::uint8_t kRewritten = 200;

/// What the train node found in a device buffer: the batch's x dtype and its bytes, per sample.
struct Mirror {
  std::mutex mutex;
  std::vector<DType> dtypes;
  std::map<std::uint32_t, std::vector<std::byte>> x;  // last epoch's bytes per sample
  std::map<std::uint32_t, std::int32_t> y;
  int batches = 0;
};

/// A train node that copies each device batch back to the host on its own stream, after waiting
/// on the batch's ready event, and records its reuse event.
class MirrorTrain final : public Node {
 public:
  explicit MirrorTrain(std::shared_ptr<Mirror> mirror) : mirror_(std::move(mirror)) {}
  ~MirrorTrain() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  void setup(BuildContext& context) override {
    layout_ = &context.layout();
    host_.resize(layout_->capacity());
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void process(Batch& b) override {
    ASSERT_EQ(b.layout, layout_);  // the layout device_normalize declared
    cuda::wait_ready(b.sync, stream_);
    FLOWFEED_CUDA_CHECK(cudaMemcpyAsync(host_.data(), b.data(Tier::device), b.bytes(),
                                        cudaMemcpyDeviceToHost, stream_));
    cuda::release_after(b.sync, stream_);
    FLOWFEED_CUDA_CHECK(cudaStreamSynchronize(stream_));
    const TensorSpec& x = layout_->tensors()[0];
    std::lock_guard<std::mutex> lock(mirror_->mutex);
    mirror_->dtypes.push_back(x.dtype);
    ++mirror_->batches;
    for (std::size_t r = 0; r < b.rows(); ++r) {
      const std::byte* p = host_.data() + layout_->offset(0, b.rows()) + r * x.sample_bytes();
      mirror_->x[b.samples[r]].assign(p, p + x.sample_bytes());
      std::int32_t label;
      std::memcpy(&label, host_.data() + layout_->offset(1, b.rows()) + r * 4, 4);
      mirror_->y[b.samples[r]] = label;
    }
  }

 private:
  std::shared_ptr<Mirror> mirror_;
  const BatchLayout* layout_ = nullptr;
  std::vector<std::byte> host_;
  cudaStream_t stream_ = nullptr;
};

/// A transform between cuda_upload and device_normalize: after the upload's copy it overwrites
/// every image byte with kRewritten by a kernel that first spins for about a millisecond, and
/// hands on an event recorded after that kernel as the batch's ready event.
class SlowRewrite final : public Node {
 public:
  ~SlowRewrite() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (pattern_) cudaFree(pattern_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  void setup(BuildContext& context) override {
    const std::size_t bytes = context.layout().capacity();
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FLOWFEED_CUDA_CHECK(cudaMalloc(&pattern_, bytes));
    FLOWFEED_CUDA_CHECK(cudaMemset(pattern_, kRewritten, bytes));
    FLOWFEED_CUDA_CHECK(cudaDeviceSynchronize());
    // One event per upload buffer: a batch's event is not recorded again while it is in flight.
    events_.resize(static_cast<std::size_t>(context.prefetch_depth()));
    for (auto& e : events_) {
      FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  void process(Batch& b) override {
    cuda::wait_ready(b.sync, stream_);
    const std::size_t x_bytes = b.rows() * b.layout->tensors()[0].sample_bytes();
    FLOWFEED_CUDA_CHECK(
        test::launch_slow_copy(pattern_, b.tensor(Tier::device, 0), x_bytes, 2000000, stream_));
    cudaEvent_t e = events_.at(b.device.index());
    cuda::hand_on_in_place(b.sync, e, stream_);
  }

 private:
  cudaStream_t stream_ = nullptr;
  void* pattern_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

std::string config(const std::string& shape, const std::string& params, bool rewrite) {
  return "pipeline: { batch_size: 4, prefetch_depth: 3, epochs: 3, device: cuda }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, params: { samples: " +
         std::to_string(kSamples) + ", dtype: uint8, seed: " + std::to_string(kSeed) +
         ", sample_shape: " + shape +
         " } }\n"
         "  - { name: stage, type: pinned_staging }\n"
         "  - { name: upload, type: cuda_upload }\n" +
         (rewrite ? "  - { name: rewrite, type: slow_rewrite }\n" : "") +
         "  - { name: norm, type: device_normalize, params: { " + params +
         " } }\n"
         "  - { name: train, type: mirror }\n";
}

std::shared_ptr<Mirror> run(const std::string& yaml) {
  auto mirror = std::make_shared<Mirror>();
  Registry r = test::builtin_registry();
  NodeType mirror_type;
  mirror_type.name = "mirror";
  mirror_type.role = Role::train;
  mirror_type.create = [mirror](const NodeSpec&) { return std::make_unique<MirrorTrain>(mirror); };
  r.set(std::move(mirror_type));
  r.set(node_type<SlowRewrite>("slow_rewrite", Role::transform));
  Pipeline p(load_config_string(yaml, r), r);
  const RunReport report = test::within(60, "device_normalize run", [&] { return p.run(); });
  EXPECT_EQ(report.allocations_after_build, 0u);
  EXPECT_EQ(p.free_buffers(), p.total_buffers());
  EXPECT_EQ(mirror->batches, 3 * 6);
  return mirror;
}

/// Checks every sample's bytes against the host normalize of `raw(sample)`.
template <class Raw>
void expect_host_bits(const Mirror& m, const std::string& shape, DType dtype, ChannelLayout layout,
                      Raw raw) {
  const std::size_t elements = 6 * 5 * 3;
  NormalizeOptions o;
  o.dtype = dtype;
  o.layout = layout;
  ASSERT_EQ(m.x.size(), static_cast<std::size_t>(kSamples));
  for (DType d : m.dtypes) EXPECT_EQ(d, dtype);
  for (const auto& [sample, bytes] : m.x) {
    const std::vector<std::uint8_t> in = raw(sample);
    std::vector<std::byte> want(elements * dtype_size(dtype));
    normalize_values(in.data(), want.data(), elements, 30, o);
    ASSERT_EQ(bytes, want) << shape << " " << dtype_name(dtype) << " sample " << sample;
    EXPECT_EQ(m.y.at(sample), synthetic_label(kSeed, sample, 10));
  }
}

std::vector<std::uint8_t> synthetic_images(std::uint32_t sample) {
  std::vector<std::uint8_t> v(6 * 5 * 3);
  synthetic_fill(kSeed, sample, DType::uint8, v.size(), v.data());
  return v;
}

TEST(DeviceNormalize, WritesTheSameBitsAsTheHostNormalize) {
  FLOWFEED_REQUIRE_GPU();
  for (const char* dtype : {"float32", "float16", "bfloat16"}) {
    const DType d = *parse_dtype(dtype);
    auto hwc = run(config("[6, 5, 3]", std::string("dtype: ") + dtype, false));
    expect_host_bits(*hwc, "hwc", d, ChannelLayout::hwc, synthetic_images);
    auto chw = run(config("[3, 6, 5]", std::string("layout: chw, dtype: ") + dtype, false));
    expect_host_bits(*chw, "chw", d, ChannelLayout::chw, synthetic_images);
  }
}

TEST(DeviceNormalize, Float32IsTheFormulaItself) {
  FLOWFEED_REQUIRE_GPU();
  auto m = run(config("[6, 5, 3]", "mean: [10, 20, 30], std: [2, 4, 8]", false));
  const float mean[3] = {10, 20, 30}, stddev[3] = {2, 4, 8};
  for (const auto& [sample, bytes] : m->x) {
    const std::vector<std::uint8_t> in = synthetic_images(sample);
    for (std::size_t e = 0; e < in.size(); ++e) {
      float got;
      std::memcpy(&got, bytes.data() + e * 4, 4);
      ASSERT_EQ(got, (static_cast<float>(in[e]) - mean[e % 3]) / stddev[e % 3]);
    }
  }
}

TEST(DeviceNormalize, WaitsOnTheBatchReadyEvent) {
  FLOWFEED_REQUIRE_GPU();
  auto m = run(config("[6, 5, 3]", "", true));
  expect_host_bits(*m, "rewritten", DType::float32, ChannelLayout::hwc,
                   [](std::uint32_t) { return std::vector<std::uint8_t>(6 * 5 * 3, kRewritten); });
}

}  // namespace
}  // namespace flowfeed
