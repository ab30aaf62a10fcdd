// Deliberate failures on the CUDA path: each ends the run with the right message, returns every
// buffer, and never hangs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/device.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "gpu_test.hpp"
#include "test_kernels.hpp"
#include "tests/error_of.hpp"

namespace flowfeed {
namespace {

std::string what_of_run(Pipeline& p) {
  return test::error_of<std::exception>([&] { p.run(); });
}

TEST(CudaCheck, NamesTheCallTheErrorAndWhetherItIsSticky) {
  try {
    FLOWFEED_CUDA_CHECK(cudaMemcpyAsync(nullptr, nullptr, 1, cudaMemcpyHostToDevice, nullptr));
    FAIL() << "no error";
  } catch (const CudaError& e) {
    // Without a driver the call fails with "no driver" instead; both are named the same way.
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("cudaMemcpyAsync: ", 0), 0u) << what;
    EXPECT_NE(what.find(", not sticky)"), std::string::npos) << what;
    EXPECT_FALSE(e.sticky());
  }
  EXPECT_TRUE(cuda::is_sticky(cudaErrorIllegalAddress));
  EXPECT_TRUE(cuda::is_sticky(cudaErrorLaunchFailure));
  EXPECT_FALSE(cuda::is_sticky(cudaErrorInvalidValue));
  const CudaError sticky = cuda::make_error(cudaErrorIllegalAddress, "cudaEventQuery(e)");
  EXPECT_STREQ(sticky.what(),
               "cudaEventQuery: an illegal memory access was encountered "
               "(cudaErrorIllegalAddress = 700, sticky: the CUDA context is unusable, the "
               "process must exit)");
  EXPECT_TRUE(sticky.sticky());
  EXPECT_EQ(sticky.code(), 700);
}

/// Runs `yaml` (named `file`) twice with an upload whose device pool hands out null pointers, so
/// that cudaMemcpyAsync rejects the copy (bounced batches in chunks of `bounce_bytes`), and checks
/// the message, which names the upload's line, and that every buffer came back.
void expect_invalid_copy(const std::string& yaml, const std::string& file, int upload_line,
                         std::size_t bounce_bytes) {
  Registry r = test::builtin_registry();
  NodeType upload = *r.find("cuda_upload");
  upload.create = [bounce_bytes](const NodeSpec& spec) -> std::unique_ptr<Node> {
    CudaUploadOptions o;
    o.streams = spec.streams;
    o.bounce_bytes = bounce_bytes;
    o.device_allocator = {[](std::size_t) -> void* { return nullptr; }, [](void*) {}};
    return make_cuda_upload(std::move(o));
  };
  r.set(std::move(upload));
  test::within(60, file, [&] {
    Pipeline p(load_config_string(yaml, r, {}, file), r);
    for (int run = 0; run < 2; ++run) {
      EXPECT_EQ(what_of_run(p), "node 'upload' (cuda_upload, " + file + ":" +
                                    std::to_string(upload_line) +
                                    ") batch 0 (epoch 0): cudaMemcpyAsync: invalid argument "
                                    "(cudaErrorInvalidValue = 1, not sticky)");
      EXPECT_EQ(p.free_buffers(), p.total_buffers());
    }
  });
}

TEST(CudaFailure, AnInvalidCopyEndsTheRunNamingNodeBatchAndCall) {
  FLOWFEED_REQUIRE_GPU();
  expect_invalid_copy(
      "pipeline: { batch_size: 16, prefetch_depth: 1, device: cuda, stall_timeout_s: 30 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 20, sample_shape: [100] } }\n"
      "  - { name: stage, type: pinned_staging }\n"
      "  - { name: upload, type: cuda_upload, streams: 2 }\n"
      "  - { name: train, type: device_checksum }\n",
      "bad_copy.yaml", 5, CudaUploadOptions{}.bounce_bytes);
}

TEST(CudaFailure, AnInvalidBouncedCopyEndsTheRunNamingNodeBatchAndCall) {
  FLOWFEED_REQUIRE_GPU();
  // No staging node: pageable batches go through the bounce buffers in 4 KiB chunks, each a task,
  // and every chunk's cudaMemcpyAsync into the null device buffer fails.
  expect_invalid_copy(
      "pipeline: { batch_size: 16, prefetch_depth: 1, device: cuda, stall_timeout_s: 30 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 20, sample_shape: [1000] } }\n"
      "  - { name: upload, type: cuda_upload }\n"
      "  - { name: train, type: device_checksum }\n",
      "bad_bounce.yaml", 4, 4096);
}

/// A test-only transform after the upload: on batch `at` it overwrites one byte of the device
/// buffer with a wrong value (stream-ordered after the copy, before the checksum).
class CorruptOneByte final : public Node {
 public:
  CorruptOneByte(std::uint64_t at, std::size_t row, std::size_t byte, bool label)
      : at_(at), row_(row), byte_(byte), label_(label) {}
  ~CorruptOneByte() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }
  void setup(BuildContext& context) override {
    content_ = dynamic_cast<const SyntheticContent*>(&context.loader());
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    events_.resize(static_cast<std::size_t>(context.prefetch_depth()));
    for (auto& e : events_)
      FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  void process(Batch& batch) override {
    if (batch.seq != at_) return;
    const auto& opts = content_->synthetic_options();
    const auto& x = batch.layout->tensors()[0];
    std::vector<unsigned char> row(x.sample_bytes());
    std::int32_t label = 0;
    synthetic_fill(opts.seed, batch.samples[row_], opts.dtype, x.sample_elements(), row.data());
    label = synthetic_label(opts.seed, batch.samples[row_], opts.classes);
    const std::size_t offset = label_ ? batch.layout->offset(1, batch.rows()) + row_ * 4 + byte_
                                      : row_ * x.sample_bytes() + byte_;
    const unsigned char right =
        label_ ? reinterpret_cast<const unsigned char*>(&label)[byte_] : row[byte_];
    cudaEvent_t done = events_[batch.device.index()];
    cuda::wait_ready(batch.sync, stream_);
    FLOWFEED_CUDA_CHECK(cudaMemsetAsync(batch.device.data() + offset, right ^ 0x5A, 1, stream_));
    cuda::hand_on_in_place(batch.sync, done, stream_);
  }
  void quiesce() noexcept override { cudaStreamSynchronize(stream_); }

 private:
  std::uint64_t at_;
  std::size_t row_, byte_;
  bool label_;
  const SyntheticContent* content_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> events_;
};

std::string corrupted_run(bool label) {
  Registry r = test::builtin_registry();
  r.set(factory_type("corrupt_one_byte", Role::transform, {}, [label](const NodeSpec&) {
    return std::make_unique<CorruptOneByte>(5, 3, label ? 1 : 6, label);
  }));
  const std::string yaml =
      "pipeline: { batch_size: 16, prefetch_depth: 4, device: cuda, stall_timeout_s: 30 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: 40, sample_shape: [7, 7], seed: 9 } "
      "}\n"
      "  - { name: stage, type: pinned_staging }\n"
      "  - { name: upload, type: cuda_upload }\n"
      "  - { name: corrupt, type: corrupt_one_byte }\n"
      "  - { name: train, type: device_checksum }\n";
  return test::within(60, "corrupted run", [&] {
    Pipeline p(load_config_string(yaml, r, {}, "corrupt.yaml"), r);
    std::string what = what_of_run(p);
    EXPECT_EQ(p.free_buffers(), p.total_buffers());
    return what;
  });
}

TEST(CudaFailure, ACorruptedByteOfXIsFoundOnTheDeviceWithBatchRowAndByte) {
  FLOWFEED_REQUIRE_GPU();
  const std::string what = corrupted_run(false);
  // Found a few batches later or at the end of the epoch, so the prefix names another batch.
  EXPECT_EQ(what.rfind("node 'train' (device_checksum, corrupt.yaml:7) ", 0), 0u) << what;
  EXPECT_NE(what.find("device_checksum: batch 5 row 3 (sample 83): x differs at byte 6 of 196 "
                      "(expected element bits 0x"),
            std::string::npos)
      << what;
  EXPECT_NE(what.find("; 1 mismatching element in all"), std::string::npos) << what;
}

TEST(CudaFailure, ACorruptedLabelIsFoundOnTheDevice) {
  FLOWFEED_REQUIRE_GPU();
  const std::string what = corrupted_run(true);
  EXPECT_NE(what.find("device_checksum: batch 5 row 3 (sample 83): label y is "), std::string::npos)
      << what;
  EXPECT_NE(what.find(" (byte 1 of 4 differs); 1 mismatching element in all"), std::string::npos)
      << what;
}

/// A test-only train node whose kernel faults on batch `at` (a sticky error, like a buggy model).
class FaultingTrain final : public Node {
 public:
  explicit FaultingTrain(std::uint64_t at) : at_(at) {}
  void setup(BuildContext&) override {
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void process(Batch& batch) override {
    cuda::wait_ready(batch.sync, stream_);
    if (batch.seq == at_) FLOWFEED_CUDA_CHECK(test::launch_fault(nullptr, stream_));
    cuda::release_after(batch.sync, stream_);
  }

 private:
  std::uint64_t at_;
  cudaStream_t stream_ = nullptr;
};

/// Runs a pipeline whose train kernel faults; prints the error and exits 3 (in a child process:
/// the fault poisons the CUDA context for good).
[[noreturn]] void run_faulting_pipeline_and_exit() {
  Registry r = test::builtin_registry();
  r.set(factory_type("faulting_train", Role::train, {},
                     [](const NodeSpec&) { return std::make_unique<FaultingTrain>(10); }));
  const std::string yaml =
      "pipeline: { batch_size: 64, prefetch_depth: 8, device: cuda, stall_timeout_s: 30 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 2, params: { batches: 1000 } }\n"
      "  - { name: stage, type: pinned_staging }\n"
      "  - { name: upload, type: cuda_upload, streams: 2 }\n"
      "  - { name: train, type: faulting_train }\n";
  const std::string what = test::within(60, "faulting run", [&] {
    std::string message;
    {
      Pipeline p(load_config_string(yaml, r, {}, "fault.yaml"), r);
      message = what_of_run(p);
      if (p.free_buffers() != p.total_buffers()) message += " [buffers not returned]";
    }  // destroying the pipeline after a sticky error must not hang either
    return message;
  });
  std::fprintf(stderr, "%s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(what.find("[buffers not returned]") == std::string::npos ? 3 : 4);
}

TEST(CudaFailureDeathTest, AFaultingKernelEndsTheRunWithAStickyErrorAndNoHang) {
  FLOWFEED_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(run_faulting_pipeline_and_exit(), ::testing::ExitedWithCode(3),
              "node '(upload|train)' \\((cuda_upload, fault\\.yaml:5|faulting_train, "
              "fault\\.yaml:6)\\) batch [0-9]+ \\(epoch 0\\): [a-zA-Z]+: an illegal memory access "
              "was encountered \\(cudaErrorIllegalAddress = 700, sticky: the CUDA context is "
              "unusable, the process must exit\\)");
}

}  // namespace
}  // namespace flowfeed
