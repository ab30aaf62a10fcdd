// The mix scenario: the cost of mixing. One `memory` loader of 2N samples against a `mix` of two
// `memory` sources of N samples each (weights 1:1, epoch: first_exhausted: 2N positions), the same
// sample shape, batch and graph (→ host_staging → host_upload → discard, host types), alternated
// `--repeats` times in one process; the best batches/s of each. The memory loader serves each
// batch as a slice of its data set (the staging node copies it); the mix's sources write their
// rows straight into the staging node's buffer (fill_rows), which then passes through: one copy
// of every byte before the upload either way. Besides batches/s, batches per CPU second of the
// process (getrusage), which a machine shared with other work disturbs less than wall time.

#include <algorithm>
#include <cstdio>
#include <string>

#include "bench.hpp"

namespace flowfeed::bench {

void mix(Bench& bench) {
  const Options& o = bench.options();
  const Registry& registry = bench.registry();
  const int epochs = o.quick ? 2 : o.mix_epochs;
  const int repeats = o.quick ? 1 : o.mix_repeats;
  const std::size_t per_source = o.quick ? 2048 : o.mix_samples;
  const std::string content =
      "sample_shape: [" + std::to_string(o.mix_sample_bytes) + "], dtype: uint8";
  const std::string head = "pipeline: { epochs: " + std::to_string(epochs) +
                           ", batch_size: " + std::to_string(o.mix_batch) +
                           ", prefetch_depth: 16, device: host }\n"
                           "sampler: { shuffle: false }\n"
                           "nodes:\n";
  const std::string tail =
      "  - { name: stage, type: host_staging, concurrency: 2 }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: discard }\n";
  const std::string one =
      head + "  - { name: load, type: memory, concurrency: 2, params: { samples: " +
      std::to_string(2 * per_source) + ", " + content + ", seed: 1 } }\n" + tail;
  const std::string two = head +
                          "  - name: load\n"
                          "    type: mix\n"
                          "    concurrency: 2\n"
                          "    sources:\n"
                          "      - { type: memory, params: { samples: " +
                          std::to_string(per_source) + ", " + content +
                          ", seed: 1 } }\n"
                          "      - { type: memory, params: { samples: " +
                          std::to_string(per_source) + ", " + content + ", seed: 2 } }\n" + tail;
  const PipelineConfig single_config = load_config_string(one, registry, {}, "mix_single");
  const PipelineConfig mix_config = load_config_string(two, registry, {}, "mix_two");
  std::printf(
      "mix: one memory loader of %zu samples vs a mix of two memory sources of %zu, %d uint8 "
      "bytes a sample, batch %d, %d epochs, %d repeats, host types\n",
      2 * per_source, per_source, o.mix_sample_bytes, o.mix_batch, epochs, repeats);
  Pipeline single(single_config, registry);
  Pipeline mixed(mix_config, registry);
  double best_single = 0;
  double best_mix = 0;
  double best_single_cpu = 0;  // batches per CPU second
  double best_mix_cpu = 0;
  nlohmann::json runs = nlohmann::json::array();
  const auto timed = [](Pipeline& p, double* per_cpu_second) {
    const double before = process_cpu_seconds();
    RunReport r = p.run();
    const double cpu = process_cpu_seconds() - before;
    *per_cpu_second = cpu > 0 ? static_cast<double>(r.batches) / cpu : 0;
    return r;
  };
  for (int r = 0; r < repeats; ++r) {
    double single_cpu = 0;
    double mix_cpu = 0;
    const RunReport s = timed(single, &single_cpu);
    print_run("graph, memory -> host_staging -> host_upload -> discard", s);
    const RunReport m = timed(mixed, &mix_cpu);
    print_run("graph, mix of two memory sources -> host_staging -> host_upload -> discard", m);
    std::printf("  batches per CPU second: memory %.0f, mix %.0f\n", single_cpu, mix_cpu);
    best_single = std::max(best_single, s.batches_per_second);
    best_mix = std::max(best_mix, m.batches_per_second);
    best_single_cpu = std::max(best_single_cpu, single_cpu);
    best_mix_cpu = std::max(best_mix_cpu, mix_cpu);
    runs.push_back({{"single", s.batches_per_second},
                    {"mix", m.batches_per_second},
                    {"single_per_cpu_second", single_cpu},
                    {"mix_per_cpu_second", mix_cpu}});
  }
  std::printf(
      "  best batches/s: memory %.0f, mix %.0f (ratio %.3f); per CPU second: memory %.0f, mix "
      "%.0f (ratio %.3f)\n",
      best_single, best_mix, best_single > 0 ? best_mix / best_single : 0.0, best_single_cpu,
      best_mix_cpu, best_single_cpu > 0 ? best_mix_cpu / best_single_cpu : 0.0);
  bench.result("mix_two_memory_sources", best_mix, "batches/s", best_single,
               Target{0.95, true, false});
  bench.result("mix_two_memory_sources_cpu", best_mix_cpu, "batches/cpu-s", best_single_cpu);
  bench.details("mix") = {{"samples_per_source", per_source},
                          {"sample_bytes", o.mix_sample_bytes},
                          {"batch", o.mix_batch},
                          {"epochs", epochs},
                          {"runs", runs}};
}

}  // namespace flowfeed::bench
