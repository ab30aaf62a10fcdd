// The scenarios that need a CUDA device: bandwidth, small_batches, naive.
#include <cstdio>
#include <string>
#include <vector>

#include "bench.hpp"
#include "raw_copies.hpp"

namespace flowfeed::bench {

void bandwidth(Bench& bench) {
  bench.require_cuda("bandwidth");
  const Options& o = bench.options();
  const Registry& registry = bench.registry();
  const PipelineConfig pinned = load_config_file(o.bandwidth_config, registry);
  if (pinned.backend != Backend::cuda) {
    throw NeedsCuda("bandwidth needs a CUDA device (" + pinned.device_reason + ")");
  }
  const std::size_t batch_bytes = 33554688;  // 64 x 131072 float32 + 64 labels at a 256 B boundary
  const auto raw = raw_pinned_copies(batch_bytes, o.raw_seconds, pinned.pipeline.device_id);
  std::printf(
      "bandwidth: raw pinned cudaMemcpyAsync, 32 MiB copies, one stream: %.2f GB/s "
      "(%zu copies in %.3f s)\n",
      raw.gbps, raw.copies, raw.seconds);
  const RunReport a = Pipeline(pinned, registry).run();
  print_run("graph, data set pinned in place (cudaHostRegister)", a);
  std::printf("  device: %s (%s)\n", a.device.c_str(), a.device_reason.c_str());
  bench.result("bandwidth_pinned_in_place", a.upload_gbps, "GB/s", raw.gbps,
               Target{0.95, true, false});

  // Pageable source, the recommended way: no staging node, cuda_upload's bounce buffers.
  const std::string epochs = "pipeline.epochs=" + std::to_string(o.pageable_epochs);
  const PipelineConfig bounced = load_config_file(o.pageable_config, registry, {epochs});
  const RunReport b = Pipeline(bounced, registry).run();
  print_run("graph, pageable data set, no staging node (cuda_upload's bounce buffers)", b);
  bench.result("bandwidth_pageable_source", b.upload_gbps, "GB/s", raw.gbps,
               Target{48, false, false});
  // The same data through pinned_staging (whole 32 MiB pinned batches copied in parallel
  // chunks, one DMA each), with cached and with streaming stores, for comparison.
  std::vector<std::string> overrides = {"nodes.load.params.pin=false", epochs};
  const PipelineConfig staged = load_config_file(o.bandwidth_config, registry, overrides);
  const RunReport c = Pipeline(staged, registry).run();
  print_run("graph, pageable data set, pinned_staging copies whole batches", c);
  bench.result("bandwidth_pageable_staged", c.upload_gbps, "GB/s", raw.gbps);
  overrides.push_back("nodes.stage.params.stores=streaming");
  const PipelineConfig streaming = load_config_file(o.bandwidth_config, registry, overrides);
  const RunReport d = Pipeline(streaming, registry).run();
  print_run("graph, pageable data set, pinned_staging with streaming stores", d);
  bench.result("bandwidth_pageable_streaming_stores", d.upload_gbps, "GB/s", raw.gbps);
  bench.details("bandwidth") = {{"device", a.device},
                                {"raw_gbps", raw.gbps},
                                {"pinned_in_place", nlohmann::json::parse(a.to_json())},
                                {"pageable_source", nlohmann::json::parse(b.to_json())},
                                {"pageable_staged", nlohmann::json::parse(c.to_json())},
                                {"pageable_streaming_stores", nlohmann::json::parse(d.to_json())}};
}

void small_batches(Bench& bench) {
  bench.require_cuda("small_batches");
  const Options& o = bench.options();
  const Registry& registry = bench.registry();
  // 64 x 784 float32 (200,704 bytes), labels at the next 256-byte boundary: 200,960 bytes, one
  // copy.
  const std::string yaml =
      "pipeline: { epochs: " + std::to_string(o.epochs) +
      ", batch_size: 64, prefetch_depth: " + std::to_string(o.depth) +
      ", device: cuda }\n"
      "nodes:\n"
      "  - { name: load, type: memory, params: { batches: 1024, sample_shape: [784], pin: true } "
      "}\n"
      "  - { name: stage, type: pinned_staging }\n"
      "  - { name: upload, type: cuda_upload, streams: " +
      std::to_string(o.streams) +
      " }\n"
      "  - { name: train, type: " +
      o.sink + " }\n";
  const PipelineConfig config = load_config_string(yaml, registry, o.overrides, "small_batches");
  const auto raw = raw_pinned_copies(200960, o.raw_seconds, config.pipeline.device_id);
  std::printf(
      "small_batches: raw pinned cudaMemcpyAsync, 200,960-byte copies, one stream: %.0f "
      "copies/s (%.2f GB/s)\n",
      raw.copies_per_second, raw.gbps);
  const RunReport r = Pipeline(config, registry).run();
  print_run(("graph, memory (pinned) -> cuda_upload -> " + o.sink + ", prefetch_depth " +
             std::to_string(o.depth) + ", streams " + std::to_string(o.streams))
                .c_str(),
            r);
  std::printf("%s", r.to_table().c_str());
  std::printf(
      "  device_checksum verified %.3f GB on the GPU\n",
      r.extra.count("train.bytes_verified") ? r.extra.at("train.bytes_verified") * 1e-9 : 0.0);
  const std::string name = "small_batches_" + o.sink + "_depth" + std::to_string(o.depth) +
                           "_streams" + std::to_string(o.streams);
  bench.result(name, r.batches_per_second, "batches/s", raw.copies_per_second);
  bench.result(name + "_vs_target", r.batches_per_second, "batches/s", 100000,
               Target{100000, false, false});
  bench.details("small_batches") = {{"raw_copies_per_second", raw.copies_per_second},
                                    {"raw_gbps", raw.gbps},
                                    {"run", nlohmann::json::parse(r.to_json())}};
}

void naive(Bench& bench) {
  bench.require_cuda("naive");
  const Options& o = bench.options();
  const Registry& registry = bench.registry();
  // The founding report's shape: 64 x 1000 float32 per batch (labels beside it). flowfeed runs
  // the same batches and the same checksum kernel as the naive loop twice: from the pageable data
  // set (pinned_staging copies each batch into a pinned buffer, 8 at once, while earlier ones
  // upload), and from the same set page-locked in place once (cudaHostRegister: no host copy).
  constexpr std::size_t kRows = 64, kElements = 1000;
  auto yaml = [&](bool pin, const char* stores = "auto") {
    return "pipeline: { epochs: " + std::to_string(o.naive_pipeline_epochs) +
           ", batch_size: 64, prefetch_depth: " + std::to_string(o.naive_depth) +
           ", ordered: true, device: cuda }\n"
           "nodes:\n"
           "  - { name: load, type: memory, params: { batches: " +
           std::to_string(o.naive_batches) +
           ", sample_shape: [1000], dtype: float32, pin: " + (pin ? "true" : "false") +
           " } }\n"
           "  - { name: stage, type: pinned_staging, concurrency: 8, params: { stores: " +
           stores +
           " } }\n"
           "  - { name: upload, type: cuda_upload }\n"
           "  - { name: train, type: device_checksum }\n";
  };
  const PipelineConfig pageable = load_config_string(yaml(false), registry, {}, "naive");
  const PipelineConfig pinned = load_config_string(yaml(true), registry, {}, "naive");
  const PipelineConfig cached = load_config_string(yaml(false, "cached"), registry, {}, "naive");
  const NaiveLoop loop = naive_loop(static_cast<std::size_t>(o.naive_batches), o.naive_epochs,
                                    kRows, kElements, pageable.pipeline.device_id);
  std::printf(
      "naive: per batch cudaMalloc + pageable cudaMemcpy + device checksum + cudaFree, 64x1000 "
      "float32: %.0f batches/s (%zu batches in %.3f s, %llu mismatches)\n",
      loop.batches_per_second, loop.batches, loop.seconds, loop.mismatches);
  if (loop.mismatches != 0) {
    throw std::runtime_error("naive: the checksum kernel found " + std::to_string(loop.mismatches) +
                             " wrong elements in the naive loop");
  }
  const RunReport a = Pipeline(pageable, registry).run();
  const std::string depth = ", prefetch_depth " + std::to_string(o.naive_depth);
  print_run(
      ("graph, memory (pageable) -> pinned_staging x8 -> cuda_upload -> device_checksum" + depth)
          .c_str(),
      a);
  const RunReport b = Pipeline(pinned, registry).run();
  print_run(("graph, memory (pinned in place) -> cuda_upload -> device_checksum" + depth).c_str(),
            b);
  const RunReport c = Pipeline(cached, registry).run();
  print_run(("graph, as the first but staging with cached stores (memcpy)" + depth).c_str(), c);
  for (const auto* r : {&a, &b, &c}) {
    std::printf(
        "  flowfeed / naive: %.0f / %.0f batches/s = %.2fx\n", r->batches_per_second,
        loop.batches_per_second,
        loop.batches_per_second > 0 ? r->batches_per_second / loop.batches_per_second : 0.0);
  }
  bench.result("naive_vs_flowfeed", a.batches_per_second, "batches/s", loop.batches_per_second,
               Target{5, true, false});
  bench.result("naive_vs_flowfeed_pinned_in_place", b.batches_per_second, "batches/s",
               loop.batches_per_second, Target{5, true, false});
  bench.result("naive_vs_flowfeed_cached_stores", c.batches_per_second, "batches/s",
               loop.batches_per_second);
  bench.details("naive") = {{"batch", "64x1000 float32 + 64 int32 labels"},
                            {"naive_batches", loop.batches},
                            {"naive_seconds", loop.seconds},
                            {"naive_batches_per_second", loop.batches_per_second},
                            {"run_pageable", nlohmann::json::parse(a.to_json())},
                            {"run_pinned_in_place", nlohmann::json::parse(b.to_json())},
                            {"run_pageable_cached_stores", nlohmann::json::parse(c.to_json())}};
}

}  // namespace flowfeed::bench
