#include "bench.hpp"

#include <sys/resource.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <vector>

#include "flowfeed/nodes/builtin.hpp"

namespace flowfeed::bench {

Bench::Bench(Options options) : options_(std::move(options)) {
  register_builtin_nodes(registry_);
}

void Bench::result(const std::string& name, double figure, const std::string& unit, double baseline,
                   std::optional<Target> target) {
  results_.push_back({name, figure, unit, baseline, target});
}

void Bench::skip(const std::string& scenario, const std::string& why) {
  skipped_.push_back({{"scenario", scenario}, {"reason", why}});
}

void Bench::fail(const std::string& scenario, const std::string& error) {
  failed_.push_back({{"scenario", scenario}, {"error", error}});
}

bool Bench::has_image_shards(const std::string& scenario) {
  if (!options_.image_shards.empty()) return true;
  const std::string why = "needs --shards (make them with scripts/make_image_shards.py)";
  if (!options_.all) throw std::invalid_argument(scenario + " " + why);
  std::printf("SKIPPED %s: %s\n", scenario.c_str(), why.c_str());
  skip(scenario, why);
  return false;
}

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  const auto seconds = [](const timeval& t) {
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_usec) * 1e-6;
  };
  return seconds(u.ru_utime) + seconds(u.ru_stime);
}

bool Bench::has_cuda() const {
  return registry_.cuda_built() && registry_.device_count() > 0;
}

void Bench::require_cuda(const std::string& scenario) const {
  if (!registry_.cuda_built()) {
    throw NeedsCuda(scenario +
                    " needs CUDA (this build has none: reconfigure with -DFLOWFEED_CUDA=ON and run "
                    "it on a GPU machine)");
  }
  if (registry_.device_count() == 0) {
    throw NeedsCuda(scenario + " needs a CUDA device (none is visible: run it on a GPU machine)");
  }
}

void Bench::print_results() const {
  for (const auto& r : results_) {
    std::printf("RESULT %s %.4g %s baseline %.4g ratio %.3f\n", r.name.c_str(), r.figure,
                r.unit.c_str(), r.baseline, r.ratio());
  }
}

nlohmann::json Bench::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : results_) {
    nlohmann::json row = {{"name", r.name},         {"figure", r.figure}, {"unit", r.unit},
                          {"baseline", r.baseline}, {"ratio", r.ratio()}, {"target", nullptr}};
    if (r.target) {
      row["target"] = {{"value", r.target->value},
                       {"of", r.target->on_ratio ? "ratio" : "figure"},
                       {"bound", r.target->at_most ? "at_most" : "at_least"},
                       {"met", r.target->met(r.figure, r.ratio())}};
    }
    rows.push_back(row);
  }
  return {{"results", rows}, {"scenarios", details_}, {"skipped", skipped_}, {"failed", failed_}};
}

void fail_errno(const std::string& what, const std::string& path) {
  throw std::runtime_error(what + " " + path + ": " + std::strerror(errno));
}

void read_into_page_cache(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> sink(std::size_t{8} << 20);
  while (in.read(sink.data(), static_cast<std::streamsize>(sink.size())) || in.gcount() > 0) {
  }
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

}  // namespace flowfeed::bench
