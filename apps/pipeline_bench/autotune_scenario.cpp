// pipeline_bench autotune: `concurrency: auto` and `prefetch_depth: auto` against the best
// hand-tuned setting a sweep finds, in the same process: the scaling scenario's load-bound and
// train-bound shapes, the load-bound one under a memory budget too small for its best depth, and
// any config given with --config (or the storage scenario's with --storage).

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "bench.hpp"
#include "flowfeed/config.hpp"
#include "flowfeed/pipeline.hpp"

namespace flowfeed::bench {

namespace {

struct Point {
  std::string setting;
  double rate = 0;
  int concurrency = 1;
  int depth = 1;
};

const Point& best_of(const std::vector<Point>& sweep) {
  return *std::max_element(sweep.begin(), sweep.end(),
                           [](const Point& a, const Point& b) { return a.rate < b.rate; });
}

RunReport run(Bench& bench, const std::string& yaml, const std::string& name,
              const std::vector<std::string>& overrides = {}) {
  return Pipeline(load_config_string(yaml, bench.registry(), overrides, name), bench.registry())
      .run();
}

/// Records the auto run against the best point of the sweep run again for as many epochs (`best`:
/// the sweep's one-epoch points are short, and the highest of several is the luckiest), and what
/// the tuner did.
void record(Bench& bench, nlohmann::json& details, const std::string& name,
            const std::vector<Point>& sweep, const RunReport& best_run, const RunReport& r) {
  const Point& best = best_of(sweep);
  const double best_rate = best_run.batches_per_second;
  const double share =
      r.batches > 0 ? static_cast<double>(r.tuning.settled_batches) / static_cast<double>(r.batches)
                    : 0;
  std::printf(
      "  %s: auto %.0f batches/s, best hand-tuned %.0f (%s, run for as many epochs; %.0f in the "
      "sweep): %.2f; last change at batch %llu of %llu (%.1f%%); %s\n",
      name.c_str(), r.batches_per_second, best_rate, best.setting.c_str(), best.rate,
      r.batches_per_second / best_rate, static_cast<unsigned long long>(r.tuning.settled_batches),
      static_cast<unsigned long long>(r.batches), share * 100,
      r.tuning.within_budget ? "within budget" : "OVER BUDGET");
  std::printf("%s", r.tuning.yaml.c_str());
  bench.result("autotune_" + name, r.batches_per_second, "batches/s", best_rate,
               Target{0.95, true, false});
  bench.result("autotune_" + name + "_settled_share", share, "of the run's batches", 0.05,
               Target{0.05, false, true});
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : sweep)
    points.push_back({{"setting", p.setting}, {"batches_per_second", p.rate}});
  nlohmann::json decisions = nlohmann::json::array();
  for (const auto& d : r.tuning.decisions) {
    decisions.push_back({{"seconds", d.seconds},
                         {"batch", d.batch},
                         {"knob", d.knob},
                         {"from", d.from},
                         {"to", d.to},
                         {"why", d.why}});
  }
  details[name] = {{"sweep", points},
                   {"best", best.setting},
                   {"best_sweep_batches_per_second", best.rate},
                   {"best_batches_per_second", best_rate},
                   {"auto_batches_per_second", r.batches_per_second},
                   {"batches", r.batches},
                   {"settled_batches", r.tuning.settled_batches},
                   {"settled_seconds", r.tuning.settled_seconds},
                   {"settled", r.tuning.settled},
                   {"state", r.tuning.state},
                   {"max_prefetch_depth", r.tuning.max_prefetch_depth},
                   {"depth_capped_by_memory", r.tuning.depth_capped_by_memory},
                   {"host_pool_bytes", r.tuning.host_pool_bytes},
                   {"host_budget_bytes", r.tuning.host_budget_bytes},
                   {"device_pool_bytes", r.tuning.device_pool_bytes},
                   {"device_budget_bytes", r.tuning.device_budget_bytes},
                   {"within_budget", r.tuning.within_budget},
                   {"decisions", decisions}};
}

/// A config given by path (or text): sweeps the concurrency of its nodes before the upload node
/// (load, transforms, staging) together, then the depth at the best one, and runs it with every
/// one of them auto.
void tune_config(Bench& bench, nlohmann::json& details, const std::string& name,
                 const std::string& yaml, const std::string& file) {
  const Options& o = bench.options();
  const PipelineConfig base = load_config_string(yaml, bench.registry(), o.overrides, file);
  std::vector<std::string> knobs;
  for (const auto& n : base.nodes) {
    if (n.role == Role::upload || n.role == Role::train) break;  // host-side stages only
    knobs.push_back(n.name);
  }
  auto with = [&](const std::string& concurrency, const std::string& depth, int epochs) {
    std::vector<std::string> set = o.overrides;
    for (const auto& k : knobs) set.push_back("nodes." + k + ".concurrency=" + concurrency);
    set.push_back("pipeline.prefetch_depth=" + depth);
    set.push_back("pipeline.epochs=" + std::to_string(epochs));
    return set;
  };
  std::vector<Point> sweep;
  for (int c : {1, 2, 4, 8, 16}) {
    const int depth = std::max(8, 2 * c);
    const double rate = run(bench, yaml, file, with(std::to_string(c), std::to_string(depth), 1))
                            .batches_per_second;
    sweep.push_back({fmt::format("concurrency {}, prefetch_depth {}", c, depth), rate, c, depth});
    std::printf("| %s | concurrency %d | prefetch_depth %d | %.0f |\n", name.c_str(), c, depth,
                rate);
  }
  const int best_c = best_of(sweep).concurrency;
  for (int depth : {best_c + 2, 4 * best_c + 4}) {
    const double rate =
        run(bench, yaml, file, with(std::to_string(best_c), std::to_string(depth), 1))
            .batches_per_second;
    sweep.push_back(
        {fmt::format("concurrency {}, prefetch_depth {}", best_c, depth), rate, best_c, depth});
    std::printf("| %s | concurrency %d | prefetch_depth %d | %.0f |\n", name.c_str(), best_c, depth,
                rate);
  }
  const int epochs = o.quick ? 2 : o.autotune_epochs;
  const Point& best = best_of(sweep);
  const RunReport best_run =
      run(bench, yaml, file,
          with(std::to_string(best.concurrency), std::to_string(best.depth), epochs));
  record(bench, details, name, sweep, best_run,
         run(bench, yaml, file, with("auto", "auto", epochs)));
}

}  // namespace

