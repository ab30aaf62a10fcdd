// pipeline_bench remote: the same npy shards read by the same config from local disk and by URL
// from nginx on 127.0.0.1 (docs/REMOTE.md; where nginx is not installed, from
// tests/remote/range_server.py, Python's ThreadingHTTPServer with Range requests). Each figure
// is samples per second over the pipeline's build and run. From disk (every file read dropped
// from the page cache first, posix_fadvise): the local files, then by URL with an empty cache
// (cold: the server reads the same files from the same disk) and again with that cache (warm:
// the cached copies read from disk). Right after the fetch: the warm cache read from memory as
// the cold run wrote it, against the local files in memory. From memory (every file dropped and
// read again first): the local files and the warm cache again. Faults: cold by URL through
// tests/remote/fault_proxy.py failing a share of the requests (503 or a reset mid-body), against
// the same proxy failing none. With
// --order shards (the default) the shards are streamed during the run; with --order samples all
// are fetched while it is built. Random access besides: the samples in a full shuffle, read by
// Range requests (access: range, nothing cached) against the local run of that order, and
// language-model windows at random positions of raw token files read by Range requests against
// the same windows read from the local files in memory.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "bench.hpp"
#include "flowfeed/nodes/detail/npy_file.hpp"
#include "tests/remote/servers.hpp"

namespace flowfeed::bench {

namespace {

namespace fs = std::filesystem;

struct Timed {
  double samples_per_second = 0;
  RunReport report;
};

/// `windows` windows of 1,024 tokens at random positions of `files`, batches of 64 (`extra`: more
/// loader params).
std::string tokens_yaml(const Options& o, const std::string& files, std::size_t windows,
                        const std::string& extra) {
  return "pipeline: { epochs: 1, batch_size: 64, prefetch_depth: 8, device: host }\n"
         "sampler: { shuffle: true, seed: 1 }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: tokens\n"
         "    concurrency: " +
         std::to_string(o.remote_loaders) + "\n    params: { files: '" + files +
         "', context: 1024, positions: random, seed: 2, windows: " + std::to_string(windows) +
         extra +
         " }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: discard }\n";
}

std::string yaml(const Options& o, const std::string& features, const std::string& labels,
                 const std::string& cache, const std::string& order, const std::string& extra) {
  return "pipeline: { epochs: " + std::to_string(o.remote_epochs) +
         ", batch_size: 64, prefetch_depth: 8, device: host }\n"
         "sampler: { shuffle: true, seed: 1" +
         (order == "shards" ? std::string(", order: shards, shuffle_window: 4") : "") +
         " }\n"
         "nodes:\n"
         "  - name: load\n"
         "    type: npy\n"
         "    concurrency: " +
         std::to_string(o.remote_loaders) + "\n    params: { features: '" + features +
         "', labels: '" + labels + "'" +
         (cache.empty() ? std::string() : ", cache_dir: '" + cache + "'") +
         ", transfers: " + std::to_string(o.remote_transfers) + extra +
         " }\n"
         "  - { name: upload, type: host_upload }\n"
         "  - { name: train, type: discard }\n";
}

Timed timed_run(Bench& bench, const std::string& text, const std::string& name) {
  const auto start = std::chrono::steady_clock::now();
  Pipeline p(load_config_string(text, bench.registry(), {}, name), bench.registry());
  Timed t;
  t.report = p.run();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  t.samples_per_second = static_cast<double>(t.report.samples) / seconds;
  return t;
}

/// Drops the pages of every file under `dir` from the page cache (written back first:
/// posix_fadvise drops clean pages only), so the next read of them comes from the disk.
void evict(const fs::path& dir) {
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // a cache's lock file, say: nothing read from it counts
    ::fdatasync(fd);
    const int rc = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (rc != 0) {
      throw std::runtime_error("remote: posix_fadvise(DONTNEED) failed on " +
                               entry.path().string() + ": " + std::strerror(rc));
    }
  }
}

/// Reads every file under `dir` once from its start to its end, from the disk (evicted first):
/// both memory runs then find their files in the page cache in the same state, whichever reads
/// left them there before.
void preload(const fs::path& dir) {
  evict(dir);
  std::vector<char> buffer(std::size_t{1} << 20);
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    while (::read(fd, buffer.data(), buffer.size()) > 0) {
    }
    ::close(fd);
  }
}

