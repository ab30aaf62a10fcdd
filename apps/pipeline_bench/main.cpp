// pipeline_bench SCENARIO [options]: measures flowfeed on the GPU against raw CUDA copies measured
// in the same process, and prints each figure with its baseline and their ratio.
//   bandwidth      32 MiB batches, configs/bandwidth.yaml: pinned in place, then a pageable source
//   small_batches  200 KB batches (64x784 float32 + labels) through cuda_upload + device_checksum
// The last lines are `RESULT <name> <figure> <unit> baseline <baseline> ratio <ratio>`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"
#include "flowfeed/nodes/cuda.hpp"
#include "raw_copies.hpp"

namespace {

using flowfeed::RunReport;

struct Result {
  std::string name;
  double figure;
  std::string unit;
  double baseline;
};
std::vector<Result> g_results;

void result(const std::string& name, double figure, const std::string& unit, double baseline) {
  g_results.push_back({name, figure, unit, baseline});
}

RunReport run_pipeline(const flowfeed::PipelineConfig& config, const flowfeed::Registry& registry) {
  flowfeed::Pipeline pipeline(config, registry);
  return pipeline.run();
}

void print_run(const char* what, const RunReport& r) {
  std::printf(
      "  %s: %llu batches, %.3f GB in %.3f s = %.2f GB/s, %.0f batches/s; allocations after "
      "build %llu; device pools %.1f MiB; stream copies",
      what, static_cast<unsigned long long>(r.batches),
      static_cast<double>(r.bytes_uploaded) * 1e-9, r.seconds, r.upload_gbps, r.batches_per_second,
      static_cast<unsigned long long>(r.allocations_after_build),
      static_cast<double>(r.device_pool_bytes) / (1 << 20));
  for (auto c : r.stream_copies) std::printf(" %llu", static_cast<unsigned long long>(c));
  std::printf("\n");
}

int bandwidth(const flowfeed::Registry& registry, const std::string& config_path,
              int pageable_epochs, double raw_seconds) {
  const flowfeed::PipelineConfig pinned = flowfeed::load_config_file(config_path, registry);
  if (pinned.backend != flowfeed::Backend::cuda) {
    std::cerr << "pipeline_bench: no CUDA device (" << pinned.device_reason << ")\n";
    return 1;
  }
  const std::size_t batch_bytes = 33554688;  // 64 x 131072 float32 + 64 labels at a 256 B boundary
  const auto raw =
      flowfeed::bench::raw_pinned_copies(batch_bytes, raw_seconds, pinned.pipeline.device_id);
  std::printf(
      "bandwidth: raw pinned cudaMemcpyAsync, 32 MiB copies, one stream: %.2f GB/s "
      "(%zu copies in %.3f s)\n",
      raw.gbps, raw.copies, raw.seconds);
  const RunReport a = run_pipeline(pinned, registry);
  print_run("graph, data set pinned in place (cudaHostRegister)", a);
  std::printf("  device: %s (%s)\n", a.device.c_str(), a.device_reason.c_str());
  result("bandwidth_pinned_in_place", a.upload_gbps, "GB/s", raw.gbps);

  const flowfeed::PipelineConfig pageable = flowfeed::load_config_file(
      config_path, registry,
      {"nodes.load.params.pin=false", "pipeline.epochs=" + std::to_string(pageable_epochs)});
  const RunReport b = run_pipeline(pageable, registry);
  print_run("graph, pageable data set (pinned_staging copies in parallel chunks)", b);
  result("bandwidth_pageable_source", b.upload_gbps, "GB/s", raw.gbps);
  return 0;
}

int small_batches(const flowfeed::Registry& registry, int depth, int streams, int epochs,
                  const std::string& sink, const std::vector<std::string>& overrides,
                  double raw_seconds) {
  // 64 x 784 float32 (200,704 bytes), labels at the next 256-byte boundary: 200,960 bytes, one
  // copy.
  const std::string yaml =
      "pipeline: { epochs: " + std::to_string(epochs) +
      ", batch_size: 64, prefetch_depth: " + std::to_string(depth) +
      ", device: cuda }\n"
      "nodes:\n"
      "  - { name: load, type: memory, params: { batches: 1024, sample_shape: [784], pin: true } "
      "}\n"
      "  - { name: stage, type: pinned_staging }\n"
      "  - { name: upload, type: cuda_upload, streams: " +
      std::to_string(streams) +
      " }\n"
      "  - { name: train, type: " +
      sink + " }\n";
  const flowfeed::PipelineConfig config =
      flowfeed::load_config_string(yaml, registry, overrides, "small_batches");
  const auto raw =
      flowfeed::bench::raw_pinned_copies(200960, raw_seconds, config.pipeline.device_id);
  std::printf(
      "small_batches: raw pinned cudaMemcpyAsync, 200,960-byte copies, one stream: %.0f "
      "copies/s (%.2f GB/s)\n",
      raw.copies_per_second, raw.gbps);
  const RunReport r = run_pipeline(config, registry);
  print_run(("graph, memory (pinned) -> cuda_upload -> " + sink + ", prefetch_depth " +
             std::to_string(depth) + ", streams " + std::to_string(streams))
                .c_str(),
            r);
  std::printf("%s", r.to_table().c_str());
  std::printf(
      "  device_checksum verified %.3f GB on the GPU\n",
      r.extra.count("train.bytes_verified") ? r.extra.at("train.bytes_verified") * 1e-9 : 0.0);
  const std::string name = "small_batches_" + sink + "_depth" + std::to_string(depth) + "_streams" +
                           std::to_string(streams);
  result(name, r.batches_per_second, "batches/s", raw.copies_per_second);
  result(name + "_vs_target", r.batches_per_second, "batches/s", 100000);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowfeed pipeline_bench: pipeline figures against same-process baselines"};
  app.require_subcommand(1);
  std::string config = std::string(FLOWFEED_SOURCE_DIR) + "/configs/bandwidth.yaml";
  int pageable_epochs = 100;
  int depth = 16, streams = 1, epochs = 300;
  std::string sink = "device_checksum";
  double raw_seconds = 1.0;
  auto* bw = app.add_subcommand("bandwidth", "32 MiB batches: graph vs raw pinned copies");
  bw->add_option("--config", config, "the bandwidth config");
  bw->add_option("--pageable-epochs", pageable_epochs, "epochs of the pageable-source run");
  auto* small = app.add_subcommand("small_batches", "200 KB batches uploaded and checksummed");
  small->add_option("--depth", depth, "prefetch_depth");
  small->add_option("--streams", streams, "cuda_upload streams");
  small->add_option("--epochs", epochs, "epochs over the 1024-batch data set");
  small->add_option("--sink", sink, "train node: device_checksum or device_discard");
  std::vector<std::string> overrides;
  small->add_option("--set", overrides, "override a config value, e.g. nodes.upload.concurrency=2");
  app.add_option("--raw-seconds", raw_seconds, "length of each raw copy loop");
  CLI11_PARSE(app, argc, argv);

  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  int rc = 0;
  try {
    if (*bw) rc = bandwidth(registry, config, pageable_epochs, raw_seconds);
    if (*small) rc = small_batches(registry, depth, streams, epochs, sink, overrides, raw_seconds);
  } catch (const std::exception& e) {
    std::cerr << "pipeline_bench: " << e.what() << "\n";
    return 1;
  }
  for (const auto& r : g_results) {
    std::printf("RESULT %s %.4g %s baseline %.4g ratio %.3f\n", r.name.c_str(), r.figure,
                r.unit.c_str(), r.baseline, r.baseline > 0 ? r.figure / r.baseline : 0.0);
  }
  return rc;
}