void autotune(Bench& bench) {
  const Options& o = bench.options();
  struct Shape {
    const char* name;
    double load_ms, train_ms;
  };
  const double scale = o.quick ? 0.25 : 1.0;
  const std::vector<Shape> shapes = {{"load_bound", 4 * scale, 1 * scale},
                                     {"train_bound", 1 * scale, 2 * scale}};
  const int batches = o.quick ? 40 : 200;  // per epoch, as the scaling sweep's points
  const int epochs = o.quick ? 2 : o.autotune_epochs;
  nlohmann::json details = nlohmann::json::object();
  std::printf("autotune: the scaling sweep (%d batches per point), then auto for %d epochs\n",
              batches, epochs);
  std::printf("| config | setting | | batches/s |\n|---|---|---|---|\n");
  for (const Shape& s : shapes) {
    // One hand-tuned point of a sweep: one epoch at load concurrency c and a fixed depth.
    auto point = [&](std::vector<Point>& into, const std::string& label, int c, int depth) {
      const double rate = run(bench,
                              scaling_yaml(s.load_ms, s.train_ms, batches, 1, std::to_string(c),
                                           std::to_string(depth)),
                              "autotune")
                              .batches_per_second;
      into.push_back(
          {fmt::format("load concurrency {}, prefetch_depth {}", c, depth), rate, c, depth});
      std::printf("| %s | load concurrency %d | prefetch_depth %d | %.0f |\n", label.c_str(), c,
                  depth, rate);
    };
    std::vector<Point> sweep;
    for (int d : {1, 2, 4, 8, 16, 32}) point(sweep, s.name, 2, d);
    for (int c : {1, 4, 8}) point(sweep, s.name, c, 16);
    // The best point again, for as many epochs as the auto run.
    auto again = [&](const std::vector<Point>& points, const std::string& extra) {
      const Point& best = best_of(points);
      return run(bench,
                 scaling_yaml(s.load_ms, s.train_ms, batches, epochs,
                              std::to_string(best.concurrency), std::to_string(best.depth), extra),
                 "autotune");
    };
    const RunReport best_run = again(sweep, "");
    const RunReport r = run(
        bench, scaling_yaml(s.load_ms, s.train_ms, batches, epochs, "auto", "auto"), "autotune");
    record(bench, details, s.name, sweep, best_run, r);

    if (std::string(s.name) != "load_bound") continue;
    // A memory budget that holds 6 batches in flight (three pools of 16640-byte buffers) beside
    // the sampling order (64 samples a batch, 8 bytes a sample), less than the best setting's
    // depth: auto reaches the best the budget allows, and says so.
    constexpr int kDepth = 6;
    const std::string budget =
        fmt::format(", memory_budget: {{ host: {} }}", kDepth * 3 * 16640 + batches * 64 * 8);
    std::vector<Point> allowed;
    for (int c : {1, 2, 4, 8}) point(allowed, std::string(s.name) + "_small_budget", c, kDepth);
    const RunReport best_small = again(allowed, budget);
    const RunReport small =
        run(bench, scaling_yaml(s.load_ms, s.train_ms, batches, epochs, "auto", "auto", budget),
            "autotune");
    record(bench, details, std::string(s.name) + "_small_budget", allowed, best_small, small);
    std::printf("  %s_small_budget: %s\n", s.name, small.tuning.state.c_str());
  }
  for (const auto& path : o.autotune_configs) {
    const std::string name = path.substr(path.find_last_of('/') + 1);
    std::ifstream in(path);
    if (!in) throw std::runtime_error("autotune: cannot read " + path);
    std::stringstream text;
    text << in.rdbuf();
    tune_config(bench, details, name.substr(0, name.rfind('.')), text.str(), path);
  }
  if (o.autotune_storage) {
    tune_config(bench, details, "storage", storage_config(o, 1), "storage");
  }
  bench.details("autotune") = details;
}

}  // namespace flowfeed::bench