/// The middle value; of an even count, the mean of the two middle ones.
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

}  // namespace

void remote(Bench& bench) {
  const Options& o = bench.options();
  const std::uint64_t total = o.quick ? std::uint64_t{8} << 20 : o.remote_bytes;
  const int shards = o.quick ? 4 : o.remote_shards;
  const std::size_t row_bytes = 16384;
  const std::size_t rows = std::max<std::size_t>(1, total / shards / row_bytes);
  const fs::path dir =
      fs::temp_directory_path() / ("flowfeed_remote_bench_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  for (int s = 0; s < shards; ++s) {
    char name[64];
    std::vector<std::uint8_t> x(rows * row_bytes);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<std::uint8_t>(i * 31 + s);
    std::vector<std::int32_t> y(rows);
    for (std::size_t i = 0; i < rows; ++i) y[i] = static_cast<std::int32_t>(i % 10);
    std::snprintf(name, sizeof name, "x-%03d.npy", s);
    write_npy((dir / "data" / name).string(), NpyDtype::uint8,
              {static_cast<std::int64_t>(rows), static_cast<std::int64_t>(row_bytes)}, x.data());
    std::snprintf(name, sizeof name, "y-%03d.npy", s);
    write_npy((dir / "data" / name).string(), NpyDtype::int32, {static_cast<std::int64_t>(rows)},
              y.data());
  }
  // Raw token files beside the shards, an eighth of their bytes in four files.
  const int token_files = 4;
  const std::size_t file_tokens = std::max<std::size_t>(total / 8 / token_files / 2, 4096);
  for (int t = 0; t < token_files; ++t) {
    char name[64];
    std::snprintf(name, sizeof name, "t-%03d.bin", t);
    write_token_file((dir / "data" / name).string(), file_tokens);
  }
  const std::size_t windows = o.quick ? 256 : 65536;
  char last[16];
  std::snprintf(last, sizeof last, "%03d", shards - 1);
  const std::string range = std::string("{000..") + last + "}";
  // nginx when it is installed, else Python's threaded server (the H200 machines have no nginx).
  std::unique_ptr<remote_test::Nginx> nginx;
  std::unique_ptr<remote_test::Child> python;
  int port = 0;
  const bool has_nginx = ::access("/usr/sbin/nginx", X_OK) == 0;
  if (o.remote_server == "nginx" && !has_nginx) {
    bench.skip("remote", "nginx is not installed (scripts/deps.sh); --server python uses Python's");
    return;
  }
  if (o.remote_server == "nginx" || (o.remote_server == "auto" && has_nginx)) {
    nginx = std::make_unique<remote_test::Nginx>((dir / "data").string(), (dir / "nginx").string());
    port = nginx->port();
  } else {
    python = remote_test::python_server("range_server.py", {"--root", (dir / "data").string()});
    port = python->port();
  }
  const std::string server = nginx ? "nginx" : "python ThreadingHTTPServer (range_server.py)";
  std::printf("remote: shards served by %s on 127.0.0.1:%d, sampler order %s\n", server.c_str(),
              port, o.remote_order.c_str());
  bench.details("remote")["server"] = server;
  bench.details("remote")["order"] = o.remote_order;
  auto proxy_failing = [&](double rate) {
    return remote_test::python_server(
        "fault_proxy.py",
        {"--upstream", std::to_string(port), "--rate", std::to_string(rate), "--faults",
         "503,reset", "--seed", "7", "--log", (dir / "faults.log").string()});
  };
  auto clean_proxy = proxy_failing(0);
  auto proxy = proxy_failing(o.remote_fault_rate);
  const std::string local = (dir / "data").string() + "/";
  const std::string http = "http://127.0.0.1:" + std::to_string(port) + "/";
  const std::string through_proxy = "http://127.0.0.1:" + std::to_string(clean_proxy->port()) + "/";
  const std::string faulty = "http://127.0.0.1:" + std::to_string(proxy->port()) + "/";
  const std::uint64_t expected = static_cast<std::uint64_t>(rows) * shards * o.remote_epochs;
  struct Series {
    std::vector<double> rate, ratio;
  };
  Series local_disk, cold, warm, local_memory, warm_memory, proxied, faults, local_random, ranged,
      local_tokens, token_ranges, local_fresh, warm_fresh;
  std::vector<double> fault_cost;  ///< each round's share of the transfers' time lost to faults
  nlohmann::json& details = bench.details("remote");
  {
    // Untimed, before the rounds: one cold run by URL, so that the first round's runs do not
    // meet the disk still taking the data set just written.
    const fs::path scratch = dir / "warm-up-cache";
    ::sync();
    timed_run(bench,
              yaml(o, http + "x-" + range + ".npy", http + "y-" + range + ".npy", scratch.string(),
                   o.remote_order, ""),
              "remote_warm_up");
    fs::remove_all(scratch);
  }
  for (int round = 0; round < o.remote_runs; ++round) {
    const fs::path cache = dir / ("cache-" + std::to_string(round));
    const std::string fault_cache = (dir / ("fault-cache-" + std::to_string(round))).string();
    const std::string range_cache = (dir / ("range-cache-" + std::to_string(round))).string();
    auto text = [&](const std::string& base, const std::string& c, const std::string& order = "",
                    const std::string& extra = "") {
      return yaml(o, base + "x-" + range + ".npy", base + "y-" + range + ".npy", c,
                  order.empty() ? o.remote_order : order, extra);
    };
    // A run of `yaml_text`, checked to deliver `samples` (none: every npy sample) and added to
    // `series` (with its ratio to `base`; none: to itself) and to the round's details as `key`.
    nlohmann::json round_details;
    auto measure = [&](Series& series, const std::string& yaml_text, const std::string& key,
                       const Timed* base = nullptr, std::uint64_t samples = 0) {
      // Nothing left to write back: the cache an earlier run filled is not written to the disk
      // while this one runs.
      ::sync();
      Timed t = timed_run(bench, yaml_text, "remote_" + key);
      round_details[key] = t.samples_per_second;
      if (t.report.samples != (samples ? samples : expected)) {
        throw std::runtime_error("remote: a run delivered " + std::to_string(t.report.samples) +
                                 " samples, not " + std::to_string(samples ? samples : expected));
      }
      series.rate.push_back(t.samples_per_second);
      series.ratio.push_back(t.samples_per_second / (base ? base : &t)->samples_per_second);
      return t;
    };
    // Runs a and b four times each, in the order a b b a b a a b, each after its `before` (an
    // eviction, or nothing): a drift of the machine's speed over the eight runs, steady or
    // bending, falls on both alike. One untimed run of each side comes first. The first run of a
    // side after the other's was slow: the first warm run from memory at 0.90 of the next ones
    // (2-core machine). Cold runs through the proxy, whichever side ran, were slow at every other
    // run that wrote a cache (80, 79, 45, 82, 41, 81, 49 and 81 thousand samples/s without the
    // untimed runs, b's runs two of the three slow ones); after the two untimed runs the slow
    // ones fall at the odd places, two on each side. The round's figure of each is the mean of
    // its four runs, recorded in the round's details under its key; b's runs are returned
    // beside.
    struct Side {
      std::string text, key;
      std::function<void()> before;
    };
    struct Pair {
      double a = 0, b = 0;
      std::vector<Timed> b_runs;
    };
    auto alternated = [&](const Side& a, const Side& b) {
      Series scratch;
      for (const Side* side : {&a, &b}) {
        if (side->before) side->before();
        measure(scratch, side->text, side->key);
      }
      Pair pair;
      nlohmann::json& order = round_details[a.key + "_then_" + b.key];
      order = nlohmann::json::array();
      for (const bool is_b : {false, true, true, false, true, false, false, true}) {
        const Side& side = is_b ? b : a;
        if (side.before) side.before();
        Timed t = measure(scratch, side.text, side.key);
        order.push_back(t.samples_per_second);  // each run in the order they ran
        (is_b ? pair.b : pair.a) += t.samples_per_second / 4;
        if (is_b) pair.b_runs.push_back(std::move(t));
      }
      round_details[a.key] = pair.a;
      round_details[b.key] = pair.b;
      return pair;
    };
    // From disk: every file these runs read is dropped from the page cache first. Cold first
    // (it fills the cache), then the local and warm runs alternated.
    Series scratch;
    evict(dir / "data");
    const Timed c = measure(scratch, text(http, cache.string()), "cold");
    // Right after the fetch: the warm cache read from memory as the cold run's transfers wrote
    // it (what a second epoch meets), against the local files read once from the disk first.
    ::sync();
    preload(dir / "data");
    const Pair fresh = alternated({text(local, ""), "local_memory_after_fetch", nullptr},
                                  {text(http, cache.string()), "warm_after_fetch", nullptr});
    local_fresh.rate.push_back(fresh.a);
    warm_fresh.rate.push_back(fresh.b);
    warm_fresh.ratio.push_back(fresh.b / fresh.a);
    const Pair disk = alternated({text(local, ""), "local_disk", [&] { evict(dir / "data"); }},
                                 {text(http, cache.string()), "warm", [&] { evict(cache); }});
    const double ld = disk.a, wd = disk.b;
    const Timed& w = disk.b_runs.front();
    local_disk.rate.push_back(ld);
    cold.rate.push_back(c.samples_per_second);
    cold.ratio.push_back(c.samples_per_second / ld);
    warm.rate.push_back(wd);
    warm.ratio.push_back(wd / ld);
    // From memory: the files read again while they are in the page cache.
    preload(dir / "data");
    preload(cache);
    const Pair memory = alternated({text(local, ""), "local_memory", nullptr},
                                   {text(http, cache.string()), "warm_memory", nullptr});
    const double lm = memory.a, wm = memory.b;
    local_memory.rate.push_back(lm);
    warm_memory.rate.push_back(wm);
    warm_memory.ratio.push_back(wm / lm);
    // Faults: the same proxy failing none and failing a share of the requests, alternated, each
    // run cold. All of them fill the same cache directory, emptied before each, and the warm
    // cache is gone before the first: every run writes its shards into the page-cache memory the
    // run before it freed. (Memory the machine has not used since it started is slower to write on
    // a virtual machine: a run given it ran at half the speed of the next through the same
    // proxy.)
    fs::remove_all(cache);
    const auto empty_cache = [&] { fs::remove_all(fault_cache); };
    const Pair fault_pair = alternated({text(through_proxy, fault_cache), "proxy", empty_cache},
                                       {text(faulty, fault_cache), "faults", empty_cache});
    proxied.rate.push_back(fault_pair.a);
    faults.rate.push_back(fault_pair.b);
    faults.ratio.push_back(fault_pair.b / fault_pair.a);
    // What the faults cost, counted by the transfers themselves rather than read off two
    // throughputs that vary from run to run by more: the seconds of lost tries and waits before
    // retries, over the seconds the loader's transfers had (the run's time × transfers), for the
    // four fault runs together.
    double lost_seconds = 0, transfer_seconds = 0, retries = 0;
    for (const Timed& t : fault_pair.b_runs) {
      lost_seconds += t.report.extra.at("load.remote_retry_seconds");
      retries += t.report.extra.at("load.remote_retries");
      transfer_seconds +=
          static_cast<double>(t.report.samples) / t.samples_per_second * o.remote_transfers;
    }
    fault_cost.push_back(lost_seconds / transfer_seconds);
    // Random access: every sample anywhere, by Range requests, against local files in that order.
    const Timed lr = measure(local_random, text(local, "", "samples"), "local_random");
    const Timed r =
        measure(ranged, text(http, range_cache, "samples", ", access: range"), "range", &lr);
    // Token windows: the local files (in memory since the preload) and the same windows by Range
    // requests.
    const Timed lt = measure(local_tokens, tokens_yaml(o, local + "t-{000..003}.bin", windows, ""),
                             "local_tokens", nullptr, windows);
    const Timed tr = measure(token_ranges,
                             tokens_yaml(o, http + "t-{000..003}.bin", windows,
                                         ", access: range, cache_dir: '" + range_cache + "'"),
                             "token_range", &lt, windows);
    std::printf(
        "remote round %d, from disk: local %.0f, cold %.0f (%.3f), warm %.0f (%.3f) samples/s; "
        "fetch at build: cold %.3f s, warm %.3f s\n",
        round, ld, c.samples_per_second, cold.ratio.back(), wd, warm.ratio.back(),
        c.report.extra.at("load.remote_fetch_seconds"),
        w.report.extra.at("load.remote_fetch_seconds"));
    std::printf(
        "remote round %d, from memory: local %.0f, warm %.0f (%.3f), cold above %.3f of it; "
        "right after the fetch: local %.0f, warm %.0f (%.3f); "
        "through the proxy: no faults %.0f, %.0f%% faults %.0f (%.3f) samples/s; the faults cost "
        "the transfers %.2f s of %.1f s (%.2f%%; %.0f retries in 4 runs)\n",
        round, lm, wm, warm_memory.ratio.back(), c.samples_per_second / lm, fresh.a, fresh.b,
        warm_fresh.ratio.back(), fault_pair.a, 100 * o.remote_fault_rate, fault_pair.b,
        faults.ratio.back(), lost_seconds, transfer_seconds, 100 * fault_cost.back(), retries);
    std::printf(
        "remote round %d, random order: local %.0f, by Range requests %.0f (%.3f; %.0f requests) "
        "samples/s\n",
        round, lr.samples_per_second, r.samples_per_second, ranged.ratio.back(),
        r.report.extra.at("load.remote_range_reads"));
    std::printf(
        "remote round %d, token windows at random: local %.0f, by Range requests %.0f (%.3f; "
        "%.0f requests) windows/s\n",
        round, lt.samples_per_second, tr.samples_per_second, token_ranges.ratio.back(),
        tr.report.extra.at("load.remote_range_reads"));
    round_details["token_range_reads"] = tr.report.extra.at("load.remote_range_reads");
    round_details["fault_retries"] = retries;
    round_details["fault_retry_seconds"] = lost_seconds;
    round_details["fault_transfer_seconds"] = transfer_seconds;
    round_details["cold_fetch_seconds"] = c.report.extra.at("load.remote_fetch_seconds");
    round_details["range_reads"] = r.report.extra.at("load.remote_range_reads");
    details["rounds"].push_back(round_details);
    fs::remove_all(cache);
    fs::remove_all(fault_cache);
    fs::remove_all(range_cache);
  }
  auto span = [](const std::vector<double>& v) {
    return nlohmann::json{{"min", *std::min_element(v.begin(), v.end())},
                          {"max", *std::max_element(v.begin(), v.end())}};
  };
  details["cold_ratio"] = span(cold.ratio);
  details["warm_ratio"] = span(warm.ratio);
  details["warm_memory_ratio"] = span(warm_memory.ratio);
  details["warm_after_fetch_ratio"] = span(warm_fresh.ratio);
  details["fault_ratio"] = span(faults.ratio);
  details["fault_cost_share"] = span(fault_cost);
  details["range_ratio"] = span(ranged.ratio);
  details["token_range_ratio"] = span(token_ranges.ratio);
  details["bytes"] = rows * row_bytes * static_cast<std::size_t>(shards);
  bench.result("remote_cold", median(cold.rate), "samples/s", median(local_disk.rate),
               Target{0.9, true, false});
  bench.result("remote_warm", median(warm.rate), "samples/s", median(local_disk.rate),
               Target{0.95, true, false});
  bench.result("remote_warm_memory", median(warm_memory.rate), "samples/s",
               median(local_memory.rate), Target{0.95, true, false});
  bench.result("remote_cold_vs_memory", median(cold.rate), "samples/s", median(local_memory.rate));
  bench.result("remote_warm_after_fetch", median(warm_fresh.rate), "samples/s",
               median(local_fresh.rate));
  bench.result("remote_faults", median(faults.rate), "samples/s", median(proxied.rate),
               Target{0.8, true, false});
  bench.result("remote_range", median(ranged.rate), "samples/s", median(local_random.rate));
  bench.result("remote_token_range", median(token_ranges.rate), "windows/s",
               median(local_tokens.rate));
  clean_proxy.reset();
  proxy.reset();
  fs::remove_all(dir);
}

}  // namespace flowfeed::bench
