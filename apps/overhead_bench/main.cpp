// overhead_bench [--batches N] [--repeats R]: the framework's own cost per batch. Zero-work
// pipelines (1-sample batches of one float, no delay, a discard sink) run with recording off, with
// stats (the default) and with tracing; prints batches/s and microseconds per batch (median of R
// runs per mode, modes interleaved) and the range.
// --variant/--mode pick one combination (e.g. for valgrind --tool=callgrind).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "flowfeed/flowfeed.hpp"
#include "flowfeed/nodes/builtin.hpp"

namespace {

struct Variant {
  const char* name;
  const char* nodes;
  bool ordered;
  int load_concurrency;
};

std::string yaml_of(const Variant& v, long long batches) {
  return std::string("pipeline: { epochs: 1, batch_size: 1, prefetch_depth: 16, ordered: ") +
         (v.ordered ? "true" : "false") +
         ", device: host }\n"
         "nodes:\n"
         "  - { name: load, type: synthetic, concurrency: " +
         std::to_string(v.load_concurrency) + ", params: { batches: " + std::to_string(batches) +
         ", sample_shape: [1] } }\n" + v.nodes + "  - { name: train, type: discard }\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flowfeed overhead_bench: per-batch cost of the framework itself"};
  long long batches = 200000;
  int repeats = 5;
  int only_variant = -1;
  int only_mode = -1;
  app.add_option("--batches", batches, "batches per run")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "runs per variant (the median is printed)")
      ->check(CLI::PositiveNumber);
  app.add_option("--variant", only_variant, "run only this pipeline (0 to 3)");
  app.add_option("--mode", only_mode, "run only this recording mode (0 off, 1 stats, 2 trace)");
  CLI11_PARSE(app, argc, argv);

  flowfeed::Registry registry;
  flowfeed::register_builtin_nodes(registry);
  const std::vector<Variant> variants = {
      {"load -> discard, unordered", "", false, 1},
      {"load -> discard, ordered", "", true, 1},
      {"load -> staging -> upload -> discard, ordered",
       "  - { name: stage, type: host_staging }\n  - { name: upload, type: host_upload }\n", true,
       1},
      {"load x2 -> staging x2 -> upload -> discard, unordered",
       "  - { name: stage, type: host_staging, concurrency: 2 }\n"
       "  - { name: upload, type: host_upload }\n",
       false, 2},
  };
  struct Mode {
    const char* name;
    bool stats;
    bool trace;
  };
  const Mode modes[] = {
      {"stats off", false, false}, {"stats on", true, false}, {"stats + trace", true, true}};
  std::printf(
      "| pipeline | recording | batches/s (median) | us per batch | range over runs |\n"
      "|---|---|---:|---:|---:|\n");
  for (std::size_t vi = 0; vi < variants.size(); ++vi) {
    if (only_variant >= 0 && static_cast<std::size_t>(only_variant) != vi) continue;
    const Variant& v = variants[vi];
    flowfeed::Pipeline pipeline(flowfeed::load_config_string(yaml_of(v, batches), registry),
                                registry);
    // Modes alternate run by run, so a change in the machine's load hits them alike.
    std::vector<std::vector<double>> rates(3);
    for (int r = 0; r < repeats; ++r) {
      for (int mi = 0; mi < 3; ++mi) {
        if (only_mode >= 0 && only_mode != mi) continue;
        flowfeed::Trace trace;
        flowfeed::RunOptions options;
        options.stats = modes[mi].stats;
        options.trace = modes[mi].trace ? &trace : nullptr;
        rates[static_cast<std::size_t>(mi)].push_back(pipeline.run(options).batches_per_second);
      }
    }
    for (int mi = 0; mi < 3; ++mi) {
      auto& v_rates = rates[static_cast<std::size_t>(mi)];
      if (v_rates.empty()) continue;
      std::sort(v_rates.begin(), v_rates.end());
      const double median = v_rates[v_rates.size() / 2];
      std::printf("| %s | %s | %.0f | %.2f | %.0f-%.0f |\n", v.name, modes[mi].name, median,
                  1e6 / median, v_rates.front(), v_rates.back());
      std::fflush(stdout);
    }
  }
  return 0;
}
