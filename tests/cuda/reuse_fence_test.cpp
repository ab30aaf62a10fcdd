// The reuse contract between cuda_upload and a consumer that reads device buffers slowly: the
// upload must not overwrite a buffer before the consumer's last kernel on it has run, whether the
// consumer releases each batch (cuda::release_after) or leaves one fence per group
// (cuda::leave_fence).
// The consumer here is a test-only train node whose kernel spins before it copies each batch
// to a mirror; the mirror is then compared with the synthetic formula, byte for byte.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/cuda/check.hpp"
#include "flowfeed/cuda/handoff.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "flowfeed/nodes/synthetic.hpp"
#include "flowfeed/pipeline.hpp"
#include "gpu_test.hpp"
#include "test_kernels.hpp"

namespace flowfeed {
namespace {

/// How the consumer tells the upload that it is done with a buffer.
enum class Reuse {
  fence,  ///< one event per group, left in every batch's fence slot (cuda::leave_fence)
  event,  ///< each batch released after its kernel (cuda::release_after)
  none,   ///< nothing: breaks the contract (shows that the check below sees overwrites)
};

constexpr int kBatches = 60;
constexpr int kRows = 64;
constexpr int kElements = 784;
constexpr std::uint64_t kSeed = 11;
// About 100 µs at the H200's clock: far longer than a 200 KB copy (about 6 µs).
constexpr long long kSpinCycles = 200000;

/// Copies every batch into mirror slot `seq` with a slow kernel, in groups of exactly `group`
/// batches (flush() completes a smaller group only for the last batch or a cancelled run: the
/// groups must form for the fence count below to mean something).
class MirrorTrain final : public AsynchronousNode {
 public:
  MirrorTrain(Reuse reuse, std::size_t group, std::byte* mirror, std::size_t slot_bytes,
              std::vector<std::vector<std::uint32_t>>* samples)
      : reuse_(reuse), group_(group), mirror_(mirror), slot_(slot_bytes), samples_(samples) {}

  ~MirrorTrain() override {
    for (cudaEvent_t e : fences_) cudaEventDestroy(e);
    if (stream_) cudaStreamDestroy(stream_);
  }

  void setup(BuildContext& context) override {
    cancelled_ = &context.cancelled();
    FLOWFEED_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    for (int i = 0; i < 8; ++i) {
      cudaEvent_t e = nullptr;
      FLOWFEED_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      fences_.push_back(e);
    }
  }

  void submit(Batch& batch, Completion done) override {
    std::vector<Held> ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      (*samples_)[batch.seq] = batch.samples;
      held_.push_back({&batch, done});
      if (held_.size() == group_) ready.swap(held_);
    }
    launch(ready);
  }

  void flush() noexcept override {
    std::vector<Held> ready;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool last = !held_.empty() && held_.back().batch->seq + 1 == kBatches;
      if (last || cancelled_->load()) ready.swap(held_);
    }
    launch(ready);
  }

  void quiesce() noexcept override {
    if (cudaStreamSynchronize(stream_) != cudaSuccess) cudaGetLastError();
  }

  void finish(RunReport& report) override {
    report.extra["train.fences"] = static_cast<double>(stamp_);
  }

 private:
  struct Held {
    Batch* batch;
    Completion done;
  };

