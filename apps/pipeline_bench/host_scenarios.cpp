// The scenarios that run on any machine (host node types): overhead, seed, scaling.
#include <fmt/format.h>
#include <oneapi/tbb/flow_graph.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench.hpp"
#include "scaling_svg.hpp"

namespace flowfeed::bench {

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

/// The bare oneTBB chain the framework is compared with: input_node → limiter_node(depth) →
/// `functions` serial function_nodes doing nothing, the last one decrementing the limiter. Returns
/// microseconds per message.
double bare_tbb_chain_us(long long messages, int depth, int functions) {
  namespace flow = tbb::flow;
  flow::graph g;
  long long next = 0;
  flow::input_node<long long> source(g, [&](tbb::flow_control& fc) -> long long {
    if (next >= messages) {
      fc.stop();
      return 0;
    }
    return next++;
  });
  flow::limiter_node<long long, int> limiter(g, static_cast<std::size_t>(depth));
  std::vector<std::unique_ptr<flow::function_node<long long, long long>>> chain;
  for (int i = 0; i + 1 < functions; ++i) {
    chain.push_back(std::make_unique<flow::function_node<long long, long long>>(
        g, flow::serial, [](long long v) { return v; }));
  }
  long long done_count = 0;
  flow::function_node<long long, int> last(g, flow::serial, [&done_count](long long) {
    ++done_count;
    return 1;
  });
  flow::make_edge(source, limiter);
  flow::sender<long long>* tail = &limiter;
  for (auto& f : chain) {
    flow::make_edge(*tail, *f);
    tail = f.get();
  }
  flow::make_edge(*tail, last);
  flow::make_edge(last, limiter.decrementer());
  const auto start = std::chrono::steady_clock::now();
  source.activate();
  g.wait_for_all();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (done_count != messages) {
    throw std::runtime_error("overhead: the bare oneTBB chain delivered " +
                             std::to_string(done_count) + " of " + std::to_string(messages) +
                             " messages");
  }
  return seconds * 1e6 / static_cast<double>(messages);
}

}  // namespace

void overhead(Bench& bench) {
  const Options& o = bench.options();
  const long long batches = o.quick ? 20000 : o.overhead_batches;
  const int repeats = o.quick ? 3 : o.overhead_repeats;
  constexpr int kDepth = 16;
  // apps/overhead_bench's "load -> staging -> upload -> discard, ordered": four nodes.
  const std::string yaml =
      "pipeline: { epochs: 1, batch_size: 1, prefetch_depth: " + std::to_string(kDepth) +
      ", ordered: true, device: host }\n"
      "nodes:\n"
      "  - { name: load, type: synthetic, params: { batches: " +
      std::to_string(batches) +
      ", sample_shape: [1] } }\n"
      "  - { name: stage, type: host_staging }\n"
      "  - { name: upload, type: host_upload }\n"
      "  - { name: train, type: discard }\n";
  Pipeline pipeline(load_config_string(yaml, bench.registry(), {}, "overhead"), bench.registry());
  constexpr int kNodes = 4;
  // Alternated run by run, so that a change in the machine's load hits both alike.
  std::vector<double> graph_us, bare_us;
  for (int r = 0; r < repeats; ++r) {
    const RunReport report = pipeline.run();
    graph_us.push_back(1e6 / report.batches_per_second);
    bare_us.push_back(bare_tbb_chain_us(batches, kDepth, kNodes));
  }
  const double g = median(graph_us), b = median(bare_us);
  std::printf(
      "overhead: %lld zero-work batches (1 sample of one float32), load -> staging -> upload -> "
      "discard, ordered, prefetch_depth %d, median of %d runs: %.3f us per batch\n"
      "  bare oneTBB chain, input_node -> limiter_node(%d) -> %d serial function_nodes -> "
      "decrement, same process: %.3f us per message\n"
      "  flowfeed adds %.3f us per batch\n",
      batches, kDepth, repeats, g, kDepth, kNodes, b, g - b);
  bench.result("overhead", g, "us/batch", b, Target{5, false, true});
  bench.details("overhead") = {{"batches", batches},   {"repeats", repeats},
                               {"nodes", kNodes},      {"prefetch_depth", kDepth},
                               {"graph_us", graph_us}, {"bare_tbb_us", bare_us},
                               {"added_us", g - b}};
}

void seed(Bench& bench) {
  const Options& o = bench.options();
  // --quick: 20 batches instead of the config's 50 (the same delays).
  std::vector<std::string> overrides;
  if (o.quick) overrides.push_back("nodes.load.params.batches=20");
  const PipelineConfig config = load_config_file(o.seed_config, bench.registry(), overrides);
  // The ideal run (configs/seed_prefetch.yaml, README): the first load cannot overlap anything;
  // after it the slower of the train step and the loaders' rate sets the pace, and the last batch
  // still has to be trained. With load L ms at concurrency C (at most prefetch_depth loads in
  // flight) and train T ms: max(L + B*T, B*L/C' + T) for B batches, C' = min(C, depth).
  const NodeSpec& load = config.nodes.front();
  const NodeSpec& train = config.nodes.back();
  const double load_ms = load.params.get_number("delay_ms");
  const double train_ms = train.params.get_number("ms");
  const int parallel_loads = std::min(load.concurrency, config.pipeline.prefetch_depth);
  const RunReport r = Pipeline(config, bench.registry()).run();
  const double b = static_cast<double>(r.batches);
  const double ideal_s =
      std::max(load_ms + b * train_ms, b * load_ms / parallel_loads + train_ms) * 1e-3;
  const double serial_s = b * (load_ms + train_ms) * 1e-3;
  std::printf(
      "seed: %s, %.0f batches, load %.0f ms at concurrency %d, train %.0f ms: %.3f s; ideal "
      "%.3f s, serial %.3f s: %.3f x ideal\n",
      o.seed_config.c_str(), b, load_ms, load.concurrency, train_ms, r.seconds, ideal_s, serial_s,
      r.seconds / ideal_s);
  bench.result("seed", r.seconds, "s", ideal_s);
  bench.details("seed") = {{"config", o.seed_config},  {"batches", r.batches},
                           {"load_ms", load_ms},       {"load_concurrency", load.concurrency},
                           {"train_ms", train_ms},     {"seconds", r.seconds},
                           {"ideal_seconds", ideal_s}, {"serial_seconds", serial_s},
                           {"verdict", r.verdict}};
}

