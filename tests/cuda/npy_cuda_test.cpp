// The npy loader on CUDA: rows read from a file straight into page-locked memory (pinned_staging
// passes them through, or cuda_upload copies from them without bounce buffers) arrive on the
// device byte-exact, with pread and io_uring; nothing is allocated after build.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "flowfeed/config.hpp"
#include "flowfeed/pipeline.hpp"
#include "flowfeed/stats.hpp"
#include "gpu_test.hpp"
#include "nodes/load/npy_file.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

using namespace testing_files;

constexpr std::size_t kRowBytes = 8192;
constexpr std::size_t kRows = 100;

std::uint8_t byte_of(std::size_t s, std::size_t k) {
  return static_cast<std::uint8_t>((s * 131 + k * 7 + k / 251) & 0xFF);
}

/// Train node: copies each batch's device x back to the host once its upload is ready.
struct DeviceRows {
  std::mutex mutex;
  std::vector<std::vector<std::uint32_t>> samples;
  std::vector<std::vector<std::uint8_t>> x;
};

void register_device_rows(Registry& r, std::shared_ptr<DeviceRows> out) {
  class Node final : public flowfeed::Node {
   public:
    explicit Node(std::shared_ptr<DeviceRows> out) : out_(std::move(out)) {}
    void process(Batch& batch) override {
      ASSERT_EQ(cudaEventSynchronize(static_cast<cudaEvent_t>(batch.ready_event)), cudaSuccess);
      std::vector<std::uint8_t> x(batch.rows() * kRowBytes);
      ASSERT_EQ(
          cudaMemcpy(x.data(), batch.tensor(Tier::device, 0), x.size(), cudaMemcpyDeviceToHost),
          cudaSuccess);
      std::lock_guard<std::mutex> lock(out_->mutex);
      out_->samples.push_back(batch.samples);
      out_->x.push_back(std::move(x));
    }

   private:
    std::shared_ptr<DeviceRows> out_;
  };
  NodeType t;
  t.name = "device_rows";
  t.role = Role::train;
  t.doc = "test sink: copies x back from the device";
  t.create = [out](const NodeSpec&) { return std::make_unique<Node>(out); };
  r.set(std::move(t));
}

TEST(NpyCuda, RowsReadIntoPinnedMemoryArriveOnTheDevice) {
  FLOWFEED_REQUIRE_GPU();
  TempDir dir;
  std::vector<std::uint8_t> x(kRows * kRowBytes);
  std::vector<std::int32_t> y(kRows, 1);
  for (std::size_t s = 0; s < kRows; ++s) {
    for (std::size_t k = 0; k < kRowBytes; ++k) x[s * kRowBytes + k] = byte_of(s, k);
  }
  const auto rows = static_cast<std::int64_t>(kRows);
  write_npy(dir.file("x.npy"), NpyDtype::uint8, {rows, static_cast<std::int64_t>(kRowBytes)},
            x.data(), 4096);
  write_npy(dir.file("y.npy"), NpyDtype::int32, {rows}, y.data());
  for (const char* io : {"pread", "io_uring"}) {
    for (const bool staging : {true, false}) {
      SCOPED_TRACE(std::string(io) + (staging ? " pinned_staging" : " no staging node"));
      auto seen = std::make_shared<DeviceRows>();
      Registry r = test::builtin_registry();
      register_device_rows(r, seen);
      const std::string yaml =
          "pipeline: { epochs: 2, batch_size: 16, prefetch_depth: 4, device: cuda }\n"
          "sampler: { shuffle: true, seed: 3 }\n"
          "nodes:\n"
          "  - { name: load, type: npy, concurrency: 2, params: { features: " +
          dir.file("x.npy") + ", labels: " + dir.file("y.npy") + ", io: " + io +
          ", direct: true } }\n" + (staging ? "  - { name: stage, type: pinned_staging }\n" : "") +
          "  - { name: upload, type: cuda_upload }\n"
          "  - { name: train, type: device_rows }\n";
      Pipeline p(load_config_string(yaml, r), r);
      const RunReport report = test::within(60, "the npy run", [&] { return p.run(); });
      ASSERT_EQ(seen->x.size(), 14u);
      for (std::size_t b = 0; b < seen->x.size(); ++b) {
        for (std::size_t row = 0; row < seen->samples[b].size(); ++row) {
          const std::uint32_t s = seen->samples[b][row];
          ASSERT_EQ(
              std::memcmp(seen->x[b].data() + row * kRowBytes, x.data() + s * kRowBytes, kRowBytes),
              0)
              << "batch " << b << " row " << row << " sample " << s;
        }
      }
      EXPECT_EQ(report.allocations_after_build, 0u);
      std::vector<std::string> pools;
      for (const auto& pool : report.pools) pools.push_back(pool.name + " " + pool.kind);
      // The loader's buffers are the only host batch buffers, and they are page-locked: no
      // staging pool, no bounce buffers.
      EXPECT_EQ(pools, (std::vector<std::string>{"load.staging pinned", "upload.device device"}));
      if (staging) {
        EXPECT_EQ(report.extra.at("stage.copied_bytes"), 0.0);
        EXPECT_EQ(report.extra.at("stage.passed_through_batches"), 14.0);
      }
      EXPECT_EQ(report.extra.count("upload.bounced_bytes"), 0u);
    }
  }
}

}  // namespace
}  // namespace flowfeed
