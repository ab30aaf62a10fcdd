// Host tests of how configs choose the CUDA backend: `device: auto|cuda|host`, builds without CUDA,
// machines without a GPU. The device probe is replaced, so these run the same on CI and on a GPU.
#include <gtest/gtest.h>

#include <string>

#include "flowfeed/config.hpp"
#include "flowfeed/extend.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/pipeline.hpp"
#include "tests/nodes/test_files.hpp"

namespace flowfeed {
namespace {

std::string config_text(const std::string& device, const std::string& extra = "") {
  return "pipeline:\n"
         "  batch_size: 8\n"
         "  device: " +
         device + "\n" + extra +
         "nodes:\n"
         "  - { name: load, type: synthetic, params: { batches: 3, sample_shape: [5] } }\n"
         "  - { name: stage, type: pinned_staging }\n"
         "  - { name: upload, type: cuda_upload, streams: 2 }\n"
         "  - { name: train, type: device_checksum }\n";
}

/// The built-in types as a build with CUDA has them, on a machine with `devices` GPUs.
Registry cuda_registry(int devices) {
  Registry r;
  register_builtin_nodes(r);
  r.set_device_probe([devices] { return devices; });
  r.set_cuda_built(true);
  return r;
}

/// The built-in types as a build without CUDA has them.
Registry host_only_registry() {
  Registry r;
  register_builtin_nodes(r);
  register_cuda_placeholders(r);
  return r;
}

/// True when this build has the real CUDA types (the tests that use them skip otherwise).
bool cuda_in_build() {
  Registry r;
  register_builtin_nodes(r);
  return r.cuda_built();
}

#define SKIP_WITHOUT_CUDA_BUILD() \
  if (!cuda_in_build()) GTEST_SKIP() << "built without CUDA (FLOWFEED_CUDA=OFF)"

std::string config_error(const std::string& yaml, const Registry& registry) {
  return testing_files::error_of<ConfigError>(
      [&] { load_config_string(yaml, registry, {}, "x.yaml"); });
}

TEST(CudaConfig, CudaWithoutADeviceIsAConfigErrorAtTheDeviceKey) {
  SKIP_WITHOUT_CUDA_BUILD();
  EXPECT_EQ(config_error(config_text("cuda"), cuda_registry(0)),
            "x.yaml:3:11: pipeline.device: cuda was asked for but no CUDA device is visible "
            "(cudaGetDeviceCount found none) use device: auto or device: host");
}

TEST(CudaConfig, DeviceIdBeyondTheVisibleDevicesIsAConfigError) {
  SKIP_WITHOUT_CUDA_BUILD();
  EXPECT_EQ(config_error(config_text("cuda", "  device_id: 2\n"), cuda_registry(2)),
            "x.yaml:3:11: pipeline.device_id: 2 is out of range (2 CUDA devices visible)");
}

TEST(CudaConfig, CudaInABuildWithoutCudaSaysHowToGetIt) {
  EXPECT_EQ(config_error(config_text("cuda"), host_only_registry()),
            "x.yaml:3:11: pipeline.device: cuda is unavailable in this build (flowfeed was built "
            "without CUDA) reconfigure with -DFLOWFEED_CUDA=ON, or use device: auto\n"
            "x.yaml:6:26: nodes[1].type: 'pinned_staging' is unavailable in this build (it needs "
            "CUDA) reconfigure with -DFLOWFEED_CUDA=ON\n"
            "x.yaml:7:27: nodes[2].type: 'cuda_upload' is unavailable in this build (it needs "
            "CUDA) reconfigure with -DFLOWFEED_CUDA=ON\n"
            "x.yaml:8:26: nodes[3].type: 'device_checksum' is unavailable in this build (it needs "
            "CUDA) reconfigure with -DFLOWFEED_CUDA=ON");
}

TEST(CudaConfig, PlaceholderTypesAreMarkedUnavailable) {
  const Registry r = host_only_registry();
  EXPECT_FALSE(r.cuda_built());
  EXPECT_EQ(r.device_count(), 0);
  for (const char* name : {"pinned_staging", "cuda_upload", "device_checksum", "device_discard"}) {
    const NodeType* t = r.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_TRUE(t->unavailable) << name;
    EXPECT_EQ(t->backend, TypeBackend::cuda) << name;
  }
}

TEST(CudaConfig, AutoWithoutCudaBuildRunsHostCounterpartsAndSaysWhy) {
  PipelineConfig c = load_config_string(config_text("auto"), host_only_registry(), {}, "x.yaml");
  EXPECT_EQ(c.backend, Backend::host);
  ASSERT_EQ(c.nodes.size(), 4u);
  EXPECT_EQ(c.nodes[1].type, "host_staging");
  EXPECT_EQ(c.nodes[2].type, "host_upload");
  EXPECT_EQ(c.nodes[3].type, "checksum");
  EXPECT_EQ(c.nodes[3].declared_type, "device_checksum");
  EXPECT_EQ(c.device_reason,
            "device: auto, and this build has no CUDA (FLOWFEED_CUDA=OFF): host types");
}

TEST(CudaConfig, AutoWithoutADeviceRunsOnTheHostAndTheReportSaysSo) {
  SKIP_WITHOUT_CUDA_BUILD();
  const Registry r = cuda_registry(0);
  Pipeline p(load_config_string(config_text("auto"), r, {}, "x.yaml"), r);
  RunReport report = p.run();
  EXPECT_EQ(report.device, "host");
  EXPECT_EQ(report.device_reason, "device: auto, and no CUDA device is visible: host types");
  EXPECT_EQ(report.batches, 3u);
  EXPECT_EQ(report.nodes[3].type, "checksum");
  // Each batch: 8 x 5 float32 = 160 bytes of x, 8 labels at offset 256: 288 bytes.
  EXPECT_EQ(report.extra.at("checksum_bytes_verified"), 3 * 288.0);
}

TEST(CudaConfig, AutoWithADevicePicksTheCudaTypes) {
  SKIP_WITHOUT_CUDA_BUILD();
  PipelineConfig c =
      load_config_string(config_text("auto", "  device_id: 1\n"), cuda_registry(2), {}, "x.yaml");
  EXPECT_EQ(c.backend, Backend::cuda);
  EXPECT_EQ(c.nodes[1].type, "pinned_staging");
  EXPECT_EQ(c.nodes[2].type, "cuda_upload");
  EXPECT_EQ(c.nodes[2].streams, 2);
  EXPECT_EQ(c.device_reason, "device: auto, 2 CUDA devices visible");
}

TEST(CudaConfig, AutoWithTooFewDevicesForDeviceIdFallsBackToTheHost) {
  SKIP_WITHOUT_CUDA_BUILD();
  PipelineConfig c =
      load_config_string(config_text("auto", "  device_id: 1\n"), cuda_registry(1), {}, "x.yaml");
  EXPECT_EQ(c.backend, Backend::host);
  EXPECT_EQ(c.device_reason, "device: auto, device_id 1 but 1 CUDA device visible: host types");
}

TEST(CudaConfig, HostTypesBecomeCudaTypesUnderDeviceCuda) {
  SKIP_WITHOUT_CUDA_BUILD();
  const std::string yaml =
      "pipeline: { batch_size: 8, device: cuda }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic }\n"
      "  - { name: stage, type: host_staging }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: checksum }\n";
  PipelineConfig c = load_config_string(yaml, cuda_registry(1), {}, "x.yaml");
  EXPECT_EQ(c.nodes[1].type, "pinned_staging");
  EXPECT_EQ(c.nodes[2].type, "cuda_upload");
  EXPECT_EQ(c.nodes[3].type, "device_checksum");
  EXPECT_EQ(c.device_reason, "device: cuda");
}

TEST(CudaConfig, DeviceHostKeepsHostTypesAndSaysWhy) {
  SKIP_WITHOUT_CUDA_BUILD();
  PipelineConfig c = load_config_string(config_text("host"), cuda_registry(1), {}, "x.yaml");
  EXPECT_EQ(c.backend, Backend::host);
  EXPECT_EQ(c.nodes[2].type, "host_upload");
  EXPECT_EQ(c.device_reason, "device: host");
}

TEST(CudaConfig, ACudaOnlyTypeWithoutCounterpartFailsOnTheHost) {
  Registry r = cuda_registry(0);
  r.set(
      factory_type("my_cuda_train", Role::train, {}, [](const NodeSpec&) -> std::unique_ptr<Node> {
        return nullptr;
      }).runs_on(TypeBackend::cuda));
  const std::string yaml =
      "pipeline: { batch_size: 8 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic }\n"
      "  - { name: train, type: my_cuda_train }\n";
  EXPECT_EQ(config_error(yaml, r),
            "x.yaml:4:26: nodes[1].type: 'my_cuda_train' needs a CUDA device (the pipeline runs "
            "on the host: no CUDA device is visible) pick a host type");
}

TEST(CudaConfig, CudaNodeParamsAreValidated) {
  SKIP_WITHOUT_CUDA_BUILD();
  const std::string yaml =
      "pipeline: { batch_size: 8, device: cuda }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic }\n"
      "  - { name: stage, type: pinned_staging, params: { chunk_bytes: -1 } }\n"
      "  - { name: upload, type: cuda_upload, streams: 65 }\n"
      "  - { name: train, type: device_discard }\n";
  EXPECT_EQ(config_error(yaml, cuda_registry(1)),
            "x.yaml:4:65: nodes[1].params.chunk_bytes: -1 is out of range (must be between 0 and "
            "1000000000000)\n"
            "x.yaml:5:49: nodes[2].streams: 65 is out of range (must be between 1 and 64)");
}

TEST(CudaConfig, BounceParamsOfCudaUploadAreValidated) {
  SKIP_WITHOUT_CUDA_BUILD();
  const std::string yaml =
      "pipeline: { batch_size: 8, device: cuda }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic }\n"
      "  - name: upload\n"
      "    type: cuda_upload\n"
      "    params: { bounce: always, bounce_bytes: 100, bounce_buffers: -2 }\n"
      "  - { name: train, type: device_discard }\n";
  EXPECT_EQ(config_error(yaml, cuda_registry(1)),
            "x.yaml:6:23: nodes[1].params.bounce: 'always' is not one of auto, on, off\n"
            "x.yaml:6:45: nodes[1].params.bounce_bytes: 100 is out of range (must be between 4096 "
            "and 1000000000000)\n"
            "x.yaml:6:66: nodes[1].params.bounce_buffers: -2 is out of range (must be between 0 "
            "and 4096)");
}

TEST(CudaConfig, WrittenCudaParamsAreCheckedAgainstTheHostCounterpart) {
  SKIP_WITHOUT_CUDA_BUILD();
  const std::string yaml =
      "pipeline: { batch_size: 8 }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic }\n"
      "  - { name: stage, type: pinned_staging, params: { chunk_bytes: 4096 } }\n"
      "  - { name: upload, type: cuda_upload }\n"
      "  - { name: train, type: device_discard }\n";
  EXPECT_EQ(config_error(yaml, cuda_registry(0)),
            "x.yaml:4:65: nodes[1].params.chunk_bytes: unknown key (this takes no keys)");
}

}  // namespace
}  // namespace flowfeed