std::string scaling_yaml(double load_ms, double train_ms, int batches, int epochs,
                         const std::string& load, const std::string& depth,
                         const std::string& extra) {
  return fmt::format(
      "pipeline: {{ epochs: {}, batch_size: 64, prefetch_depth: {}, threads: 16, device: host{} "
      "}}\n"
      "nodes:\n"
      "  - {{ name: load, type: synthetic, concurrency: {}, params: {{ batches: {}, "
      "sample_shape: [64], delay_ms: {:g} }} }}\n"
      "  - {{ name: stage, type: host_staging, concurrency: 2 }}\n"
      "  - {{ name: upload, type: host_upload }}\n"
      "  - {{ name: train, type: sleep, params: {{ ms: {:g} }} }}\n",
      epochs, depth, extra, load, batches, load_ms, train_ms);
}

void scaling(Bench& bench) {
  const Options& o = bench.options();
  struct Shape {
    const char* name;
    double load_ms, train_ms;
    int load_concurrency;  // for the depth sweep
  };
  // Load-bound: two loaders of 4 ms give 500 batches/s against a 1 ms train step (1000/s).
  // Train-bound: two loaders of 1 ms give 2000 batches/s against a 2 ms train step (500/s).
  // --quick divides every delay by 4 and runs fewer batches.
  const double scale = o.quick ? 0.25 : 1.0;
  const std::vector<Shape> shapes = {{"load_bound", 4 * scale, 1 * scale, 2},
                                     {"train_bound", 1 * scale, 2 * scale, 2}};
  const std::vector<int> depths = {1, 2, 4, 8, 16, 32};
  const std::vector<int> concurrencies = {1, 2, 4, 8};
  const int batches = o.quick ? 40 : 200;
  constexpr int kConcurrencyDepth = 16;
  auto run = [&](const Shape& s, int depth, int concurrency) {
    const std::string yaml = scaling_yaml(s.load_ms, s.train_ms, batches, 1,
                                          std::to_string(concurrency), std::to_string(depth));
    const RunReport r =
        Pipeline(load_config_string(yaml, bench.registry(), {}, "scaling"), bench.registry()).run();
    return r.batches_per_second;
  };
  std::vector<ScalingSeries> series;
  std::printf("scaling: %d batches per point, host types (synthetic delay_ms -> sleep)\n", batches);
  std::printf(
      "| config | load ms | train ms | sweep | value | batches/s |\n|---|---|---|---|---|---|\n");
  nlohmann::json details = nlohmann::json::object();
  for (const Shape& s : shapes) {
    ScalingSeries by_depth{s.name, "prefetch_depth", {}, {}};
    ScalingSeries by_concurrency{s.name, "load concurrency", {}, {}};
    for (int d : depths) {
      const double rate = run(s, d, s.load_concurrency);
      by_depth.x.push_back(d);
      by_depth.y.push_back(rate);
      std::printf("| %s | %g | %g | prefetch_depth (load concurrency %d) | %d | %.0f |\n", s.name,
                  s.load_ms, s.train_ms, s.load_concurrency, d, rate);
    }
    for (int c : concurrencies) {
      const double rate = run(s, kConcurrencyDepth, c);
      by_concurrency.x.push_back(c);
      by_concurrency.y.push_back(rate);
      std::printf("| %s | %g | %g | load concurrency (prefetch_depth %d) | %d | %.0f |\n", s.name,
                  s.load_ms, s.train_ms, kConcurrencyDepth, c, rate);
    }
    const std::size_t knee = knee_index(by_depth.y);
    const double best = *std::max_element(by_depth.y.begin(), by_depth.y.end());
    // The ideal rate for the depth sweep: the slower of the loaders and the train step.
    const double ideal =
        1e3 / std::max(s.train_ms, s.load_ms / static_cast<double>(s.load_concurrency));
    std::printf("  %s: knee at prefetch_depth %d (%.0f batches/s, best %.0f, ideal %.0f)\n", s.name,
                by_depth.x[knee], by_depth.y[knee], best, ideal);
    bench.result("scaling_" + std::string(s.name), best, "batches/s", ideal);
    details[s.name] = {{"load_ms", s.load_ms},
                       {"train_ms", s.train_ms},
                       {"load_concurrency_for_depth_sweep", s.load_concurrency},
                       {"prefetch_depth_for_concurrency_sweep", kConcurrencyDepth},
                       {"depths", by_depth.x},
                       {"depth_batches_per_second", by_depth.y},
                       {"concurrencies", by_concurrency.x},
                       {"concurrency_batches_per_second", by_concurrency.y},
                       {"knee_depth", by_depth.x[knee]},
                       {"ideal_batches_per_second", ideal}};
    series.push_back(std::move(by_depth));
    series.push_back(std::move(by_concurrency));
  }
  write_scaling_svg(o.svg, series);
  std::printf("  plot: %s\n", o.svg.c_str());
  details["batches_per_point"] = batches;
  details["svg"] = o.svg;
  bench.details("scaling") = details;
}

}  // namespace flowfeed::bench
