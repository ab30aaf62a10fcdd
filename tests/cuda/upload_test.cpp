// The CUDA path end to end: bytes verified on the device (device_checksum) for many shapes of
// pipeline, zero allocations after build, device memory bounded by the pools.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <oneapi/tbb/info.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <ostream>
#include <string>
#include <vector>

#include "flowfeed/batch.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "flowfeed/pipeline.hpp"
#include "gpu_test.hpp"

namespace flowfeed {
namespace {

struct Case {
  std::string name{};
  std::string loader = "synthetic";
  bool pin = true;
  std::string dtype = "float32";
  std::vector<std::int64_t> shape = {784};
  int batch = 64;
  int samples = 1000;
  int epochs = 1;
  int depth = 8;
  int streams = 1;
  int load_concurrency = 2;
  int stage_concurrency = 1;
  int upload_concurrency = 1;
  bool ordered = true;
  bool shuffle = false;
  std::int64_t chunk_bytes = -1;     // -1: the default
  std::string stores{};              // pinned_staging's stores; empty: the default
  bool staging = true;               // false: no staging node, so pageable batches are bounced
  std::string bounce{};              // cuda_upload's bounce; empty: the default (auto)
  std::int64_t bounce_bytes = -1;    // -1: the default
  std::int64_t bounce_buffers = -1;  // -1: the default
};

/// Names the case in test output (instead of its bytes).
void PrintTo(const Case& c, std::ostream* os) {
  *os << c.name;
}

std::string list(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string yaml_of(const Case& c) {
  std::string y =
      "pipeline: { epochs: " + std::to_string(c.epochs) +
      ", batch_size: " + std::to_string(c.batch) + ", prefetch_depth: " + std::to_string(c.depth) +
      ", ordered: " + (c.ordered ? "true" : "false") + ", device: cuda, stall_timeout_s: 30 }\n";
  y += std::string("sampler: { shuffle: ") + (c.shuffle ? "true" : "false") + ", seed: 5 }\n";
  y += "nodes:\n";
  y += "  - { name: load, type: " + c.loader +
       ", concurrency: " + std::to_string(c.load_concurrency) +
       ", params: { samples: " + std::to_string(c.samples) + ", sample_shape: " + list(c.shape) +
       ", dtype: " + c.dtype + ", seed: 11" +
       (c.loader == "memory" ? std::string(", pin: ") + (c.pin ? "true" : "false") : "") + " } }\n";
  if (c.staging) {
    y += "  - { name: stage, type: pinned_staging, concurrency: " +
         std::to_string(c.stage_concurrency) +
         ", params: { stores: " + (c.stores.empty() ? std::string("auto") : c.stores) +
         (c.chunk_bytes >= 0 ? ", chunk_bytes: " + std::to_string(c.chunk_bytes) : "") + " }" +
         " }\n";
  }
  y += "  - { name: upload, type: cuda_upload, concurrency: " +
       std::to_string(c.upload_concurrency) + ", streams: " + std::to_string(c.streams) +
       ", params: { bounce: " + (c.bounce.empty() ? std::string("auto") : c.bounce) +
       (c.bounce_bytes >= 0 ? ", bounce_bytes: " + std::to_string(c.bounce_bytes) : "") +
       (c.bounce_buffers >= 0 ? ", bounce_buffers: " + std::to_string(c.bounce_buffers) : "") +
       " } }\n";
  y += "  - { name: train, type: device_checksum }\n";
  return y;
}

BatchLayout layout_of(const Case& c) {
  return BatchLayout(
      {TensorSpec{"x", *parse_dtype(c.dtype), c.shape}, TensorSpec{"y", DType::int32, {}}},
      static_cast<std::size_t>(c.batch));
}

/// Bytes of each batch of one epoch: full batches and the last partial one.
std::vector<std::uint64_t> batch_bytes(const Case& c) {
  const BatchLayout l = layout_of(c);
  std::vector<std::uint64_t> bytes;
  for (int first = 0; first < c.samples; first += c.batch) {
    bytes.push_back(l.bytes(static_cast<std::size_t>(std::min(c.batch, c.samples - first))));
  }
  return bytes;
}

/// Bytes of one epoch.
std::uint64_t epoch_bytes(const Case& c) {
  const std::vector<std::uint64_t> bytes = batch_bytes(c);
  return std::accumulate(bytes.begin(), bytes.end(), std::uint64_t{0});
}

/// True when the case's batches reach cuda_upload pageable and go through its bounce buffers.
bool bounced(const Case& c) {
  const bool pinned_source = c.loader == "memory" && c.pin;
  return c.bounce == "on" || (c.bounce != "off" && !c.staging && !pinned_source);
}

/// Bounce chunks of one epoch: each batch in chunks of bounce_bytes (at most a batch's capacity).
std::uint64_t epoch_chunks(const Case& c) {
  const BatchLayout l = layout_of(c);
  const std::uint64_t chunk = std::min<std::uint64_t>(
      c.bounce_bytes >= 0 ? static_cast<std::uint64_t>(c.bounce_bytes) : 4u << 20, l.capacity());
  std::uint64_t chunks = 0;
  for (const std::uint64_t bytes : batch_bytes(c)) chunks += (bytes + chunk - 1) / chunk;
  return chunks;
}

/// The source tree (for configs/): $FLOWFEED_SOURCE_DIR when set (a build run elsewhere), else the
/// tree this binary was built from.
std::string source_dir() {
  const char* env = std::getenv("FLOWFEED_SOURCE_DIR");
  return env && *env ? env : FLOWFEED_SOURCE_DIR;
}

class DeviceBytes : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceBytes, EveryByteArrivesInOrderWithNoAllocationAfterBuild) {
  FLOWFEED_REQUIRE_GPU();
  const Case& c = GetParam();
  const Registry r = test::builtin_registry();
  const std::uint64_t batches_per_epoch =
      static_cast<std::uint64_t>((c.samples + c.batch - 1) / c.batch);
  const std::uint64_t batches = batches_per_epoch * static_cast<std::uint64_t>(c.epochs);
  test::within(120, c.name, [&] {
    Pipeline p(load_config_string(yaml_of(c), r, {}, c.name + ".yaml"), r);
    for (int run = 0; run < 2; ++run) {
      SCOPED_TRACE("run " + std::to_string(run));
      const RunReport report = p.run();
      EXPECT_EQ(report.batches, batches);
      EXPECT_EQ(report.allocations_after_build, 0u);
      EXPECT_EQ(report.bytes_uploaded, epoch_bytes(c) * static_cast<std::uint64_t>(c.epochs));
      EXPECT_EQ(report.extra.at("train.bytes_verified"),
                static_cast<double>(epoch_bytes(c) * static_cast<std::uint64_t>(c.epochs)));
      EXPECT_GT(report.upload_gbps, 0.0);
      EXPECT_EQ(report.device_pool_bytes,
                static_cast<std::size_t>(c.depth) * layout_of(c).capacity());
      EXPECT_LE(report.max_in_flight, c.depth);
      // Even spread: batch seq goes to stream seq % streams.
      ASSERT_EQ(report.stream_copies.size(), static_cast<std::size_t>(c.streams));
      for (int s = 0; s < c.streams; ++s) {
        const std::uint64_t expected =
            batches / static_cast<std::uint64_t>(c.streams) +
            (static_cast<std::uint64_t>(s) < batches % static_cast<std::uint64_t>(c.streams) ? 1
                                                                                             : 0);
        EXPECT_EQ(report.stream_copies[static_cast<std::size_t>(s)], expected) << "stream " << s;
      }
      const bool pinned_source = c.loader == "memory" && c.pin;
      if (c.staging) {
        EXPECT_EQ(report.extra.at("stage.passed_through_batches"),
                  pinned_source ? static_cast<double>(batches) : 0.0);
        EXPECT_EQ(report.extra.at("stage.copied_bytes"),
                  pinned_source ? 0.0 : static_cast<double>(report.bytes_uploaded));
      }
      // The bounce ring exists only where batches arrive pageable; every byte goes through it.
      const auto ring =
          std::find_if(report.pools.begin(), report.pools.end(),
                       [](const PoolReport& pr) { return pr.name == "upload.bounce"; });
      ASSERT_EQ(ring != report.pools.end(), bounced(c));
      if (bounced(c)) {
        EXPECT_EQ(ring->buffers, c.bounce_buffers > 0 ? static_cast<std::size_t>(c.bounce_buffers)
                                                      : 2 * static_cast<std::size_t>(
                                                                tbb::info::default_concurrency()));
        EXPECT_EQ(report.extra.at("upload.bounced_bytes"),
                  static_cast<double>(report.bytes_uploaded));
        EXPECT_EQ(report.extra.at("upload.bounce_chunks"),
                  static_cast<double>(epoch_chunks(c) * static_cast<std::uint64_t>(c.epochs)));
        EXPECT_EQ(ring->acquisitions, epoch_chunks(c) * static_cast<std::uint64_t>(c.epochs));
        EXPECT_LE(ring->high_water, ring->buffers);
      } else {
        EXPECT_EQ(report.extra.count("upload.bounced_bytes"), 0u);
      }
      EXPECT_EQ(report.device.rfind("cuda:0 (", 0), 0u) << report.device;
      EXPECT_NE(report.device_reason.find("device: cuda"), std::string::npos);
      EXPECT_EQ(p.free_buffers(), p.total_buffers());
    }
  });
}

std::vector<Case> cases() {
  std::vector<Case> v;
  // MNIST-like, shuffled (indices inside the checksum's launch), partial last batch
  v.push_back({.name = "mnist_shuffled_depth8", .shuffle = true});
  // shuffled 300-row batches: too many indices for the launch, they use mapped slots
  v.push_back({.name = "shuffled_300_rows_index_slots",
               .shape = {17},
               .batch = 300,
               .samples = 300 * 40 + 7,
               .epochs = 2,
               .depth = 4,
               .shuffle = true});
  // 13-byte samples (not a multiple of 16), 7-row batches, serial everything
  v.push_back({.name = "uint8_13_bytes_depth1",
               .dtype = "uint8",
               .shape = {13},
               .batch = 7,
               .samples = 100,
               .depth = 1,
               .load_concurrency = 1});
  // concurrent staging and upload bodies, two streams, unordered
  v.push_back({.name = "float16_concurrent_unordered",
               .dtype = "float16",
               .shape = {5, 3},
               .batch = 33,
               .samples = 500,
               .depth = 3,
               .streams = 2,
               .load_concurrency = 3,
               .stage_concurrency = 3,
               .upload_concurrency = 2,
               .ordered = false});
  // a last batch of one row, two epochs, four streams, depth 16
  v.push_back({.name = "int64_last_row_alone_4_streams",
               .dtype = "int64",
               .shape = {9},
               .samples = 64 * 20 + 1,
               .epochs = 2,
               .depth = 16,
               .streams = 4,
               .shuffle = true});
  // more streams than device buffers
  v.push_back({.name = "int32_streams_over_depth",
               .dtype = "int32",
               .shape = {100},
               .batch = 50,
               .samples = 1234,
               .depth = 2,
               .streams = 3});
  // the memory loader's pinned data set: staging passes batches through
  v.push_back({.name = "memory_pinned_pass_through",
               .loader = "memory",
               .shape = {1000},
               .batch = 16,
               .samples = 333,
               .epochs = 3,
               .depth = 4,
               .streams = 2});
  // a pageable data set: staging copies, in 4 KiB chunks in parallel
  v.push_back({.name = "memory_pageable_chunked_copy",
               .loader = "memory",
               .pin = false,
               .shape = {1000},
               .batch = 16,
               .samples = 333,
               .depth = 4,
               .stage_concurrency = 2,
               .chunk_bytes = 4096});
  // streaming stores at every alignment: 13-byte samples, 37-byte chunks
  v.push_back({.name = "memory_pageable_unaligned_chunks",
               .loader = "memory",
               .pin = false,
               .dtype = "uint8",
               .shape = {13},
               .batch = 7,
               .samples = 100,
               .depth = 3,
               .stage_concurrency = 2,
               .chunk_bytes = 37,
               .stores = "streaming"});
  // no staging node: 4 KiB bounce chunks through only 2 bounce buffers, so chunks of
  // two concurrent batches on two streams keep waiting for a buffer's previous DMA
  v.push_back({.name = "synthetic_bounced_4KiB_chunks_2_buffers",
               .shape = {1000},
               .batch = 16,
               .samples = 333,
               .depth = 4,
               .streams = 2,
               .upload_concurrency = 2,
               .staging = false,
               .bounce_bytes = 4096,
               .bounce_buffers = 2});
  // a pageable memory data set bounced in chunks that end at odd offsets (9,100-byte x)
  v.push_back({.name = "memory_pageable_bounced_odd_chunks",
               .loader = "memory",
               .pin = false,
               .dtype = "uint8",
               .shape = {13},
               .batch = 700,
               .samples = 700 * 5 + 3,
               .epochs = 2,
               .depth = 3,
               .upload_concurrency = 3,
               .staging = false,
               .bounce_bytes = 4100,
               .bounce_buffers = 5});
  // 4 MiB batches bounced in 1 MiB chunks (the last one 256 bytes), default ring
  v.push_back({.name = "float32_4MiB_batches_bounced",
               .shape = {131072},
               .batch = 8,
               .samples = 8 * 10 + 3,
               .depth = 4,
               .streams = 2,
               .load_concurrency = 4,
               .upload_concurrency = 2,
               .staging = false,
               .bounce_bytes = 1 << 20});
  // bounce: off: cudaMemcpyAsync straight from pageable batches
  v.push_back({.name = "synthetic_pageable_bounce_off",
               .shape = {300},
               .batch = 32,
               .samples = 1000,
               .depth = 4,
               .staging = false,
               .bounce = "off"});
  // the memory loader's pinned data set, no staging node: nothing to bounce
  v.push_back({.name = "memory_pinned_no_staging_no_bounce",
               .loader = "memory",
               .shape = {1000},
               .batch = 16,
               .samples = 333,
               .depth = 4,
               .staging = false});
  // 4 MiB batches: the default 1 MiB chunks copy in parallel
  v.push_back({.name = "float32_4MiB_batches",
               .shape = {131072},
               .batch = 8,
               .samples = 8 * 10 + 3,
               .depth = 4,
               .streams = 2,
               .load_concurrency = 4});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cuda, DeviceBytes, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(CudaMemory, DeviceMemoryForDataIsThePoolsNotTheDataSet) {
  FLOWFEED_REQUIRE_GPU();
  const Registry r = test::builtin_registry();
  // 1 MiB batches, 256 of them (a 256 MiB data set), through a pool of 4 device buffers.
  const std::string yaml =
      "pipeline: { batch_size: 64, prefetch_depth: 4, device: cuda, stall_timeout_s: 30 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, concurrency: 4, params: { batches: 256, "
      "sample_shape: [4096] } }\n"
      "  - { name: stage, type: pinned_staging }\n"
      "  - { name: upload, type: cuda_upload, streams: 2 }\n"
      "  - { name: train, type: device_checksum }\n";
  const PipelineConfig config = load_config_string(yaml, r);
  test::within(120, "device memory run", [&] {
    // A first small run loads the checksum kernel's module and creates the context, which take
    // device memory of their own.
    {
      Pipeline warm(load_config_string(yaml, r, {"nodes.load.params.batches=1"}), r);
      warm.run();
    }
    std::size_t free0 = 0, free1 = 0, free2 = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
    Pipeline p(config, r);
    ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
    const RunReport report = p.run();
    ASSERT_EQ(cudaMemGetInfo(&free2, &total), cudaSuccess);
    const std::size_t capacity = 64 * 4096 * 4 + 256;
    const std::size_t dataset = 256 * capacity;
    const std::size_t low = std::min(free1, free2);
    const std::size_t used = free0 > low ? free0 - low : 0;
    EXPECT_EQ(report.device_pool_bytes, 4 * capacity);
    EXPECT_EQ(report.batches, 256u);
    EXPECT_EQ(report.allocations_after_build, 0u);
    // cudaMalloc rounds each buffer up to 2 MiB pages; streams, events and the checksum's record
    // take a little more.
    const std::size_t two_mib = std::size_t{2} << 20;
    const std::size_t bound = 4 * ((capacity + two_mib - 1) / two_mib * two_mib) + (8u << 20);
    EXPECT_LE(used, bound) << "device memory used " << used << " bytes for a " << dataset
                           << "-byte data set";
    EXPECT_GT(dataset, 10 * bound);
  });
}

TEST(CudaConfigs, BandwidthConfigRunsFromThePinnedDataSetWithoutHostCopies) {
  FLOWFEED_REQUIRE_GPU();
  const Registry r = test::builtin_registry();
  test::within(120, "configs/bandwidth.yaml", [&] {
    Pipeline p(load_config_file(source_dir() + "/configs/bandwidth.yaml", r, {"pipeline.epochs=1"}),
               r);
    const RunReport report = p.run();
    EXPECT_EQ(report.batches, 16u);
    EXPECT_EQ(report.extra.at("stage.passed_through_batches"), 16.0);
    EXPECT_EQ(report.extra.at("stage.copied_bytes"), 0.0);
    EXPECT_EQ(report.allocations_after_build, 0u);
    EXPECT_GT(report.upload_gbps, 0.0);
    EXPECT_EQ(report.nodes.back().type, "device_discard");
  });
}

TEST(CudaConfigs, BandwidthPageableConfigBouncesEveryByte) {
  FLOWFEED_REQUIRE_GPU();
  const Registry r = test::builtin_registry();
  test::within(120, "configs/bandwidth_pageable.yaml", [&] {
    Pipeline p(load_config_file(source_dir() + "/configs/bandwidth_pageable.yaml", r,
                                {"pipeline.epochs=1"}),
               r);
    const RunReport report = p.run();
    EXPECT_EQ(report.batches, 16u);
    EXPECT_EQ(report.bytes_uploaded, 16u * 33554688u);
    EXPECT_EQ(report.extra.at("upload.bounced_bytes"), static_cast<double>(report.bytes_uploaded));
    // 32 MiB + 256 bytes of labels: 8 chunks of 4 MiB and one of 256 bytes per batch.
    EXPECT_EQ(report.extra.at("upload.bounce_chunks"), 16.0 * 9);
    EXPECT_EQ(report.allocations_after_build, 0u);
    const auto ring = std::find_if(report.pools.begin(), report.pools.end(),
                                   [](const PoolReport& pr) { return pr.name == "upload.bounce"; });
    ASSERT_NE(ring, report.pools.end());
    EXPECT_EQ(ring->kind, "pinned");
    EXPECT_EQ(ring->bytes, ring->buffers * (std::size_t{4} << 20));
    EXPECT_EQ(ring->acquisitions, 16u * 9);  // one lease per chunk
  });
}

TEST(CudaConfigs, MnistSyntheticConfigRunsOnTheCudaTypes) {
  FLOWFEED_REQUIRE_GPU();
  const Registry r = test::builtin_registry();
  test::within(120, "configs/mnist_synthetic.yaml", [&] {
    const PipelineConfig config =
        load_config_file(source_dir() + "/configs/mnist_synthetic.yaml", r);
    EXPECT_EQ(config.backend, Backend::cuda);
    Pipeline p(config, r);
    const RunReport report = p.run();
    EXPECT_EQ(report.batches, (60000u + 63) / 64);
    EXPECT_EQ(report.nodes.back().type, "device_checksum");
    EXPECT_EQ(report.allocations_after_build, 0u);
    EXPECT_NE(report.device_reason.find("device: auto, "), std::string::npos);
  });
}

}  // namespace
}  // namespace flowfeed