  void launch(const std::vector<Held>& group) noexcept {
    if (group.empty()) return;
    std::exception_ptr error;
    try {
      std::lock_guard<std::mutex> lock(launch_mutex_);
      for (const Held& h : group) {
        Batch& b = *h.batch;
        cuda::wait_ready(b.sync, stream_);
        FLOWFEED_CUDA_CHECK(test::launch_slow_copy(b.device.data(), mirror_ + b.seq * slot_,
                                                   b.bytes(), kSpinCycles, stream_));
        if (reuse_ == Reuse::event) {
          cuda::release_after(b.sync, stream_);
        }
      }
      if (reuse_ == Reuse::fence) {
        cudaEvent_t fence = fences_[stamp_ % fences_.size()];
        FLOWFEED_CUDA_CHECK(cudaEventRecord(fence, stream_));
        ++stamp_;
        for (const Held& h : group) {
          if (!h.batch->sync.takes_fence()) throw Error("cuda_upload takes no fences");
          cuda::leave_fence(h.batch->sync, fence, stamp_);
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
    for (const Held& h : group) h.done(error);
  }

  Reuse reuse_;
  std::size_t group_;
  std::byte* mirror_;
  std::size_t slot_;
  std::vector<std::vector<std::uint32_t>>* samples_;
  const std::atomic<bool>* cancelled_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<cudaEvent_t> fences_;
  std::uint64_t stamp_ = 0;
  std::mutex mutex_;         // held_
  std::mutex launch_mutex_;  // the stream's order of waits, kernels and records
  std::vector<Held> held_;
};

struct Outcome {
  RunReport report;
  int mismatched_batches = 0;
};

/// Runs kBatches synthetic batches through cuda_upload (`streams`, depth 4) into MirrorTrain and
/// counts the batches whose mirror differs from what the loader produced.
Outcome run_mirrored(Reuse reuse, std::size_t group, int streams) {
  const BatchLayout layout(
      {TensorSpec{"x", DType::float32, {kElements}}, TensorSpec{"y", DType::int32, {}}}, kRows);
  const std::size_t slot = layout.capacity();
  std::byte* mirror = nullptr;
  FLOWFEED_CUDA_CHECK(cudaMalloc(&mirror, slot * kBatches));
  FLOWFEED_CUDA_CHECK(cudaMemset(mirror, 0, slot * kBatches));
  std::vector<std::vector<std::uint32_t>> samples(kBatches);

  Registry r = test::builtin_registry();
  r.set(factory_type("mirror_train", Role::train, {}, [&](const NodeSpec&) {
    return std::make_unique<MirrorTrain>(reuse, group, mirror, slot, &samples);
  }));
  const std::string yaml =
      "pipeline: { batch_size: 64, prefetch_depth: 4, device: cuda, stall_timeout_s: 30 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 2, params: { batches: 60, "
      "sample_shape: [784], dtype: float32, seed: 11 } }\n"
      "  - { name: stage, type: pinned_staging }\n"
      "  - { name: upload, type: cuda_upload, streams: " +
      std::to_string(streams) +
      " }\n"
      "  - { name: train, type: mirror_train }\n";
  Outcome out;
  {
    Pipeline p(load_config_string(yaml, r, {}, "mirror.yaml"), r);
    out.report = p.run();
    EXPECT_EQ(p.free_buffers(), p.total_buffers());
  }
  std::vector<std::byte> host(slot * kBatches);
  FLOWFEED_CUDA_CHECK(cudaMemcpy(host.data(), mirror, host.size(), cudaMemcpyDeviceToHost));
  FLOWFEED_CUDA_CHECK(cudaFree(mirror));

  std::vector<std::byte> x(kElements * sizeof(float));
  for (int seq = 0; seq < kBatches; ++seq) {
    const std::byte* batch = host.data() + static_cast<std::size_t>(seq) * slot;
    const auto& rows = samples[static_cast<std::size_t>(seq)];
    bool same = rows.size() == static_cast<std::size_t>(kRows);
    for (std::size_t row = 0; same && row < rows.size(); ++row) {
      synthetic_fill(kSeed, rows[row], DType::float32, kElements, x.data());
      same = std::memcmp(batch + row * x.size(), x.data(), x.size()) == 0;
      std::int32_t y = 0;
      std::memcpy(&y, batch + layout.offset(1, rows.size()) + row * sizeof y, sizeof y);
      same = same && y == synthetic_label(kSeed, rows[row], 10);
    }
    if (!same) ++out.mismatched_batches;
  }
  return out;
}

TEST(ReuseFence, OneFencePerGroupKeepsEveryBufferUntilItsSlowReaderIsDone) {
  FLOWFEED_REQUIRE_GPU();
  for (int streams : {1, 2}) {
    SCOPED_TRACE("streams " + std::to_string(streams));
    const Outcome o =
        test::within(60, "fenced run", [&] { return run_mirrored(Reuse::fence, 2, streams); });
    EXPECT_EQ(o.report.batches, static_cast<std::uint64_t>(kBatches));
    EXPECT_EQ(o.mismatched_batches, 0);
    // A stream waits at most once per fence (a group of 2 batches: 30 fences), plus once per
    // buffer's first use (4 buffers), never once per batch: a buffer from an older group that
    // comes back after a newer one (the pool hands out the last buffer returned) carries a fence
    // the stream already waited past, and a newer fence covers the older ones.
    const double fences = o.report.extra.at("train.fences");
    const double waits = o.report.extra.at("upload.reuse_waits");
    EXPECT_EQ(fences, kBatches / 2);
    EXPECT_LE(waits, streams * (4 + fences)) << waits;
    // The buffers came back 56 times: without a wait on a fence the mirror above would differ.
    EXPECT_GT(waits, 4) << waits;
  }
}

TEST(ReuseFence, PerBatchReuseEventsStillWork) {
  FLOWFEED_REQUIRE_GPU();
  const Outcome o =
      test::within(60, "per-batch run", [&] { return run_mirrored(Reuse::event, 2, 2); });
  EXPECT_EQ(o.mismatched_batches, 0);
  EXPECT_EQ(o.report.extra.at("upload.reuse_waits"), static_cast<double>(kBatches));
}

TEST(ReuseFence, WithoutEitherTheSlowReaderSeesOverwrittenBuffers) {
  // The control: a consumer that breaks the contract finds later batches in its buffers, so the
  // two tests above would see a missing wait.
  FLOWFEED_REQUIRE_GPU();
  const Outcome o =
      test::within(60, "unfenced run", [&] { return run_mirrored(Reuse::none, 2, 1); });
  EXPECT_GT(o.mismatched_batches, 0);
}

}  // namespace
}  // namespace flowfeed
